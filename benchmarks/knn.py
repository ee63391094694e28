"""Throughput of probe's blocked k-NN against a plain torch matmul of the same shapes, in one run.

The matmul (normalised test features × normalised train features, all at once, in float32) is
the physical bound of any exact k-NN: probe's ``analyses.knn.classify`` does the same products in
blocks, keeps a running top-k (k = 200) and votes for k = 10, 20, 100 and 200. Features are
synthetic clustered float32 vectors at ViT-S/16 width (384). Rounds are interleaved and medians
compared; the ratio is matmul seconds / k-NN seconds (target ≥ 0.8). Prints a table and a JSON line.

    python benchmarks/knn.py [--train 20000] [--test 2000] [--rounds 3] [--full]

``--full`` uses 100,000 train and 10,000 test images (the plain matmul then holds 4 GB).
``--parts`` also times one block's pieces (1,024 test × 4,096 train, medians of 5): its products,
the top-200 of its rows (what an early block adds to the running selection), the top-16 (the
least a late block of a large train set takes: ``knn._candidates``), and counting the values
above a running 200th value (a bool reduction, which is why the selection does not count); and
beside them numpy's own: the products by numpy's BLAS and the top-200 by ``np.argpartition``
(each library at its default threads): what a k-NN in numpy, without torch, would cost.
``--train 100000`` or ``300000`` shows the late blocks' saving (a 20,000-image train set has no
late block: five blocks, each still expected to hold many of the 200 best).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from probe_toolkit.analyses import knn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--parts", action="store_true", help="also time one block's products, top-k and pruning comparison")
    args = parser.parse_args()
    if args.full:
        args.train, args.test = 100_000, 10_000
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(args.classes, args.dim)).astype(np.float32)
    train_labels = rng.integers(0, args.classes, args.train)
    test_labels = rng.integers(0, args.classes, args.test)
    train = centres[train_labels] + 2.0 * rng.normal(size=(args.train, args.dim)).astype(np.float32)
    test = centres[test_labels] + 2.0 * rng.normal(size=(args.test, args.dim)).astype(np.float32)

    def plain() -> float:
        start = time.perf_counter()
        a, b = F.normalize(torch.from_numpy(test), dim=1), F.normalize(torch.from_numpy(train), dim=1)
        sims = a @ b.T
        elapsed = time.perf_counter() - start
        del sims
        return elapsed

    def toolkit() -> tuple[float, knn.KnnResult]:
        start = time.perf_counter()
        result = knn.classify(lambda i, j: train[i:j], args.train, train_labels, lambda i, j: test[i:j], args.test, test_labels, args.classes)
        return time.perf_counter() - start, result

    times = {"plain": [], "knn": []}
    result = None
    for r in range(args.rounds + 1):  # round 0 warms up
        t_plain = plain()
        t_knn, result = toolkit()
        if r:
            times["plain"].append(t_plain)
            times["knn"].append(t_knn)
    plain_s, knn_s = statistics.median(times["plain"]), statistics.median(times["knn"])
    pairs = args.train * args.test
    print(f"{args.test:,} test × {args.train:,} train × {args.dim} channels, {args.classes} classes, torch {torch.get_num_threads()} threads")
    print(f"  plain matmul (all similarities)   {plain_s:7.3f} s   {pairs / plain_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['plain']]}")
    print(f"  probe k-NN (blocks, top-200, 4 k) {knn_s:7.3f} s   {pairs / knn_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['knn']]}")
    print(f"  ratio {plain_s / knn_s:.2f} (target ≥ 0.8); top-1 at k = 20: {100 * result.top1[1]:.2f} %")
    parts = block_parts(train, test) if args.parts else {}
    for name, seconds in parts.items():
        print(f"  one block ({knn.TEST_BLOCK:,} × {knn.TRAIN_BLOCK:,}): {name.replace('_', ' '):<24} {1e3 * seconds:7.1f} ms")
    print(json.dumps({
        "benchmark": "knn", **{f"block_{k}_ms": round(1e3 * v, 2) for k, v in parts.items()}, "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "train": args.train, "test": args.test, "dim": args.dim, "rounds": args.rounds,
        "plain_s": round(plain_s, 4), "knn_s": round(knn_s, 4), "ratio": round(plain_s / knn_s, 3), "top1_k20": round(float(result.top1[1]), 5),
    }))


def block_parts(train: np.ndarray, test: np.ndarray, rounds: int = 5) -> dict[str, float]:
    """Median seconds of one block's pieces: products, top-k (k = 200, unsorted as ``running_topk``
    takes it; 16, the least a late block of a large train set takes, ``knn._candidates``), and
    counting each row's values above its running 200th (a bool reduction: what selecting by
    count would cost)."""
    a = F.normalize(torch.from_numpy(test[: knn.TEST_BLOCK]), dim=1)
    b = F.normalize(torch.from_numpy(train[: knn.TRAIN_BLOCK]), dim=1)
    sim = a @ b.T
    floor = sim.topk(200, dim=1).values[:, -1:]
    a_np, b_np, sim_np = a.numpy(), b.numpy(), sim.numpy()
    width = sim_np.shape[1]
    pieces = {"products": lambda: a @ b.T, "top-200": lambda: sim.topk(200, dim=1, sorted=False),
              "top-16": lambda: sim.topk(16, dim=1, sorted=False), "count above 200th": lambda: (sim >= floor).sum(1),
              "numpy products": lambda: a_np @ b_np.T, "numpy argpartition 200": lambda: np.argpartition(sim_np, width - 200, axis=1)[:, -200:]}
    out = {}
    for name, fn in pieces.items():
        fn()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name.replace(" ", "_")] = statistics.median(times)
    return out


if __name__ == "__main__":
    main()
