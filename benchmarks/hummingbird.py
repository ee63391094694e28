"""Hummingbird retrieval: probe's exact blocked 30-NN and label transfer against an exhaustive matmul + sort, in one run.

The baseline is what a plain exact search does: every cosine at once (normalised queries ×
normalised memory, one float32 matmul) and a full sort of each row, the first 30 kept, then the
same softmax label transfer. probe's ``analyses.hummingbird.nearest`` takes the products in
float64 blocks of the memory (rounded to float32, so the ranking does not depend on the block)
with a running top-30 (``analyses.knn``'s keys: equal cosines to the lower row). Both run on
synthetic clustered features at ViT-S width (384) and label distributions over VOC's 21 classes.
Rounds are interleaved and medians compared; the ratio is baseline seconds / probe seconds. The
neighbours' agreement is printed: rows whose 30 neighbours are the same set in both.

    python benchmarks/hummingbird.py [--memory 102400] [--queries 4096] [--rounds 3] [--device auto] [--record]

``--device`` (auto: cuda when torch sees a GPU, else cpu; none: skip) adds the torch search of
``probe hummingbird --backend torch`` (``analyses.search_torch``) on that device against an
exhaustive baseline on the same device (one float32 matmul of every cosine + a full sort), both
with the memory already on the device (a run moves it there once); it prints whether its
neighbours and cosines are the numpy search's, bit for bit.

``--memory`` 102400 is the first published memory size (1024·10²); ``--queries`` 4096 is four
512 px views at /16. ``--record`` appends the JSON line to ``benchmarks/records/hummingbird.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
from startup import cpu_model, emit, header  # the processor's name, as the startup benchmark records it

from probe_toolkit.analyses import hummingbird as hb

RECORDS = Path(__file__).resolve().parent / "records" / "hummingbird.jsonl"


def baseline(queries: np.ndarray, memory: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive: every cosine by one float32 matmul, each row fully sorted, the first k kept."""
    sims = hb.normalise(queries) @ memory.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(sims, order, 1)
    return hb.transfer(top, order, labels), order


def toolkit(queries: np.ndarray, memory: np.ndarray, labels: np.ndarray, k: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    similarity, neighbour = hb.nearest(queries, memory, k, block)
    return hb.transfer(similarity, neighbour, labels), neighbour


def torch_rows(queries: np.ndarray, memory: np.ndarray, labels: np.ndarray, k: int, block: int, device: str, rounds: int):
    """(baseline seconds, probe seconds, probe's (similarity, neighbour)) on ``device``: medians of ``rounds``."""
    import torch

    from probe_toolkit.analyses import search_torch as ht

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    bank = ht.on_device(memory, device)
    q = hb.normalise(queries)
    times: dict[str, list[float]] = {"baseline": [], "probe": []}
    got = None
    for r in range(rounds + 1):  # round 0 warms up
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            sims = torch.as_tensor(q).to(device) @ bank.T
            order = torch.sort(sims, dim=1, descending=True, stable=True).indices[:, :k]
            top = torch.gather(sims, 1, order)
            hb.transfer(top.cpu().numpy(), order.cpu().numpy(), labels)
        sync()
        t_b = time.perf_counter() - start
        start = time.perf_counter()
        got = ht.nearest(q, bank, k, block, device)
        hb.transfer(*got, labels)
        sync()
        t_p = time.perf_counter() - start
        if r:
            times["baseline"].append(t_b)
            times["probe"].append(t_p)
        del sims, order, top
    return statistics.median(times["baseline"]), statistics.median(times["probe"]), got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", type=int, default=102400)
    parser.add_argument("--queries", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=hb.K)
    parser.add_argument("--block", type=int, default=16384, help="memory rows per product block (probe hummingbird's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or none: the torch search's row")
    parser.add_argument("--device-block", type=int, default=16384, help="memory rows per product block of the torch search")
    parser.add_argument("--record", action="store_true", help=f"append the JSON line to {RECORDS.relative_to(RECORDS.parents[2])}")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(hb.VOC_CLASSES, args.dim)).astype(np.float32)
    memory_class = rng.integers(0, hb.VOC_CLASSES, args.memory)
    memory = hb.normalise(centres[memory_class] + 2.0 * rng.normal(size=(args.memory, args.dim)).astype(np.float32))
    labels = np.zeros((args.memory, hb.VOC_CLASSES), np.float32)
    labels[np.arange(args.memory), memory_class] = 1.0
    queries = centres[rng.integers(0, hb.VOC_CLASSES, args.queries)] + 2.0 * rng.normal(size=(args.queries, args.dim)).astype(np.float32)

    times: dict[str, list[float]] = {"baseline": [], "probe": []}
    for r in range(args.rounds + 1):  # round 0 warms up
        start = time.perf_counter()
        soft_b, order_b = baseline(queries, memory, labels, args.k)
        t_b = time.perf_counter() - start
        start = time.perf_counter()
        soft_p, order_p = toolkit(queries, memory, labels, args.k, args.block)
        t_p = time.perf_counter() - start
        if r:
            times["baseline"].append(t_b)
            times["probe"].append(t_p)
    base_s, probe_s = statistics.median(times["baseline"]), statistics.median(times["probe"])
    same_set = float(np.mean([set(a) == set(b) for a, b in zip(order_b.tolist(), order_p.tolist())]))
    same_label = float(np.mean(soft_b.argmax(1) == soft_p.argmax(1)))
    pairs = args.memory * args.queries
    print(f"{args.queries:,} query patches × {args.memory:,} memory patches × {args.dim} channels, k {args.k}; {os.cpu_count()} cores, {cpu_model()}")
    print(f"  exhaustive float32 matmul + full sort   {base_s:7.3f} s   {pairs / base_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['baseline']]}")
    print(f"  probe (float64 blocks, running top-{args.k})  {probe_s:7.3f} s   {pairs / probe_s / 1e6:8.1f} M pairs/s   rounds {[round(t, 3) for t in times['probe']]}")
    print(
        f"  ratio {base_s / probe_s:.2f} (baseline seconds / probe seconds); same {args.k} neighbours on {100 * same_set:.2f} % of rows, "
        f"same transferred label on {100 * same_label:.2f} %"
    )
    fields = {
        **header("hummingbird"),
        "memory": args.memory,
        "queries": args.queries,
        "dim": args.dim,
        "k": args.k,
        "block": args.block,
        "rounds": args.rounds,
        "baseline_s": round(base_s, 4),
        "probe_s": round(probe_s, 4),
        "ratio": round(base_s / probe_s, 3),
        "same_neighbours": round(same_set, 5),
        "same_label": round(same_label, 5),
    }
    if args.device != "none":
        import torch

        device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
        gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
        base_d, probe_d, (sim_d, near_d) = torch_rows(queries, memory, labels, args.k, args.device_block, device, args.rounds)
        sim_n, near_n = hb.nearest(queries, memory, args.k, args.block)
        exact = bool(np.array_equal(near_d, near_n) and np.array_equal(sim_d, sim_n))
        print(
            f"  on {device}{f' ({gpu})' if gpu else ''}: exhaustive float32 matmul + full sort {base_d:7.3f} s; "
            f"probe --backend torch (float64 blocks of {args.device_block}) {probe_d:7.3f} s; ratio {base_d / probe_d:.2f}; "
            f"against probe's numpy search {probe_s / probe_d:.2f}×; same neighbours and cosines as the numpy search: {exact}"
        )
        fields.update(
            {
                "device": device,
                "gpu": gpu,
                "torch": torch.__version__,
                "device_block": args.device_block,
                "device_baseline_s": round(base_d, 4),
                "device_probe_s": round(probe_d, 4),
                "device_ratio": round(base_d / probe_d, 3),
                "device_vs_numpy": round(probe_s / probe_d, 3),
                "device_exact": exact,
            }
        )
    emit(fields, RECORDS, args.record)


if __name__ == "__main__":
    main()
