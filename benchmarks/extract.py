"""Throughput of ``probe extract`` against a bare timm forward of the same ViT-S/16, in one run.

For each view (224: tokens + attention; 480: keys) the whole ``extract`` call (checkpoint read,
decode, views, forward with hooks, zarr writes) is timed against ``vit.forward_features`` on
already-decoded tensors of the same images. Rounds are interleaved and medians compared, as
``reference/baselines.md`` advises on this noisy machine. Prints the ratios and a JSON line.

    python benchmarks/extract.py [--images-224 128] [--images-480 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from probe_toolkit.demo.samples import write_checkpoint
from probe_toolkit.store import images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import VIT_S16, load_checkpoint
from probe_toolkit.store.extract import Settings, extract


def image_folder(root: Path, count: int) -> Path:
    folder = root / f"images-{count}"
    folder.mkdir()
    photos = sorted(images.sample_photos().glob("*.jpg"))
    for i in range(count):
        shutil.copy(photos[i % len(photos)], folder / f"{i:05d}-{photos[i % len(photos)].name}")
    return folder


def bare_forward(vit: torch.nn.Module, folder: Path, size: int, batch: int) -> float:
    refs = images.list_images(folder)
    tensors = torch.stack([images.views(images.load_image(r.path), (size,))[size] for r in refs])
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(tensors), batch):
            vit.forward_features(tensors[i:i + batch])
    return len(tensors) / (time.perf_counter() - start)


def probe_extract(checkpoint: Path, folder: Path, size: int, batch: int, root: Path, tag: str) -> float:
    settings = Settings(views=(size,), attention="last" if size == 224 else "none", chunk=batch)
    n = len(images.list_images(folder))
    start = time.perf_counter()
    extract(checkpoint, folder, settings=settings, store=root / f"{tag}.zarr", batch_size=batch, quiet=True)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images-224", type=int, default=128)
    parser.add_argument("--images-480", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = write_checkpoint(root / "dino_vits16_random.pth", "dino-backbone", VIT_S16)
        plan = {224: (image_folder(root, args.images_224), 16), 480: (image_folder(root, args.images_480), 8)}
        loaded = load_checkpoint(checkpoint)
        bare = {}
        for size in plan:
            # the same weights, the same position table: a timm model built for this input size
            model = Backbone.from_checkpoint(loaded)
            vit = model.vit
            vit.pos_embed = torch.nn.Parameter(_pos(model, size))
            vit.patch_embed.strict_img_size = False
            bare[size] = vit.eval()
        results: dict[int, dict[str, list[float]]] = {s: {"probe": [], "bare": []} for s in plan}
        for r in range(args.rounds + 1):  # round 0 warms up
            for size, (folder, batch) in plan.items():
                b = bare_forward(bare[size], folder, size, batch)
                p = probe_extract(checkpoint, folder, size, batch, root, f"s{size}-r{r}")
                if r:
                    results[size]["bare"].append(b)
                    results[size]["probe"].append(p)
    line = {"benchmark": "extract", "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads", "torch": torch.__version__}
    for size, res in results.items():
        probe, bare_rate = statistics.median(res["probe"]), statistics.median(res["bare"])
        print(f"{size} px: probe extract {probe:.2f} img/s, bare timm forward {bare_rate:.2f} img/s, ratio {probe / bare_rate:.2f}  (rounds {res})")
        line[f"ratio_{size}"] = round(probe / bare_rate, 3)
        line[f"probe_{size}_img_s"] = round(probe, 3)
        line[f"bare_{size}_img_s"] = round(bare_rate, 3)
    print(json.dumps(line))


def _pos(model: Backbone, size: int) -> torch.Tensor:
    from probe_toolkit.store.backbone import interpolate_pos_embed

    return interpolate_pos_embed(model.vit.pos_embed.detach(), size // 16, model.prefix, "dino")


if __name__ == "__main__":
    main()
