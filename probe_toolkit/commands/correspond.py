"""``probe correspond STORE --panel NAME``: SPair-71k keypoint correspondence (PCK) on frozen patch tokens.

As mbanani/probe3d's ``evaluate_spair_correspondence.py`` runs it (``analyses.correspond``): the
store's square800 view (``probe extract --panel NAME --views square800``), each category and
viewpoint bin (0, 1, 2 and every pair, each its own sample of at most 200 pairs drawn with Python's
``random`` seeded 20), PCK of the pooled keypoints per category, then the mean over the categories
that have pairs. Order, which the ledger shows: the store is checked for the panel's images and
the view (no label read), then the pairs are read once (purpose ``correspond: score``), then the
pairs are matched in blocks on the runner (``--workers``, ``--dask-address``), each pair on its own,
so the numbers are the same wherever they run. ``--shard i/n`` (or torchrun): shard i matches its
contiguous share of the sampled pairs (whole blocks) and saves it as ``results/correspond-part-i-of-n``;
the shard that finds every part in (``shards.collect``) scores them all and saves the record
(every shard reads the pairs' annotations: the sample is drawn from them). Results ``results/correspond``:

    pck            (category, bin, threshold)   percent; NaN where a category has no pair in a bin
    pck_mean       (bin, threshold)             the mean over the categories with pairs
    error          (pair, keypoint)             float32, in units of the target box's larger side (NaN: not in both)
    predicted      (pair, keypoint, xy)         the matched patch's corner, a fraction of the view's side
    target_xy, source_xy (pair, keypoint, xy)   the keypoints in the view's pixels (-1: not annotated)
    sampled        (bin, pair)                  whether a pair is in the bin's sample of its category
    coords: category, bin ("0", "1", "2", "all"), threshold, pair (file names), pair_category, viewpoint,
            source, target (store ids)
    attrs: settings, view, view_text, ledger, panel, counts, tokens dtype, source, provenance
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analyses import correspond
from ..infra.errors import ProbeError
from ..infra.runner import map_blocks
from ..infra.settings import SettingError
from ..labels import spair_read
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.correspond import CorrespondSettings
from ..results.correspond_report import BIN_NAMES, CorrespondReport
from ..store import arrays, cache, grids, images
from ..store.sources import new_store_command, stale_fix
from . import shards
from .panel_stores import image_sizes, locate, panel_ids
from .runs import result_provenance
from .shards import images_sha256

if TYPE_CHECKING:
    import xarray as xr

VIEW = images.SQUARE
BLOCK = 64  # pairs per runner task (a category's pairs share images: each is read and normalised once a block)


def pair_block(
    images: np.ndarray, source: np.ndarray, target: np.ndarray, source_kps: np.ndarray, target_kps: np.ndarray, scale: np.ndarray, *, rows: int, cols: int, side: int
) -> dict[str, np.ndarray]:
    """A block of pairs: ``images`` (m, rows · cols, D) tokens of the block's distinct images (each
    normalised once), ``source``/``target`` (n,) their rows, keypoints (n, K, 3) → ``error`` (n, K)
    float32 (NaN where a keypoint is not in both) and ``predicted`` (n, K, 2). Each pair on its own."""
    import torch

    n, k = source_kps.shape[:2]
    error = np.full((n, k), np.nan, np.float32)
    predicted = np.full((n, k, 2), np.nan, np.float32)
    with torch.no_grad():
        grids = [correspond.normalised(t, rows, cols) for t in images]
        for i in range(n):
            got = correspond.match(grids[int(source[i])], grids[int(target[i])], source_kps[i], target_kps[i], float(scale[i]), side)
            error[i, got.index] = got.error
            predicted[i, got.index] = got.predicted
    return {"error": error, "predicted": predicted}


def shard_pairs(
    store: Path, shard: tuple[int, int], n_pairs: int, match: Callable[[int, int], dict[str, np.ndarray]], names: Sequence[str], identity: dict[str, Any]
) -> tuple[dict[str, np.ndarray] | None, list[int]]:
    """This shard's pairs [a, b) (whole blocks of ``BLOCK``: the blocks of a one-process run)
    matched and saved as ``results/correspond-part-i-of-n``; (every pair's errors and matches in
    pair order, []) once every part with this ``identity`` is in, else (None, the shards missing)."""
    import xarray as xr

    which, (a, b) = shards.share(shard, n_pairs, BLOCK)
    got = match(a, b)
    part = xr.Dataset({"error": (("pair", "keypoint"), got["error"]), "predicted": (("pair", "keypoint", "xy"), got["predicted"])}, coords={"pair": list(names[a:b])})
    identity = {**identity, "pairs": int(n_pairs)}
    parts, missing = shards.exchange(store, "correspond", which, part, identity)
    if missing:
        return None, missing
    return {name: np.concatenate([np.asarray(q[name].values) for q in parts], axis=0) for name in ("error", "predicted")}, []


def _sizes(ds: xr.Dataset, ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    if "image_width" not in ds or "image_height" not in ds:
        held = ds.attrs.get("store")
        raise ProbeError(held, "does not record its images' sizes (written before stores did)", f"extract its images again into a new store: `{new_store_command(held)}`")
    return dict(zip(ids, image_sizes(ds, ids)))


def run(inputs: Inputs, settings: CorrespondSettings, context: RunContext) -> CorrespondReport:
    """Score the panel's pairs on the store's square800 tokens; save ``results/correspond``. The
    blocks of pairs run where the context places them; a shard matches its share, the last shard to
    finish scores every part (``shard_pairs``)."""
    from ..labels import navi
    from ..protocols.correspond import NAVI_ONLY, SPAIR_SEED, not_for

    the_panel = context.panel("panel")  # its kind and seal checked before the run
    if the_panel.kind == navi.KIND:
        from .correspond_navi import run as run_navi

        return run_navi(inputs, settings, context)
    not_for(settings, NAVI_ONLY, "SPair-71k")
    if context.gpu_asked():
        raise SettingError("device", "a SPair-71k panel is scored on the store's tokens, on the CPU", "drop device: it runs NAVI's network")
    thresholds, instances = tuple(float(t) for t in settings.thresholds), settings.instances
    seed = SPAIR_SEED if settings.seed is None else settings.seed
    store = inputs.store
    source = locate(store, [(the_panel, panel_ids(the_panel))], "patch", (VIEW,), plain=True)  # xarray only to save the result
    ds, ids = source.panel_stores[the_panel.name]
    rows, cols = grids.fixed_grid(ds, VIEW)
    meta = source.manifest
    checkpoint = str((meta.get("checkpoint") or {}).get("sha256", "?"))
    sizes = _sizes(ds, ids)
    labels = context.read("panel", spair_read.read_pairs, purpose="correspond: score", checkpoint=checkpoint, images=ids)
    store_id = {name: sid for sid, name in labels.image_map.items()}
    for pair in labels.pairs:
        for image, size in ((pair.source, pair.source_size), (pair.target, pair.target_size)):
            if sizes[store_id[image]] != size:
                held = Path(ds.attrs["store"])  # the panel's own store, or this one
                raise ProbeError(held, f"holds {image} at {sizes[store_id[image]]}, its annotation says {size}", stale_fix(held))
    start = time.perf_counter()
    categories = sorted({p.category for p in labels.pairs})
    samples = {(c, b): correspond.sample(labels.pairs, c, v, instances, seed) for c in categories for b, v in zip(BIN_NAMES, correspond.BINS)}
    chosen = list({p.name: p for group in samples.values() for p in group}.values())
    chosen.sort(key=lambda p: p.name)
    index = {p.name: i for i, p in enumerate(chosen)}
    k = max([len(p.source_kps) for p in chosen], default=1)

    def kps(points, size) -> np.ndarray:
        out = np.zeros((k, 3), np.int32)
        out[: len(points)] = correspond.view_keypoints(points, size)
        return out

    src_kps = np.stack([kps(p.source_kps, p.source_size) for p in chosen]) if chosen else np.zeros((0, k, 3), np.int32)
    trg_kps = np.stack([kps(p.target_kps, p.target_size) for p in chosen]) if chosen else np.zeros((0, k, 3), np.int32)
    scale = np.array([correspond.threshold_scale(p.target_box, p.target_size) for p in chosen], np.float64)
    tokens = cache.require(ds, f"tokens_{VIEW}")

    def read(a: int, b: int) -> dict[str, np.ndarray]:
        wanted = sorted({store_id[p.source] for p in chosen[a:b]} | {store_id[p.target] for p in chosen[a:b]})
        row = {sid: j for j, sid in enumerate(wanted)}
        return {
            "images": tokens.sel(image=wanted).values,
            "source": np.array([row[store_id[p.source]] for p in chosen[a:b]]),
            "target": np.array([row[store_id[p.target]] for p in chosen[a:b]]),
            "source_kps": src_kps[a:b],
            "target_kps": trg_kps[a:b],
            "scale": scale[a:b],
        }

    def match(a: int, b: int) -> dict[str, np.ndarray]:
        if b <= a:
            return {"error": np.zeros((0, k), np.float32), "predicted": np.zeros((0, k, 2), np.float32)}
        with context.placed() as where:
            return map_blocks(
                partial(pair_block, rows=rows, cols=cols, side=correspond.SIDE),
                read,
                [(s, min(s + BLOCK, b)) for s in range(a, b, BLOCK)],
                workers=where.workers,
                client=where.client,
                progress=progress,
            )

    progress = context.task("correspond", len(chosen))

    if context.sharded:
        identity = {
            "view": VIEW,
            "instances": int(instances),
            "seed": int(seed),
            "block": BLOCK,
            "keypoints": int(k),
            "panel": the_panel.name,
            "pairs_sha256": images_sha256([p.name for p in chosen]),
            "images_sha256": images_sha256([f"{store_id[p.source]}|{store_id[p.target]}" for p in chosen]),
        }
        out, missing = shard_pairs(store, context.shard(), len(chosen), match, [p.name for p in chosen], identity)
        if out is None:  # a shard that finished before the others
            empty = np.zeros((0, len(BIN_NAMES), len(thresholds)))
            return context.finish(
                CorrespondReport(
                    store, source.name, the_panel.name, categories, thresholds, empty, empty.sum(0), {}, labels.entry_id, time.perf_counter() - start, waiting=missing
                )
            )
    else:
        out = match(0, len(chosen))
    table = np.full((len(categories), len(BIN_NAMES), len(thresholds)), np.nan)
    sampled = np.zeros((len(BIN_NAMES), len(chosen)), bool)
    for c, category in enumerate(categories):
        for b, name in enumerate(BIN_NAMES):
            rows_of = [index[p.name] for p in samples[(category, name)]]
            sampled[b, rows_of] = True
            errors = out["error"][rows_of].ravel()
            errors = errors[np.isfinite(errors)]
            for t, threshold in enumerate(thresholds):
                table[c, b, t] = correspond.pck(errors, threshold) if rows_of else np.nan
    mean = correspond.class_average(table)
    seconds = time.perf_counter() - start
    counts = {"pairs_in_panel": len(labels.pairs), "pairs_matched": len(chosen), "categories": len(categories), "keypoints_scored": int(np.isfinite(out["error"]).sum())}
    dtype = str(tokens.dtype)
    report = CorrespondReport(store, source.name, the_panel.name, categories, thresholds, table, mean, counts, labels.entry_id, seconds, dtype=dtype)
    import xarray as xr

    ds_out = xr.Dataset(
        {
            "pck": (("category", "bin", "threshold"), table),
            "pck_mean": (("bin", "threshold"), mean),
            "error": (("pair", "keypoint"), out["error"]),
            "predicted": (("pair", "keypoint", "xy"), out["predicted"]),
            "source_xy": (("pair", "keypoint", "xy"), np.where(src_kps[..., 2:] == 1, src_kps[..., :2], -1).astype(np.int32)),
            "target_xy": (("pair", "keypoint", "xy"), np.where(trg_kps[..., 2:] == 1, trg_kps[..., :2], -1).astype(np.int32)),
            "sampled": (("bin", "pair"), sampled),
        },
        coords={
            "category": categories,
            "bin": list(BIN_NAMES),
            "threshold": list(thresholds),
            "pair": [p.name for p in chosen],
            "pair_category": ("pair", [p.category for p in chosen]),
            "viewpoint": ("pair", np.array([p.viewpoint for p in chosen], np.int32)),
            "source": ("pair", [store_id[p.source] for p in chosen]),
            "target": ("pair", [store_id[p.target] for p in chosen]),
        },
    )
    attrs = {
        "settings": {"thresholds": list(thresholds), "instances": int(instances), "seed": int(seed), "side": correspond.SIDE},
        "view": VIEW,
        "view_text": arrays.geometry(VIEW),
        "grid": [int(rows), int(cols)],
        "tokens_dtype": dtype,
        "feature": "last-block patch tokens (before any final norm), L2-normalised per patch; source keypoints sampled bilinearly (align_corners)",
        "ledger": labels.entry_id,
        "image_source": str(cache.manifest(ds).get("image_source") or ""),
        "panel": {"name": the_panel.name, "role": the_panel.role, "split": the_panel.split},
        "counts": counts,
        "source": "mbanani/probe3d evaluate_spair_correspondence.py, evals/datasets/spair.py, configs/spair_correspondence.yaml",
        "provenance": result_provenance(ds, context.command),
    }
    return context.finish(report, Saving(store, "correspond", ds_out, attrs))
