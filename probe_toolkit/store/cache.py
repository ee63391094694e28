"""The feature cache: one zarr v3 store per (checkpoint, network), read as an xarray Dataset or with zarr alone (``store.direct``).

Layout (every array chunked along ``image``; dimension names are stored in zarr v3 metadata):

    image                (image,)                       str, the coordinate: ids relative to the source
    done, failed         (image,)                       bool: every view done / any view failed
    image_height/width   (image,)                       int32, the original size in pixels
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

Patch dimensions carry their view because one Dataset cannot hold two sizes of one dimension;
``require(ds, name)`` returns an array with the plain dimension name ``patch``. Image i's
patches are the first rows_i * cols_i entries of it, row-major (``store.grids``); the rest is
NaN padding. The manifest lives in the root group's attributes under ``manifest``, with one
entry per view under ``per_view``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ..infra import lazy_dask, litter
from ..infra.errors import ProbeError
from . import grids, hints
from .views import NAMES as VIEW_ORDER
from .codec import encode_without_gil

lazy_dask.defer_on_import()  # before xarray builds a variable: it would import dask.array to type-check numpy data

if TYPE_CHECKING:
    import xarray as xr

    from .direct import StoreData
    from .plain import Results


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


def store_path(root: Path, checkpoint: Path, sha256: str, network: str) -> Path:
    """``<root>/<file stem>-<sha256[:8]>/<network>.zarr``."""
    return Path(root) / f"{Path(checkpoint).stem}-{sha256[:8]}" / f"{network}.zarr"


def open_store(path: str | Path, *, done_only: bool = True, allow_partial: bool = True, arrays: str | list[str] | None = None,
               plain: bool = False) -> xr.Dataset | StoreData:
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
    (a store growing a new view stays complete for the views it already had).
    """
    path = Path(path)
    if not (path / "zarr.json").is_file():
        raise ProbeError(path, "is not a probe store (no zarr.json)", "run `probe extract` first")
    group = zarr.open_group(path, mode="r", use_consolidated=False)
    if "manifest" not in group.attrs:
        raise ProbeError(path, "has no manifest", "it was not written by `probe extract`")
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
    """Each image array's zarr chunk boundaries among the kept images (``infra.chunked.image_chunk_edges``),
    where dask would have kept them as its chunks: readers then read each chunk once."""
    for variable in ds.variables.values():
        chunks = variable.encoding.get("chunks")
        if chunks and variable.dims and variable.dims[0] == "image" and variable.ndim > 1:
            starts = np.flatnonzero(np.diff(kept // int(chunks[0]))) + 1
            variable.encoding["probe_image_edges"] = [0, *starts.tolist(), int(kept.size)]


def _flags(group: zarr.Group, arrays: list[str] | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(done, failed) per image: of the views ``arrays`` belong to, else of the whole store."""
    def read(name: str) -> np.ndarray:
        return np.asarray(group[name][:], dtype=bool)

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


def require(ds: xr.Dataset | StoreData, name: str) -> xr.DataArray:
    """The array ``name`` with its patch dimension named ``patch``, or an error naming the extract flag."""
    if name not in ds:
        flag = ARRAY_FLAGS.get(name, f"--views {grids.view_of(name)}")
        fix = f"rerun `probe extract` with {flag}" if flag else "rerun `probe extract`"
        held = hints.other_views(ds.attrs.get("store"), name, grids.view_of(name), VIEW_ORDER)
        if held:  # the same array of another view: reading that view is the nearer fix
            fix = f"it holds {', '.join(f'{name[: -len(grids.view_of(name))]}{v}' for v in held)}: read it with --view {held[0]}, or {fix}"
        raise ProbeError(ds.attrs.get("store"), f"has no array {name}", fix)
    array = ds[name]
    array = array.rename({d: "patch" for d in array.dims if str(d).startswith("patch_")})
    if ds.attrs.get("store") and "manifest" in ds.attrs:  # so that cluster tasks can prove they read this store
        from ..infra.chunked import fingerprint

        array.attrs.update(probe_store=str(Path(ds.attrs["store"]).resolve()), probe_fingerprint=fingerprint(ds.attrs["manifest"]))
    return array


def consolidate(store: str | Path) -> None:
    """Rewrite the consolidated metadata after arrays or groups change, so that a plain
    ``xarray.open_zarr(store)`` opens without a warning (probe's own readers never use it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note that consolidation is not yet in the v3 spec
        zarr.consolidate_metadata(str(store))


# ----------------------------------------------------------------------------------------------
# Writing: a store is created once with its full image list; chunks are then filled in any
# order (by shards, by reruns). Each view has its own ``done_<view>`` / ``failed_<view>`` flags,
# written after its arrays; the global ``done`` (every view done) and ``failed`` (any view
# failed) follow. A store grows: a later run may add views beside the existing ones.

# manifest fields that must agree before a process may write into an existing store
IDENTITY = ("checkpoint", "network", "arch", "interpolation", "dtype", "image_list_sha256", "chunk")
# per-view facts that must agree before a process may write into an existing view
VIEW_IDENTITY = ("attention", "resample", "patches")
FLAGS = ("image", "done", "failed", "image_height", "image_width")
PER_VIEW = ("done_", "failed_", "grid_rows_", "grid_cols_")


def identity(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: manifest.get(k) for k in IDENTITY}


def _mismatch(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = identity(old), identity(new)
    if isinstance(a.get("checkpoint"), dict) and isinstance(b.get("checkpoint"), dict):
        a["checkpoint"] = a["checkpoint"].get("sha256")
        b["checkpoint"] = b["checkpoint"].get("sha256")
    return [k for k in IDENTITY if a[k] != b[k]]


def view_facts(manifest: dict[str, Any], view: str) -> dict[str, Any]:
    """The manifest's facts about one view; stores written before views had their own entry
    were all bicubic with the store-wide attention setting at 224."""
    facts = dict((manifest.get("per_view") or {}).get(view, {}))
    if not facts and view in [str(v) for v in manifest.get("views", [])]:
        facts = {"resample": "bicubic"} if view == "480" else {}
        if view == "224":
            facts["attention"] = manifest.get("attention")
    return facts


def _view_mismatch(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [k for k in VIEW_IDENTITY if k in old and k in new and old[k] != new[k]]


def array_names(group: zarr.Group) -> list[str]:
    """The store's arrays, read from its folder: the sub-folders whose ``zarr.json`` is an array's.

    ``results/`` is a plain folder (result groups, mask files) beside the arrays, not a zarr
    node, and zarr's own listing warns about it every time. A filter cannot silence that: zarr
    warns on its event-loop thread, and the process's warning filters are changed by other
    threads too (``warnings.catch_warnings`` is not thread-safe), so a filter here would hold only
    some of the time."""
    root = getattr(group.store, "root", None)
    if root is None:  # not a local folder: zarr's listing (its warning included)
        return list(group.array_keys())
    folder = Path(root) / group.path
    names = []
    for entry in sorted(folder.iterdir()):
        meta = entry / "zarr.json"
        if entry.is_dir() and meta.is_file() and json.loads(meta.read_text()).get("node_type") == "array":
            names.append(entry.name)
    return names


def _view_arrays(group: zarr.Group, view: str) -> list[str]:
    """Every array that belongs to ``view``: its data, flags and grids."""
    return [name for name in array_names(group) if name not in FLAGS and grids.view_of(name) == view]


def chunk_ranges(n_images: int, chunk: int, shard: tuple[int, int] = (0, 1)) -> list[tuple[int, int]]:
    """The chunk-aligned (start, stop) ranges of shard i of n of a store of ``n_images``."""
    i, n = shard
    n_chunks = -(-n_images // chunk)
    lo, hi = (i * n_chunks) // n, ((i + 1) * n_chunks) // n
    return [(c * chunk, min((c + 1) * chunk, n_images)) for c in range(lo, hi)]


class StoreWriter:
    """Fills a created store chunk by chunk; see ``create_store``."""

    def __init__(self, path: Path):
        encode_without_gil()  # chunks compressed beside the forward pass (store/codec.py)
        self.path = Path(path)
        self.group = zarr.open_group(self.path, mode="r+", use_consolidated=False)
        self.manifest = dict(self.group.attrs["manifest"])
        self.chunk = int(self.manifest["chunk"])
        self.n_images = int(self.group["done"].shape[0])
        self.views = sorted(name[len("done_"):] for name in array_names(self.group) if name.startswith("done_"))
        self._opened: dict[tuple[str, bool], zarr.Array] = {}

    def _array(self, name: str, every_chunk: bool = False) -> zarr.Array:
        """An array to write, opened once per writer: each ``group[name]`` reads and parses its
        metadata again (~0.5 ms, about ten per run), and an array's metadata does not change
        once the store is created. ``every_chunk`` (the data arrays): each chunk is written,
        all-NaN or not (the same values read back), as zarr's test for an all-fill chunk passes
        over it once more, half the CPU of writing attention."""
        key = (name, every_chunk)
        array = self._opened.get(key)
        if array is None:  # threads writing at once may both open it: the same array either way
            array = self.group[name]
            self._opened[key] = array = array.with_config({"write_empty_chunks": True}) if every_chunk else array
        return array

    def arrays(self) -> list[str]:
        return [name for name in array_names(self.group) if name not in FLAGS and not name.startswith(PER_VIEW)]

    def done(self, view: str | None = None) -> np.ndarray:
        name = "done" if view is None else f"done_{view}"
        return np.asarray(self.group[name][:], dtype=bool)

    def grid(self, view: str) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.group[f"grid_rows_{view}"][:]), np.asarray(self.group[f"grid_cols_{view}"][:])

    def chunk_ranges(self, shard: tuple[int, int] = (0, 1)) -> list[tuple[int, int]]:
        """The chunk-aligned (start, stop) ranges of shard i of n, contiguous and disjoint."""
        return chunk_ranges(self.n_images, self.chunk, shard)

    def todo(self, shard: tuple[int, int] = (0, 1), views: list[str] | None = None) -> list[tuple[int, int, tuple[str, ...]]]:
        """Runs (start, stop, views lacking) of images some of ``views`` still lack, never crossing
        a chunk; the images of a run lack the same views. Flags are read once."""
        views = self.views if views is None else views
        missing = np.stack([~self.done(view) for view in views], axis=1) if views else np.zeros((self.n_images, 0), dtype=bool)
        runs = []
        for a, b in self.chunk_ranges(shard):
            position = a
            while position < b:
                if not missing[position].any():
                    position += 1
                    continue
                stop = position + 1
                while stop < b and np.array_equal(missing[stop], missing[position]):
                    stop += 1
                runs.append((position, stop, tuple(v for v, lacking in zip(views, missing[position]) if lacking)))
                position = stop
        return runs

    def write(self, start: int, data: dict[str, np.ndarray], sizes: np.ndarray, failed: np.ndarray) -> None:
        """Write every view of images ``start:start+len(failed)``: arrays, then flags (``done`` last)."""
        self.write_views(start, {view: ({k: v for k, v in data.items() if grids.view_of(k) == view}, failed) for view in self.views}, sizes)

    def write_views(self, start: int, views: dict[str, tuple[dict[str, np.ndarray], np.ndarray]], sizes: np.ndarray) -> None:
        """Write some views of images ``start:stop``: each view's arrays and ``failed_<view>``, then
        the sizes, then each ``done_<view>``, then the global flags (``done`` last)."""
        stop = start + len(sizes)
        for view, (data, failed) in views.items():
            for name, values in data.items():
                self._array(name, every_chunk=True)[start:stop] = values
            self._array(f"failed_{view}")[start:stop] = failed
        known = np.asarray(sizes)[:, 0] > 0
        if known.any():
            for column, name in enumerate(("image_height", "image_width")):
                given = np.asarray(sizes)[:, column]
                # an unreadable image keeps the size an earlier run recorded (read only then)
                self._array(name)[start:stop] = given if known.all() else np.where(known, given, np.asarray(self._array(name)[start:stop]))
        for view in views:
            self._array(f"done_{view}")[start:stop] = np.ones(stop - start, dtype=bool)
        self._settle(start, stop, {view: np.asarray(failed, dtype=bool) for view, (_, failed) in views.items()})

    def _settle(self, start: int, stop: int, written: dict[str, np.ndarray]) -> None:
        """The global flags of images ``start:stop`` from the views' own: those ``written`` just
        now (done, and failed as given) from hand, the others read back."""
        done = np.ones(stop - start, dtype=bool)
        failed = np.zeros(stop - start, dtype=bool)
        for view in self.views:
            if view in written:
                failed |= written[view]
                continue
            done &= np.asarray(self._array(f"done_{view}")[start:stop], dtype=bool)
            failed |= np.asarray(self._array(f"failed_{view}")[start:stop], dtype=bool)
        self._array("failed")[start:stop] = failed
        self._array("done")[start:stop] = done


ArrayPlan = dict[str, tuple[tuple[str, ...], tuple[int, ...]]]
Grids = dict[str, tuple[np.ndarray, np.ndarray]]


def _square_grids(arrays: ArrayPlan, n: int) -> Grids:
    """Grids of the views in ``arrays`` when the caller gives none: square, from the patch count
    (or, for a view holding only attention, from its token count less a class token)."""
    sides: dict[str, int] = {}
    for name, (dims, shape) in arrays.items():
        view = grids.view_of(name)
        for dim, size in zip(dims, shape):
            if dim.startswith("patch_"):
                sides[view] = math.isqrt(size)
            elif dim == "query" and view not in sides:
                side = math.isqrt(size)
                sides[view] = side if side * side == size else math.isqrt(size - 1)
        sides.setdefault(view, 0)
    return {view: (np.full(n, side, dtype=np.int32), np.full(n, side, dtype=np.int32)) for view, side in sides.items()}


def _add_view(group: zarr.Group, view: str, arrays: ArrayPlan, grid: tuple[np.ndarray, np.ndarray], chunk: int, dtype: np.dtype) -> None:
    n = int(group["done"].shape[0])
    for name, kind, fill in ((f"done_{view}", bool, False), (f"failed_{view}", bool, False)):
        group.create_array(name, shape=(n,), dtype=kind, chunks=(chunk,), dimension_names=["image"], fill_value=fill, overwrite=True)
    _write_grid(group, view, grid[0], grid[1])
    compressors = [zarr.codecs.ZstdCodec(level=1)]
    for name, (dims, shape) in arrays.items():
        group.create_array(
            name, shape=(n, *shape), dtype=dtype, chunks=(chunk, *shape), dimension_names=["image", *dims],
            fill_value=np.nan, compressors=compressors, overwrite=True,
        )


def _write_grid(group: zarr.Group, view: str, rows: np.ndarray, cols: np.ndarray) -> None:
    """The per-image grid of a view: written once, at creation, in one chunk (a few bytes per image)."""
    n = int(group["done"].shape[0])
    for name, values in ((f"grid_rows_{view}", rows), (f"grid_cols_{view}", cols)):
        array = group.create_array(name, shape=(n,), dtype="int32", chunks=(max(n, 1),), dimension_names=["image"], fill_value=0, overwrite=True)
        if n:
            array[:] = np.asarray(values, dtype=np.int32)


def _upgrade(group: zarr.Group, manifest: dict[str, Any]) -> None:
    """Give a store written before views had their own flags and grids those arrays (same values)."""
    for view in [str(v) for v in manifest.get("views", [])]:
        if f"done_{view}" in group:
            continue
        chunk = int(manifest["chunk"])
        n = int(group["done"].shape[0])
        for flag in ("done", "failed"):
            group.create_array(f"{flag}_{view}", shape=(n,), dtype=bool, chunks=(chunk,), dimension_names=["image"], fill_value=False, overwrite=True)
            if n:
                group[f"{flag}_{view}"][:] = np.asarray(group[flag][:], dtype=bool)
        plan = {name: (tuple(group[name].metadata.dimension_names[1:]), group[name].shape[1:]) for name in _view_arrays(group, view)}
        _write_grid(group, view, *_square_grids(plan, n).get(view, (np.zeros(n, np.int32), np.zeros(n, np.int32))))


def _untouched(path: Path, group: zarr.Group, names: list[str]) -> bool:
    """No image of these flag arrays is done and no analysis has saved results: safe to rebuild."""
    held = path / "results"  # any analysis output, record or file
    return not (held.is_dir() and any(held.iterdir())) and not any(np.asarray(group[name][:], dtype=bool).any() for name in names if name in group)


def _fresh(path: Path, manifest: dict[str, Any], image_ids: list[str], arrays: ArrayPlan, view_grids: Grids) -> None:
    tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    n, chunk, dtype = len(image_ids), int(manifest["chunk"]), np.dtype(manifest["dtype"])
    group = zarr.open_group(tmp, mode="w", zarr_format=3)
    image = group.create_array("image", shape=(n,), dtype=str, chunks=(max(n, 1),), dimension_names=["image"])
    if n:
        image[:] = np.asarray(image_ids, dtype=object)
    for name, kind in (("done", bool), ("failed", bool)):
        group.create_array(name, shape=(n,), dtype=kind, chunks=(chunk,), dimension_names=["image"], fill_value=False)
    for name in ("image_height", "image_width"):
        group.create_array(name, shape=(n,), dtype="int32", chunks=(chunk,), dimension_names=["image"], fill_value=0)
    for view, grid in view_grids.items():
        _add_view(group, view, {k: v for k, v in arrays.items() if grids.view_of(k) == view}, grid, chunk, dtype)
    group.attrs["manifest"] = manifest
    consolidate(tmp)
    tmp.rename(path)


def _merge_manifest(old: dict[str, Any], new: dict[str, Any], added: list[str]) -> dict[str, Any]:
    """The old manifest with the added views' entries (per_view, geometry, views) from the new one."""
    merged = dict(old)
    order = {name: i for i, name in enumerate(VIEW_ORDER)}
    held = {str(v): v for v in old.get("views", [])} | {str(v): v for v in new.get("views", []) if str(v) in added}
    merged["views"] = [held[k] for k in sorted(held, key=lambda k: order.get(k, 99))]
    per_view = {v: view_facts(old, v) for v in held if v not in added}
    per_view.update({v: new.get("per_view", {}).get(v, {}) for v in added})
    merged["per_view"] = per_view
    geometry = dict(old.get("view_geometry", {}))
    geometry.update({v: new.get("view_geometry", {}).get(v) for v in added if v in new.get("view_geometry", {})})
    merged["view_geometry"] = geometry
    if "224" in added and "attention" in new:
        merged["attention"] = new["attention"]
    if "final_norm" in new:  # a store extracted before the final norm was recorded (same checkpoint: identity agrees)
        merged.setdefault("final_norm", new["final_norm"])
    merged.setdefault("grown", []).append({"views": added, "date": new.get("date"), "git_revision": new.get("git_revision")})
    return merged


def create_store(
    path: str | Path,
    manifest: dict[str, Any],
    image_ids: list[str],
    arrays: ArrayPlan,
    view_grids: Grids | None = None,
) -> StoreWriter:
    """Create the store, or reopen it and add the views it lacks, and return a writer.

    ``arrays`` maps a name ``<kind>_<view>`` to its dimension names and shape after ``image``;
    ``view_grids`` gives each view's per-image (rows, cols) (default: square, from the patch
    count). A store written with another checkpoint, network, dtype, chunk or image list is
    refused, and so is an existing view asked with other settings (attention, resample), unless
    nothing of it was written yet: a store (or a view) with no finished image and no results
    takes the new settings, so a run that failed early never blocks the corrected one. Creation
    holds a lock file so that shards starting at once create or grow it exactly once.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    view_grids = {**_square_grids(arrays, len(image_ids)), **(view_grids or {})}
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "zarr.json").is_file():
            group = zarr.open_group(path, mode="r+", use_consolidated=False)
            old = dict(group.attrs.get("manifest", {}))
            bad = _mismatch(old, manifest)
            if bad and _untouched(path, group, ["done", *(f"done_{v}" for v in old.get("views", []))]):
                shutil.rmtree(path)
            elif bad:
                raise ProbeError(
                    path,
                    f"was written with other settings ({', '.join(hints.named_differences(bad, _ids(group), image_ids))} differ)",
                    "use another --cache root or --store, or delete the store to start again",
                )
            else:
                _no_space(path, lambda: _grow(path, group, old, manifest, arrays, view_grids))
                return StoreWriter(path)
        litter.sweep(path.parent, path.name)  # a creation killed (or out of disk) before its rename
        _no_space(path, lambda: _fresh(path, manifest, image_ids, arrays, view_grids))
        return StoreWriter(path)


def _ids(group: zarr.Group) -> list[str]:
    return [str(i) for i in group["image"][:].tolist()] if "image" in group else []


def _no_space(path: Path, step) -> None:
    """Creating or growing a store on a full disk is one line; a half-made new store is removed."""
    try:
        step()
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        raise ProbeError(path, "ran out of disk space while the store was being created or grown", "free space and rerun the same command") from None


def _grow(path: Path, group: zarr.Group, old: dict[str, Any], manifest: dict[str, Any], arrays: ArrayPlan, view_grids: Grids) -> None:
    """Add the views of ``manifest`` the store lacks; check the ones it has (see ``create_store``)."""
    _upgrade(group, old)
    existing = [str(v) for v in old.get("views", [])]
    added = []
    for view, grid in view_grids.items():
        planned = {k: v for k, v in arrays.items() if grids.view_of(k) == view}
        if view in existing:
            differ = _view_mismatch(view_facts(old, view), (manifest.get("per_view") or {}).get(view, {}))
            shapes = {name: tuple(group[name].shape[1:]) for name in planned if name in group}
            differ += [f"{name} shape" for name, (_, shape) in planned.items() if shapes.get(name) != tuple(shape)]
            if not differ:
                continue
            if not _untouched(path, group, [f"done_{view}"]):
                raise ProbeError(
                    path,
                    f"holds the {view} view with other settings ({', '.join(differ)} differ)",
                    "extract into another --store, or delete the store to start again",
                )
            for name in _view_arrays(group, view):
                del group[name]
        _add_view(group, view, planned, grid, int(old["chunk"]), np.dtype(old["dtype"]))
        added.append(view)
    if added:
        merged = _merge_manifest(old, manifest, added)
        group.attrs["manifest"] = merged
        consolidate(path)
        n = int(group["done"].shape[0])
        if n:
            group["done"][:] = np.zeros(n, dtype=bool)  # an image is done when every view is


def _describe_view(ds: xr.Dataset | StoreData, meta: dict[str, Any], view: str) -> str:
    """One line for a view: its grid(s), filter, attention, and how many images it holds."""
    facts = view_facts(meta, view)
    try:
        rows, cols = grids.view_grid(ds, view)
    except ProbeError:
        return "no arrays"
    pairs = sorted(set(zip(rows.tolist(), cols.tolist())) - {(0, 0)}, key=lambda rc: rc[0] * rc[1])
    if len(pairs) == 1:
        grid = f"{pairs[0][0]}x{pairs[0][1]} patches"
    elif pairs:
        grid = f"per-image grids {pairs[0][0]}x{pairs[0][1]} to {pairs[-1][0]}x{pairs[-1][1]} (patch dimension {ds.sizes.get(f'patch_{view}')})"
    else:
        grid = "no grid"
    patch = (meta.get("arch") or {}).get("patch")
    parts = [grid + (f" at /{patch}" if patch else "")]
    parts += [f"{key} {facts[key]}" for key in ("resample", "attention") if facts.get(key) not in (None, "none")]
    if f"done_{view}" in ds:
        done = ds[f"done_{view}"].values.astype(bool)
        parts.append(f"{int(done.sum())}/{done.size} done, {int(ds[f'failed_{view}'].values.astype(bool).sum())} failed")
    return "; ".join(parts)


def describe_store(path: str | Path) -> list[tuple[str, str]]:
    """Rows for ``probe info``: completeness, arrays with shapes, manifest fields, results (read with zarr alone)."""
    ds = open_store(path, done_only=False, plain=True)
    meta = manifest(ds)
    done = ds["done"].values.astype(bool)
    failed = ds["failed"].values.astype(bool)
    n = len(done)
    rows = [
        ("images", f"{int(done.sum())}/{n} done ({100.0 * done.sum() / max(n, 1):.1f} %), {int(failed.sum())} failed"),
        ("checkpoint", f"{meta['checkpoint']['path']} ({meta['checkpoint']['format']}, sha256 {meta['checkpoint']['sha256'][:12]})"),
        ("network", str(meta["network"]) + (" (converted)" if meta["checkpoint"].get("converted") else "")),
        ("arch", ", ".join(f"{k}={v}" for k, v in meta["arch"].items())),
    ]
    rows.append(("views", ", ".join(str(v) for v in meta.get("views", []))))
    for name in ("interpolation", "attention", "dtype", "chunk", "image_source", "image_list_sha256", "toolkit_version", "git_revision", "date"):
        rows.append((name, str(meta.get(name))))
    for view in grids.views_in(ds):
        rows.append((f"view {view}", _describe_view(ds, meta, view)))
    for name, var in sorted(ds.data_vars.items()):
        if name not in FLAGS and not name.startswith(PER_VIEW):
            rows.append((f"array {name}", f"{dict(zip(var.dims, var.shape))} {var.dtype}"))
    return rows
