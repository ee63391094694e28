"""Per-image decode time: the toolkit's decoder against TokenCut's dense generalized solver;
then the whole machine (``probe decode`` on every core against one core) and the torch backend
on the CPU beside the scipy one.

1. Per core. Both run in this process on the same keys (a noisy disc on a noisy background, 384
   channels, float16 as stored) at N = 900 (30 × 30, our 480 view) and N = 3600 (60 × 60,
   MaskCut's size), for the centred preset (centred keys) and for TokenCut's (uncentred). It
   times the whole per-image decode (keys → mask) and, separately, the eigensolve alone on the
   same graph. The baseline is TokenCut's pipeline as published: float64 cosines, dense W and D,
   ``scipy.linalg.eigh(D − W, D, subset_by_index=[1, 2])``, mean threshold, argmax |x| seed,
   4-connected component. The masks must be identical on every image the decoder does not flag.
2. Whole machine. ``probe.run("decode", ...)`` on a synthetic store (N = 900) with ``workers`` = every core
   against ``workers=1``, interleaved rounds; every saved array must be identical.
3. Torch backend on the CPU (one thread, as a worker runs it): ``decoder_torch.decode_batch`` on
   a batch against ``decode_image`` per image; certified masks must be identical. ``--presets``
   (default centred; ``all``: centred, tokencut, maskcut, lost, dsm, each at N = 900, and MaskCut
   at N = 3600 too with ``--full``) times each preset and prints what VOC07's 9,963 images would
   take at that pace, and MaskCut's pace against CutLER's 13.5 s an image (CutLER#74).

    python benchmarks/decoder.py [--full] [--images 4 --images-large 1 --threads 1] [--clock cpu|wall]
    python benchmarks/decoder.py --only torch --full --device cuda --images 256 --images-large 16   (on a GPU)

Per-core times are CPU seconds of this process by default (one BLAS thread both sides, so CPU
time is each side's work, unaffected by other load); ``--clock wall`` times wall seconds.

Targets: per core ≥ 5× at N = 900 and ≥ 25× at N = 3600; whole machine ≥ 1.8× on 2 cores.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=None, help="images at N = 900 (default 4; --full 12)")
    parser.add_argument("--images-large", type=int, default=None, help="images at N = 3600 (default 1; --full 3)")
    parser.add_argument(
        "--store-images",
        type=int,
        default=None,
        help="images of the whole-machine store (default 96, enough that throughput, not the command's fixed cost, is timed; --full 192)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the whole-machine runs (default 2; --full 5)")
    parser.add_argument("--only", choices=("per-core", "machine", "torch"), help="run one part only")
    parser.add_argument("--full", action="store_true", help="more images and rounds, and the torch backend at N = 3600")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads for both sides (decode's default is 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="the torch backend's device (cuda: a GPU solves each batch; the scipy side stays on one CPU thread)"
    )
    parser.add_argument("--presets", default="centred", help="the torch backend's presets, comma-separated, or all")
    parser.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="per-core times: CPU seconds of this process (default; robust on a shared machine) or wall seconds"
    )
    args = parser.parse_args()
    full = args.full
    args.images = args.images or (12 if full else 4)
    args.images_large = args.images_large or (3 if full else 1)
    args.store_images = args.store_images or (192 if full else 96)
    args.rounds = args.rounds or (5 if full else 2)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    import numpy as np
    import scipy.linalg
    import scipy.ndimage
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=args.threads)  # both sides, whatever the environment said

    from probe_toolkit.analyses import decoder, decoder_cut, decoder_graph, decoder_masks
    from probe_toolkit.analyses.decoder import decode_image
    from probe_toolkit.analyses.decoder_settings import Settings

    def keys(rng, grid: int, channels: int = 384) -> np.ndarray:
        yy, xx = np.mgrid[:grid, :grid]
        disc = ((yy - grid / 2) ** 2 + (xx - grid / 2) ** 2 < (0.3 * grid) ** 2).reshape(-1)
        means = rng.standard_normal((2, channels))
        return (means[disc.astype(int)] + 2.0 * rng.standard_normal((grid * grid, channels))).astype(np.float16)

    rng = np.random.default_rng(args.seed)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter  # one BLAS thread: CPU time is the work
    rows = []
    for grid, count in ((30, args.images), (60, args.images_large)) if args.only in (None, "per-core") else ():
        for preset in ("centred", "tokencut"):
            settings = Settings.from_preset(preset)
            ours, ref, ours_solve, ref_solve, same, flagged, solvers, steps = [], [], [], [], 0, 0, [], []
            decode_image(keys(rng, grid), settings)  # warm-up (imports, BLAS)
            for _ in range(count):
                k = keys(rng, grid)
                t = clock()
                out = decode_image(k, settings)
                ours.append(clock() - t)
                t = clock()
                mask = decoder.tokencut_dense(k, settings.tau, settings.eps, settings.center)
                ref.append(clock() - t)
                solvers += out.solver
                # the eigensolve alone, on the same graph: ours (Lanczos on 𝒩 until decode's certificate holds, as
                # decode runs it) vs dense generalized eigh
                graph = decoder_graph.key_graph(decoder_graph.cosines(k, center=settings.center), settings.tau, settings.eps)
                scale = 1.0 / np.sqrt(graph.degree)
                t = clock()
                cut = decoder_cut.normalized_cut(
                    graph, enough=lambda c, scale=scale, grid=grid, settings=settings: decoder_masks.certified_cut(c, scale, (grid, grid), settings)[-1]
                )
                ours_solve.append(clock() - t)
                steps.append(cut.steps)
                w = graph.dense()
                d = np.diag(w.sum(axis=1))
                t = clock()
                scipy.linalg.eigh(d - w, d, subset_by_index=[1, 2])
                ref_solve.append(clock() - t)
                if out.degenerate:
                    flagged += 1
                else:
                    assert np.array_equal(out.masks[0], mask), f"mask differs from the dense reference at N = {grid * grid}"
                    same += 1
            row = {
                "n": grid * grid,
                "preset": preset,
                "images": count,
                "ours_s": statistics.median(ours),
                "dense_s": statistics.median(ref),
                "ratio": statistics.median(ref) / statistics.median(ours),
                "identical": same,
                "flagged": flagged,
                "ours_solve_s": statistics.median(ours_solve),
                "dense_solve_s": statistics.median(ref_solve),
                "solve_ratio": statistics.median(ref_solve) / statistics.median(ours_solve),
                "dense_fallbacks": solvers.count("dense"),
                "lanczos_steps": statistics.median(steps),
            }
            rows.append(row)
            target = 5 if grid == 30 else 25
            print(
                f"N={row['n']:5d} {preset:9s} ours {row['ours_s'] * 1e3:8.1f} ms  dense eigh {row['dense_s'] * 1e3:9.1f} ms  "
                f"ratio {row['ratio']:6.1f}× (target {target}×) | eigensolve alone {row['ours_solve_s'] * 1e3:7.1f} vs "
                f"{row['dense_solve_s'] * 1e3:8.1f} ms = {row['solve_ratio']:5.1f}× ({row['lanczos_steps']:.0f} Lanczos steps) | identical {same}/{count}, "
                f"flagged {flagged}",
                flush=True,
            )
    machine = whole_machine(keys, rng, args.store_images, args.rounds) if args.only in (None, "machine") else None
    presets = ("centred", "tokencut", "maskcut", "lost", "dsm") if args.presets == "all" else tuple(args.presets.split(","))
    backend = (
        [
            torch_backend(keys, rng, grid, args.images if grid == 30 else args.images_large, args.device, preset)
            for preset in presets
            for grid in ((30, 60) if full and preset in ("centred", "maskcut") else (30,))
        ]
        if args.only in (None, "torch")
        else []
    )
    print(
        json.dumps(
            {
                "benchmark": "decoder",
                "threads": args.threads,
                "clock": args.clock,
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "load": os.getloadavg()[0],
                "rows": rows,
                "whole_machine": machine,
                "torch": backend,
            }
        )
    )


def whole_machine(keys, rng, count: int, rounds: int) -> dict:
    """``probe decode`` with every core against one core on one store; identical arrays."""
    import tempfile
    from pathlib import Path

    import numpy as np

    import probe_toolkit as probe
    from probe_toolkit.infra.runner import local_cores
    from probe_toolkit.results import records
    from probe_toolkit.store.create import create_store

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.zarr"
        data = np.stack([keys(rng, 30) for _ in range(count)])
        meta = {"kind": "probe-store", "checkpoint": {"sha256": "0" * 64}, "dtype": "float16", "chunk": 16, "views": [480]}
        writer = create_store(path, meta, [f"{i}.jpg" for i in range(count)], {"keys_480": (("patch_480", "channel"), data.shape[1:])})
        for a in range(0, count, 16):
            b = min(a + 16, count)
            writer.write(a, {"keys_480": data[a:b]}, np.tile([480, 640], (b - a, 1)), np.zeros(b - a, dtype=bool))
        times: dict[int, list[float]] = {1: [], local_cores(): []}
        cpu: dict[int, list[float]] = {w: [] for w in times}
        parent: dict[int, list[float]] = {w: [] for w in times}  # this process alone: reading, assembling, saving
        saved: dict[int, object] = {}
        for _ in range(rounds):
            for workers in times:
                c, p, t = _cpu(), time.process_time(), time.perf_counter()
                probe.run("decode", path, preset="centred", workers=workers, cache_dir=tmp)
                times[workers].append(time.perf_counter() - t)
                cpu[workers].append(_cpu() - c)
                parent[workers].append(time.process_time() - p)
                saved[workers] = records.load(path, "decoder").load()
        one, every = (statistics.median(times[w]) for w in times)
        a, b = saved.values()
        identical = all(np.array_equal(a[v].values, b[v].values, equal_nan=a[v].dtype.kind == "f") for v in a.data_vars)
        assert identical, "every-core decode differs from the one-core decode"
    row = {
        "images": count,
        "cores": local_cores(),
        "one_core_img_s": count / one,
        "every_core_img_s": count / every,
        "ratio": one / every,
        "identical": identical,
        "cpu_s": {w: statistics.median(v) for w, v in cpu.items()},
        "parent_cpu_s": {w: statistics.median(v) for w, v in parent.items()},
        "share_of_cores": {w: statistics.median(c / t for c, t in zip(cpu[w], times[w])) for w in times},
    }
    print(
        f"probe decode, {count} images at N=900: one core {row['one_core_img_s']:6.1f} img/s, {row['cores']} cores "
        f"{row['every_core_img_s']:6.1f} img/s = {row['ratio']:.2f}× (target 1.8× on 2 cores) | arrays identical {identical} | "
        f"CPU seconds used {row['cpu_s'][1]:.1f} / {row['cpu_s'][local_cores()]:.1f}, cores actually obtained "
        f"{row['share_of_cores'][1]:.2f} / {row['share_of_cores'][local_cores()]:.2f} (other load shows here); CPU seconds of "
        f"this process alone {row['parent_cpu_s'][1]:.1f} / {row['parent_cpu_s'][local_cores()]:.1f}",
        flush=True,
    )
    return row


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the worker processes)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


VOC07_IMAGES, CUTLER_S = 9963, 13.5  # VOC07 trainval; CutLER#74: MaskCut's seconds an image


def torch_backend(keys, rng, grid: int, count: int, device: str = "cpu", preset: str = "centred") -> dict:
    """The torch backend on ``device`` (the CPU: one thread), a batch at once, against the scipy
    path on one CPU thread. The batch's masks come back to the host, so the time includes the
    GPU's work to the last image."""
    import numpy as np

    from probe_toolkit.analyses.decoder import decode_image
    from probe_toolkit.analyses.decoder_settings import Settings
    from probe_toolkit.analyses.decoder_torch import decode_batch

    settings = Settings.from_preset(preset)
    batch = np.stack([keys(rng, grid) for _ in range(max(count, 1))])
    threads = 1 if device == "cpu" else None
    decode_batch(batch[:1], settings, device=device, threads=threads)  # warm-up (kernels, the device's start)
    t = time.perf_counter()
    ours = decode_batch(batch, settings, device=device, threads=threads)
    torch_s = (time.perf_counter() - t) / len(batch)
    t = time.perf_counter()
    ref = [decode_image(k, settings) for k in batch]
    scipy_s = (time.perf_counter() - t) / len(batch)
    both = [(a, b) for a, b in zip(ours, ref) if not a.degenerate and not b.degenerate]
    same = sum(np.array_equal(a.masks, b.masks) for a, b in both)
    assert same == len(both), "a certified torch mask differs from the scipy path's"
    name = "CPU, 1 thread"
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name()
    row = {
        "n": grid * grid,
        "preset": preset,
        "device": name,
        "images": len(batch),
        "images_per_s": 1.0 / torch_s,
        "torch_s": torch_s,
        "scipy_s": scipy_s,
        "ratio": scipy_s / torch_s,
        "identical": same,
        "certified_both": len(both),
        "solvers": sorted({s for r in ours for s in r.solver}),
        "voc07_min": VOC07_IMAGES * torch_s / 60,
        **({"vs_cutler": CUTLER_S / torch_s} if preset == "maskcut" and grid == 60 else {}),
    }
    print(
        f"torch backend ({name}) {preset} N={grid * grid}: {torch_s * 1e3:8.1f} ms per image ({1.0 / torch_s:.1f} img/s, batch of {len(batch)}) "
        f"vs scipy (1 CPU thread) {scipy_s * 1e3:8.1f} ms = {row['ratio']:.2f}× | identical {same}/{len(both)} certified by both | "
        f"VOC07's {VOC07_IMAGES:,} images: {row['voc07_min']:.1f} min" + (f"; {row['vs_cutler']:.0f}× CutLER's {CUTLER_S} s" if "vs_cutler" in row else ""),
        flush=True,
    )
    return row


if __name__ == "__main__":
    main()
