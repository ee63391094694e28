"""Throughput of probe's blocked k-NN against a plain matmul of the same shapes, in one run.

The matmul (normalised test features × normalised train features, all at once, in float32) is
the physical bound of any exact k-NN: probe's ``analyses.knn.classify`` does the same products in
blocks, by numpy's BLAS (``analyses.search``: a float32 screen, the candidates near each row's
running 200th settled in float64 at the end), keeps a running top-k (k = 200) and votes for k = 10,
20, 100 and 200.
The baseline is numpy's own matmul (the same BLAS at the same threads); torch's, the library the
k-NN ran on before, is timed beside it. Features are synthetic clustered float32 vectors at
ViT-S/16 width (384). Rounds are interleaved and medians compared; the ratio is matmul seconds /
k-NN seconds (target ≥ 0.8). Prints a table and a JSON line.

    python benchmarks/knn.py [--train 20000] [--test 2000] [--rounds 3] [--full] [--sorted]

``--full`` uses 100,000 train and 10,000 test images (the plain matmul then holds 4 GB).
``--sorted`` orders the train set by class (a query's own class then fills whole blocks).
``--parts`` also times one block's pieces (1,024 test × 4,096 train, medians of 5): its products,
each row's 200th largest value (``np.partition``: how the first block finds its 200 best), the
values above a running 200th gathered as keys (what a later block adds: ``search.block_candidates``),
and the merge of 200 running keys with 200 new ones (a value partition: keys carry their index); beside them ``np.argpartition``'s top-200 and
torch's products and ``topk`` (each library at its default threads), the pieces the selection
does not use.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from probe_toolkit.analyses import knn, search
from probe_toolkit.protocols.knn import NB_KNN, KnnSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, options  # noqa: E402  (the processor's name and the command line, as every benchmark has them)


def main() -> None:
    args = options(
        __doc__,
        {"sorted": "train set sorted by class", "parts": "also time one block's products and selection pieces"},
        train=20000,
        test=2000,
        dim=384,
        classes=100,
        rounds=3,
        full=False,
        sorted=False,
        parts=False,
    )
    if args.full:
        args.train, args.test = 100_000, 10_000
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(args.classes, args.dim)).astype(np.float32)
    train_labels = rng.integers(0, args.classes, args.train)
    test_labels = rng.integers(0, args.classes, args.test)
    train = centres[train_labels] + 2.0 * rng.normal(size=(args.train, args.dim)).astype(np.float32)
    test = centres[test_labels] + 2.0 * rng.normal(size=(args.test, args.dim)).astype(np.float32)
    if args.sorted:
        order = np.argsort(train_labels, kind="stable")
        train, train_labels = train[order], train_labels[order]

    def plain() -> float:
        start = time.perf_counter()
        a, b = knn.normalise(test), knn.normalise(train)
        sims = a @ b.T
        elapsed = time.perf_counter() - start
        del sims
        return elapsed

    def plain_torch() -> float:
        start = time.perf_counter()
        a, b = F.normalize(torch.from_numpy(test), dim=1), F.normalize(torch.from_numpy(train), dim=1)
        sims = a @ b.T
        elapsed = time.perf_counter() - start
        del sims
        return elapsed

    def toolkit() -> tuple[float, knn.KnnResult]:
        start = time.perf_counter()
        result = knn.classify(
            lambda i, j: train[i:j],
            args.train,
            train_labels,
            lambda i, j: test[i:j],
            args.test,
            test_labels,
            args.classes,
            ks=NB_KNN,
            temperature=KnnSettings().temperature,
        )
        return time.perf_counter() - start, result

    times = {"plain": [], "torch": [], "knn": []}
    result = None
    for r in range(args.rounds + 1):  # round 0 warms up
        t_plain, t_torch = plain(), plain_torch()
        t_knn, result = toolkit()
        if r:
            times["plain"].append(t_plain)
            times["torch"].append(t_torch)
            times["knn"].append(t_knn)
    plain_s, torch_s, knn_s = (statistics.median(times[k]) for k in ("plain", "torch", "knn"))
    pairs = args.train * args.test
    print(
        f"{args.test:,} test × {args.train:,} train × {args.dim} channels, {args.classes} classes{', train sorted by class' if args.sorted else ''}; "
        f"BLAS {blas_threads()} threads, torch {torch.get_num_threads()}"
    )
    print(f"  plain numpy matmul (all similarities) {plain_s:7.3f} s   {pairs / plain_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['plain']]}")
    print(f"  plain torch matmul (the same)         {torch_s:7.3f} s   {pairs / torch_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['torch']]}")
    print(f"  probe k-NN (blocks, top-200, 4 k)     {knn_s:7.3f} s   {pairs / knn_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['knn']]}")
    print(f"  ratio {plain_s / knn_s:.2f} against numpy's matmul (target ≥ 0.8), {torch_s / knn_s:.2f} against torch's; top-1 at k = 20: {100 * result.top1[1]:.2f} %")
    parts = block_parts(train, test) if args.parts else {}
    for name, seconds in parts.items():
        print(f"  one block ({knn.TEST_BLOCK:,} × {knn.TRAIN_BLOCK:,}): {name.replace('_', ' '):<24} {1e3 * seconds:7.1f} ms")
    print(
        json.dumps(
            {
                "benchmark": "knn",
                **{f"block_{k}_ms": round(1e3 * v, 2) for k, v in parts.items()},
                "machine": cpu_model(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "train": args.train,
                "test": args.test,
                "dim": args.dim,
                "rounds": args.rounds,
                "sorted": args.sorted,
                "plain_s": round(plain_s, 4),
                "torch_s": round(torch_s, 4),
                "knn_s": round(knn_s, 4),
                "ratio": round(plain_s / knn_s, 3),
                "ratio_torch": round(torch_s / knn_s, 3),
                "top1_k20": round(float(result.top1[1]), 5),
            }
        )
    )


def blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return max((int(pool.get("num_threads", 1)) for pool in threadpool_info() if pool.get("user_api") == "blas"), default=1)


def block_parts(train: np.ndarray, test: np.ndarray, rounds: int = 5) -> dict[str, float]:
    """Median seconds of one block's pieces: the selection's (products, 200th largest values, the
    values above a running 200th gathered as keys, a merge of 200 + 200 keys) and, beside them,
    ``np.argpartition``'s top-200 and torch's products and top-200, which it does not use."""
    a, b = knn.normalise(test[: knn.TEST_BLOCK]), knn.normalise(train[: knn.TRAIN_BLOCK])
    sim = a @ b.T
    floor = search._kth_largest(sim, 200)
    margin = search.screen_slack(a)
    later = knn.normalise(train[knn.TRAIN_BLOCK : 2 * knn.TRAIN_BLOCK])
    late_sim = a @ later.T if len(later) else sim
    running = search.block_candidates(sim, 0, 200, None, margin)[:, :200]
    fresh = np.sort(search.block_candidates(late_sim, knn.TRAIN_BLOCK, 200, None, margin)[:, :200], axis=1)
    merged = np.concatenate([running, fresh], axis=1)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    tsim = ta @ tb.T
    width = sim.shape[1]
    pieces = {
        "products": lambda: a @ b.T,
        "200th largest": lambda: search._kth_largest(sim, 200),
        "above floor as keys": lambda: search.block_candidates(late_sim, knn.TRAIN_BLOCK, 200, floor, margin),
        "merge 200 + 200": lambda: np.partition(merged, 199, axis=1),
        "argpartition 200": lambda: np.argpartition(sim, width - 200, axis=1)[:, -200:],
        "torch products": lambda: ta @ tb.T,
        "torch top-200": lambda: tsim.topk(200, dim=1, sorted=False),
    }
    out = {}
    for name, fn in pieces.items():
        fn()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name.replace(" ", "_").replace("+", "plus")] = statistics.median(times)
    return out


if __name__ == "__main__":
    main()
