"""Throughput of ``neighbours`` and ``entropy`` against plain per-image numpy loops, in one run.

A synthetic store of ``--images`` images (tokens_224: 196 × 384, attention_224: 6 heads ×
196 × 196, float16, no class token, chunks of 16) is written with ``create.create_store`` in a
temporary folder. Each round times, in turn:

  toolkit     the analysis function over the whole store (lazy xarray/dask chunks, batched
              torch, bootstrap summary), as ``probe neighbours`` / ``probe entropy`` run it;
  plain loop  the same statistics the way the definitions read: chunks read with zarr, then
              image by image and anchor by anchor (neighbours) or row by row (entropy) in numpy;
              the reference implementation of the tests, on a subset of ``--plain`` images;
  per-image   numpy vectorised within one image (whole similarity matrix, argsort of every row;
              whole attention tensor), still one image at a time, on ``--per-image`` images.

  reading     the chunks alone, read with zarr on one thread: the ceiling every variant shares.

Rounds are interleaved and medians compared (this machine's timings vary by 15–20 % from minute to minute).
Round 0 warms up and is dropped. Prints images/s and ratios, then one JSON line.

    python benchmarks/analyses.py [--images 2000] [--rounds 3] [--plain 24] [--per-image 200]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zarr

from probe_toolkit.analyses.entropy import entropy
from probe_toolkit.analyses.neighbours import neighbours
from probe_toolkit.infra.runner import Where, per_image
from probe_toolkit.store.cache import open_store, require
from probe_toolkit.store.create import create_store

GRID, CHANNELS, HEADS, CHUNK = 14, 384, 6, 16
N = GRID * GRID


def manifest(n: int) -> dict:
    return {
        "toolkit_version": "bench",
        "git_revision": "bench",
        "checkpoint": {"path": "synthetic", "sha256": "0" * 64, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": CHANNELS, "depth": 12, "heads": HEADS, "patch": 16, "class_token": False, "final_norm": False, "mlp_hidden": 1536},
        "views": [224],
        "interpolation": "dino",
        "attention": "last",
        "dtype": "float16",
        "chunk": CHUNK,
        "image_list_sha256": "0" * 64,
        "n_images": n,
        "libraries": {},
        "date": "",
    }


def synthetic_chunk(rng: np.random.Generator, count: int, distance: np.ndarray) -> dict[str, np.ndarray]:
    """Tokens with 2 × 2 structure plus noise; attention rows local to a per-head width."""
    base = rng.standard_normal((count, GRID // 2, GRID // 2, CHANNELS)).astype(np.float32)
    tokens = base.repeat(2, axis=1).repeat(2, axis=2).reshape(count, N, CHANNELS)
    tokens += 0.8 * rng.standard_normal(tokens.shape).astype(np.float32)
    width = rng.uniform(0.7, 6.0, size=(count, HEADS, 1, 1)).astype(np.float32)
    logits = -((distance[None, None] / width) ** 2) + rng.standard_normal((count, HEADS, N, N)).astype(np.float32)
    logits -= logits.max(-1, keepdims=True)
    attention = np.exp(logits)
    attention /= attention.sum(-1, keepdims=True)
    return {"tokens_224": tokens.astype(np.float16), "attention_224": attention.astype(np.float16)}


def build_store(path: Path, n: int, seed: int = 0) -> Path:
    ids = [f"synthetic/{i:06d}.jpg" for i in range(n)]
    writer = create_store(path, manifest(n), ids, {"tokens_224": (("patch_224", "channel"), (N, CHANNELS)), "attention_224": (("head", "query", "key"), (HEADS, N, N))})
    rng = np.random.default_rng(seed)
    pos = np.stack(np.divmod(np.arange(N), GRID), 1)
    distance = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1)).astype(np.float32)
    for start in range(0, n, CHUNK):
        count = min(CHUNK, n - start)
        writer.write(start, synthetic_chunk(rng, count, distance), np.tile([480, 640], (count, 1)), np.zeros(count, bool))
    return path


# ----------------------------------------------------------------------------------------------
# baselines: the definitions as they read, in plain numpy


def windows(grid: int) -> list[list[int]]:
    out = []
    for a in range(grid * grid):
        r, c = divmod(a, grid)
        out.append(sorted(((r + dr) % grid) * grid + (c + dc) % grid for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)))
    return out


def torus_chebyshev(grid: int, i: int, j: int) -> int:
    dr, dc = abs(i // grid - j // grid), abs(i % grid - j % grid)
    return max(min(dr, grid - dr), min(dc, grid - dc))


def plain_neighbours(tokens: np.ndarray, k: int = 4, top: int = 8, q: float = 0.2, m: int = 48) -> np.ndarray:
    """Image by image, anchor by anchor: the same ten statistics as ``neighbours`` (float64, the
    reference: float32 can swap two cosines that differ by less than its rounding)."""
    cands = windows(GRID)
    plain = [set(c) for c in windows_plain(GRID)]
    out = []
    for image in tokens.astype(np.float64):
        unit = image / np.linalg.norm(image, axis=1, keepdims=True)
        sim = unit @ unit.T
        theta = np.quantile(sim[np.triu_indices(N, 1)], q)
        acc = {key: [] for key in ("top", "dist", "topk", "pos", "oth", "wrap", "con", "cdist", "neg")}
        for a in range(N):
            order = [j for j in np.argsort(-sim[a], kind="stable") if j != a]
            window = set(cands[a])
            acc["top"].extend(j in window for j in order[:top])
            acc["dist"].extend(torus_chebyshev(GRID, a, j) for j in order[:top])
            acc["topk"].extend(j in window for j in order[:k])
            ranked = sorted(range(8), key=lambda p: -sim[a, cands[a][p]])
            chosen = [cands[a][p] for p in ranked[:k]]
            acc["pos"].extend(sim[a, j] for j in chosen)
            acc["oth"].extend(sim[a, cands[a][p]] for p in ranked[k:])
            acc["wrap"].extend(j not in plain[a] for j in chosen)
            acc["con"].extend(j in window for j in order[:k])
            acc["cdist"].extend(torus_chebyshev(GRID, a, j) for j in order[:k])
            acc["neg"].append(min(m, sum(1 for j in order[k:] if sim[a, j] <= theta)))
        out.append([np.mean(acc[key]) for key in ("top", "dist", "topk", "pos", "oth", "wrap", "con", "cdist", "neg")] + [theta])
    return np.array(out)


def windows_plain(grid: int) -> list[list[int]]:
    out = []
    for a in range(grid * grid):
        r, c = divmod(a, grid)
        out.append([(r + dr) * grid + c + dc for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0) and 0 <= r + dr < grid and 0 <= c + dc < grid])
    return out


def per_image_neighbours(tokens: np.ndarray, k: int = 4, top: int = 8, q: float = 0.2, m: int = 48) -> np.ndarray:
    """Image by image, numpy vectorised over anchors."""
    table = np.array(windows(GRID))
    inside = np.zeros((N, N), bool)
    np.put_along_axis(inside, table, True, axis=1)
    pos = np.stack(np.divmod(np.arange(N), GRID), 1)
    delta = np.abs(pos[:, None] - pos[None])
    dist = np.minimum(delta, GRID - delta).max(-1)
    plain_inside = np.zeros((N, N), bool)
    for a, cells in enumerate(windows_plain(GRID)):
        plain_inside[a, cells] = True
    rows = np.arange(N)[:, None]
    upper = np.triu_indices(N, 1)
    out = []
    for image in tokens.astype(np.float32):
        unit = image / np.linalg.norm(image, axis=1, keepdims=True)
        sim = unit @ unit.T
        masked = sim.copy()
        np.fill_diagonal(masked, -np.inf)
        order = np.argsort(-masked, axis=1, kind="stable")
        theta = np.quantile(sim[upper], q)
        cand = np.take_along_axis(sim, table, 1)
        ranked = np.argsort(-cand, axis=1, kind="stable")
        chosen = np.take_along_axis(table, ranked[:, :k], 1)
        others = np.take_along_axis(table, ranked[:, k:], 1)
        allowed = (sim <= theta) & ~np.eye(N, dtype=bool)
        np.put_along_axis(allowed, order[:, :k], False, axis=1)
        out.append(
            [
                inside[rows, order[:, :top]].mean(),
                dist[rows, order[:, :top]].mean(),
                inside[rows, order[:, :k]].mean(),
                sim[rows, chosen].mean(),
                sim[rows, others].mean(),
                (~plain_inside[rows, chosen]).mean(),
                inside[rows, order[:, :k]].mean(),
                dist[rows, order[:, :k]].mean(),
                np.minimum(allowed.sum(1), m).mean(),
                theta,
            ]
        )
    return np.array(out)


def plain_entropy(attention: np.ndarray) -> np.ndarray:
    """Image by image, head by head, row by row: mean H, mean e^H, mean distance per head."""
    pos = np.stack(np.divmod(np.arange(N), GRID), 1).astype(np.float64)
    dist = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    out = np.zeros((len(attention), HEADS, 3))
    for i, image in enumerate(attention):
        for h in range(HEADS):
            hs, es, ds = [], [], []
            for qi in range(N):
                row = image[h, qi].astype(np.float32)
                nz = row[row > 0]
                value = float(-(nz * np.log(nz)).sum())
                hs.append(value)
                es.append(math.exp(value))
                ds.append(float((row * dist[qi]).sum() / row.sum()))
            out[i, h] = (np.mean(hs), np.mean(es), np.mean(ds))
    return out


def per_image_entropy(attention: np.ndarray) -> np.ndarray:
    pos = np.stack(np.divmod(np.arange(N), GRID), 1).astype(np.float32)
    dist = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    out = np.zeros((len(attention), HEADS, 3))
    for i, image in enumerate(attention):
        a = image.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
        d = (a * dist).sum(-1) / a.sum(-1)
        out[i] = np.stack([h.mean(-1), np.exp(h).mean(-1), d.mean(-1)], -1)
    return out


def from_store(path: Path, name: str, count: int, fn) -> tuple[float, np.ndarray]:
    """Read ``count`` images chunk by chunk with zarr and run ``fn`` on each chunk."""
    array = zarr.open_group(path, mode="r")[name]
    start = time.perf_counter()
    parts = [fn(array[s : min(s + CHUNK, count)]) for s in range(0, count, CHUNK)]
    return count / (time.perf_counter() - start), np.concatenate(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plain", type=int, default=24, help="images for the plain loops (slow)")
    parser.add_argument("--per-image", type=int, default=200, help="images for the per-image numpy baseline")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = build_store(Path(tmp) / "bench" / "synthetic.zarr", args.images)
        print(f"store: {args.images} images written in {time.perf_counter() - t0:.1f} s")
        ds = open_store(path)
        tokens, attention = require(ds, "tokens_224"), require(ds, "attention_224")
        for r in range(args.rounds + 1):
            found = {}
            start = time.perf_counter()
            found["neighbours"] = neighbours(tokens, GRID, run_blocks=per_image(Where(workers=args.workers or 1)))
            found["neighbours_rate"] = args.images / (time.perf_counter() - start)
            plain_n = from_store(path, "tokens_224", args.plain, plain_neighbours)
            image_n = from_store(path, "tokens_224", args.per_image, per_image_neighbours)
            start = time.perf_counter()
            found["entropy"] = entropy(attention, class_token=False, run_blocks=per_image(Where(workers=args.workers or 1)))
            found["entropy_rate"] = args.images / (time.perf_counter() - start)
            plain_e = from_store(path, "attention_224", args.plain, plain_entropy)
            image_e = from_store(path, "attention_224", args.per_image, per_image_entropy)
            read_t = from_store(path, "tokens_224", args.per_image, lambda x: np.zeros(len(x)))
            read_a = from_store(path, "attention_224", args.per_image, lambda x: np.zeros(len(x)))
            if r == 0:  # warm-up; check that all three compute the same numbers
                ours = np.stack([found["neighbours"][s].values[: args.plain] for s in found["neighbours"].statistic.values], 1)
                print(
                    f"neighbours: max |toolkit - plain loop| {np.abs(ours - plain_n[1]).max():.2e}, |per-image (float32) - plain loop| "
                    f"{np.abs(image_n[1][: args.plain] - plain_n[1]).max():.2e}"
                )
                e = found["entropy"]
                ours_e = np.stack([e.patch_entropy.values, e.patch_effective.values, e.distance.values], -1)[: args.plain]
                print(
                    f"entropy: max |toolkit - plain loop| {np.abs(ours_e - plain_e[1]).max():.2e}, |per-image - plain loop| "
                    f"{np.abs(image_e[1][: args.plain] - plain_e[1]).max():.2e}"
                )
                continue
            for key, value in (
                ("neighbours_toolkit", found["neighbours_rate"]),
                ("neighbours_plain_loop", plain_n[0]),
                ("neighbours_per_image", image_n[0]),
                ("entropy_toolkit", found["entropy_rate"]),
                ("entropy_plain_loop", plain_e[0]),
                ("entropy_per_image", image_e[0]),
                ("read_tokens", read_t[0]),
                ("read_attention", read_a[0]),
            ):
                rates.setdefault(key, []).append(value)
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()) + " img/s")
    med = {key: statistics.median(values) for key, values in rates.items()}
    line = {
        "benchmark": "analyses",
        "images": args.images,
        "rounds": args.rounds,
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, {args.workers} chunk workers",
        "torch": torch.__version__,
    }
    for analysis in ("neighbours", "entropy"):
        ours = med[f"{analysis}_toolkit"]
        for base in ("plain_loop", "per_image"):
            ratio = ours / med[f"{analysis}_{base}"]
            line[f"{analysis}_ratio_vs_{base}"] = round(ratio, 2)
        print(
            f"{analysis}: toolkit {ours:.1f} img/s; plain loop {med[f'{analysis}_plain_loop']:.2f} img/s (ratio {line[f'{analysis}_ratio_vs_plain_loop']}x); "
            f"per-image numpy {med[f'{analysis}_per_image']:.1f} img/s (ratio {line[f'{analysis}_ratio_vs_per_image']}x)"
        )
    print(f"reading alone (zarr, one thread): tokens {med['read_tokens']:.0f} img/s, attention {med['read_attention']:.0f} img/s")
    line.update({f"{key}_img_s": round(value, 2) for key, value in med.items()})
    print(json.dumps(line))


if __name__ == "__main__":
    main()
