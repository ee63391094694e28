"""``probe hummingbird``'s CPU seconds per val image, this checkout against another (e.g. main before a change), on one scale-run store.

The store and panels are one size of ``benchmarks/scale.py`` (``--folder ROOT/n1000``: its
``store.zarr``, ``cache`` with the panels voc-train and voc-val; 80 % of the images train the
memory, 20 % are scored), the command as the scale run gives it (the published 1024·10² memory,
one augmentation epoch, ``--workers``). Each round runs this checkout's command and the other's,
interleaved; the CPU time is that of every process of the run (a quiet machine's wall time on
one core, which hardly moves when other work shares the machine), divided by the val images (the
memory's train images, read and drawn once per run, are in it). The ratio is the other's median
CPU over this one's. Both runs write a record into the store: their confusion counts (and every
number of the record) must be equal, which is printed and recorded.

    python benchmarks/hummingbird_cpu.py --folder /tmp/hbird-scale/n1000 --compare OTHER_CHECKOUT [--rounds 1] [--workers 1] [--record]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import _children_cpu, cpu_model, emit, header, options  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "hummingbird-cpu.jsonl"
MEMORY = 102400  # benchmarks/scale.py's


def run(tree: Path, folder: Path, workers: int) -> tuple[float, float, Path]:
    """(wall s, CPU s, the record it saved) of one ``probe hummingbird`` with ``tree``'s code. Run
    from an empty folder: ``python -m`` puts the working folder first on the path."""
    store = folder / "store.zarr"
    args = [sys.executable, "-m", "probe_toolkit", "hummingbird", str(store), "--train", "voc-train", "--val", "voc-val", "--memory", str(MEMORY)]
    args += ["--augmentation-epochs", "1", "-q", "--cache", str(folder / "cache"), "--workers", str(workers)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    before = set((store / "results" / "hummingbird").glob("*")) if (store / "results" / "hummingbird").exists() else set()
    c, t = _children_cpu(), time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    if done.returncode:
        raise SystemExit(f"probe hummingbird ({tree.name}) failed: {done.stderr[-800:]}")
    (record,) = set((store / "results" / "hummingbird").glob("*")) - before
    return wall, cpu, record


def same_numbers(a: Path, b: Path) -> bool:
    """Every array of two hummingbird records equal (confusion counts, mIoUs, shown predictions)."""
    import warnings

    import numpy as np
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a record is not consolidated, and holds record.json beside its arrays
        x, y = xr.open_zarr(a, consolidated=False), xr.open_zarr(b, consolidated=False)
    return set(x.data_vars) == set(y.data_vars) and all(np.array_equal(x[v].values, y[v].values) for v in x.data_vars)


def main() -> None:
    args = options(
        __doc__,
        {
            "folder": "one size of benchmarks/scale.py (store.zarr, cache)",
            "compare": "another checkout of the toolkit",
            "rounds": "interleaved rounds",
            "workers": "--workers",
        },
        RECORDS,
        folder="/tmp/hbird-scale/n1000",
        compare="",
        rounds=1,
        workers=1,
        note="",
    )
    folder = Path(args.folder)
    if not args.compare:
        raise SystemExit("--compare: another checkout of the toolkit (e.g. main before the change)")
    val = len((folder / "VOC2012" / "ImageSets" / "Segmentation" / "val.txt").read_text().split())
    train = len((folder / "VOC2012" / "ImageSets" / "Segmentation" / "train.txt").read_text().split())
    trees = {"this": Path(__file__).resolve().parents[1], "other": Path(args.compare).resolve()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    records: dict[str, Path] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            wall, cpu, records[name] = run(tree, folder, args.workers)
            times[name].append((wall, cpu))
            print(f"  {name:5s}: {wall:7.1f} s wall, {cpu:7.1f} s CPU ({1e3 * cpu / val:6.1f} ms per val image)", flush=True)
    same = same_numbers(records["this"], records["other"])
    cpu = {name: statistics.median(c for _, c in t) for name, t in times.items()}
    wall = {name: statistics.median(w for w, _ in t) for name, t in times.items()}
    ratio = cpu["other"] / cpu["this"]
    print(
        f"probe hummingbird, {train:,} train / {val:,} val images, memory {MEMORY}: {1e3 * cpu['this'] / val:.1f} ms CPU per val image against "
        f"{1e3 * cpu['other'] / val:.1f} (the other checkout): {ratio:.2f}x; the same numbers: {same} ({cpu_model()}, load {os.getloadavg()[0]:.1f})"
    )
    emit(
        {
            **header("hummingbird-cpu"),
            "images": train + val,
            "train": train,
            "val": val,
            "memory": MEMORY,
            "workers": args.workers,
            "rounds": args.rounds,
            "network": "tiny DINO (width 32, depth 1, patch 32), random weights (benchmarks/scale.py)",
            "cpu_s": {name: round(c, 2) for name, c in cpu.items()},
            "wall_s": {name: round(w, 2) for name, w in wall.items()},
            "cpu_ms_per_val_image": {name: round(1e3 * c / val, 1) for name, c in cpu.items()},
            "ratio": round(ratio, 3),
            "same_numbers": same,
            **({"note": args.note} if args.note else {}),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
