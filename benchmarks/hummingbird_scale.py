"""Hummingbird at the published memories: the exact search of every VOC val patch against 1024·10² (CPU) or 1024·10⁴ (GPU) memory patches.

Open-hummingbird-eval's VOC table uses memories of 1024·10², 10³ and 10⁴ patches; VOC 2012 val has
1,449 images, 1,024 query patches each at 512 px and /16 (1,483,776 queries). The search is
queries × memory × D multiply-adds: at 1024·10⁴ and D = 384, 2 × 1,483,776 × 10,240,000 × 384 =
1.17·10¹⁶ floating-point operations (11.7 PFLOP), at 1024·10² a hundredth (117 TFLOP).

``--device cpu`` (the numpy search on ``--workers`` processes, as ``probe hummingbird`` runs it):
the memory is written block by block to one file (``infra.shared.spooled``, as the command spools
it) and each worker reads it block by block (``analyses.hummingbird.soft_labels_block``, the
command's own task, with its label transfer); ``--views`` query views of 1,024 patches are
searched and the time extrapolated to VOC val. Peak memory: the largest resident set of this
process and of any worker, beside the memory's size.

``--device cuda`` (``--backend torch``'s search, ``analyses.search_torch``): the memory is made on
the GPU (a file of 15.7 GB would take longer to write than to search), the search runs on
``--views`` query views, 16 at a time as the command sends them, and is extrapolated likewise;
the first 8 queries are checked against every cosine sorted on the GPU (float64 products rounded
to float32, one stable sort by (-cosine, row)).

    python benchmarks/hummingbird_scale.py --device cpu [--memory 102400] [--views 8] [--record]
    python benchmarks/hummingbird_scale.py --device cuda [--memory 10240000] [--views 64] [--record]
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
from startup import cpu_model, emit, header, options  # noqa: E402

from probe_toolkit.analyses import hummingbird as hb  # noqa: E402
from probe_toolkit.analyses import search  # noqa: E402
from probe_toolkit.infra.runner import local_cores, map_blocks  # noqa: E402
from probe_toolkit.infra.shared import shared_blocks  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "hummingbird-scale.jsonl"
VOC_VAL_IMAGES, PATCHES = 1449, 1024  # VOC 2012 val; 512 px at /16
VOC_VAL_QUERIES = VOC_VAL_IMAGES * PATCHES
CPU_QUERY_BLOCK, GPU_QUERY_BLOCK, BANK_BLOCK = 2, 16, 16384  # commands/hummingbird.py's
WRITE_BLOCK = 65536


def flops(queries: int, memory: int, dim: int) -> float:
    """Multiply-adds of an exhaustive search, counted as two operations each."""
    return 2.0 * queries * memory * dim


def memory_blocks(rows: int, dim: int, centres: np.ndarray):
    """The normalised synthetic memory, block by block (each block its own seed)."""
    for a in range(0, rows, WRITE_BLOCK):
        rng = np.random.default_rng(1 + a // WRITE_BLOCK)
        n = min(WRITE_BLOCK, rows - a)
        yield search.normalise(centres[rng.integers(0, len(centres), n)] + np.float32(2.0) * rng.standard_normal((n, dim), dtype=np.float32))


def cpu_run(args) -> dict:
    workers = args.workers or local_cores()
    centres = np.random.default_rng(0).standard_normal((hb.VOC_CLASSES, args.dim), dtype=np.float32)
    rng = np.random.default_rng(10**6)
    queries = (
        centres[rng.integers(0, hb.VOC_CLASSES, args.views * PATCHES)] + np.float32(2.0) * rng.standard_normal((args.views * PATCHES, args.dim), dtype=np.float32)
    ).reshape(args.views, PATCHES, args.dim)
    labels = np.eye(hb.VOC_CLASSES, dtype=np.float32)[np.random.default_rng(2).integers(0, hb.VOC_CLASSES, args.memory)]
    with tempfile.TemporaryDirectory(dir=args.folder or None) as folder:
        start = time.perf_counter()
        with (
            shared_blocks(memory_blocks(args.memory, args.dim, centres), (args.memory, args.dim), np.float32, folder, "bank") as bank,
            shared_blocks([labels], labels.shape, np.float32, folder, "labels") as label_file,
        ):
            write_s = time.perf_counter() - start
            del labels
            ranges = [(a, min(a + CPU_QUERY_BLOCK, args.views)) for a in range(0, args.views, CPU_QUERY_BLOCK)]
            fn = functools.partial(hb.soft_labels_block, bank=bank, labels=label_file, norm=None, k=hb.K, temperature=hb.TEMPERATURE, block=BANK_BLOCK)
            done = [0]

            def each(a, b, part):  # the command spools these; here only counted
                done[0] += b - a

            start = time.perf_counter()
            map_blocks(
                fn,
                lambda a, b: {"values": queries[a:b]},
                ranges,
                workers=workers,
                torch_free=True,
                each=each,
                keep=False,
                progress=lambda n: print(f"  {done[0]}/{args.views} query views", file=sys.stderr) if args.verbose else None,
            )
            search_s = time.perf_counter() - start
            want = reference(search.normalise(queries[0, :8]), np.concatenate([b for _, b in search.bank_blocks(bank, 65536)]), hb.K)
            got = hb.nearest(queries[0, :8], bank, hb.K, BANK_BLOCK)
            exact = bool(np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0]))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "search": f"numpy, {workers} worker processes",
        "workers": workers,
        "write_s": round(write_s, 2),
        "search_s": round(search_s, 3),
        "peak_self_mib": round(own, 1),
        "peak_worker_mib": round(child, 1),
        "exact": exact,
        "gpu": None,
    }


def reference(queries: np.ndarray, bank: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cosine (float64 products rounded to float32), one stable sort by (-cosine, row)."""
    cos = (queries.astype(np.float64) @ bank.astype(np.float64).T).astype(np.float32)
    order = np.lexsort((np.broadcast_to(np.arange(cos.shape[1]), cos.shape), -cos.astype(np.float64)), axis=1)[:, :k]
    return np.take_along_axis(cos, order, 1), order


def gpu_run(args) -> dict:
    import torch

    from probe_toolkit.analyses import search_torch

    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    centres = torch.randn(hb.VOC_CLASSES, args.dim, generator=gen, device=device)
    bank = torch.empty(args.memory, args.dim, device=device)
    for a in range(0, args.memory, 1 << 20):
        n = min(1 << 20, args.memory - a)
        rows = centres[torch.randint(0, hb.VOC_CLASSES, (n,), generator=gen, device=device)] + 2.0 * torch.randn(n, args.dim, generator=gen, device=device)
        bank[a : a + n] = torch.nn.functional.normalize(rows, dim=1)
    queries = centres[torch.randint(0, hb.VOC_CLASSES, (args.views * PATCHES,), generator=gen, device=device)] + 2.0 * torch.randn(
        args.views * PATCHES, args.dim, generator=gen, device=device
    )
    q = search.normalise(queries.cpu().numpy())
    rows = GPU_QUERY_BLOCK * PATCHES
    search_torch.nearest(q[:rows], bank[: BANK_BLOCK * 4], hb.K, BANK_BLOCK, args.device)  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    for a in range(0, len(q), rows):
        got = search_torch.nearest(q[a : a + rows], bank, hb.K, BANK_BLOCK, args.device)
    torch.cuda.synchronize()
    search_s = time.perf_counter() - start
    first = search_torch.nearest(q[:8], bank, hb.K, BANK_BLOCK, args.device)
    with torch.no_grad():
        cos = (torch.as_tensor(q[:8], device=device).double() @ bank.double().T).float()
        order = torch.sort(cos, dim=1, descending=True, stable=True).indices[:, : hb.K]  # stable: equal cosines keep the lower row first
        want = (torch.gather(cos, 1, order).cpu().numpy(), order.cpu().numpy())
    exact = bool(np.array_equal(first[1], want[1]) and np.array_equal(first[0], want[0]))
    del got
    return {
        "search": f"torch on {args.device}",
        "workers": 1,
        "write_s": None,
        "search_s": round(search_s, 3),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        "exact": exact,
        "gpu": torch.cuda.get_device_name(device),
    }


def main() -> None:
    args = options(
        __doc__,
        {
            "memory": "memory patches (1024·10² on the CPU, 1024·10⁴ on a GPU by default)",
            "views": "query views of 1,024 patches searched",
            "workers": "local processes (0: every core)",
            "folder": "where the CPU memory's file goes",
        },
        RECORDS,
        device="cpu",
        memory=0,
        views=0,
        dim=384,
        workers=0,
        folder="",
        note="",
        verbose=False,
    )
    gpu = args.device != "cpu"
    args.memory = args.memory or (10_240_000 if gpu else 102_400)
    args.views = args.views or (64 if gpu else 8)
    fields = gpu_run(args) if gpu else cpu_run(args)
    queries = args.views * PATCHES
    total = flops(VOC_VAL_QUERIES, args.memory, args.dim)
    per_query = fields["search_s"] / queries
    voc_s = per_query * VOC_VAL_QUERIES
    rate = flops(queries, args.memory, args.dim) / fields["search_s"]
    print(
        f"{queries:,} query patches ({args.views} views) × {args.memory:,} memory patches × {args.dim} channels, k {hb.K}; {fields['search']}"
        f"{' (' + fields['gpu'] + ')' if fields['gpu'] else ''}; {os.cpu_count()} cores, {cpu_model()}, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"  search {fields['search_s']:.2f} s: {rate / 1e12:.2f} TFLOP/s of products; all VOC val ({VOC_VAL_QUERIES:,} queries, "
        f"{total / 1e15:.3g} PFLOP) at this pace: {voc_s / 60:.1f} min"
    )
    if not gpu:
        print(
            f"  peak resident set: this process {fields['peak_self_mib']:,.0f} MiB, largest worker {fields['peak_worker_mib']:,.0f} MiB, "
            f"against a memory of {args.memory * args.dim * 4 / 2**20:,.0f} MiB (written in {fields['write_s']:.1f} s)"
        )
    else:
        print(f"  peak GPU memory {fields['peak_gpu_gib']} GiB (the memory itself {args.memory * args.dim * 4 / 2**30:.1f} GiB)")
    print(f"  first 8 queries: the same neighbours and cosines as every cosine sorted: {fields['exact']}")
    emit(
        {
            **header("hummingbird-scale"),
            "memory": args.memory,
            "views": args.views,
            "queries": queries,
            "dim": args.dim,
            "k": hb.K,
            **fields,
            "tflop_per_s": round(rate / 1e12, 4),
            "voc_val_queries": VOC_VAL_QUERIES,
            "voc_val_pflop": round(total / 1e15, 4),
            "voc_val_min": round(voc_s / 60, 2),
            **({"note": args.note} if args.note else {}),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
