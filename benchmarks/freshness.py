"""Freshness: what checking that a store's photographs are still the files it was extracted from costs.

Every read path that pairs stored features with files read now checks the files
(``store.sources.changed``): each file's size and mtime against those recorded at extraction,
and its sha256 only where they moved. This benchmark times that check over ``--images`` files of
``--kilobytes`` each, recorded as ``probe extract`` records them (``sources.record_digests``):
unchanged (size and mtime only), and every file touched (mtime moved, bytes the same: every file
hashed, as a store recorded before stats were, or a folder copied without its times, costs). The
baseline is hashing every file with no stat recorded; the ratio is the stat check's seconds over
the baseline's.

    python benchmarks/freshness.py [--images 1000] [--kilobytes 64] [--rounds 3] [--record]

``--record`` appends the JSON line to ``benchmarks/records/freshness.jsonl``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from probe_toolkit.store import sources

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit, header, options  # noqa: E402  (the processor's name and the record, as every benchmark writes them)

RECORDS = Path(__file__).resolve().parent / "records" / "freshness.jsonl"


def store_of(folder: Path, store: Path, n: int, chunk: int = 64) -> list[tuple[str, Path]]:
    """A store's image list and flags (every image finished) over ``folder``'s files, digests recorded."""
    group = zarr.open_group(str(store), mode="w")
    ids = [f"{i:06d}.jpg" for i in range(n)]
    group.create_array("image", shape=(n,), dtype=str, chunks=(chunk,))[:] = np.asarray(ids)
    for name, value in (("done", True), ("failed", False)):
        group.create_array(name, shape=(n,), dtype=bool, chunks=(chunk,), fill_value=False)[:] = np.full(n, value)
    sources.record_digests(store, folder)
    return [(i, folder / i) for i in ids]


def timed(run) -> float:
    start = time.perf_counter()
    found = run()
    assert not found, found[:1]
    return time.perf_counter() - start


def main() -> None:
    args = options(__doc__, record=RECORDS, images=1000, kilobytes=64, rounds=3)
    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="probe-freshness-"))
    try:
        folder = root / "images"
        folder.mkdir()
        for i in range(args.images):
            (folder / f"{i:06d}.jpg").write_bytes(rng.integers(0, 256, args.kilobytes * 1024, dtype=np.uint8).tobytes())
        files = store_of(folder, root / "s.zarr", args.images)
        times: dict[str, list[float]] = {"stat": [], "hashed": [], "baseline": []}
        for r in range(args.rounds + 1):  # round 0 warms the page cache up
            unchanged = timed(lambda: sources.changed(root / "s.zarr", files))
            for _, path in files:  # mtime moved, bytes the same: every file is hashed
                os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
            hashed = timed(lambda: sources.changed(root / "s.zarr", files))
            sources.record_digests(root / "s.zarr", folder)  # (no new stat: recorded rows are kept)
            baseline = timed(lambda: [p for _, p in files if sources.file_digest(p) == ""])
            for _, path in files:
                os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns - 1_000_000_000))
            if r:
                times["stat"].append(unchanged)
                times["hashed"].append(hashed)
                times["baseline"].append(baseline)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    stat_s, hashed_s, base_s = (statistics.median(times[k]) for k in ("stat", "hashed", "baseline"))
    print(f"{args.images} files of {args.kilobytes} KB; {os.cpu_count()} cores, {cpu_model()}, load {os.getloadavg()[0]:.2f}")
    print(f"  unchanged (size and mtime)   {stat_s:7.3f} s   {1e6 * stat_s / args.images:8.1f} µs a file")
    print(f"  touched (every file hashed)  {hashed_s:7.3f} s   {1e6 * hashed_s / args.images:8.1f} µs a file")
    print(f"  baseline (hash every file)   {base_s:7.3f} s   {1e6 * base_s / args.images:8.1f} µs a file")
    print(f"  ratio {stat_s / base_s:.3f} (unchanged / baseline); touched / baseline {hashed_s / base_s:.3f}")
    emit(
        {
            **header("freshness"),
            "images": args.images,
            "kilobytes": args.kilobytes,
            "rounds": args.rounds,
            "stat_s": round(stat_s, 4),
            "hashed_s": round(hashed_s, 4),
            "baseline_s": round(base_s, 4),
            "stat_us_per_image": round(1e6 * stat_s / args.images, 1),
            "ratio": round(stat_s / base_s, 3),
            "touched_ratio": round(hashed_s / base_s, 3),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
