"""Per-image decode time: the toolkit's decoder against TokenCut's dense generalized solver.

Both run in this process on the same keys (a noisy disc on a noisy background, 384 channels,
float16 as stored) at N = 900 (30 × 30, our 480 view) and N = 3600 (60 × 60, MaskCut's size),
for the centred preset (centred keys) and for TokenCut's (uncentred). It times the whole
per-image decode (keys → mask) and, separately, the eigensolve alone on the same graph. The baseline is TokenCut's
pipeline as published: float64 cosines, dense W and D, ``scipy.linalg.eigh(D − W, D,
subset_by_index=[1, 2])``, mean threshold, argmax |x| seed, 4-connected component. The masks
must be identical on every image the decoder does not flag as degenerate.

    python benchmarks/decoder.py [--images 6 --images-large 2 --threads 1]

Targets: ≥ 20× at N = 900 and ≥ 50× at N = 3600. Prints a table and one JSON line.
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
    parser.add_argument("--images", type=int, default=6, help="images at N = 900")
    parser.add_argument("--images-large", type=int, default=2, help="images at N = 3600")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads for both sides (decode's default is 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    import numpy as np
    import scipy.linalg
    import scipy.ndimage
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=args.threads)  # both sides, whatever the environment said

    from probe_toolkit.analyses import decoder
    from probe_toolkit.analyses.decoder import Settings, decode_image

    def keys(rng, grid: int, channels: int = 384) -> np.ndarray:
        yy, xx = np.mgrid[:grid, :grid]
        disc = ((yy - grid / 2) ** 2 + (xx - grid / 2) ** 2 < (0.3 * grid) ** 2).reshape(-1)
        means = rng.standard_normal((2, channels))
        return (means[disc.astype(int)] + 2.0 * rng.standard_normal((grid * grid, channels))).astype(np.float16)

    rng = np.random.default_rng(args.seed)
    rows = []
    for grid, count in ((30, args.images), (60, args.images_large)):
        for preset in ("centred", "tokencut"):
            settings = Settings.from_preset(preset)
            ours, ref, ours_solve, ref_solve, same, flagged, solvers = [], [], [], [], 0, 0, []
            decode_image(keys(rng, grid), settings)  # warm-up (imports, BLAS)
            for _ in range(count):
                k = keys(rng, grid)
                t = time.perf_counter()
                out = decode_image(k, settings)
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                mask = decoder.tokencut_dense(k, settings.tau, settings.eps, settings.center)
                ref.append(time.perf_counter() - t)
                solvers += out.solver
                # the eigensolve alone, on the same graph: ours (ARPACK on 𝒩) vs dense generalized eigh
                graph = decoder.key_graph(decoder.cosines(k, center=settings.center), settings.tau, settings.eps)
                t = time.perf_counter()
                decoder.normalized_cut(graph)
                ours_solve.append(time.perf_counter() - t)
                w = graph.dense()
                d = np.diag(w.sum(axis=1))
                t = time.perf_counter()
                scipy.linalg.eigh(d - w, d, subset_by_index=[1, 2])
                ref_solve.append(time.perf_counter() - t)
                if out.degenerate:
                    flagged += 1
                else:
                    assert np.array_equal(out.masks[0], mask), f"mask differs from the dense reference at N = {grid * grid}"
                    same += 1
            row = {
                "n": grid * grid, "preset": preset, "images": count, "ours_s": statistics.median(ours), "dense_s": statistics.median(ref),
                "ratio": statistics.median(ref) / statistics.median(ours), "identical": same, "flagged": flagged,
                "ours_solve_s": statistics.median(ours_solve), "dense_solve_s": statistics.median(ref_solve),
                "solve_ratio": statistics.median(ref_solve) / statistics.median(ours_solve),
                "dense_fallbacks": solvers.count("dense"),
            }
            rows.append(row)
            target = 20 if grid == 30 else 50
            print(f"N={row['n']:5d} {preset:9s} ours {row['ours_s'] * 1e3:8.1f} ms  dense eigh {row['dense_s'] * 1e3:9.1f} ms  "
                  f"ratio {row['ratio']:6.1f}× (target {target}×) | eigensolve alone {row['ours_solve_s'] * 1e3:7.1f} vs "
                  f"{row['dense_solve_s'] * 1e3:8.1f} ms = {row['solve_ratio']:5.1f}× | identical {same}/{count}, flagged {flagged}", flush=True)
    print(json.dumps({"benchmark": "decoder", "threads": args.threads, "cpu": platform.processor() or platform.machine(),
                      "cores": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()
