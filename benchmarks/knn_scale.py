"""ImageNet-shaped k-NN: probe knn's exact search over 1.28 M synthetic train features in bounded memory, against the bare products.

The bank has ImageNet-1k's 1,281,167 train rows × 384 channels (ViT-S; ``--dim 1024`` for ViT-L).

The train bank is written block by block to one file, as ``probe knn`` writes it
(``infra.shared.shared_blocks``), and never held whole: test rows are searched in blocks by the
command's own per-block function (``analyses.knn.nearest_block``) on ``--workers`` local processes
of the runner, each reading the bank 4,096 rows at a time; then DINO's vote for k = 10, 20, 100
and 200. The baseline runs on the same runner and reads the bank the same way, but only takes the
float32 products of each test block with each bank block (no selection, nothing kept): the
physical bound of any exact search of those shapes on this hardware. The ratio is baseline
seconds / probe seconds.

Peak memory is the largest resident set (``ru_maxrss``) of this process and of any worker,
printed beside the bank's size: bounded memory means it does not follow the bank. ``--check``
rows are compared with a plain full-matrix search written here (every cosine of those rows as
the float32 rounding of a float64 product, one stable sort).

On a 2-core machine the 50,000 ImageNet val images take hours (50,000 × 1.28 M × 384 × 2 =
4.9·10¹³ products), so ``--test`` scales the query count down (default 2,048: one test block of
1,024 per worker on 2 cores); seconds per test image and the extrapolation to 50,000 are printed. ``--backend torch
--device cuda`` searches on the GPU (``analyses.search_torch``: the bank moved there once, float64
products; one process), checked against the numpy search on the ``--check`` rows.

    python benchmarks/knn_scale.py [--train 1281167] [--dim 384] [--test 1024] [--workers 2] [--record]
    python benchmarks/knn_scale.py --backend torch --device cuda --test 50000 [--dim 1024] [--record]
"""

from __future__ import annotations

import functools
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit, header, options  # noqa: E402  (the processor's name, the command line and the record, as every benchmark has them)

from probe_toolkit.analyses import knn, search  # noqa: E402
from probe_toolkit.infra.runner import local_cores, map_blocks  # noqa: E402
from probe_toolkit.infra.shared import shared_blocks  # noqa: E402
from probe_toolkit.protocols.knn import NB_KNN, KnnSettings  # noqa: E402

TEMPERATURE = KnnSettings().temperature  # DINO's eval_knn.py

RECORDS = Path(__file__).resolve().parent / "records" / "knn-scale.jsonl"
IMAGENET_TRAIN, IMAGENET_VAL, CLASSES, K = 1_281_167, 50_000, 1000, 200
WRITE_BLOCK = 65536


def features(n: int, dim: int, centres: np.ndarray, seed: int, spread: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """(rows float32, classes): ``n`` clustered synthetic features of one generator seed."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(centres), n)
    rows = centres[labels] + np.float32(spread) * rng.standard_normal((n, dim), dtype=np.float32)
    return rows, labels


def bank_blocks(n: int, dim: int, centres: np.ndarray, labels: list[np.ndarray]):
    """The normalised train bank, block by block (each block its own seed: reproducible)."""
    for a in range(0, n, WRITE_BLOCK):
        rows, classes = features(min(WRITE_BLOCK, n - a), dim, centres, seed=1 + a // WRITE_BLOCK)
        labels.append(classes)
        yield search.normalise(rows)


def bare_products(values: np.ndarray, *, bank, train_block: int) -> dict[str, np.ndarray]:
    """The baseline's task: the float32 products of the block with every bank block, read as the
    search reads them; nothing kept."""
    q = search.normalise(values)
    for _, block in search.bank_blocks(bank, train_block):
        q @ block.T
    return {"rows": np.zeros(len(values), np.int8)}


def bare_device_products(test: np.ndarray, on, test_block: int, train_block: int) -> float:
    """Seconds of the baseline on a GPU: the float32 products of every test block with every bank
    block of the bank already on the device (no selection, nothing kept)."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        for a in range(0, len(test), test_block):
            q = torch.as_tensor(search.normalise(test[a : a + test_block])).to(on.device)
            for b in range(0, on.shape[0], train_block):
                q @ on[b : b + train_block].T
    torch.cuda.synchronize()
    return time.perf_counter() - start


def reference(queries: np.ndarray, bank, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cosine of a few rows (float64 products rounded to float32), one stable sort by (-cosine, row)."""
    q = search.normalise(queries).astype(np.float64)
    cos = np.concatenate([(q @ block.astype(np.float64).T).astype(np.float32) for _, block in search.bank_blocks(bank, 65536)], axis=1)
    order = np.lexsort((np.broadcast_to(np.arange(cos.shape[1]), cos.shape), -cos.astype(np.float64)), axis=1)[:, :k]
    return np.take_along_axis(cos, order, 1), order


def peak_mib() -> dict[str, float]:
    """Largest resident sets so far (MiB): this process, and its largest finished child (a worker)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"self": round(own, 1), "workers": round(child, 1)}


def main() -> None:
    args = options(
        __doc__,
        {
            "train": "train features (ImageNet-1k: 1,281,167)",
            "test": "test rows searched (ImageNet val: 50,000)",
            "workers": "local processes (0: every core; 1 on a GPU)",
            "check": "test rows checked against a full-matrix search",
            "folder": "where the bank's file goes (default: a temporary folder)",
        },
        RECORDS,
        train=IMAGENET_TRAIN,
        test=2048,
        dim=384,
        workers=0,
        backend="scipy",
        device="cpu",
        check=32,
        folder="",
        note="",
    )
    device = args.device if args.backend == "torch" else None
    on_gpu = device not in (None, "cpu")
    workers = 1 if on_gpu else (args.workers or local_cores())
    test_block = knn.DEVICE_TEST_BLOCK if on_gpu else knn.TEST_BLOCK
    train_block = knn.DEVICE_TRAIN_BLOCK if on_gpu else knn.TRAIN_BLOCK
    centres = np.random.default_rng(0).standard_normal((CLASSES, args.dim), dtype=np.float32)
    test, test_labels = features(args.test, args.dim, centres, seed=10**6)
    train_labels: list[np.ndarray] = []
    gpu = None
    if on_gpu:
        import torch

        gpu = torch.cuda.get_device_name(device)
    with tempfile.TemporaryDirectory(dir=args.folder or None) as folder:
        start = time.perf_counter()
        with shared_blocks(bank_blocks(args.train, args.dim, centres, train_labels), (args.train, args.dim), np.float32, folder, "bank") as bank:
            write_s = time.perf_counter() - start
            before = peak_mib()
            ranges = [(a, min(a + test_block, args.test)) for a in range(0, args.test, test_block)]
            read = lambda a, b: {"values": test[a:b]}  # noqa: E731
            move_s = None
            if on_gpu:
                from probe_toolkit.analyses import search_torch

                start = time.perf_counter()
                on = search_torch.on_device(bank, device, bank.sha256)  # as the command's first block moves it, kept for the others
                move_s = time.perf_counter() - start
                bare_s = bare_device_products(test, on, test_block, train_block)
            else:
                start = time.perf_counter()
                map_blocks(functools.partial(bare_products, bank=bank, train_block=train_block), read, ranges, workers=workers, torch_free=True)
                bare_s = time.perf_counter() - start
            start = time.perf_counter()
            near = map_blocks(
                functools.partial(knn.nearest_block, bank=bank, feature="cls", norm=None, k=K, train_block=train_block, device=device),
                read,
                ranges,
                workers=workers,
                torch_free=device is None,
            )
            ranked = knn.ranked_votes(near["similarity"], near["neighbour"], np.concatenate(train_labels), CLASSES, NB_KNN, TEMPERATURE, knn.vote_width(CLASSES))
            result = knn.scored(NB_KNN, ranked, test_labels, CLASSES, near["neighbour"], near["similarity"])
            probe_s = time.perf_counter() - start
            peak = peak_mib()
            rows = min(args.check, args.test)
            want = reference(test[:rows], bank, K)
            exact = bool(np.array_equal(near["neighbour"][:rows], want[1]) and np.array_equal(near["similarity"][:rows], want[0]))
            same_as_numpy = None
            if device is not None:
                got = search.nearest(test[:rows], bank, K, knn.TRAIN_BLOCK)
                same_as_numpy = bool(np.array_equal(got[1], near["neighbour"][:rows]) and np.array_equal(got[0], near["similarity"][:rows]))
    bank_mib = args.train * args.dim * 4 / 2**20
    per_image = probe_s / args.test
    where = f"torch on {device}{f' ({gpu})' if gpu else ''}" if device else f"numpy, {workers} worker processes"
    print(
        f"{args.test:,} test × {args.train:,} train × {args.dim} channels, k {K}, {CLASSES} classes; {where}; {os.cpu_count()} cores, {cpu_model()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"  bank written block by block: {bank_mib:,.0f} MiB in {write_s:.1f} s")
    print(f"  bare float32 products (the bound)   {bare_s:8.2f} s" + (f"   (the bank moved to the GPU in {move_s:.1f} s, once)" if move_s is not None else ""))
    print(
        f"  probe k-NN (search + DINO's vote)   {probe_s:8.2f} s   {1e3 * per_image:.2f} ms a test image; "
        f"{IMAGENET_VAL:,} val images: {per_image * IMAGENET_VAL / 60:.1f} min at this pace"
    )
    print(
        f"  ratio {bare_s / probe_s:.2f}; peak resident set: this process {peak['self']:,.0f} MiB (before the search {before['self']:,.0f}), "
        f"largest worker {peak['workers']:,.0f} MiB, against a bank of {bank_mib:,.0f} MiB"
    )
    print(
        f"  first {rows} rows: the same neighbours and cosines as a full-matrix search: {exact}"
        + ("" if same_as_numpy is None else f"; as the numpy search: {same_as_numpy}")
        + f"; top-1 at k = 20: {100 * result.top1[1]:.2f} %"
    )
    import torch

    emit(
        {
            **header("knn-scale"),
            "torch": torch.__version__,
            "train": args.train,
            "test": args.test,
            "dim": args.dim,
            "k": K,
            "classes": CLASSES,
            "search": "numpy" if device is None else f"torch {device}",
            "gpu": gpu,
            "workers": workers,
            "test_block": test_block,
            "train_block": train_block,
            "bank_mib": round(bank_mib, 1),
            "write_s": round(write_s, 2),
            "move_s": None if move_s is None else round(move_s, 2),
            "bare_s": round(bare_s, 3),
            "probe_s": round(probe_s, 3),
            "ratio": round(bare_s / probe_s, 3),
            "ms_per_test_image": round(1e3 * per_image, 3),
            "imagenet_val_min": round(per_image * IMAGENET_VAL / 60, 2),
            "peak_self_mib": peak["self"],
            "peak_self_before_search_mib": before["self"],
            "peak_worker_mib": peak["workers"],
            "exact_rows": rows,
            "exact": exact,
            "same_as_numpy": same_as_numpy,
            "top1_k20": round(float(result.top1[1]), 5),
            **({"note": args.note} if args.note else {}),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
