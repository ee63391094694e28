"""The feature cache: one zarr v3 store per (checkpoint, network), read as an xarray Dataset or with zarr alone (``store.direct``).

Layout (every array chunked along ``image``; dimension names are stored in zarr v3 metadata):

    image                (image,)                       str, the coordinate: ids relative to the source
    done, failed         (image,)                       bool: every view done / any view failed
    image_height/width   (image,)                       int32, the original size in pixels
    image_sha256         (image, sha256_byte)           uint8, each image file's sha256 as extracted (store/sources.py)
    done_<view>, failed_<view>        (image,)          bool, per view; ``done_<view>`` written after its arrays
    grid_rows_<view>, grid_cols_<view> (image,)         int32, each image's patch grid in that view
    tokens_224           (image, patch_224, channel)    last-block tokens, before any final norm
    cls_tokens_224       (image, channel)               when the network has a class token
    attention_224        (image, head, query, key)      last block; covers every token (0 = CLS if any)
    attention_blocks_224 (image, block, head, query, key)  with ``--attention all``
    tokens_eval224, cls_tokens_eval224              the same at DINO's evaluation view (short side 256, crop 224)
    keys_480             (image, patch_480, channel)    last-block keys, heads concatenated
    cls_keys_480         (image, channel)
    tokens_96            (image, patch_96, channel)
    keys_native, tokens_native (image, patch_native, channel)  padded to the set's largest grid
    keys_native_crop, tokens_native_crop (image, patch_native_crop, channel)  the same, each image cut to whole patches
    keys_native_resized, tokens_native_resized (image, patch_native_resized, channel)  the same, each image resized (LANCZOS) to round(side/p) patches
    results/<name>/<run id>/  one record per run of an analysis (``results.records``), never replaced

Block B's arrays are ``<kind>_b<B>_<view>`` and a later part of a view ``<name>.p<n>`` (``store.layout``);
``require(ds, name, block=B)`` reads one block. Views of other sizes are named as spelled
(``keys_square@1024``; ``store.views``).

Patch dimensions carry their view because one Dataset cannot hold two sizes of one dimension;
``require(ds, name)`` returns an array with the plain dimension name ``patch``. Image i's
patches are the first rows_i * cols_i entries of it, row-major (``store.grids``); the rest is
NaN padding. The manifest lives in the root group's attributes under ``manifest``, with one
entry per view under ``per_view``.

Writing is ``store.writer`` (filling chunks) and ``store.create`` (creating and growing a store);
``store.describe`` gives ``probe info`` its rows.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ..infra import lazy_dask
from ..infra.errors import ProbeError, reading
from . import grids, hints, integrity, layout
from .group import array_names, consolidate, open_read, whole  # noqa: F401  (where readers and writers found them first)
from .sources import DIGESTS, STATS
from .views import KEY_VIEWS
from .views import NAMES as VIEW_ORDER

lazy_dask.defer_on_import()  # before xarray builds a variable: it would import dask.array to type-check numpy data

if TYPE_CHECKING:
    import xarray as xr

    from .direct import StoreData


def _xarray():
    """xarray, imported where a reader or writer needs it (it brings pandas: half a second), with
    dask's deferral installed first (it would import dask.array to type-check numpy data)."""
    return lazy_dask.xarray()


DEFAULT_ROOT = Path("cache")

# which ``probe extract`` flag produces each array, for the error that says how to get it
ARRAY_FLAGS = {
    "tokens_224": "--views 224",
    "attention_224": "--views 224 --attention last",
    "attention_blocks_224": "--views 224 --attention all",
    "keys_480": "--views 480",
    "tokens_96": "--views 96",
    "keys_native": "--views native",
    "tokens_native": "--views native",
    "keys_native_crop": "--views native_crop",
    "tokens_native_crop": "--views native_crop",
    "keys_native_resized": "--views native_resized",
    "tokens_native_resized": "--views native_resized",
}


def cache_root(cache: str | Path | None = None) -> Path:
    """``--cache`` if given, else ``$PROBE_CACHE``, else ``./cache``."""
    env = os.environ.get("PROBE_CACHE")
    root = Path(cache) if cache is not None else Path(env) if env else DEFAULT_ROOT
    if root.exists() and not root.is_dir():
        where = "--cache" if cache is not None else "$PROBE_CACHE" if env else "./cache"
        raise ProbeError(root, f"is a file, not a cache folder ({where})", "pass --cache a folder, or move the file")
    return root


def store_path(root: Path, stem: str | Path, sha256: str, network: str) -> Path:
    """``<root>/<stem>-<sha256[:8]>/<network>.zarr``: ``stem`` the checkpoint's (``Checkpoint.stem``: a file's stem or a Hub
    repository's name, dots kept); a ``Path`` is taken as the checkpoint file and its stem used."""
    name = stem.stem if isinstance(stem, Path) else stem
    return Path(root) / f"{name}-{sha256[:8]}" / f"{network}.zarr"


def open_store(
    path: str | Path, *, done_only: bool = True, allow_partial: bool = True, arrays: str | list[str] | None = None, plain: bool = False
) -> xr.Dataset | StoreData:
    """Open a store lazily: xarray's lazy zarr arrays, read only where a command indexes them.

    No dask here: its chunk manager imports dask.array and distributed (about a second of a
    command's start-up). Readers index the arrays a block of images at a time (the runners in
    ``infra``); on a cluster (``--dask-address``) each worker reads its own chunks with zarr.
    The manifest and the flags are read with zarr directly. ``plain``: the same arrays and
    images as a ``store.direct.StoreData``, read with zarr alone (no xarray, no pandas).

    With ``done_only`` the dataset holds only images whose extraction finished and did not
    fail, so a reader during a write never sees a half-written image. Without
    ``allow_partial`` a store whose extraction has not finished is an error (analyses refuse
    to summarise a set that is still growing unless asked with ``--partial``). ``arrays``
    names what the reader will read: completeness is then judged by those arrays' views only
    (a store growing a new view stays complete for the views it already had). A store whose
    metadata is damaged or foreign is one line (``infra.errors.reading``), never a traceback.
    """
    shared = _CHECKS.get() if plain else None
    key = (Path(path).resolve(), done_only, allow_partial, str(arrays))
    if shared is not None and key in shared:
        return shared[key]
    with reading(path, "probe store", DAMAGED_STORE_FIX):
        opened = _open_store(Path(path), done_only=done_only, allow_partial=allow_partial, arrays=arrays, plain=plain)
    if shared is not None:
        shared[key] = opened
    return opened


_CHECKS: ContextVar[dict | None] = ContextVar("probe_checks_openings", default=None)


@contextmanager
def one_opening_each() -> Iterator[None]:
    """Within it, a store opened with ``plain`` is opened once (later calls get the same
    ``StoreData``): the checks before a run (pairing, panel coverage, current photographs, per
    panel) open the same stores, each opening re-reading every flag chunk; and they then judge
    one snapshot of it. Nested, it keeps the openings of the block around it (a run of a protocol
    that reads stores shares its checks' openings: ``protocols.api.run``)."""
    if _CHECKS.get() is not None:
        yield
        return
    token = _CHECKS.set({})
    try:
        yield
    finally:
        _CHECKS.reset(token)


def _open_store(path: Path, *, done_only: bool, allow_partial: bool, arrays: str | list[str] | None, plain: bool) -> xr.Dataset | StoreData:
    path = Path(path)
    if not (path / "zarr.json").is_file():
        raise ProbeError(path, "is not a probe store (no zarr.json)", "run `probe extract` first")
    integrity.install()  # a chunk that does not decode is one line (store/integrity.py)
    group = open_read(path)
    if "manifest" not in group.attrs:
        raise ProbeError(path, "has no manifest", "it was not written by `probe extract`")
    integrity.check_listed(path, group)  # an array deleted from outside: one line, not a KeyError deep in a reader
    integrity.check_present(path, integrity.shared_arrays(group), group=group)  # ids, grids, sizes: read by every command
    integrity.check_flags(path, group)  # a deleted flag chunk is damage, not images dropped as unfinished
    done, failed = _flags(group, [arrays] if isinstance(arrays, str) else arrays)
    if not allow_partial and done is not None and not done.all():
        raise ProbeError(path, f"is incomplete: {int(done.sum())}/{done.size} images done", "finish it with the same `probe extract` command, or pass --partial")
    n = int(group["image"].shape[0]) if "image" in group else 0
    kept, dropped = np.arange(n), False
    if done_only and done is not None:
        keep = done & ~failed if failed is not None else done
        if not keep.all():
            kept, dropped = np.flatnonzero(keep), True
    if plain:
        from .direct import StoreData

        ds = StoreData(group, kept if dropped else None, dict(group.attrs))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = _xarray().open_dataset(path, engine="zarr", consolidated=False, chunks=None, cache=False)
        if dropped:
            ds = ds.isel(image=kept)
    _record_chunk_edges(ds, kept)
    ds.attrs["store"] = str(path)
    return ds


def _record_chunk_edges(ds: xr.Dataset | StoreData, kept: np.ndarray) -> None:
    """Each image array's zarr chunk boundaries among the kept images (``infra.cluster.image_chunk_edges``),
    where dask would have kept them as its chunks: readers then read each chunk once. One array of
    edges per chunk height, shared by the arrays cut alike (not a list of Python ints per array:
    the edges grow with the store, and a local worker forked later maps them too)."""
    edges: dict[int, np.ndarray] = {}
    for variable in ds.variables.values():
        chunks = variable.encoding.get("chunks")
        if chunks and variable.dims and variable.dims[0] == "image" and variable.ndim > 1:
            step = int(chunks[0])
            if step not in edges:
                starts = np.flatnonzero(np.diff(kept // step)) + 1
                edges[step] = np.concatenate([[0], starts, [kept.size]]).astype(np.int64)
            variable.encoding["probe_image_edges"] = edges[step]


def _flags(group: zarr.Group, arrays: list[str] | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(done, failed) per image: of the views ``arrays`` belong to, else of the whole store."""

    def read(name: str) -> np.ndarray:
        return np.asarray(whole(group[name]), dtype=bool)

    views = sorted({grids.view_of(a) for a in arrays}) if arrays else []
    if views and all(f"done_{v}" in group and f"failed_{v}" in group for v in views):
        done = np.logical_and.reduce([read(f"done_{v}") for v in views])
        failed = np.logical_or.reduce([read(f"failed_{v}") for v in views])
        return done, failed
    return (read("done") if "done" in group else None), (read("failed") if "failed" in group else None)


def manifest(ds_or_path: xr.Dataset | StoreData | str | Path) -> dict[str, Any]:
    """The store's manifest (a plain dict)."""
    if not isinstance(ds_or_path, (str, Path)):
        return dict(ds_or_path.attrs["manifest"])
    group = zarr.open_group(Path(ds_or_path), mode="r")
    return dict(group.attrs["manifest"])


def depth(ds: xr.Dataset | StoreData) -> int | None:
    """The network's blocks, from the store's manifest (None where a dataset has no manifest)."""
    value = ((ds.attrs.get("manifest") or {}).get("arch") or {}).get("depth")
    return int(value) if value is not None else None


def resolve_block(ds: xr.Dataset | StoreData, block: int | None) -> int | None:
    """``block`` as a 0-based index of the store's network (``-1``: the last; None stays None, the last block)."""
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise ProbeError(ds.attrs.get("store"), f"block {block!r} is not a whole number", "pass a 0-based block index, e.g. --block 11")
    blocks = depth(ds)
    if blocks is None:
        return int(block)
    if not -blocks <= int(block) < blocks:
        raise ProbeError(
            ds.attrs.get("store"),
            f"has a network of {blocks} blocks: block {block} is not one of 0..{blocks - 1}",
            f"pass a 0-based block index, e.g. --block {blocks - 1} (the last)",
        )
    return int(block) % blocks


# the block a run reads where a reader names none (``protocols.api.run`` sets it from ``--block`` / ``block=``)
_READING: ContextVar[int | None] = ContextVar("probe_reading_block", default=None)
_READABLE: ContextVar[Callable[[str], bool] | None] = ContextVar("probe_readable_views", default=None)


@contextmanager
def reading_block(block: int | None, views: Callable[[str], bool] | None = None) -> Iterator[None]:
    """Within it, ``require`` and ``checked`` read ``block`` where their caller names none (arrays
    holding every block still come whole): a protocol reads the run's block without passing it.
    ``views``: whether the run could be told to read a view instead (its ``--view``), so that a
    missing array's line offers only such views of the store (None: any view)."""
    tokens = _READING.set(block), _READABLE.set(views)
    try:
        yield
    finally:
        _READING.reset(tokens[0])
        _READABLE.reset(tokens[1])


def run_block() -> int | None:
    """The block the current run reads (``reading_block``; None outside a run)."""
    return _READING.get()


def _per_block(name: str) -> bool:
    """Whether ``name`` is one block's array, read at the run's block where its reader names none: not
    an array of every block (``layout.BLOCKED``), nor a view's grids and flags (``PER_VIEW``)."""
    return layout.parse(name).kind not in layout.BLOCKED and not name.startswith(PER_VIEW)


def locate(ds: xr.Dataset | StoreData, name: str, block: int | None = None) -> tuple[str, int | None]:
    """Where ``name`` at ``block`` is stored: (the array, the index along its ``block`` dimension, or
    None where it holds one block). ``name`` is the array's plain name (``tokens_224``); the block's
    own array (``tokens_b3_224``, or in a later part ``tokens_b3_224.p1``: ``store.layout``) is found
    by its kind and view. ``block`` None: the last block, as every store holds it."""
    wanted = layout.parse(name)
    if block is None and _per_block(name):
        block = _READING.get()
    index = resolve_block(ds, block)
    blocks = depth(ds)
    if wanted.kind in layout.BLOCKED:  # every block along one dimension
        found = name if name in ds else _find(ds, wanted.kind, wanted.view, None)
        return (found or name), index
    if wanted.kind == "attention" and index is not None and index != (blocks or 0) - 1:  # another block's map: among every block's
        return f"attention_blocks_{wanted.view}", index
    if index is None and name in ds:
        return name, None
    label = wanted.block if index is None else (None if blocks is not None and index == blocks - 1 else index)
    return (_find(ds, wanted.kind, wanted.view, label) or layout.ArrayName(wanted.kind, wanted.view, label).name), None


def holds(ds: xr.Dataset | StoreData, name: str, block: int | None = None) -> bool:
    """Whether ``ds`` holds ``name`` (a plain name, ``tokens_224``) at ``block`` (None: the run's
    block, ``reading_block``, else the last): a store extracted with ``--blocks B`` alone holds
    ``tokens_bB_224`` and no ``tokens_224``."""
    return locate(ds, name, block)[0] in ds


def _names(ds: xr.Dataset | StoreData) -> list[str]:
    return [str(n) for n in (ds.variables if hasattr(ds, "variables") else ds)]


def _find(ds: xr.Dataset | StoreData, kind: str, view: str, block: int | None) -> str | None:
    """The array of ``kind`` at ``block`` of ``view`` in any of the view's parts."""
    for name in _names(ds):
        if not name.startswith(kind):
            continue
        found = layout.parse(name)
        if found.kind == kind and found.view == view and found.block == block:
            return name
    return None


def _stored_block(ds: xr.Dataset | StoreData, name: str, index: int | None) -> int | None:
    """The 0-based block an array holds (its ``block`` attribute; the last where none is recorded)."""
    if index is not None:
        return index
    recorded = layout.parse(name).block
    blocks = depth(ds)
    return recorded if recorded is not None else (blocks - 1 if blocks is not None else None)


def _part_finished(ds: xr.Dataset | StoreData, wanted: str, found: str) -> None:
    """An array of a later part than the one the store was opened for is read only where every image of ``ds`` is done in that part."""
    unit, asked = grids.view_of(found), grids.view_of(wanted)
    if unit == asked or f"done_{unit}" not in ds:
        return
    done = np.asarray(ds[f"done_{unit}"].values, dtype=bool) & ~np.asarray(ds[f"failed_{unit}"].values, dtype=bool)
    if not done.all():
        raise ProbeError(
            ds.attrs.get("store"),
            f"holds {found} for {int(done.sum())} of its {done.size} images (extraction of that part has not finished)",
            "finish it with the same `probe extract` command",
        )


def checked(ds: xr.Dataset | StoreData, name: str, block: int | None = None) -> xr.DataArray:
    """``ds[name]`` once every chunk of it holding a finished image is there (``integrity.check_present``):
    the one read of a store's array, for readers that keep its own dimension names (the report's
    figures and pictures, stored masks); ``require`` adds the extract flag and the plain ``patch``.

    ``block`` (0-based, as ``probe extract --blocks`` counts them; negative from the end): that
    block's array, its ``block`` dimension dropped, the same shape as the last block's; None: the
    last block, as every store holds it (an array holding every block, ``attention_blocks_224``,
    is then returned whole). The array's ``attrs`` say which block and facet it holds."""
    if block is None and _per_block(name):
        block = _READING.get()  # the run's block (reading_block)
    found, index = locate(ds, name, block)
    if found not in ds:
        named = _named_block(ds, block)
        raise ProbeError(ds.attrs.get("store"), f"has no array {name}" + (f" at block {named}" if named is not None else ""), _fix(ds, name, named))
    _part_finished(ds, name, found)
    if ds.attrs.get("store"):
        integrity.check_present(ds.attrs["store"], [found], group=getattr(ds, "zarr_group", None))  # a plain opening's group, else opened again
    array = ds[found]
    array = array.copy(deep=False) if hasattr(array, "copy") else array.rename({})  # its own attrs: the dataset's stay as stored
    if index is not None and "block" in array.dims:
        axis = list(array.dims).index("block")
        array = array.isel(block=index)
        array.attrs["probe_pick"] = f"{axis}:{index}"  # a worker reading the array by name takes the same block (infra.cluster.proven_read)
    held = _stored_block(ds, found, index)
    if held is not None:
        facet = layout.parse(found).facet
        array.attrs.update(block=int(held), **({"facet": facet} if facet else {}))
    return array


def _named_block(ds: xr.Dataset | StoreData, block: int | None) -> int | None:
    """``block`` as a message names it: None for the last block (what every store holds, what a run
    reads where none is asked), so that a missing view is said as one, not as a missing block."""
    index = resolve_block(ds, block)
    blocks = depth(ds)
    return None if index is None or (blocks is not None and index == blocks - 1) else index


def _fix(ds: xr.Dataset | StoreData, name: str, block: int | None) -> str:
    """How to get a missing array: the whole ``probe extract`` that adds it to this very store (its
    checkpoint, images and settings from the manifest; a command with CKPT left to fill where the
    store's images cannot be found), or the view the store holds it in."""
    wanted = layout.parse(name)
    view = wanted.view
    shlex_flags = ARRAY_FLAGS.get(name, f"--views {view}").split()
    attention = shlex_flags[shlex_flags.index("--attention") + 1] if "--attention" in shlex_flags else None
    extra: list[str] = []
    if block is not None:  # another block's attention map is among every block's
        facet = layout.ArrayName(wanted.kind, view).facet if wanted.kind != "attention" else None
        attention = "all" if wanted.kind == "attention" else attention
        extra = [] if wanted.kind == "attention" else ["--blocks", str(block), *(["--facets", facet] if facet else [])]
    extract = extract_into(ds, view, attention, extra)
    fix = f"rerun `{extract}`" + (" with the store's checkpoint and images" if " CKPT " in extract else "")
    readable = KEY_VIEWS if wanted.kind == "keys" else VIEW_ORDER  # keys are read by the decoders alone, in the views they cut
    accepts = _READABLE.get() or (lambda other: True)
    held = [v for v in hints.other_views(ds.attrs.get("store"), name, view, readable) if accepts(v)] if block is None else []
    if held:  # the same array of another view: reading that view is the nearer fix
        fix = f"it holds {', '.join(f'{name[: -len(view)]}{v}' for v in held)}: read it with --view {held[0]}, or {fix}"
    return fix


def extract_into(ds: xr.Dataset | StoreData, view: str, attention: str | None = None, extra: list[str] | tuple[str, ...] = ()) -> str:
    """``probe extract`` of ``view`` (views, comma-separated) into the store ``ds`` was opened from
    (the whole command, issue 46 class 5: pasted, it adds the array where the rerun reads it)."""
    import shlex

    from .sources import image_folder_or_none

    store, meta = ds.attrs.get("store"), dict(ds.attrs.get("manifest") or {})
    source = image_folder_or_none(store, meta) if store and meta else None
    if source is None or not Path(source).is_dir():  # (moved, or another machine's): the user names them
        args = ["CKPT", "--views", view, *(["--attention", attention] if attention else []), *extra]
        return "probe extract " + shlex.join(args)
    args = hints.extract_arguments(meta, [view], source)
    if attention and "--attention" in args:
        at = args.index("--attention")
        del args[at : at + 2]
    return "probe extract " + shlex.join([*args, *(["--attention", attention] if attention else []), *extra, "--store", str(store)])


def require(ds: xr.Dataset | StoreData, name: str, block: int | None = None) -> xr.DataArray:
    """The array ``name`` at ``block`` (``checked``) with its patch dimension named ``patch`` (and a
    view's query and key dimensions ``query`` and ``key``), or an error naming the extract flag."""
    array = checked(ds, name, block)  # every chunk of a finished image is there before it is read (store/integrity.py)
    array = array.rename({d: plain for d in array.dims for plain in ("patch", "query", "key") if str(d).startswith(f"{plain}_")})
    if ds.attrs.get("store") and "manifest" in ds.attrs:  # so that cluster tasks can prove they read this store
        from ..infra.cluster import fingerprint

        array.attrs.update(
            probe_store=str(Path(ds.attrs["store"]).resolve()), probe_fingerprint=fingerprint(ds.attrs["manifest"]), probe_check=f"{integrity.__name__}:worker_check"
        )
    return array


# what a damaged or foreign store's one line tells the user to do (open_store, store/describe.py)
DAMAGED_STORE_FIX = "restore the store from a copy, or extract its images again into a new store"
# the arrays every store has whatever its views (bookkeeping: no protocol reads them; the photographs'
# sha256 and size+mtime are store/sources.py's), and the prefixes of each view's flags and grids
FLAGS = ("image", "done", "failed", "image_height", "image_width", DIGESTS, STATS)
PER_VIEW = ("done_", "failed_", "grid_rows_", "grid_cols_")


def view_facts(manifest: dict[str, Any], view: str) -> dict[str, Any]:
    """The manifest's facts about one view; stores written before views had their own entry
    were all bicubic with the store-wide attention setting at 224."""
    facts = dict((manifest.get("per_view") or {}).get(view, {}))
    if not facts and view in [str(v) for v in manifest.get("views", [])]:
        facts = {"resample": "bicubic"} if view == "480" else {}
        if view == "224":
            facts["attention"] = manifest.get("attention")
    return facts
