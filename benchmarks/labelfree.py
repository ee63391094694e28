"""RankMe and linear CKA on 100 k × 384 tokens: probe's streamed float64 estimators against a plain numpy SVD / product, in one run.

RankMe: probe's ``analyses.rank.Spectrum`` (a QR of the rows updated a store chunk at a time,
the singular values of its R factor) against ``np.linalg.svd`` of the whole float64 matrix, the
RankMe formula on each. CKA: probe's ``analyses.similarity.FeatureMoments`` (shifted float64
cross-products accumulated a chunk at a time) against the plain formula on the whole centred
float64 matrices, ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F). Both sides run under one BLAS thread (as probe's
protocols do) on synthetic tokens with a decaying spectrum and a large mean (as real tokens have).
Peak memory is tracemalloc's peak of each call (numpy's allocations, LAPACK's workspace among
them); time the median of ``--rounds``; the ratio is baseline seconds / probe seconds. The
agreement of the two answers is printed (relative difference).

    python benchmarks/labelfree.py [--rows 100000] [--width 384] [--chunk 3136] [--rounds 3] [--record]

``--chunk`` 3136 rows is a store chunk of 16 images × 196 patches. ``--record`` appends the JSON
line to ``benchmarks/records/labelfree.jsonl``.

    python benchmarks/labelfree.py --store STORE [--record]

measures instead how RankMe depends on the number of rows on one store's tokens (``probe rank``'s
nested seeded subsets, 256 … 25,600 rows, and every row), as its own record (the store's network,
width and weights named, not its folder).
"""

from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from startup import cpu_model, emit, header, options

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_toolkit.analyses import rank, similarity  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "labelfree.jsonl"


def tokens(rows: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float32 token sets of the same rows: a decaying spectrum around a large mean, the second a noisy map of the first."""
    rng = np.random.default_rng(seed)
    scale = (np.arange(1, width + 1) ** -0.5).astype(np.float32)
    x = (rng.standard_normal((rows, width), dtype=np.float32) * scale) @ np.linalg.qr(rng.standard_normal((width, width)))[0].astype(np.float32)
    x += rng.normal(0, 0.3, width).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)) + 0.1 * rng.standard_normal((rows, width), dtype=np.float32)
    return x, y.astype(np.float32)


def rankme_svd(x: np.ndarray) -> float:
    return rank.rankme(np.linalg.svd(x.astype(np.float64), compute_uv=False))


def rankme_probe(x: np.ndarray, chunk: int) -> float:
    spectrum = rank.Spectrum(x.shape[1])
    for a in range(0, len(x), chunk):
        spectrum.add(x[a : a + chunk])
    return spectrum.rankme()


def cka_product(x: np.ndarray, y: np.ndarray) -> float:
    a = x.astype(np.float64)
    a -= a.mean(axis=0)
    b = y.astype(np.float64)
    b -= b.mean(axis=0)
    return float(np.sum((b.T @ a) ** 2) / (np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b)))


def cka_probe(x: np.ndarray, y: np.ndarray, chunk: int) -> float:
    moments = similarity.FeatureMoments((x.shape[1], y.shape[1]))
    for a in range(0, len(x), chunk):
        moments.add([x[a : a + chunk], y[a : a + chunk]])
    return float(moments.cka()[0, 1])


def measured(fn, rounds: int) -> tuple[float, float, float]:
    """(answer, median seconds, peak MiB of one call)."""
    tracemalloc.start()
    answer = fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return answer, statistics.median(times), peak


def curve(store: Path) -> dict:
    """RankMe of the store's class and patch tokens at each number of rows, as ``probe rank`` measures it."""
    from probe_toolkit.commands.rank import measure
    from probe_toolkit.infra import origin
    from probe_toolkit.store import cache

    ds = cache.open_store(store, plain=True)
    manifest = ds.attrs["manifest"]
    arch, checkpoint = manifest.get("arch", {}), manifest.get("checkpoint") or {}
    measured = measure(ds, ("class", "patch"), "224", None, rank.SAMPLE_SIZES, 0)
    out = {
        "benchmark": "labelfree-rankme-rows",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": cpu_model(),
        "network": f"{arch.get('family', 'dino')} width {arch.get('width')} depth {arch.get('depth')} patch {arch.get('patch')}",
        "checkpoint_format": checkpoint.get("format"),
        "images": int(ds.sizes.get("image", 0)),
        "view": "224",
        "weights": origin.random_weights(checkpoint.get("path"), checkpoint.get("sha256")) or "not made by probe",
    }
    for kind, (whole, subsets) in measured.items():
        out[f"{kind}_rows"] = whole.rows
        out[f"{kind}_rankme_all"] = round(whole.rankme(), 3)
        out[f"{kind}_rankme_by_rows"] = {str(n): round(g.rankme(), 3) for n, g in sorted(subsets.items())}
    return out


def main() -> None:
    from threadpoolctl import threadpool_limits

    args = options(__doc__, record=RECORDS, rows=100_000, width=384, chunk=3136, rounds=3, seed=0, store="")
    if args.store:
        with threadpool_limits(1):
            emit(curve(Path(args.store)), RECORDS, args.record)
        return
    x, y = tokens(args.rows, args.width, args.seed)
    with threadpool_limits(1):
        rm_base, rm_base_s, rm_base_mib = measured(lambda: rankme_svd(x), args.rounds)
        rm_probe, rm_probe_s, rm_probe_mib = measured(lambda: rankme_probe(x, args.chunk), args.rounds)
        cka_base, cka_base_s, cka_base_mib = measured(lambda: cka_product(x, y), args.rounds)
        cka_ours, cka_probe_s, cka_probe_mib = measured(lambda: cka_probe(x, y, args.chunk), args.rounds)
    record = {
        **header("labelfree"),
        "blas_threads": 1,
        "rows": args.rows,
        "width": args.width,
        "chunk": args.chunk,
        "rounds": args.rounds,
        "rankme_baseline": "numpy svd of the float64 matrix",
        "rankme_baseline_s": round(rm_base_s, 4),
        "rankme_probe_s": round(rm_probe_s, 4),
        "rankme_ratio": round(rm_base_s / rm_probe_s, 3),
        "rankme_baseline_peak_mib": round(rm_base_mib, 1),
        "rankme_probe_peak_mib": round(rm_probe_mib, 1),
        "rankme": rm_probe,
        "rankme_rel_diff": abs(rm_probe - rm_base) / rm_base,
        "cka_baseline": "plain float64 products of the centred matrices",
        "cka_baseline_s": round(cka_base_s, 4),
        "cka_probe_s": round(cka_probe_s, 4),
        "cka_ratio": round(cka_base_s / cka_probe_s, 3),
        "cka_baseline_peak_mib": round(cka_base_mib, 1),
        "cka_probe_peak_mib": round(cka_probe_mib, 1),
        "cka": cka_ours,
        "cka_rel_diff": abs(cka_ours - cka_base) / cka_base,
        "numpy": np.__version__,
    }
    emit(record, RECORDS, args.record)


if __name__ == "__main__":
    main()
