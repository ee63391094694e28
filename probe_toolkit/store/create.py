"""Creating a store, or growing it by the views it lacks: a store is created once with its full
image list (``store.writer`` then fills its chunks); a later run may add views beside the
existing ones, and one written with other settings is refused unless nothing of it was written.
"""

from __future__ import annotations

import errno
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ..infra import litter
from ..infra.errors import ProbeError
from . import codec, grids, hints, integrity, layout
from .cache import FLAGS, PER_VIEW, view_facts
from .group import array_names, consolidate
from .views import order as view_order
from .writer import StoreWriter

# manifest fields that must agree before a process may write into an existing store
IDENTITY = ("checkpoint", "network", "arch", "interpolation", "dtype", "image_list_sha256", "chunk")
# per-view facts that must agree before a process may write into an existing view (what else it
# asks, another block, facet or attention array, grows the view by a part: store/layout.py)
VIEW_IDENTITY = ("resample", "patches")
# per-view facts compared even where the old manifest lacks them (a view made before the fact existed differs)
VIEW_IDENTITY_STRICT = ("augmentation",)


def identity(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: manifest.get(k) for k in IDENTITY}


def _mismatch(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = identity(old), identity(new)
    if isinstance(a.get("checkpoint"), dict) and isinstance(b.get("checkpoint"), dict):
        a["checkpoint"] = a["checkpoint"].get("sha256")
        b["checkpoint"] = b["checkpoint"].get("sha256")
    return [k for k in IDENTITY if a[k] != b[k]]


def _view_mismatch(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [k for k in VIEW_IDENTITY if k in old and k in new and old[k] != new[k]] + [k for k in VIEW_IDENTITY_STRICT if k in new and old.get(k) != new[k]]


def _view_arrays(group: zarr.Group, view: str) -> list[str]:
    """Every array that belongs to ``view``: its data, flags and grids."""
    return [name for name in array_names(group) if name not in FLAGS and grids.view_of(name) == view]


ArrayPlan = dict[str, tuple]  # name -> (dims, shape) after ``image``, and optionally attributes (dtype, block, facet)
Grids = dict[str, tuple[np.ndarray, np.ndarray]]


def _square_grids(arrays: ArrayPlan, n: int) -> Grids:
    """Grids of the views in ``arrays`` when the caller gives none: square, from the patch count
    (or, for a view holding only attention, from its token count less a class token)."""
    sides: dict[str, int] = {}
    for name, (dims, shape, *_) in arrays.items():
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
        group.create_array(name, shape=(n,), dtype=kind, chunks=(chunk,), dimension_names=["image"], fill_value=fill, overwrite=True, compressors=codec.compressors())
    _write_grid(group, view, grid[0], grid[1])
    compressors = codec.compressors()  # zstd, then a crc32c checksum of each chunk
    for name, (dims, shape, *more) in arrays.items():
        attrs = dict(more[0]) if more else {}
        created = group.create_array(
            name,
            shape=(n, *shape),
            dtype=np.dtype(attrs.pop("dtype", dtype)),
            chunks=(chunk, *shape),
            dimension_names=["image", *dims],
            fill_value=np.nan,
            compressors=compressors,
            overwrite=True,
        )
        if attrs:  # which block and facet it holds (store/layout.py)
            created.attrs.update(attrs)


def _write_grid(group: zarr.Group, view: str, rows: np.ndarray, cols: np.ndarray) -> None:
    """The per-image grid of a view: written once, at creation, in one chunk (a few bytes per image).
    The chunk is written even when every value is the fill value (a view without a patch grid,
    such as a masks store's): a missing chunk is how a damaged store is recognised."""
    n = int(group["done"].shape[0])
    for name, values in ((f"grid_rows_{view}", rows), (f"grid_cols_{view}", cols)):
        array = group.create_array(
            name, shape=(n,), dtype="int32", chunks=(max(n, 1),), dimension_names=["image"], fill_value=0, overwrite=True, compressors=codec.compressors()
        )
        if n:
            array.with_config({"write_empty_chunks": True})[:] = np.asarray(values, dtype=np.int32)


def _upgrade(group: zarr.Group, manifest: dict[str, Any]) -> None:
    """Give a store written before views had their own flags and grids those arrays (same values)."""
    for view in [str(v) for v in manifest.get("views", [])]:
        if f"done_{view}" in group:
            continue
        chunk = int(manifest["chunk"])
        n = int(group["done"].shape[0])
        for flag in ("done", "failed"):
            group.create_array(
                f"{flag}_{view}", shape=(n,), dtype=bool, chunks=(chunk,), dimension_names=["image"], fill_value=False, overwrite=True, compressors=codec.compressors()
            )
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
    checked = codec.compressors()  # every array: zstd, then a crc32c checksum of each chunk
    image = group.create_array("image", shape=(n,), dtype=str, chunks=(max(n, 1),), dimension_names=["image"], compressors=checked)
    if n:
        image[:] = np.asarray(image_ids, dtype=object)
    for name, kind in (("done", bool), ("failed", bool)):
        group.create_array(name, shape=(n,), dtype=kind, chunks=(chunk,), dimension_names=["image"], fill_value=False, compressors=checked)
    for name in ("image_height", "image_width"):
        group.create_array(name, shape=(n,), dtype="int32", chunks=(chunk,), dimension_names=["image"], fill_value=0, compressors=checked)
    for view, grid in view_grids.items():
        _add_view(group, view, {k: v for k, v in arrays.items() if grids.view_of(k) == view}, grid, chunk, dtype)
    group.attrs["manifest"] = manifest
    consolidate(tmp)
    tmp.rename(path)


def _merge_manifest(old: dict[str, Any], new: dict[str, Any], added: list[str]) -> dict[str, Any]:
    """The old manifest with the added views' entries (per_view, geometry, views) from the new one."""
    merged = dict(old)
    held = {str(v): v for v in old.get("views", [])} | {str(v): v for v in new.get("views", []) if str(v) in added}
    merged["views"] = [held[k] for k in sorted(held, key=view_order)]
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


def lock_file(path: str | Path) -> Path:
    """``.<store>.lock`` beside a store: empty, probe's, the lock under which shards create and grow
    one store (beside it, since it must exist before the store does); it stays as long as the store."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


def create_store(
    path: str | Path,
    manifest: dict[str, Any],
    image_ids: list[str],
    arrays: ArrayPlan,
    view_grids: Grids | None = None,
    repair: bool = False,
) -> StoreWriter:
    """Create the store, or reopen it and add the views it lacks, and return a writer.

    ``arrays`` maps a name ``<kind>_<view>`` to its dimension names and shape after ``image``;
    ``view_grids`` gives each view's per-image (rows, cols) (default: square, from the patch
    count). A store written with another checkpoint, network, dtype, chunk or image list is
    refused, and so is an existing view asked with other settings (attention, resample), unless
    nothing of it was written yet: a store (or a view) with no finished image and no results
    takes the new settings, so a run that failed early never blocks the corrected one. Creation
    holds a lock file so that shards starting at once create or grow it exactly once. A store
    whose completion flag chunk was deleted is refused (``integrity.check_flags``) unless
    ``repair``: its images would otherwise be extracted again as unfinished, unchecked.
    """
    import fcntl

    path = Path(path)
    holder = next((p for p in path.resolve().parents if (p / "zarr.json").is_file()), None)
    if holder is not None:  # inside another store (its results/, say): that store's folder is probe's, and a reader would trip on it
        raise ProbeError(path, f"lies inside the store {holder}", "pass --store a path outside any store")
    path.parent.mkdir(parents=True, exist_ok=True)
    view_grids = {**_square_grids(arrays, len(image_ids)), **(view_grids or {})}
    with open(lock_file(path), "w") as lock:
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
                integrity.check_listed(path, group, growing=True)  # a deleted flag or grid array (--repair cannot bring back what it held)
                if not repair:  # every flag, the global ``done`` too: a deleted one is damage, not "0 written" with exit 0
                    integrity.check_flags(path, group)
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
    """Add the views of ``manifest`` the store lacks, and to a view it holds the arrays it lacks
    (another block, facet or attention array) as a new part of that view (``store.layout``); check
    the ones it has (see ``create_store``)."""
    _upgrade(group, old)
    existing = [str(v) for v in old.get("views", [])]
    added, parts = [], {}
    for view, grid in view_grids.items():
        planned = {k: v for k, v in arrays.items() if grids.view_of(k) == view}
        if view in existing:
            differ = _view_mismatch(view_facts(old, view), (manifest.get("per_view") or {}).get(view, {}))
            held = _held(group, view)
            shapes = {name: tuple(group[held[_key(name)]].shape[1:]) for name in planned if _key(name) in held}
            differ += [f"{name} shape" for name, (_, shape, *_) in planned.items() if _key(name) in held and shapes[name] != tuple(shape)]
            new = {name: spec for name, spec in planned.items() if _key(name) not in held}
            if not differ and not new:
                continue
            untouched = _untouched(path, group, [f"done_{u}" for u in _units(group, view)])
            if differ and not untouched:
                raise ProbeError(
                    path,
                    f"holds the {view} view with other settings ({', '.join(differ)} differ)",
                    "extract into another --store, or delete the store to start again",
                )
            if not untouched:  # what it lacks, as a part of its own: what it holds stays readable
                part = 1 + max(layout.split_unit(u)[1] for u in _units(group, view))
                unit = layout.unit(view, part)
                renamed = {_in_part(name, part): _dims_in_part(spec, view, unit) for name, spec in new.items()}
                _add_view(group, unit, renamed, grid, int(old["chunk"]), np.dtype(old["dtype"]))
                parts[view] = (part, sorted(renamed))
                continue
            for unit in _units(group, view):
                for name in _view_arrays(group, unit):
                    del group[name]
        _add_view(group, view, planned, grid, int(old["chunk"]), np.dtype(old["dtype"]))
        added.append(view)
    if added or parts:
        merged = _merge_manifest(old, manifest, added)
        for view, (part, names) in parts.items():
            entry = merged["per_view"].setdefault(view, {})
            entry["parts"] = [*entry.get("parts", []), {"part": part, "arrays": names, **{k: manifest.get(k) for k in ("date", "git_revision")}}]
            merged["grown"][-1].setdefault("parts", []).append(layout.unit(view, part))
        group.attrs["manifest"] = merged
        consolidate(path)
        n = int(group["done"].shape[0])
        if n:
            group["done"][:] = np.zeros(n, dtype=bool)  # an image is done when every view (and part) is


def _key(name: str) -> tuple[str, int | None]:
    found = layout.parse(name)
    return found.kind, found.block


def _held(group: zarr.Group, view: str) -> dict[tuple[str, int | None], str]:
    """The arrays of ``view`` in any of its parts, by (kind, block)."""
    out = {}
    for name in array_names(group):
        found = layout.parse(name)
        if found.view == view and name not in FLAGS and not name.startswith(PER_VIEW):
            out.setdefault((found.kind, found.block), name)
    return out


def _units(group: zarr.Group, view: str) -> list[str]:
    """The view's parts held (``224``, ``224.p1``, ...), by their flags."""
    return [name[len("done_") :] for name in array_names(group) if name.startswith("done_") and layout.split_unit(name[len("done_") :])[0] == view]


def _in_part(name: str, part: int) -> str:
    found = layout.parse(name)
    return layout.ArrayName(found.kind, found.view, found.block, part).name


def _dims_in_part(spec: tuple, view: str, unit: str) -> tuple:
    """A part's own patch, query and key dimensions (the 224 view's maps keep ``query`` and ``key``)."""
    dims = tuple(d.replace(f"_{view}", f"_{unit}", 1) if d in (f"patch_{view}", f"query_{view}", f"key_{view}") else d for d in spec[0])
    return (dims, *spec[1:])
