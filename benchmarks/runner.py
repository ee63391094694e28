"""``probe attention-masks`` on one process against two (or ``--workers``), in one run.

A synthetic store (benchmarks/analyses.py's: attention_224 of 6 heads × 196 × 196, float16, no
class token, so the mean-of-patch-rows masks; chunks of 16) is written in a temporary folder.
Rounds interleave ``probe.run("attention-masks", ..., workers=1)`` and ``workers=W``; each prints wall
time and CPU time (this process and its reaped workers, ``resource.getrusage``), and the masks
of every placement are checked to be the same bits. Round 0 warms up and is dropped; medians.
On a shared machine the wall ratio is meaningless (use a quiet one); the CPU times show what
the processes cost beside the work (start-up, shipping blocks).

    python benchmarks/runner.py [--images 256] [--workers 2] [--rounds 3] [--full]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyses import build_store  # noqa: E402  (the synthetic store of benchmarks/analyses.py)

import probe_toolkit as probe  # noqa: E402
from probe_toolkit.results import records  # noqa: E402


def cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(store: Path, workers: int) -> tuple[float, float, np.ndarray]:
    wall, used = time.perf_counter(), cpu()
    probe.run("attention-masks", store, row="mean", workers=workers)
    wall, used = time.perf_counter() - wall, cpu() - used
    return wall, used, records.load(store, "attention_masks")["mask"].values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="2,048 images, 5 rounds")
    args = parser.parse_args()
    if args.full:
        args.images, args.rounds = 2048, 5
    with tempfile.TemporaryDirectory() as folder:
        store = build_store(Path(folder) / "store.zarr", args.images)
        times: dict[int, list[tuple[float, float]]] = {1: [], args.workers: []}
        reference = None
        for r in range(args.rounds + 1):
            for w in times:
                wall, used, masks = timed(store, w)
                reference = masks if reference is None else reference
                assert np.array_equal(masks, reference), f"workers={w}: masks differ"
                if r:
                    times[w].append((wall, used))
                print(f"round {r} workers {w}: wall {wall:.2f} s, CPU {used:.2f} s", flush=True)
    med = {w: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for w, ts in times.items()}
    one, many = med[1], med[args.workers]
    print(
        f"{args.images} images: 1 worker {args.images / one[0]:.0f} images/s (CPU {one[1]:.2f} s); {args.workers} workers "
        f"{args.images / many[0]:.0f} images/s (CPU {many[1]:.2f} s); wall ratio {one[0] / many[0]:.2f}×, CPU ratio {many[1] / one[1]:.2f}×; masks identical"
    )
    print(json.dumps({"images": args.images, "workers": args.workers, "wall_1": one[0], "wall_n": many[0], "cpu_1": one[1], "cpu_n": many[1]}))


if __name__ == "__main__":
    main()
