"""Throughput of ``probe extract`` against a bare timm forward of the same ViT, in one run.

For each view (224: tokens + attention; 480: keys) the whole ``extract`` call (checkpoint read,
decode, views, forward with hooks, zarr writes) is timed against ``vit.forward_features`` on
already-decoded tensors of the same images. Rounds are interleaved and medians compared (one
warm-up round first), so a noisy machine slows both sides alike. Prints the ratios and a JSON line.

    python benchmarks/extract.py [--arch vit-s16|vit-s8|vit-b16|vit-b8|dinov2-s14-reg|...] [--full]

The default is a short run (a few images, one timed round, under about a minute for ViT-S/16 on
two cores); ``--full`` times 128 images at 224 and 32 at 480 over 3 rounds.
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

from probe_toolkit.demo.samples import sample_photos, write_checkpoint
from probe_toolkit.store import images
from probe_toolkit.store.backbone import RELEASED, Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import Settings, extract


def image_folder(root: Path, count: int) -> Path:
    folder = root / f"images-{count}"
    folder.mkdir()
    photos = sorted(sample_photos().glob("*.jpg"))
    for i in range(count):
        shutil.copy(photos[i % len(photos)], folder / f"{i:05d}-{photos[i % len(photos)].name}")
    return folder


def bare_forward(vit: torch.nn.Module, folder: Path, size: int, batch: int, patch: int) -> float:
    refs = images.list_images(folder)
    side = size // patch * patch  # timm wants whole patches (480 px at /14: 476)
    tensors = torch.stack([images.views(images.load_image(r.path), (size,))[size][:, :side, :side] for r in refs])
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


SHORT = {"images_224": 8, "images_480": 2, "rounds": 1}
FULL = {"images_224": 128, "images_480": 32, "rounds": 3}


def layout_of(name: str) -> str:
    arch = RELEASED[name]
    return "dinov2-reg-backbone" if arch.registers else "dinov2-backbone" if arch.layerscale else "dino-backbone"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=list(RELEASED), default="vit-s16", help="released size, random weights in its own layout")
    parser.add_argument("--full", action="store_true", help="the long run (128 + 32 images, 3 rounds)")
    parser.add_argument("--images-224", type=int, default=None)
    parser.add_argument("--images-480", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    mode = FULL if args.full else SHORT
    n224 = args.images_224 if args.images_224 is not None else mode["images_224"]
    n480 = args.images_480 if args.images_480 is not None else mode["images_480"]
    rounds = args.rounds if args.rounds is not None else mode["rounds"]
    arch = RELEASED[args.arch]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = write_checkpoint(root / f"{args.arch}_random.pth", layout_of(args.arch), arch)
        plan = {224: (image_folder(root, n224), min(16, n224)), 480: (image_folder(root, n480), min(8, n480))}
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
        for r in range(rounds + 1):  # round 0 warms up
            for size, (folder, batch) in plan.items():
                b = bare_forward(bare[size], folder, size, batch, arch.patch)
                p = probe_extract(checkpoint, folder, size, batch, root, f"s{size}-r{r}")
                if r:
                    results[size]["bare"].append(b)
                    results[size]["probe"].append(p)
    line = {"benchmark": "extract", "arch": args.arch, "mode": "full" if args.full else "short",
            "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads", "torch": torch.__version__}
    for size, res in results.items():
        probe, bare_rate = statistics.median(res["probe"]), statistics.median(res["bare"])
        print(f"{args.arch} {size} px: probe extract {probe:.2f} img/s, bare timm forward {bare_rate:.2f} img/s, ratio {probe / bare_rate:.2f}  (rounds {res})")
        line[f"ratio_{size}"] = round(probe / bare_rate, 3)
        line[f"probe_{size}_img_s"] = round(probe, 3)
        line[f"bare_{size}_img_s"] = round(bare_rate, 3)
    print(json.dumps(line))


def _pos(model: Backbone, size: int) -> torch.Tensor:
    from probe_toolkit.store.backbone import interpolate_pos_embed

    return interpolate_pos_embed(model.vit.pos_embed.detach(), size // model.arch.patch, model.arch.pos_prefix, model.interpolation)


if __name__ == "__main__":
    main()
