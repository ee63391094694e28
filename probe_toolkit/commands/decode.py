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
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..analyses.decoder import Decoded, collate, decode_image
from ..analyses.decoder_settings import SINGLE, Settings
from ..analyses.decoder_blocks import ARRAYS, as_decoded, check_backend, decode_block, default_workers, group_arrays, sweep_block
from ..infra import lazy_dask, provenance
from ..infra.atomic import write_json
from ..infra.errors import IntegrityError, ProbeError
from ..infra.placement import launcher_shard
from ..infra.runner import Where, map_images, placed
from ..labels.masks import coco_results, decoder_dataset
from ..labels import saliency
from ..labels.panels import LabelRead, check_readable, read_labels
from ..labels.scoring import METRICS, Scores, evaluate
from ..store import cache, own_size
from ..results import records
from ..store.completion import computed_on
from ..store.grids import view_grid
from .decode_shards import decode_shard, sweep_shard

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreArray, StoreData

SETTINGS_FILE = "decoder-settings.json"
# the views of each image at its own size, zero-padded up, cut down or resized to whole patches
# (store.own_size, torch-free), and how a warning names each
OWN_SIZE = own_size.DESCRIBED
# the view TokenCut's saliency table was computed on (unsupervised_saliency_detection/get_saliency.py)
SALIENCY_VIEW = {"tokencut": own_size.NATIVE_RESIZED}

# The default sweep: 2 rules × 2 centrings × 6 τ × 2 ε × 3 mask counts = 144 settings.
DEFAULT_GRID: dict[str, list] = {
    "preset": ["tokencut", "maskcut", "lost", "dsm"],  # the rule; centring is its own axis (lost, dsm: 2 settings each)
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
    keys: StoreArray  # (image, patch, channel), lazy, read with zarr alone (store.direct)
    checkpoint: str | None
    view: str = "480"
    grids: np.ndarray | None = None  # (image, 2) rows, cols of an own-size view; None for the square views
    patch: int = 0  # the own-size view's patch size in pixels
    data: StoreData | None = None  # the opened store, for the runner inputs read beside the keys

    def store_array(self, name: str) -> StoreArray:
        """Another array of the store at the keys' images, as a runner input (a cluster worker reads it by name)."""
        return cache.require(self.data, name)

    def grid_arrays(self) -> dict[str, StoreArray]:
        """The per-image grid as runner inputs (``rows``, ``cols`` beside ``keys``); none for square views.
        They are the store's arrays, whose values ``native_grids`` checked."""
        if self.grids is None:
            return {}
        return {"rows": self.store_array(f"grid_rows_{self.view}"), "cols": self.store_array(f"grid_cols_{self.view}")}

    def with_grids(self, decoded: Decoded, start: int = 0, stop: int | None = None) -> Decoded:
        """``decoded`` (images [start, stop) of the store) carrying this view's per-image grid and
        patch size (its masks' geometry)."""
        if self.grids is not None:
            decoded.grids, decoded.patch, decoded.view = self.grids[start:stop], self.patch, self.view
        return decoded


def check_view(size: int | str) -> str:
    """``--view`` / ``--size``: an own-size view (native, native_crop, native_resized; ``-`` for ``_``
    accepted) or a fixed view's side in pixels (480 by default)."""
    view = str(size).strip().lower().replace("-", "_")
    if view not in OWN_SIZE and not view.isdigit():
        raise ProbeError(f"--view {view}", f"is neither {', '.join(OWN_SIZE)} nor a fixed view's size", "use --view 480, --view native, --view native_crop or --view native_resized")
    return view


def own_size_grid(heights: np.ndarray, widths: np.ndarray, patch: int, view: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) an own-size view must have (``own_size.cells``): ⌈H/p⌉ × ⌈W/p⌉ padded (native,
    as TokenCut's and LOST's code), ⌊H/p⌋ × ⌊W/p⌋ cut (native_crop, as DSM's extract.py),
    round(H/p) × round(W/p) resized (native_resized, as TokenCut's saliency code)."""
    return own_size.cells(heights, patch, view), own_size.cells(widths, patch, view)


def native_grids(store: str | Path, ds: xr.Dataset | StoreData, heights: np.ndarray, widths: np.ndarray, view: str = "native") -> tuple[np.ndarray, int]:
    """(image, 2) rows, cols of an own-size view and its patch, checked against the image's size
    (``own_size_grid``): a store whose grids disagree was not cut as its view says."""
    meta = cache.manifest(ds)
    patch = int(((meta.get("per_view") or {}).get(view) or {}).get("patch") or (meta.get("arch") or {}).get("patch") or 0)
    if patch < 1:
        raise ProbeError(store, f"does not record the {view} view's patch size", "extract the store again with this version")
    rows, cols = view_grid(ds, view)
    want_rows, want_cols = own_size_grid(heights, widths, patch, view)
    bad = np.flatnonzero((rows != want_rows) | (cols != want_cols))
    if bad.size:
        i = int(bad[0])
        edge = own_size.VERB[own_size.rule(view)]
        raise IntegrityError(store, f"image {ds['image'].values[i]}'s {view} grid {rows[i]} × {cols[i]} is not its {heights[i]} × {widths[i]} pixels "
                             f"{edge} to /{patch} ({bad.size} such images)", f"extract the {view} view again")
    return np.stack([rows, cols], axis=1), patch


def open_keys(store: str | Path, size: int | str = 480) -> StoreKeys:
    view = check_view(size)
    ds = cache.open_store(store, arrays=f"keys_{view}", plain=True)
    keys = cache.require(ds, f"keys_{view}")
    meta = cache.manifest(ds)
    if ds.sizes.get("image", 0) == 0:
        raise ProbeError(store, "has no finished images", "run `probe extract` to completion first")
    heights, widths = ds["image_height"].values.astype(np.int64), ds["image_width"].values.astype(np.int64)
    grids, patch = native_grids(store, ds, heights, widths, view) if view in OWN_SIZE else (None, 0)
    return StoreKeys(
        store=Path(store),
        manifest=meta,
        image_ids=[str(v) for v in ds["image"].values],
        heights=heights,
        widths=widths,
        keys=keys,
        checkpoint=(meta.get("checkpoint") or {}).get("sha256"),
        view=view,
        grids=grids,
        patch=patch,
        data=ds,
    )


def _ticks(on_image: Callable[[], None] | None) -> Callable[[int], None] | None:
    """A per-image tick as the runner's per-block progress."""
    if on_image is None:
        return None
    return lambda n: [on_image() for _ in range(n)]


def decode_keys(keys: xr.DataArray | StoreArray, settings: Settings, on_image: Callable[[], None] | None = None, threads: int = 1, *,
                where: Where = Where(), backend: str = "scipy", device: str = "cpu", grids: dict[str, StoreArray] | None = None,
                each: Callable[[int, int, dict[str, np.ndarray]], None] | None = None) -> Decoded:
    """Decode every image of a lazy (image, patch, channel) array, block by block, through the runner.

    Each image is computed alone with one BLAS thread (``threads`` when this process computes):
    one image's problems are small, and a busy machine makes multi-threaded OpenBLAS spin (60×
    slower measured on the shared 2-core box). Results do not depend on ``where``. ``grids``: an
    own-size view's ``rows`` and ``cols`` (``StoreKeys.grid_arrays``), read block by block beside the keys.
    ``each``: the runner's per-block hook (``BlockResults``).
    """
    fn = partial(decode_block, settings=settings, backend=backend, device=device)
    arrays = map_images(fn, {"keys": keys, **(grids or {})}, where=where, threads=threads, progress=_ticks(on_image), each=each)
    return as_decoded(arrays, settings)


def colour_task(src: StoreKeys, settings: Settings) -> tuple[Callable[..., dict[str, np.ndarray]], dict[str, Any]]:
    """DSM with its colour term as a runner task (``commands.decode_colour``): the block function
    and its arrays; each block reads its images' photographs from the store's ``image_source``."""
    from .decode_colour import colour_block

    source = src.manifest.get("image_source")
    if not source or not Path(source).is_dir():
        raise ProbeError(src.store, f"does not say where its photographs are (image_source {source!r})", "drop --color-lambda, or extract from an image folder")
    fn = partial(colour_block, settings=settings, source=str(source), patch=src.patch, padded=own_size.EDGE.get(src.view) == own_size.PAD)
    return fn, {"keys": src.keys, "names": src.store_array("image"), **src.grid_arrays()}


def decode_with_colour(src: StoreKeys, settings: Settings, on_image: Callable[[], None] | None = None, *, where: Where = Where()) -> Decoded:
    """DSM with its colour term, through the runner, every image of the store."""
    fn, arrays = colour_task(src, settings)
    arrays = map_images(fn, arrays, where=where, progress=_ticks(on_image), torch_free=True)  # PIL and scipy: workers may be forked
    return src.with_grids(as_decoded(arrays, settings))


class BlockResults:
    """The masks JSON's entries, encoded block by block as the runner hands the blocks over: this
    process draws and RLE-encodes one block's masks while the workers decode the next ones,
    instead of encoding every mask after the last block. Entries are kept by store position;
    ``entries`` gives them as ``labels.masks.coco_results`` does for the whole set."""

    def __init__(self, src: StoreKeys, settings: Settings) -> None:
        self.src, self.settings, self.parts = src, settings, []

    def __call__(self, a: int, b: int, arrays: dict[str, np.ndarray]) -> None:
        block = self.src.with_grids(as_decoded(arrays, self.settings), a, b)
        self.parts.append((a, coco_results(block, self.src.image_ids[a:b], self.src.heights[a:b], self.src.widths[a:b])))

    def add(self, decoded: Decoded) -> None:
        """A whole decode at once (the colour term's and the shards' paths)."""
        self(0, len(self.src.image_ids), {name: getattr(decoded, name) for name in ARRAYS})

    def entries(self, coco_ids: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """Every entry in image order; with ``coco_ids`` only that map's images, under their COCO ids."""
        if coco_ids is None:
            return [dict(r, image_id=a + r["image_id"]) for a, part in self.parts for r in part]
        return [dict(r, image_id=int(coco_ids[r["file_name"]])) for _, part in self.parts for r in part if r["file_name"] in coco_ids]


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
    masks_file: Path | None
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
            "masks_file": str(self.masks_file) if self.masks_file else None,
            **self.extra,
        }
        if self.scores is not None:
            out.update(scores=self.scores.table(), counts=self.scores.counts, ledger_entry=self.ledger_entry)
        out.update(self.extra)
        return out


def published_view(preset: str, panel_kind: str | None = None) -> str:
    """The view a preset's numbers on this kind of panel were published with: PUBLISHED_VIEW (the
    CorLoc and AP code), except TokenCut's saliency table, which its own script computed on
    another view (``SALIENCY_VIEW``)."""
    from ..analyses.decoder_settings import PUBLISHED_VIEW

    if panel_kind == "saliency" and preset in SALIENCY_VIEW:
        return SALIENCY_VIEW[preset]
    return PUBLISHED_VIEW.get(preset, "")


def saliency_warning(view: str, manifest: dict[str, Any]) -> str:
    """The one line for TokenCut saliency scores on keys of a view other than its saliency script's."""
    p = int((manifest.get("arch") or {}).get("patch") or 16)
    return (f"TokenCut's saliency table (unsupervised_saliency_detection/get_saliency.py) resizes each image with LANCZOS to "
            f"round(·/{p})·{p}; these are the {view} view's keys: extract with --views native_resized and decode with --view native_resized to match it")


def view_check(preset: str, size: int | str, manifest: dict[str, Any], panel_kind: str | None = None) -> dict[str, Any]:
    """The view a preset was published with on this kind of panel (``published_view``), and a
    warning when this store's view is not it."""
    published = published_view(preset, panel_kind)
    resample = str(cache.view_facts(manifest, "480").get("resample") or manifest.get("resample") or "bicubic")
    warnings = []
    if preset == "maskcut" and resample != "lanczos":
        warnings.append(f"--preset maskcut was published on 480 × 480 LANCZOS keys; this store's {size} view is {resample} "
                        "(MaskCut's masks change with the filter): extract with --views 480 --resample lanczos to match it")
    elif panel_kind == "saliency" and preset in SALIENCY_VIEW and str(size) != published:
        warnings.append(saliency_warning(str(size), manifest))
    elif published in OWN_SIZE and str(size) != published:
        warnings.append(f"--preset {preset} was published on each image at its own size, {OWN_SIZE[published]}; these are the {size} view's keys")
    return {"published_view": published, "warnings": warnings}


def panel_kind(panel: str | None, cache_dir: str | Path | None) -> str | None:
    """The kind of a registered panel (coco, voc, coco20k, saliency), None without one: which
    published view a run's scores are to be compared with."""
    from ..labels.panels import get_panel

    return get_panel(panel, cache_dir).kind if panel is not None else None


def _meta_path(masks_file: Path) -> Path:
    return masks_file.with_name(masks_file.name.removesuffix(".json") + ".meta.json")


# The decoder's outputs are one unit: ``results/decoder`` and the masks' metadata carry one
# ``unit`` id, and the metadata holds the sha256 of the masks file, written last. A run killed
# between the writes leaves a masks file whose hash its metadata does not hold, which
# ``probe score`` refuses, so masks are never scored under another run's settings.


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def bound_meta(masks_file: Path) -> dict[str, Any]:
    """The metadata of a masks file, checked against the file (``{}`` for foreign masks files)."""
    meta_path = _meta_path(masks_file)
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as error:
        raise IntegrityError(meta_path, f"is not readable JSON ({error})", "rerun `probe decode` to write the masks again") from None
    if meta.get("masks_sha256") != _file_sha256(masks_file):
        raise IntegrityError(masks_file, f"does not match {meta_path.name} (the two come from different `probe decode` runs, one interrupted)",
                             "rerun `probe decode` to write the masks and their settings again")
    return meta


def run_decode(
    store: str | Path,
    settings: Settings,
    *,
    settings_source: str = "",
    size: int | str = 480,
    out: str | Path | None = None,
    panel: str | None = None,
    unseal: str | None = None,
    cache_dir: str | Path | None = None,
    on_start: Callable[[int], Callable[[], None]] | None = None,
    threads: int = 1,
    refine: str | None = None,
    workers: int | None = 1,
    dask_address: str | None = None,
    backend: str = "scipy",
    device: str = "cpu",
    shard: str | None = None,
) -> DecodeReport:
    """Decode a store (label-free), save ``results/decoder`` and the masks JSON; score on a panel.

    ``refine="bilateral"`` scores a saliency panel on TokenCut's bilateral-solver output of each
    first mask (``analyses/bilateral.py``), computed on the panel's photographs. ``workers``:
    local processes (None: every core); ``dask_address``: a dask.distributed cluster; ``shard``:
    ``i/n``, this process's share (``commands.decode_shards``).
    """
    if refine not in (None, "bilateral"):
        raise ProbeError(None, f"--refine {refine!r} is not bilateral", "use --refine bilateral or leave it out")
    if refine and panel is None:
        raise ProbeError(None, "--refine bilateral refines masks for saliency scores, so it needs --panel", "pass --panel with a saliency panel")
    if panel is not None:  # an unknown or sealed panel is refused before any work, not after the masks are saved
        check_readable(panel, unseal, cache_dir)
    check_backend(backend, device)
    workers = default_workers(workers, device, dask_address)
    check_view(size)
    src = open_keys(store, size)
    tick = on_start(len(src.image_ids)) if on_start else None
    t0 = time.perf_counter()
    encoded = BlockResults(src, settings)
    with placed(workers, dask_address) as where:
        if shard is None and launcher_shard() is None:
            if settings.color_lambda:
                decoded = decode_with_colour(src, settings, tick, where=where)
                encoded.add(decoded)
            else:
                decoded = src.with_grids(decode_keys(src.keys, settings, tick, threads, where=where, backend=backend, device=device,
                                                     grids=src.grid_arrays(), each=encoded))
        else:
            task = colour_task(src, settings) if settings.color_lambda else None
            decoded, missing = decode_shard(src, settings, shard, where=where, backend=backend, device=device, threads=threads, on_image=tick, task=task)
            if decoded is None:
                return DecodeReport(store=src.store, settings=settings, settings_source=settings_source, n_images=len(src.image_ids), n_masks=0,
                                    degenerate=0, dense_solves=0, seconds=time.perf_counter() - t0, masks_file=None, extra={"waiting_for_shards": missing})
            encoded.add(decoded)
    seconds = time.perf_counter() - t0
    unit = uuid.uuid4().hex
    records.save(
        src.store,
        "decoder",
        decoder_dataset(decoded, src.image_ids),
        {"manifest": src.manifest, "settings": settings.as_dict(), "settings_source": settings_source, "size": size, "view": src.view,
         "seconds": seconds, "provenance": provenance.stamp(), "unit": unit, "computed_on": computed_on(src.store, src.image_ids),
         "backend": backend},
    )
    masks_file = Path(out) if out else records.results_path(src.store, "decoder-masks.json")
    report = DecodeReport(
        store=src.store, settings=settings, settings_source=settings_source, n_images=len(src.image_ids),
        n_masks=int(decoded.n_masks.sum()), degenerate=int(decoded.degenerate.sum()),
        dense_solves=int(decoded.dense_solves.sum()), seconds=seconds, masks_file=masks_file,
        extra=view_check(settings.preset, src.view, src.manifest, panel_kind(panel, cache_dir)),
    )
    coco_ids = None
    labels: LabelRead | None = None
    if panel is not None:  # the masks exist and are saved before any label is read
        labels = read_labels(panel, purpose="score", checkpoint=src.checkpoint, images=src.image_ids, unseal=unseal, cache=cache_dir)
        coco_ids = labels.image_map
    results = encoded.entries(coco_ids)
    write_json(masks_file, results)
    write_json(_meta_path(masks_file), {"store": str(src.store.resolve()), "checkpoint": src.checkpoint, "settings": settings.as_dict(),
                                        "panel": panel, "image_id": "panel COCO id" if panel else "store position", "view": src.view,
                                        "unit": unit, "masks_sha256": _file_sha256(masks_file)})
    if refine and labels is not None and labels.panel.kind != "saliency":
        raise ProbeError(panel, "is not a saliency panel; --refine bilateral applies to saliency scores (TokenCut's + BS)", "drop --refine or pass a saliency panel")
    if labels is not None and labels.panel.kind == "saliency":
        soft = refine_bilateral(labels, results) if refine else None
        report.scores = saliency.score_results(labels.coco, results, soft)
        report.ledger_entry = labels.entry_id
        save_saliency(src.store, report.scores, labels, settings, src.manifest, refine or "", view=src.view)
    elif labels is not None:
        report.scores = evaluate(labels.coco, results)
        report.ledger_entry = labels.entry_id
        save_scores(src.store, report.scores, labels, settings, src.manifest, masks_file, unit=unit)
    return report


# ----------------------------------------------------------------------------------------------
# scoring


def scores_dataset(scores: Scores, labels: LabelRead) -> xr.Dataset:
    """Scores as an xarray Dataset (dims metric, image, object); ids are store ids where known."""
    inverse = {v: k for k, v in labels.image_map.items()}
    files = {i: labels.coco.imgs[i].get("file_name", str(i)) for i in scores.image_ids}
    name = lambda i: inverse.get(i, files.get(i, str(i)))  # noqa: E731
    xr = lazy_dask.xarray()
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


def save_scores(store: Path, scores: Scores, labels: LabelRead, settings: Settings | dict | None, manifest: dict | None, masks_file: Path | None,
                unit: str | None = None) -> Path:
    attrs = {
        "unit": unit or "",
        "computed_on": computed_on(store, sorted(labels.image_map), scope="panel"),
        "ledger_entry": labels.entry_id,
        "panel": labels.panel.name,
        "role": labels.panel.role,
        "settings": settings.as_dict() if isinstance(settings, Settings) else (settings or {}),
        "manifest": manifest or {},
        "counts": scores.counts,
        "masks_file": str(masks_file) if masks_file else "",
        "units": "fractions in [0, 1]",
        "provenance": provenance.stamp(),
        **_benchmark_attrs(labels),
    }
    return records.save(store, f"scores_{labels.panel.name}", scores_dataset(scores, labels), attrs)


def _benchmark_attrs(labels: LabelRead) -> dict[str, Any]:
    """Which published benchmark the panel is (report/discovery.py puts the published numbers beside it)."""
    from ..labels.kinds import COCO20K_SIZE, benchmark

    out: dict[str, Any] = {"kind": labels.panel.kind, "benchmark": benchmark(labels.panel), "no_hard": labels.panel.no_hard}
    if labels.panel.kind == "coco20k":
        out["coco20k_images"] = f"{labels.coco.dataset.get('coco20k_found', 0)} of {COCO20K_SIZE}"
    if labels.panel.kind == "saliency":
        out["grey_ground_truth"] = labels.coco.dataset.get("saliency_grey", {"masks": 0, "pixels": 0})  # counted as foreground
    return out


def refine_bilateral(labels: LabelRead, results: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """TokenCut's bilateral-solver output of each image's first mask, on the panel's photograph."""
    from ..analyses.bilateral import refine
    from ..labels.masks import decode_rle
    from ..store.images import load_image

    first: dict[int, dict[str, Any]] = {}
    for r in results:
        if int(r["image_id"]) not in first or r.get("mask", 0) < first[int(r["image_id"])].get("mask", 0):
            first[int(r["image_id"])] = r
    out = {}
    for image_id, r in first.items():
        photo = np.asarray(load_image(labels.panel.images / labels.coco.imgs[image_id]["file_name"]).convert("RGB"))
        out[image_id] = refine(photo, decode_rle(r["segmentation"]))
    return out


def save_saliency(store: Path, scores: saliency.SaliencyScores, labels: LabelRead, settings: Settings, manifest: dict | None, refine: str = "",
                  view: str | None = None) -> Path:
    """``results/saliency_<panel>``: the headline scores, the Fβ curve and each image's IoU;
    ``view``: the view the masks were cut on, where known (TokenCut's table is native_resized's)."""
    ds = lazy_dask.xarray().Dataset(
        {**{k: ((), v) for k, v in scores.table().items()},
         "f_curve": ("threshold", scores.f_curve), "image_iou": ("image", scores.per_image_iou),
         "coco_image_id": ("image", np.asarray(scores.image_ids, dtype=np.int64))},
        coords={"threshold": np.arange(saliency.BINS) / saliency.BINS, "image": np.arange(len(scores.image_ids))},
    )
    attrs = {"ledger_entry": labels.entry_id, "panel": labels.panel.name, "role": labels.panel.role, "settings": settings.as_dict(),
             "refine": refine, "manifest": manifest or {}, "counts": scores.counts, "units": "fractions in [0, 1]",
             "provenance": provenance.stamp(), **_benchmark_attrs(labels), **({"view": view} if view else {})}
    return records.save(store, f"saliency_{labels.panel.name}", ds, attrs)


@dataclass
class ScoreReport:
    scores: Scores
    ledger_entry: str
    saved: Path | None
    warnings: list[str] = field(default_factory=list)  # the masks' view is not the one the preset was published on for this panel


def run_score(masks_file: str | Path, panel: str, *, unseal: str | None = None, cache_dir: str | Path | None = None) -> ScoreReport:
    """Score a masks JSON on a panel; images are matched by the entries' ``file_name``."""
    masks_file = Path(masks_file)
    try:
        results = json.loads(masks_file.read_text())
        if not isinstance(results, list):
            raise ValueError("not a list of results")
    except (OSError, ValueError) as error:
        raise ProbeError(masks_file, f"is not a COCO results JSON ({error})", "pass the file `probe decode --out` wrote") from None
    meta = bound_meta(masks_file)
    if any("file_name" not in r for r in results):
        raise ProbeError(masks_file, "has results without file_name, so they cannot be matched to a panel", "score masks written by `probe decode`")
    names = sorted({r["file_name"] for r in results})
    labels = read_labels(panel, purpose="score", checkpoint=meta.get("checkpoint"), images=names, unseal=unseal, cache=cache_dir)
    mapped = [dict(r, image_id=labels.image_map[r["file_name"]]) for r in results if r["file_name"] in labels.image_map]
    store = Path(meta["store"]) if meta.get("store") else None
    saved = None
    if labels.panel.kind == "saliency":
        scores = saliency.score_results(labels.coco, mapped)
        settings = Settings(**{k: v for k, v in (meta.get("settings") or {}).items() if k in Settings.__dataclass_fields__})
        in_store = store is not None and (store / "zarr.json").is_file()
        manifest = cache.manifest(store) if in_store else {}
        if in_store:
            saved = save_saliency(store, scores, labels, settings, manifest, view=meta.get("view"))
        warnings = view_check(settings.preset, meta["view"], manifest, "saliency")["warnings"] if meta.get("view") else []
        return ScoreReport(scores=scores, ledger_entry=labels.entry_id, saved=saved, warnings=warnings)
    scores = evaluate(labels.coco, mapped)
    if store is not None and (store / "zarr.json").is_file():
        saved = save_scores(store, scores, labels, meta.get("settings"), cache.manifest(store), masks_file, unit=meta.get("unit"))
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
        if Settings.from_preset(str(preset)).rule in SINGLE:  # τ, ε and the mask count do not apply: one setting per centring
            s = Settings.from_preset(str(preset), center=bool(center))
        else:
            s = Settings.from_preset(str(preset), center=bool(center), tau=float(tau), eps=float(eps), masks=int(masks))
        if s not in out:
            out.append(s)
    return out


def _prefix(decoded: Decoded, k: int, settings: Settings) -> Decoded:
    """The first k masks of a loop run for more: the loop is deterministic, so they are equal."""
    n = np.minimum(decoded.n_masks, k)
    sl = slice(0, k)
    return Decoded(
        masks=decoded.masks[:, sl], score=decoded.score[:, sl], lambda2=decoded.lambda2[:, sl], lambda3=decoded.lambda3[:, sl],
        gap=decoded.gap[:, sl], ncut=decoded.ncut[:, sl], n_masks=n, degenerate=decoded.degenerate, stop=decoded.stop,
        dense_solves=decoded.dense_solves, cuts=decoded.cuts, settings=settings, fiedler=decoded.fiedler, seed=decoded.seed,
        grids=decoded.grids, patch=decoded.patch, view=decoded.view,
    )


@dataclass
class SweepReport:
    table: list[dict[str, Any]]  # one row per setting: settings + scores
    best: Settings | None
    best_row: dict[str, Any]
    metric: str
    ledger_entry: str
    settings_file: Path | None
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing


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
    workers: int | None = 1,
    dask_address: str | None = None,
    backend: str = "scipy",
    device: str = "cpu",
    size: int | str = 480,
    shard: str | None = None,
) -> SweepReport:
    """Decode every setting of the grid (label-free), read the panel once, score every setting.
    ``shard`` i/n (or torchrun): this process decodes its share of the images under every
    setting; the shard that finds every share saved scores (the others return ``waiting``)."""
    settings_list = load_grid(grid)
    known = [f"segm_{m}" for m in METRICS] + [f"bbox_{m}" for m in METRICS] + ["corloc", "mean_best_iou"]
    if metric not in known:
        raise ProbeError(None, f"--metric {metric!r} is not one of {', '.join(known)}", "use --metric segm_AP")
    check_backend(backend, device)
    workers = default_workers(workers, device, dask_address)
    check_readable(panel, unseal, cache_dir)
    from ..labels.panels import get_panel

    if get_panel(panel, cache_dir).kind == "saliency":
        raise ProbeError(panel, "is a saliency panel; the sweep chooses settings by COCO AP or CorLoc", "sweep on a COCO or VOC panel, then `probe decode --panel` here")
    check_view(size)
    src = open_keys(store, size)
    # one decode per (rule, centring, τ, ε), run for the most masks any setting of the group asks
    groups: dict[tuple, int] = {}
    for s in settings_list:
        key = (s.preset, s.center, s.tau, s.eps)
        groups[key] = max(groups.get(key, 0), s.masks)
    group_settings = [Settings.from_preset(key[0], center=key[1], tau=key[2], eps=key[3], masks=most) for key, most in groups.items()]
    tick = on_start(len(src.image_ids)) if on_start else None
    with placed(workers, dask_address) as where:
        if shard is None and launcher_shard() is None:
            fn = partial(sweep_block, groups=group_settings, backend=backend, device=device)
            arrays = map_images(fn, {"keys": src.keys, **src.grid_arrays()}, where=where, threads=threads, progress=_ticks(tick))
            per_group = [src.with_grids(as_decoded(group_arrays(arrays, g), s)) for g, s in enumerate(group_settings)]
        else:
            per_group, missing = sweep_shard(src, group_settings, shard, where=where, backend=backend, device=device, threads=threads, on_image=tick)
            if per_group is None:
                return SweepReport(table=[], best=None, best_row={}, metric=metric, ledger_entry="", settings_file=None, waiting=missing)
    decoded = dict(zip(groups, per_group))
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
    if not np.isfinite(values).any():  # e.g. segm AP on a box-only VOC panel: no setting can be chosen by it
        raise ProbeError(f"--metric {metric}", f"is undefined on panel {panel} for every setting (a box-only panel has no mask scores)",
                         "use --metric corloc or a bbox metric")
    best_index = int(np.nanargmax(values))  # first of equals: grid order
    best = settings_list[best_index]
    settings_file = Path(settings_out) if settings_out else settings_path(cache_dir)
    write_json(settings_file, {
        "settings": best.as_dict(),
        "chosen_by": {"panel": labels.panel.name, "role": labels.panel.role, "ledger_entry": labels.entry_id, "metric": metric,
                      "value": table[best_index][metric], "grid_size": len(settings_list), "store": str(src.store.resolve()),
                      "checkpoint": src.checkpoint, "date": provenance.now()},
    })
    columns = list(table[0])
    sweep = lazy_dask.xarray().Dataset(
        {c: ("setting", np.asarray([row[c] for row in table], dtype=object if c in ("preset", "rule") else None)) for c in columns},
        coords={"setting": np.arange(len(table))},
    )
    records.save(src.store, f"sweep_{labels.panel.name}", sweep,
                       {"ledger_entry": labels.entry_id, "metric": metric, "best": best_index, "manifest": src.manifest,
                        "provenance": provenance.stamp(), "computed_on": computed_on(src.store, src.image_ids)})
    return SweepReport(table=table, best=best, best_row=table[best_index], metric=metric, ledger_entry=labels.entry_id, settings_file=settings_file)
