"""Which DINOv3 keys the decoders should cut: after RoPE (as the network attends) or before it.

A DINOv3 store holds both (``keys_<view>`` before RoPE, ``keys_rope_<view>`` after it). This script
decodes the same store with each, for every preset, and scores both on one labelled panel: CorLoc
(a hit when the first mask's box has IoU ≥ 0.5 with a ground-truth box, as LOST counts it) and the
mean best mask IoU. The scenes are synthetic (a grey, noisy background with one to three
orange rectangles, their COCO outlines exact), the network a tiny DINOv3 of random weights in
the official layout (``probe make-checkpoint``'s), several seeds; no released weights can be
downloaded here. So this measures what RoPE itself does to a cut on key cosines, not what a
trained network's keys hold.

    python benchmarks/dinov3_keys.py [--seeds 3] [--scenes 12] [--view 480|native]

Prints a table and one JSON line (append it to ``benchmarks/records/dinov3_keys.jsonl``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PRESETS = ("tokencut", "lost", "dsm", "maskcut", "centred")


def scenes(folder: Path, count: int, seed: int) -> tuple[Path, Path]:
    """Photographs (noisy grey, orange rectangles) and their COCO panel file."""
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(seed)
    images = folder / "images"
    images.mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for i in range(count):
        height, width = int(rng.choice([320, 400, 480])), int(rng.choice([400, 480, 560]))
        pixels = np.clip(110 + rng.normal(0, 25, (height, width, 3)), 0, 255)
        coco["images"].append({"id": i + 1, "file_name": f"{i:03d}.png", "height": height, "width": width})
        for _ in range(int(rng.integers(1, 4))):
            h, w = int(rng.integers(height // 5, height // 2)), int(rng.integers(width // 5, width // 2))
            y, x = int(rng.integers(0, height - h)), int(rng.integers(0, width - w))
            colour = np.array([220, 90, 40]) + rng.normal(0, 15, 3)
            pixels[y : y + h, x : x + w] = np.clip(colour + rng.normal(0, 15, (h, w, 3)), 0, 255)
            m = np.zeros((height, width), np.uint8)
            m[y : y + h, x : x + w] = 1
            rle = mask_utils.encode(np.asfortranarray(m))
            rle["counts"] = rle["counts"].decode("ascii")
            coco["annotations"].append(
                {"id": len(coco["annotations"]) + 1, "image_id": i + 1, "category_id": 1, "segmentation": rle, "bbox": [x, y, w, h], "area": float(h * w), "iscrowd": 0}
            )
        Image.fromarray(pixels.astype(np.uint8)).save(images / f"{i:03d}.png")
    (folder / "panel.json").write_text(json.dumps(coco))
    return folder / "panel.json", images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="networks of random weights (one store each)")
    parser.add_argument("--scenes", type=int, default=12)
    parser.add_argument("--view", default="480", choices=("480", "native", "native_crop"))
    args = parser.parse_args()

    import probe_toolkit as probe
    from probe_toolkit.demo.samples import TINY_DINOV3, write_checkpoint
    from probe_toolkit.labels.panels import add_panel
    from probe_toolkit.store.extract import Settings, extract

    scores: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        panel_file, folder = scenes(root / "scenes", args.scenes, seed=0)
        cache = root / "cache"
        add_panel("scenes", panel_file, folder, "val", cache=cache)
        for seed in range(args.seeds):
            checkpoint = write_checkpoint(root / f"v3-{seed}.pth", "dinov3-official", TINY_DINOV3, seed=seed)
            views = ("native", "native_crop") if args.view == "native" else (args.view,)  # DSM cuts the cropped view (its extract.py)
            store = extract(checkpoint, folder, settings=Settings(views=views, dtype="float32"), store=root / f"s{seed}.zarr", quiet=True).store
            for preset in PRESETS:
                view = "native_crop" if preset == "dsm" and args.view == "native" else args.view
                for keys in ("rope", "plain"):
                    run = probe.run(
                        "decode", store, preset=preset, view=view, keys=keys, panel="scenes", cache_dir=cache, workers=1, out=root / f"{seed}-{preset}-{keys}.json"
                    )
                    s = run.report.scores
                    scores.setdefault((preset, keys), []).append((s.corloc, s.mean_best_iou))
    line = {
        "benchmark": "dinov3_keys",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": platform.processor() or platform.machine(),
        "network": "tiny DINOv3 (width 128, depth 2), random weights",
        "seeds": args.seeds,
        "scenes": args.scenes,
        "view": args.view,
        "rows": [],
    }
    print(f"{'preset':10} {'keys':6} {'CorLoc %':>9} {'mean best IoU %':>16}   (mean over {args.seeds} networks, {args.scenes} scenes, view {args.view})")
    for (preset, keys), values in scores.items():
        corloc = 100 * statistics.mean(v[0] for v in values)
        iou = 100 * statistics.mean(v[1] for v in values)
        print(f"{preset:10} {keys:6} {corloc:9.1f} {iou:16.1f}")
        line["rows"].append({"preset": preset, "keys": keys, "corloc": round(corloc, 2), "mean_best_iou": round(iou, 2)})
    print(json.dumps(line))


if __name__ == "__main__":
    main()
