"""The decode, score and sweep pipelines behind ``probe decode``, ``probe score`` and
``probe decode-sweep``: read the store, decode without labels, write masks, and only then read
a panel's labels through the ledger.

Results written into the store (``cache.save_results``):

- ``decoder``: the patch masks and their numbers, and each image's first Fiedler vector and
  seed (``masks.decoder_dataset``), attrs ``manifest``,
  ``settings``, ``settings_source``, ``size``, ``seconds``, ``provenance``.
- ``scores_<panel>``: ``segm``/``bbox`` (metric), ``corloc``, ``mean_best_iou``, ``corloc_hit`` and
  ``first_box_iou`` (image), ``best_iou`` and ``object_image`` (object); attrs ``ledger_entry``,
  ``panel``, ``role``, ``settings``, ``manifest``, ``counts``.
- ``sweep_<panel>``: one row per setting: the settings' columns and every score (setting);
  attrs ``ledger_entry``, ``best``, ``metric``.

Settings resolution for ``probe decode``: options given on the command line, over the settings
file (``--settings``, else ``<cache>/decoder-settings.json`` written by the sweep, unless
``--preset`` is given), over the preset's defaults.
"""

from __future__ import annotations

import itertools
import json
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import xarray as xr
from threadpoolctl import threadpool_limits

from ..analyses.decoder import Decoded, ImageMasks, Settings, collate, cosines, decode_image
from ..infra import provenance
from ..infra.atomic import write_json
from ..infra.errors import ProbeError
from ..labels.masks import coco_results, decoder_dataset
from ..labels.panels import LabelRead, read_labels
from ..labels.scoring import METRICS, Scores, evaluate
from ..store import cache

SETTINGS_FILE = "decoder-settings.json"

# The default sweep: 2 rules × 2 centrings × 6 τ × 2 ε × 3 mask counts = 144 settings.
DEFAULT_GRID: dict[str, list] = {
    "preset": ["tokencut", "maskcut"],  # the foreground rule; centring is its own axis
    "center": [True, False],
    "tau": [0.0, 0.1, 0.15, 0.2, 0.25, 0.3],
    "eps": [1e-5, 1e-3],
    "masks": [1, 2, 3],
}


# ----------------------------------------------------------------------------------------------
# settings


def settings_path(cache_dir: str | Path | None) -> Path:
    return cache.cache_root(cache_dir) / SETTINGS_FILE


def resolve_settings(
    *, preset: str | None, overrides: dict[str, Any], settings_file: Path | None, cache_dir: str | Path | None
) -> tuple[Settings, str]:
    """(settings, where they came from): options > settings file > preset defaults."""
    if preset is None:
        path = settings_file or settings_path(cache_dir)
        if settings_file is not None and not path.is_file():
            raise ProbeError(path, "does not exist", "run `probe decode-sweep` or drop --settings")
        if path.is_file():
            try:
                stored = json.loads(path.read_text())["settings"]
                base = Settings(**{k: v for k, v in stored.items() if k in Settings.__dataclass_fields__})
            except (ValueError, KeyError, TypeError) as error:
                raise ProbeError(path, f"is not a decoder settings file ({error})", "rerun `probe decode-sweep` or delete it") from None
            changed = {k: v for k, v in overrides.items() if v is not None}
            return base.with_(**changed), f"{path}" + (f" + {sorted(changed)}" if changed else "")
        preset = "centred"
    return Settings.from_preset(preset, **overrides), f"preset {preset}"


# ----------------------------------------------------------------------------------------------
# decoding a store


@dataclass
class StoreKeys:
    store: Path
    manifest: dict[str, Any]
    image_ids: list[str]
    heights: np.ndarray
    widths: np.ndarray
    keys: xr.DataArray  # (image, patch, channel), lazy
    checkpoint: str | None


def open_keys(store: str | Path, size: int = 480) -> StoreKeys:
    ds = cache.open_store(store)
    keys = cache.require(ds, f"keys_{size}")
    meta = cache.manifest(ds)
    if ds.sizes.get("image", 0) == 0:
        raise ProbeError(store, "has no finished images", "run `probe extract` to completion first")
    return StoreKeys(
        store=Path(store),
        manifest=meta,
        image_ids=[str(v) for v in ds["image"].values],
        heights=ds["image_height"].values.astype(np.int64),
        widths=ds["image_width"].values.astype(np.int64),
        keys=keys,
        checkpoint=(meta.get("checkpoint") or {}).get("sha256"),
    )


def _blocks(keys: xr.DataArray, step: int = 16):
    n = keys.sizes["image"]
    for start in range(0, n, step):
        yield start, np.asarray(keys.isel(image=slice(start, min(start + step, n))).values)


def decode_keys(keys: xr.DataArray, settings: Settings, on_image: Callable[[], None] | None = None, threads: int = 1) -> Decoded:
    """Decode every image of a lazy (image, patch, channel) array, block by block.

    BLAS runs with ``threads`` threads: one image's problems are small, and a busy machine
    makes multi-threaded OpenBLAS spin (60× slower measured on the shared 2-core box).
    """
    results: list[ImageMasks] = []
    with threadpool_limits(limits=threads):
        for _, block in _blocks(keys):
            for k in block:
                results.append(decode_image(k, settings))
                if on_image:
                    on_image()
    return collate(results, settings, keys.sizes["patch"])


@dataclass
class DecodeReport:
    store: Path
    settings: Settings
    settings_source: str
    n_images: int
    n_masks: int
    degenerate: int
    dense_solves: int
    seconds: float
    masks_file: Path
    scores: Scores | None = None
    ledger_entry: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out = {
            "store": str(self.store),
            "settings": self.settings.as_dict(),
            "settings_source": self.settings_source,
            "images": self.n_images,
            "masks": self.n_masks,
            "degenerate": self.degenerate,
            "dense_solves": self.dense_solves,
            "seconds": round(self.seconds, 3),
            "masks_file": str(self.masks_file),
        }
        if self.scores is not None:
            out.update(scores=self.scores.table(), counts=self.scores.counts, ledger_entry=self.ledger_entry)
        return out


def _meta_path(masks_file: Path) -> Path:
    return masks_file.with_name(masks_file.name.removesuffix(".json") + ".meta.json")


def run_decode(
    store: str | Path,
    settings: Settings,
    *,
    settings_source: str = "",
    size: int = 480,
    out: str | Path | None = None,
    panel: str | None = None,
    unseal: str | None = None,
    cache_dir: str | Path | None = None,
    on_start: Callable[[int], Callable[[], None]] | None = None,
    threads: int = 1,
) -> DecodeReport:
    """Decode a store (label-free), save ``results/decoder`` and the masks JSON; score on a panel."""
    src = open_keys(store, size)
    tick = on_start(len(src.image_ids)) if on_start else None
    t0 = time.perf_counter()
    decoded = decode_keys(src.keys, settings, tick, threads)
    seconds = time.perf_counter() - t0
    cache.save_results(
        src.store,
        "decoder",
        decoder_dataset(decoded, src.image_ids),
        {"manifest": src.manifest, "settings": settings.as_dict(), "settings_source": settings_source, "size": size,
         "seconds": seconds, "provenance": provenance.stamp()},
    )
    masks_file = Path(out) if out else cache.results_path(src.store, "decoder-masks.json")
    report = DecodeReport(
        store=src.store, settings=settings, settings_source=settings_source, n_images=len(src.image_ids),
        n_masks=int(decoded.n_masks.sum()), degenerate=int(decoded.degenerate.sum()),
        dense_solves=int(decoded.dense_solves.sum()), seconds=seconds, masks_file=masks_file,
    )
    coco_ids = None
    labels: LabelRead | None = None
    if panel is not None:  # the masks exist and are saved before any label is read
        labels = read_labels(panel, purpose="score", checkpoint=src.checkpoint, images=src.image_ids, unseal=unseal, cache=cache_dir)
        coco_ids = labels.image_map
    results = coco_results(decoded, src.image_ids, src.heights, src.widths, coco_ids)
    write_json(masks_file, results)
    write_json(_meta_path(masks_file), {"store": str(src.store.resolve()), "checkpoint": src.checkpoint, "settings": settings.as_dict(),
                                        "panel": panel, "image_id": "panel COCO id" if panel else "store position"})
    if labels is not None:
        report.scores = evaluate(labels.coco, results)
        report.ledger_entry = labels.entry_id
        save_scores(src.store, report.scores, labels, settings, src.manifest, masks_file)
    return report


# ----------------------------------------------------------------------------------------------
# scoring


def scores_dataset(scores: Scores, labels: LabelRead) -> xr.Dataset:
    """Scores as an xarray Dataset (dims metric, image, object); ids are store ids where known."""
    inverse = {v: k for k, v in labels.image_map.items()}
    files = {i: labels.coco.imgs[i].get("file_name", str(i)) for i in scores.image_ids}
    name = lambda i: inverse.get(i, files.get(i, str(i)))  # noqa: E731
    return xr.Dataset(
        {
            "segm": ("metric", [scores.segm[m] for m in METRICS]),
            "bbox": ("metric", [scores.bbox[m] for m in METRICS]),
            "corloc": ((), scores.corloc),
            "mean_best_iou": ((), scores.mean_best_iou),
            "corloc_hit": ("image", scores.corloc_hit),
            "first_box_iou": ("image", scores.first_box_iou),
            "coco_image_id": ("image", np.asarray(scores.image_ids, dtype=np.int64)),
            "best_iou": ("object", scores.best_iou),
            "object_image": ("object", np.asarray([name(int(i)) for i in scores.object_images], dtype=object)),
        },
        coords={
            "metric": list(METRICS),
            "image": np.asarray([name(i) for i in scores.image_ids], dtype=object),
            "object": scores.object_ids,
        },
    )


def save_scores(store: Path, scores: Scores, labels: LabelRead, settings: Settings | dict | None, manifest: dict | None, masks_file: Path | None) -> Path:
    attrs = {
        "ledger_entry": labels.entry_id,
        "panel": labels.panel.name,
        "role": labels.panel.role,
        "settings": settings.as_dict() if isinstance(settings, Settings) else (settings or {}),
        "manifest": manifest or {},
        "counts": scores.counts,
        "masks_file": str(masks_file) if masks_file else "",
        "units": "fractions in [0, 1]",
        "provenance": provenance.stamp(),
    }
    return cache.save_results(store, f"scores_{labels.panel.name}", scores_dataset(scores, labels), attrs)


@dataclass
class ScoreReport:
    scores: Scores
    ledger_entry: str
    saved: Path | None


def run_score(masks_file: str | Path, panel: str, *, unseal: str | None = None, cache_dir: str | Path | None = None) -> ScoreReport:
    """Score a masks JSON on a panel; images are matched by the entries' ``file_name``."""
    masks_file = Path(masks_file)
    try:
        results = json.loads(masks_file.read_text())
        if not isinstance(results, list):
            raise ValueError("not a list of results")
    except (OSError, ValueError) as error:
        raise ProbeError(masks_file, f"is not a COCO results JSON ({error})", "pass the file `probe decode --out` wrote") from None
    meta_path = _meta_path(masks_file)
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if any("file_name" not in r for r in results):
        raise ProbeError(masks_file, "has results without file_name, so they cannot be matched to a panel", "score masks written by `probe decode`")
    names = sorted({r["file_name"] for r in results})
    labels = read_labels(panel, purpose="score", checkpoint=meta.get("checkpoint"), images=names, unseal=unseal, cache=cache_dir)
    mapped = [dict(r, image_id=labels.image_map[r["file_name"]]) for r in results if r["file_name"] in labels.image_map]
    scores = evaluate(labels.coco, mapped)
    saved = None
    store = Path(meta["store"]) if meta.get("store") else None
    if store is not None and (store / "zarr.json").is_file():
        saved = save_scores(store, scores, labels, meta.get("settings"), cache.manifest(store), masks_file)
    return ScoreReport(scores=scores, ledger_entry=labels.entry_id, saved=saved)


# ----------------------------------------------------------------------------------------------
# the sweep


def load_grid(path: str | Path | None) -> list[Settings]:
    """The settings of a grid file (TOML lists per axis; a missing axis keeps the centred preset's value)."""
    axes = dict(DEFAULT_GRID)
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ProbeError(path, f"is not a readable TOML grid ({error})", "see DEFAULT_GRID in probe_toolkit/commands/decode.py") from None
        unknown = set(data) - set(DEFAULT_GRID)
        if unknown:
            raise ProbeError(path, f"has unknown axes {sorted(unknown)}", f"use {', '.join(DEFAULT_GRID)}")
        centred = Settings.from_preset("centred")
        axes = {k: list(data[k]) if k in data else [getattr(centred, k) if k != "preset" else "tokencut"] for k in DEFAULT_GRID}
    out = []
    for preset, center, tau, eps, masks in itertools.product(*(axes[k] for k in DEFAULT_GRID)):
        out.append(Settings.from_preset(str(preset), center=bool(center), tau=float(tau), eps=float(eps), masks=int(masks)))
    return out


def _prefix(decoded: Decoded, k: int, settings: Settings) -> Decoded:
    """The first k masks of a loop run for more: the loop is deterministic, so they are equal."""
    n = np.minimum(decoded.n_masks, k)
    sl = slice(0, k)
    return Decoded(
        masks=decoded.masks[:, sl], score=decoded.score[:, sl], lambda2=decoded.lambda2[:, sl], lambda3=decoded.lambda3[:, sl],
        gap=decoded.gap[:, sl], ncut=decoded.ncut[:, sl], n_masks=n, degenerate=decoded.degenerate, stop=decoded.stop,
        dense_solves=decoded.dense_solves, cuts=decoded.cuts, settings=settings, fiedler=decoded.fiedler, seed=decoded.seed,
    )


@dataclass
class SweepReport:
    table: list[dict[str, Any]]  # one row per setting: settings + scores
    best: Settings
    best_row: dict[str, Any]
    metric: str
    ledger_entry: str
    settings_file: Path


def run_sweep(
    store: str | Path,
    panel: str,
    *,
    grid: str | Path | None = None,
    metric: str = "segm_AP",
    settings_out: str | Path | None = None,
    unseal: str | None = None,
    cache_dir: str | Path | None = None,
    on_start: Callable[[int], Callable[[], None]] | None = None,
    threads: int = 1,
) -> SweepReport:
    """Decode every setting of the grid (label-free), read the panel once, score every setting."""
    settings_list = load_grid(grid)
    known = [f"segm_{m}" for m in METRICS] + [f"bbox_{m}" for m in METRICS] + ["corloc", "mean_best_iou"]
    if metric not in known:
        raise ProbeError(None, f"--metric {metric!r} is not one of {', '.join(known)}", "use --metric segm_AP")
    src = open_keys(store)
    # one decode per (rule, centring, τ, ε), run for the most masks any setting of the group asks
    groups: dict[tuple, int] = {}
    for s in settings_list:
        key = (s.preset, s.center, s.tau, s.eps)
        groups[key] = max(groups.get(key, 0), s.masks)
    per_group: dict[tuple, list[ImageMasks]] = {key: [] for key in groups}
    tick = on_start(len(src.image_ids)) if on_start else None
    with threadpool_limits(limits=threads):
        for _, block in _blocks(src.keys):
            for keys in block:
                cos = {c: cosines(keys, center=c) for c in {key[1] for key in groups}}
                for key, most in groups.items():
                    preset, center, tau, eps = key
                    s = Settings.from_preset(preset, center=center, tau=tau, eps=eps, masks=most)
                    per_group[key].append(decode_image(keys, s, cos=cos[center]))
                if tick:
                    tick()
    decoded = {key: collate(rows, Settings.from_preset(key[0], center=key[1], tau=key[2], eps=key[3], masks=groups[key]), src.keys.sizes["patch"])
               for key, rows in per_group.items()}
    # every mask exists before the labels are read, once, for the whole grid
    labels = read_labels(panel, purpose=f"sweep of {len(settings_list)} decoder settings", checkpoint=src.checkpoint,
                         images=src.image_ids, unseal=unseal, cache=cache_dir)
    full_results = {key: coco_results(d, src.image_ids, src.heights, src.widths, labels.image_map) for key, d in decoded.items()}
    table = []
    for s in settings_list:
        key = (s.preset, s.center, s.tau, s.eps)
        results = [r for r in full_results[key] if r["mask"] < s.masks]
        scores = evaluate(labels.coco, results)
        d = _prefix(decoded[key], s.masks, s)
        table.append({"preset": s.preset, "rule": s.rule, "center": s.center, "tau": s.tau, "eps": s.eps, "masks": s.masks,
                      **scores.table(), "degenerate": int(d.degenerate.sum()), "mean_masks": float(d.n_masks.mean())})
    values = np.array([row[metric] for row in table], dtype=np.float64)
    best_index = int(np.nanargmax(values)) if np.isfinite(values).any() else 0  # first of equals: grid order
    best = settings_list[best_index]
    settings_file = Path(settings_out) if settings_out else settings_path(cache_dir)
    write_json(settings_file, {
        "settings": best.as_dict(),
        "chosen_by": {"panel": labels.panel.name, "role": labels.panel.role, "ledger_entry": labels.entry_id, "metric": metric,
                      "value": table[best_index][metric], "grid_size": len(settings_list), "store": str(src.store.resolve()),
                      "checkpoint": src.checkpoint, "date": provenance.now()},
    })
    columns = list(table[0])
    sweep = xr.Dataset(
        {c: ("setting", np.asarray([row[c] for row in table], dtype=object if c in ("preset", "rule") else None)) for c in columns},
        coords={"setting": np.arange(len(table))},
    )
    cache.save_results(src.store, f"sweep_{labels.panel.name}", sweep,
                       {"ledger_entry": labels.entry_id, "metric": metric, "best": best_index, "manifest": src.manifest,
                        "provenance": provenance.stamp()})
    return SweepReport(table=table, best=best, best_row=table[best_index], metric=metric, ledger_entry=labels.entry_id, settings_file=settings_file)
