"""Keypoints per second of ``probe correspond``'s matching against a plain per-keypoint loop, in one run.

Baseline: probe3d's procedure written keypoint by keypoint in numpy (``tests/test_correspond.py``'s
``plain_errors``, which the tests hold the toolkit against) — for every pair, both images'
tokens L2-normalised, then for every keypoint annotated in both images its feature sampled
bilinearly at ``x / 800`` of the grid (align_corners), its dot product with every target patch, the
argmax, the error. Toolkit: ``commands.correspond.pair_block`` (torch: each image normalised once
for all its pairs, all of a pair's keypoints sampled by one ``grid_sample`` and matched by one
product), in this process. Both read the same
tokens (a float32 square800 store of a synthetic SPair folder, ``probe_toolkit/demo/spair.py``, extracted
once, not timed) and must give the same matches. Rounds interleaved, medians compared. Prints a
table and a JSON line (append it to ``benchmarks/records/correspond.jsonl``).

    python benchmarks/correspond.py [--images 4] [--rounds 2] [--arch tiny|vit-s16]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model  # noqa: E402  (the processor's name, as the startup benchmark records it)
from test_correspond import plain_errors as plain  # noqa: E402  (the tests' per-keypoint loop is the baseline)

from probe_toolkit.analyses import correspond  # noqa: E402
from probe_toolkit.commands.correspond import pair_block  # noqa: E402
from probe_toolkit.demo.samples import ARCHS, write_checkpoint  # noqa: E402
from probe_toolkit.demo.spair import write_spair  # noqa: E402
from probe_toolkit.labels.spair import parse  # noqa: E402
from probe_toolkit.store.extract import Settings, extract  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4, help="images per category (two categories; every ordered pair is a pair)")
    parser.add_argument("--keypoints", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_spair(Path(tmp) / "SPair-71k", {"cat": args.images, "dog": args.images}, keypoints=args.keypoints)
        checkpoint = write_checkpoint(Path(tmp) / "net.pth", "dino-full", ARCHS[args.arch], seed=0)
        store = extract(checkpoint, folder / "JPEGImages", settings=Settings(views=("square800",), dtype="float32"), cache_dir=Path(tmp) / "c", quiet=True).store
        pairs, problems, _ = parse(folder, "test", lambda p: Path(p).read_bytes())
        assert not problems, problems
        ds = xr.open_zarr(store)
        rows = cols = int(round(math.sqrt(ds.sizes["patch_square800"])))
        tokens = {str(i): v for i, v in zip(ds.image.values, ds["tokens_square800"].values.astype(np.float32))}
        grids = {k: v.reshape(rows, cols, -1).astype(np.float64) for k, v in tokens.items()}
        k = max(len(p.source_kps) for p in pairs)

        def kps(points, size):
            out = np.zeros((k, 3), np.int32)
            out[: len(points)] = correspond.view_keypoints(points, size)
            return out

        names = sorted(tokens)
        block = {
            "images": np.stack([tokens[i] for i in names]),
            "source": np.array([names.index(p.source) for p in pairs]),
            "target": np.array([names.index(p.target) for p in pairs]),
            "source_kps": np.stack([kps(p.source_kps, p.source_size) for p in pairs]),
            "target_kps": np.stack([kps(p.target_kps, p.target_size) for p in pairs]),
            "scale": np.array([correspond.threshold_scale(p.target_box, p.target_size) for p in pairs]),
        }
        times = {"plain": [], "toolkit": []}
        same = True
        for r in range(args.rounds + 1):  # round 0 warms up
            start = time.perf_counter()
            expected = plain(grids, pairs, rows, cols)
            t_plain = time.perf_counter() - start
            start = time.perf_counter()
            got = pair_block(**block, rows=rows, cols=cols, side=correspond.SIDE)["error"]
            t_toolkit = time.perf_counter() - start
            for g, e in zip(got, expected):
                same &= bool(np.array_equal(np.isfinite(g[: len(e)]), np.isfinite(e)) and np.allclose(g[: len(e)][np.isfinite(e)], e[np.isfinite(e)], atol=1e-5))
            if r:
                times["plain"].append(t_plain)
                times["toolkit"].append(t_toolkit)
    n = int(sum(np.isfinite(e).sum() for e in expected))
    plain_s, toolkit_s = statistics.median(times["plain"]), statistics.median(times["toolkit"])
    print(f"{args.arch}, {len(pairs)} pairs, {n} keypoints matched on a {rows}×{cols} grid, one torch thread")
    print(f"  plain per-keypoint loop   {n / plain_s:9.1f} keypoints/s   rounds {[round(t, 3) for t in times['plain']]} s")
    print(f"  probe correspond          {n / toolkit_s:9.1f} keypoints/s   rounds {[round(t, 3) for t in times['toolkit']]} s")
    print(f"  ratio {plain_s / toolkit_s:.2f}; matches identical: {same}")
    print(
        json.dumps(
            {
                "benchmark": "correspond",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": cpu_model(),
                "cpu": platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "numpy": np.__version__,
                "arch": args.arch,
                "pairs": len(pairs),
                "keypoints": n,
                "grid": [rows, cols],
                "rounds": args.rounds,
                "plain_kps_per_s": round(n / plain_s, 1),
                "toolkit_kps_per_s": round(n / toolkit_s, 1),
                "ratio": round(plain_s / toolkit_s, 2),
                "identical": bool(same),
            }
        )
    )
    if not same:
        raise SystemExit("matches differ from the plain loop")


if __name__ == "__main__":
    main()
