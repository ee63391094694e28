"""How often LOST's tie rule moves its answer: torch.argsort's order on the CPU against the lowest index.

LOST (valeoai/LOST ``object_discovery.py``) ranks patches by ``torch.argsort(-degree,
descending=True)``; patches of equal degree come out in the order torch's CPU sort (libstdc++'s
introsort) leaves them, which probe's ``lost`` preset now reproduces (``ties="argsort"``,
``analyses/argsort.py``). Before, probe broke ties by the lowest patch index (``ties="lowest-index"``,
kept as an option). This script decodes the same stores with both rules and counts the images
whose seed, mask or box differs, and CorLoc under each, on synthetic scenes (noisy grey, one to
three orange rectangles, their COCO outlines exact) and the seven demo photographs (seed, mask and
box only: no labels). Networks of random weights in the released layouts (no released weights can
be downloaded here): so it measures how often ties decide, not a trained network's CorLoc. It also
times ``analyses.argsort`` against ``torch.argsort`` on the same degree vectors.

    python benchmarks/lost_ties.py [--seeds 2] [--scenes 24] [--view native|480]

Prints a table and one JSON line (append it to ``benchmarks/records/lost_ties.jsonl``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from dinov3_keys import scenes

NETWORKS = (("dino-full", "vit-s16"), ("dinov3-official", "tiny-dinov3"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="networks of random weights per family")
    parser.add_argument("--scenes", type=int, default=24)
    parser.add_argument("--view", default="native", choices=("native", "480"))
    args = parser.parse_args()

    import torch

    import probe_toolkit as probe
    from probe_toolkit.analyses.argsort import argsort
    from probe_toolkit.demo.samples import ARCHS, write_checkpoint
    from probe_toolkit.labels.panels import add_panel
    from probe_toolkit.results import records
    from probe_toolkit.store.extract import Settings, extract

    photos = Path(probe.__file__).parent / "demo" / "data" / "photos"
    rows, timings = [], {"ours": 0.0, "torch": 0.0, "vectors": 0}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        panel_file, folder = scenes(root / "scenes", args.scenes, seed=0)
        for photo in sorted(photos.glob("*.jpg")):
            shutil.copy(photo, folder / photo.name)
        cache = root / "cache"
        add_panel("scenes", panel_file, folder, "val", cache=cache)  # the scenes only: the photographs are decoded, not scored
        for layout, arch in NETWORKS:
            for seed in range(args.seeds):
                checkpoint = write_checkpoint(root / f"{arch}-{seed}.pth", layout, ARCHS[arch], seed=seed)
                store = extract(
                    checkpoint, folder, settings=Settings(views=(args.view,), dtype="float32", attention="none"), store=root / f"{arch}-{seed}.zarr", quiet=True
                ).store
                outcome = {}
                for ties in ("argsort", "lowest-index"):
                    run = probe.run(
                        "decode",
                        store,
                        preset="lost",
                        view=args.view,
                        ties=ties,
                        panel="scenes",
                        cache_dir=cache,
                        workers=1,
                        out=root / f"{arch}-{seed}-{ties}.json",
                        allow_partial=True,
                    )
                    outcome[ties] = (records.load(store, "decoder", run.run_id), run.report.scores.corloc)
                a, b = outcome["argsort"][0], outcome["lowest-index"][0]
                names = [str(n) for n in a.image.values]
                seed_moved = a.seed.values != b.seed.values
                mask_moved = np.array([not np.array_equal(a.masks.values[i], b.masks.values[i]) for i in range(len(names))])
                photo = np.array([n.endswith(".jpg") for n in names])
                for degree in a.degree.values:
                    d = degree[np.isfinite(degree)]
                    start = time.perf_counter()
                    argsort(d)
                    timings["ours"] += time.perf_counter() - start
                    start = time.perf_counter()
                    torch.argsort(-torch.from_numpy(d).float(), descending=True)
                    timings["torch"] += time.perf_counter() - start
                    timings["vectors"] += 1
                rows.append(
                    {
                        "network": f"{arch} seed {seed}",
                        "images": len(names),
                        "photos": int(photo.sum()),
                        "seed_moved": int(seed_moved.sum()),
                        "mask_moved": int(mask_moved.sum()),
                        "photos_mask_moved": int((mask_moved & photo).sum()),
                        "corloc_argsort": round(100 * outcome["argsort"][1], 2),
                        "corloc_lowest_index": round(100 * outcome["lowest-index"][1], 2),
                    }
                )
    print(f"{'network':22} {'images':>6} {'seed moved':>10} {'mask moved':>10} {'of photos':>9} {'CorLoc argsort':>14} {'lowest index':>12}")
    for r in rows:
        print(
            f"{r['network']:22} {r['images']:6} {r['seed_moved']:10} {r['mask_moved']:10} {r['photos_mask_moved']:5}/{r['photos']:<3} "
            f"{r['corloc_argsort']:14.1f} {r['corloc_lowest_index']:12.1f}"
        )
    per = {k: 1e3 * timings[k] / max(timings["vectors"], 1) for k in ("ours", "torch")}
    print(f"argsort per image: analyses.argsort {per['ours']:.2f} ms, torch.argsort {per['torch']:.3f} ms ({timings['vectors']} degree vectors)")
    line = {
        "benchmark": "lost_ties",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "view": args.view,
        "scenes": args.scenes,
        "networks": "random weights in the released layouts",
        "rows": rows,
        "argsort_ms_per_image": round(per["ours"], 3),
        "torch_argsort_ms_per_image": round(per["torch"], 4),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
