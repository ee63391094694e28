"""``probe correspond STORE --panel NAVI``: NAVI multiview correspondence (``analyses/navi.py``), as
mbanani/probe3d's ``evaluate_navi_correspondence.py`` computes it.

The network's input depends on the labels: each image is cut to the square around its object, whose
pixels are those of its depth map. So the features cannot come from a store (extraction never reads a
label): the store names the network (its manifest's checkpoint, sha256 checked) and receives the
record, and the network runs here on the views the reference makes, after the ledger entry. Order,
which the ledger shows: the panel's annotations and the scored images' depth maps are read once
(purpose ``correspond: score``), then the pairs are scored in blocks on the runner (``--workers``,
``--dask-address``), each image's forward pass alone and each pair on its own, so the numbers do not
depend on the placement; ``--shard i/n`` (or torchrun) scores a contiguous share of the pairs, and the
shard that finds every part in saves the record. Result ``results/correspond-navi``:

    recall_cm      (cm)                    percent of correspondences within 1, 2, 5 cm
    recall_px      (px)                    within 5, 25, 50 px of the 512 view
    binned         (bin)                   recall at 2 cm of each pair, averaged per rotation bin (NaN where empty)
    error_3d       (pair, match)           metres (NaN past a pair's matches)
    error_2d       (pair, match)           pixels
    source_uv, target_uv (pair, match, xy) the matched pixels in each 512 view
    matches, angle (pair)                  correspondences kept; relative rotation in degrees
    source_view, target_view (shown, y, x, rgb)   the first pairs' 512 views (uint8, every second pixel), for the figure
    coords: cm, px, bin, pair (<object>/<id>-<id>), source, target (image keys), shown
    attrs: settings, ledger, panel, counts, feature, checkpoint, bins_mean, source, provenance
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import navi
from ..infra import lazy_dask
from ..infra.errors import IntegrityError, ProbeError, worker_name
from ..infra.runner import map_blocks
from ..labels import navi_read
from ..labels.navi import MAX_ANGLE, PAIR_SEED, STRIDE, NaviImage
from ..labels.navi_pairs import camera
from ..protocols.context import Inputs, RunContext, Saving
from ..results.navi_report import BIN_NAMES, NaviReport
from . import shards
from .runs import result_provenance

RESULT = "correspond-navi"
BLOCK = 4  # pairs per runner task
SHOWN = 4  # pairs whose two views the record keeps for the report's figure


@dataclass(frozen=True)
class Job:
    """What every block of pairs shares (pickled with each task): the network (loaded once per
    worker, its sha256 checked), the panel's folder, its images, the pairs, the depth maps' sha256."""

    checkpoint: str
    sha256: str
    network: str
    device: str
    load: tuple[tuple[str, Any], ...]
    patch: int
    root: str
    images: tuple[NaviImage, ...]
    pairs: tuple[tuple[int, int], ...]
    depth_sha256: tuple[tuple[str, str], ...]
    num_corr: int
    scale: float


def read_view(job: Job, n: int) -> tuple[navi.View, np.ndarray]:
    """Image ``n``'s view and its 8-bit RGB pixels, from the files; its depth map must be the bytes the ledger logged."""
    from PIL import Image, ImageOps

    image = job.images[n]
    depth_path, image_path = Path(job.root) / image.depth, Path(job.root) / image.image
    try:
        raw = depth_path.read_bytes()
        with Image.open(image_path) as opened:
            rgb = np.asarray(ImageOps.exif_transpose(opened).convert("RGB"))
    except OSError as error:
        raise IntegrityError(worker_name(), f"cannot read {error.filename or depth_path}", "give every worker the NAVI folder at the path this machine reads") from None
    if hashlib.sha256(raw).hexdigest() != dict(job.depth_sha256)[image.key]:
        raise IntegrityError(depth_path, "is not the depth map the ledger logged (changed while the run lasts)", "leave the NAVI folder in place and rerun")
    import io

    with Image.open(io.BytesIO(raw)) as opened:
        disparity = np.array(opened).astype(np.uint16)
    try:
        return navi.view(rgb, disparity, image.focal, image.size), rgb
    except ValueError as error:
        raise ProbeError(depth_path, str(error), "restore the release's depth map") from None


def features(model, view: navi.View, patch: int, device: str):
    """(D, rows, cols) last-block patch tokens of one view (zero-padded about the centre to whole patches)."""
    import torch

    with torch.inference_mode():
        image = navi.padded(torch.from_numpy(view.image), patch)
        tokens = model(image[None].to(device))[0].float().cpu()
    rows, cols = image.shape[-2] // patch, image.shape[-1] // patch
    return tokens.reshape(rows, cols, -1).permute(2, 0, 1)


def pair_block(index: np.ndarray, *, job: Job) -> dict[str, np.ndarray]:
    """Pairs ``index`` → their errors, matched pixels, match counts and relative angles (each pair on its own)."""
    from ..store.backbone import loaded

    model = loaded(job.checkpoint, job.sha256, job.network, job.device, **dict(job.load))
    n, k = len(index), job.num_corr
    out = {
        "error_3d": np.full((n, k), np.nan, np.float32),
        "error_2d": np.full((n, k), np.nan, np.float32),
        "source_uv": np.full((n, k, 2), np.nan, np.float32),
        "target_uv": np.full((n, k, 2), np.nan, np.float32),
        "matches": np.zeros(n, np.int32),
        "angle": np.zeros(n, np.float32),
    }
    seen: dict[int, tuple[navi.View, Any]] = {}

    def prepared(m: int):
        if m not in seen:
            view, _ = read_view(job, m)
            seen[m] = (view, features(model, view, job.patch, job.device))
        return seen[m]

    for row, p in enumerate(index):
        i, j = job.pairs[int(p)]
        (v0, f0), (v1, f1) = prepared(i), prepared(j)
        try:
            found = navi.match(f0, f1, v0.points, v1.points, job.num_corr, job.scale)
        except ValueError as error:
            raise ProbeError(Path(job.root) / job.images[i].depth, str(error), "restore the release's depth maps") from None
        rt01 = navi.relative(camera(job.images[i]), camera(job.images[j]))
        e3, e2 = navi.errors(found, rt01, v1.focal)
        m = len(e3)
        out["error_3d"][row, :m], out["error_2d"][row, :m] = e3, e2
        out["source_uv"][row, :m], out["target_uv"][row, :m] = found.source_uv, found.target_uv
        out["matches"][row], out["angle"][row] = m, navi.rotation_angle(rt01)
    return out


def shown_views(job: Job, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(pairs, S/2, S/2, 3) uint8 of the first ``count`` pairs' two views (every second pixel), for the figure."""

    def rgb(n: int) -> np.ndarray:
        view, _ = read_view(job, n)
        pixels = view.image * np.array(navi.STD, np.float32)[:, None, None] + np.array(navi.MEAN, np.float32)[:, None, None]
        return np.clip(np.rint(pixels[:, ::2, ::2] * 255), 0, 255).astype(np.uint8).transpose(1, 2, 0)

    pairs = job.pairs[:count]
    side = navi.SIDE // 2
    if not pairs:
        return np.zeros((0, side, side, 3), np.uint8), np.zeros((0, side, side, 3), np.uint8)
    return np.stack([rgb(i) for i, _ in pairs]), np.stack([rgb(j) for _, j in pairs])


def _scores(out: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    e3 = out["error_3d"][np.isfinite(out["error_3d"])]
    e2 = out["error_2d"][np.isfinite(out["error_2d"])]
    recall_cm = np.array([navi.recall(e3, t) for t in navi.CM])
    recall_px = np.array([navi.recall(e2, t) for t in navi.PX])
    per_pair = np.array([navi.recall(row[np.isfinite(row)], navi.BIN_THRESHOLD) / 100 for row in out["error_3d"]], np.float32)
    return recall_cm, recall_px, 100 * navi.binned(per_pair, out["angle"])


def _placed(
    store: Path, shard: tuple[int, int] | None, score: Callable[[int, int], dict[str, np.ndarray]], names: list[str], identity: dict[str, Any]
) -> tuple[dict[str, np.ndarray] | None, list[int]]:
    """Every pair's numbers in pair order, or, on a shard that finished before the others, (None, the shards missing):
    the shard's contiguous share of the pairs (whole blocks) saved as ``results/correspond-navi-part-i-of-n``."""
    if shard is None:
        return score(0, len(names)), []
    which, (a, b) = shards.share(shard, len(names), BLOCK)
    got = score(a, b)
    part = lazy_dask.xarray().Dataset({key: (("pair", "match", "xy")[: v.ndim], v) for key, v in got.items()}, coords={"pair": names[a:b]})
    found, missing = shards.exchange(store, RESULT, which, part, identity)
    if missing:
        return None, missing
    return {key: np.concatenate([np.asarray(q[key].values) for q in found], axis=0) for key in got}, []


def run(inputs: Inputs, settings, context: RunContext) -> NaviReport:
    """Score the NAVI panel's pairs with the network of ``inputs.store``; save ``results/correspond-navi`` in it."""
    from ..protocols.correspond import SPAIR_ONLY, not_for
    from ..store import cache, parts
    from ..store.backbone import Backbone, forget, remember

    not_for(settings, SPAIR_ONLY, "NAVI")
    store = Path(inputs.store)
    if not (store / "zarr.json").is_file():
        raise ProbeError(store, "is not a probe store", "pass a store written by probe extract: its checkpoint runs on the NAVI views")
    meta = cache.manifest(store)
    info = meta.get("checkpoint") or {}
    ck = parts.store_checkpoint(meta, store, "NAVI correspondence (the network runs on the views the labels cut)")
    seed = PAIR_SEED if settings.seed is None else int(settings.seed)
    labels = context.read("panel", navi_read.read_navi, purpose="correspond: score", checkpoint=ck.sha256, seed=seed)
    start = time.perf_counter()
    device = str(context.device(auto="cpu"))
    load = (("heads", (meta.get("arch") or {}).get("heads")), ("convert", bool(info.get("converted"))), ("checked_sha256", ck.sha256))
    job = Job(
        str(Path(str(info.get("path"))).resolve()),
        ck.sha256,
        str(meta.get("network", "teacher")),
        device,
        load,
        ck.arch.patch,
        str(labels.root),
        tuple(labels.images),
        tuple(labels.pairs),
        tuple(sorted(labels.depth_sha256.items())),
        settings.num_corr,
        settings.scale_factor,
    )
    remember(job.checkpoint, job.sha256, job.network, job.device, Backbone.from_checkpoint(ck).to(device))
    names = [f"{labels.images[i].object}/{labels.images[i].id}-{labels.images[j].id}" for i, j in labels.pairs]
    k = settings.num_corr
    progress = context.task("correspond", len(names))

    def score(a: int, b: int) -> dict[str, np.ndarray]:
        if b <= a:
            return {
                "error_3d": np.zeros((0, k), np.float32),
                "error_2d": np.zeros((0, k), np.float32),
                "source_uv": np.zeros((0, k, 2), np.float32),
                "target_uv": np.zeros((0, k, 2), np.float32),
                "matches": np.zeros(0, np.int32),
                "angle": np.zeros(0, np.float32),
            }
        with context.placed() as where:
            return map_blocks(
                partial(pair_block, job=job),
                lambda s, e: {"index": np.arange(s, e)},
                [(s, min(s + BLOCK, b)) for s in range(a, b, BLOCK)],
                workers=where.workers,
                client=where.client,
                progress=progress,
            )

    identity = {
        "panel": labels.panel.name,
        "block": BLOCK,
        "num_corr": int(k),
        "scale_factor": float(settings.scale_factor),
        "seed": seed,
        "checkpoint": ck.sha256,
        "pairs_sha256": shards.images_sha256(names),
    }
    try:
        out, missing = _placed(store, context.shard(), score, names, identity)
        source_view, target_view = shown_views(job, SHOWN) if out is not None else (None, None)
    finally:
        forget()
    if out is None:
        empty = np.full(len(BIN_NAMES), np.nan)
        return context.finish(
            NaviReport(store, store.name, labels.panel.name, empty[:3], empty[:3], empty, {}, labels.entry_id, time.perf_counter() - start, waiting=missing)
        )
    recall_cm, recall_px, binned = _scores(out)
    counts = {"images": len(labels.images), "pairs": len(names), "correspondences": int(out["matches"].sum()), "pairs_short": int((out["matches"] < k).sum())}
    report = NaviReport(store, store.name, labels.panel.name, recall_cm, recall_px, binned, counts, labels.entry_id, time.perf_counter() - start)
    ds = lazy_dask.xarray().Dataset(
        {
            "recall_cm": ("cm", recall_cm),
            "recall_px": ("px", recall_px),
            "binned": ("bin", binned),
            "error_3d": (("pair", "match"), out["error_3d"]),
            "error_2d": (("pair", "match"), out["error_2d"]),
            "source_uv": (("pair", "match", "xy"), out["source_uv"]),
            "target_uv": (("pair", "match", "xy"), out["target_uv"]),
            "matches": ("pair", out["matches"]),
            "angle": ("pair", out["angle"]),
            "source_view": (("shown", "y", "x", "rgb"), source_view),
            "target_view": (("shown", "y", "x", "rgb"), target_view),
        },
        coords={
            "cm": [t * 100 for t in navi.CM],
            "px": list(navi.PX),
            "bin": list(BIN_NAMES),
            "pair": names,
            "source": ("pair", [labels.images[i].key for i, _ in labels.pairs]),
            "target": ("pair", [labels.images[j].key for _, j in labels.pairs]),
            "shown": names[:SHOWN],
        },
    )
    attrs = {
        "settings": {
            "num_corr": int(k),
            "scale_factor": float(settings.scale_factor),
            "seed": seed,
            "side": navi.SIDE,
            "stride": STRIDE,
            "max_angle": MAX_ANGLE,
            "bin_threshold_m": navi.BIN_THRESHOLD,
        },
        "feature": "last-block patch tokens (before any final norm) of the 512 view (a /14 network's zero-padded to 518), upsampled bicubically "
        "to 128 x 128, L2-normalised",
        "checkpoint": {"path": job.checkpoint, "sha256": ck.sha256, "network": job.network},
        "ledger": labels.entry_id,
        "panel": {"name": labels.panel.name, "role": labels.panel.role, "split": labels.panel.split},
        "counts": counts,
        "bins_mean": report.bins_mean,
        "source": "mbanani/probe3d evaluate_navi_correspondence.py, evals/datasets/navi.py, evals/utils/correspondence.py",
        "provenance": result_provenance(cache.open_store(store), context.command),
    }
    return context.finish(report, Saving(store, RESULT, ds, attrs))
