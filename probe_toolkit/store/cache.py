"""The feature cache: one zarr v3 store per (checkpoint, network), read as an xarray Dataset.

Layout (every array chunked along ``image``; dimension names are stored in zarr v3 metadata):

    image                (image,)                       str, the coordinate: ids relative to the source
    done, failed         (image,)                       bool; ``done`` is written last for a chunk
    image_height/width   (image,)                       int32, the original size in pixels
    tokens_224           (image, patch_224, channel)    last-block tokens, before any final norm
    cls_tokens_224       (image, channel)               when the network has a class token
    attention_224        (image, head, query, key)      last block; covers every token (0 = CLS if any)
    attention_blocks_224 (image, block, head, query, key)  with ``--attention all``
    keys_480             (image, patch_480, channel)    last-block keys, heads concatenated
    cls_keys_480         (image, channel)
    tokens_96            (image, patch_96, channel)
    results/<name>/      one group per analysis, written by ``save_results``

Patch dimensions carry their view because one Dataset cannot hold two sizes of one dimension;
``require(ds, name)`` returns an array with the plain dimension name ``patch``. The manifest
lives in the root group's attributes under ``manifest``.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from ..infra import litter
from ..infra.errors import ProbeError

DEFAULT_ROOT = Path("cache")

# which ``probe extract`` flag produces each array, for the error that says how to get it
ARRAY_FLAGS = {
    "tokens_224": "--views 224",
    "attention_224": "--views 224 --attention last",
    "attention_blocks_224": "--views 224 --attention all",
    "keys_480": "--views 480",
    "tokens_96": "--views 96",
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


def open_store(path: str | Path, *, done_only: bool = True, allow_partial: bool = True) -> xr.Dataset:
    """Open a store lazily (dask chunks along ``image``).

    With ``done_only`` the dataset holds only images whose extraction finished and did not
    fail, so a reader during a write never sees a half-written image. Without
    ``allow_partial`` a store whose extraction has not finished is an error (analyses refuse
    to summarise a set that is still growing unless asked with ``--partial``).
    """
    path = Path(path)
    if not (path / "zarr.json").is_file():
        raise ProbeError(path, "is not a probe store (no zarr.json)", "run `probe extract` first")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(path, consolidated=False, chunks={})
    if "manifest" not in ds.attrs:
        raise ProbeError(path, "has no manifest", "it was not written by `probe extract`")
    if not allow_partial and "done" in ds:
        done = ds["done"].values.astype(bool)
        if not done.all():
            raise ProbeError(path, f"is incomplete: {int(done.sum())}/{done.size} images done", "finish it with the same `probe extract` command, or pass --partial")
    if done_only and "done" in ds:
        keep = ds["done"].values.astype(bool)
        if "failed" in ds:
            keep &= ~ds["failed"].values.astype(bool)
        ds = ds.isel(image=np.flatnonzero(keep))
    ds.attrs["store"] = str(path)
    return ds


def manifest(ds_or_path: xr.Dataset | str | Path) -> dict[str, Any]:
    """The store's manifest (a plain dict)."""
    if isinstance(ds_or_path, xr.Dataset):
        return dict(ds_or_path.attrs["manifest"])
    group = zarr.open_group(Path(ds_or_path), mode="r")
    return dict(group.attrs["manifest"])


def require(ds: xr.Dataset, name: str) -> xr.DataArray:
    """The array ``name`` with its patch dimension named ``patch``, or an error naming the extract flag."""
    if name not in ds:
        flag = ARRAY_FLAGS.get(name, "")
        fix = f"rerun `probe extract` with {flag}" if flag else "rerun `probe extract`"
        raise ProbeError(ds.attrs.get("store"), f"has no array {name}", fix)
    array = ds[name]
    array = array.rename({d: "patch" for d in array.dims if str(d).startswith("patch_")})
    if ds.attrs.get("store") and "manifest" in ds.attrs:  # so that cluster tasks can prove they read this store
        from ..infra.chunked import fingerprint

        array.attrs.update(probe_store=str(Path(ds.attrs["store"]).resolve()), probe_fingerprint=fingerprint(ds.attrs["manifest"]))
    return array


def results_path(store: str | Path, name: str) -> Path:
    return Path(store) / "results" / name


def save_results(store: str | Path, name: str, results: xr.Dataset, attrs: dict[str, Any] | None = None) -> Path:
    """Write one analysis' results into ``<store>/results/<name>`` atomically (temp, rename)."""
    target = results_path(store, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    litter.sweep(target.parent)  # what killed runs left (their process is gone) goes first
    tmp = target.with_name(f".{name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    results = results.copy()
    results.attrs.update(attrs or {})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.to_zarr(tmp, mode="w", consolidated=False, zarr_format=3)
    except BaseException as error:  # a full disk, Ctrl-C: no half-written result stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):
            raise ProbeError(target, f"could not be written ({error.strerror or error})", "free disk space and rerun the analysis; the previous result is kept") from None
        raise
    if target.exists():
        old = target.with_name(f".{name}.old-{os.getpid()}")
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old)
    else:
        tmp.rename(target)
    consolidate(store)
    return target


def consolidate(store: str | Path) -> None:
    """Rewrite the consolidated metadata after arrays or groups change, so that a plain
    ``xarray.open_zarr(store)`` opens without a warning (probe's own readers never use it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note that consolidation is not yet in the v3 spec
        zarr.consolidate_metadata(str(store))


def load_results(store: str | Path, name: str) -> xr.Dataset | None:
    """The saved results ``name`` of a store, or None when that analysis has not run."""
    target = results_path(store, name)
    if not (target / "zarr.json").is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(target, consolidated=False).load()


def list_results(store: str | Path) -> list[str]:
    root = Path(store) / "results"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "zarr.json").is_file() and not litter.is_litter(p.name))


# ----------------------------------------------------------------------------------------------
# Writing: a store is created once with its full image list; chunks are then filled in any
# order (by shards, by reruns) and a chunk's ``done`` flags are written after its data.

# manifest fields that must agree before a process may write into an existing store
IDENTITY = ("checkpoint", "network", "arch", "views", "interpolation", "attention", "dtype", "image_list_sha256", "chunk")


def identity(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: manifest.get(k) for k in IDENTITY}


def _mismatch(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = identity(old), identity(new)
    if isinstance(a.get("checkpoint"), dict) and isinstance(b.get("checkpoint"), dict):
        a["checkpoint"] = a["checkpoint"].get("sha256")
        b["checkpoint"] = b["checkpoint"].get("sha256")
    return [k for k in IDENTITY if a[k] != b[k]]


class StoreWriter:
    """Fills a created store chunk by chunk; see ``create_store``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.group = zarr.open_group(self.path, mode="r+", use_consolidated=False)
        self.manifest = dict(self.group.attrs["manifest"])
        self.chunk = int(self.manifest["chunk"])
        self.n_images = int(self.group["done"].shape[0])

    def arrays(self) -> list[str]:
        return [name for name in self.group.array_keys() if name not in ("image", "done", "failed", "image_height", "image_width")]

    def done(self) -> np.ndarray:
        return np.asarray(self.group["done"][:], dtype=bool)

    def chunk_ranges(self, shard: tuple[int, int] = (0, 1)) -> list[tuple[int, int]]:
        """The chunk-aligned (start, stop) ranges of shard i of n, contiguous and disjoint."""
        i, n = shard
        n_chunks = -(-self.n_images // self.chunk)
        lo, hi = (i * n_chunks) // n, ((i + 1) * n_chunks) // n
        return [(c * self.chunk, min((c + 1) * self.chunk, self.n_images)) for c in range(lo, hi)]

    def todo(self, shard: tuple[int, int] = (0, 1)) -> list[tuple[int, int]]:
        done = self.done()
        return [(a, b) for a, b in self.chunk_ranges(shard) if not done[a:b].all()]

    def write(self, start: int, data: dict[str, np.ndarray], sizes: np.ndarray, failed: np.ndarray) -> None:
        """Write one chunk's arrays, then its ``failed`` flags, then its ``done`` flags (last)."""
        stop = start + len(failed)
        for name, values in data.items():
            self.group[name][start:stop] = values
        self.group["image_height"][start:stop] = sizes[:, 0]
        self.group["image_width"][start:stop] = sizes[:, 1]
        self.group["failed"][start:stop] = failed
        self.group["done"][start:stop] = np.ones(stop - start, dtype=bool)


def create_store(
    path: str | Path,
    manifest: dict[str, Any],
    image_ids: list[str],
    arrays: dict[str, tuple[tuple[str, ...], tuple[int, ...]]],
) -> StoreWriter:
    """Create the store (or reopen it when its manifest matches) and return a writer.

    ``arrays`` maps a name to its dimension names and shape after ``image``. A store written
    with another checkpoint, network, view setting or image list is refused. Creation holds a
    lock file so that shards starting at once create it exactly once.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = int(manifest["chunk"])
    dtype = np.dtype(manifest["dtype"])
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "zarr.json").is_file():
            group = zarr.open_group(path, mode="r", use_consolidated=False)
            old = dict(group.attrs.get("manifest", {}))
            bad = _mismatch(old, manifest)
            if bad:
                raise ProbeError(
                    path,
                    f"was written with other settings ({', '.join(bad)} differ)",
                    "use another --cache root or delete the store to start again",
                )
            missing = [name for name in arrays if name not in group]
            if missing:
                raise ProbeError(path, f"lacks arrays {missing} for these settings", "delete the store and extract again")
            return StoreWriter(path)
        litter.sweep(path.parent, path.name)  # a creation killed (or out of disk) before its rename
        tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        n = len(image_ids)
        group = zarr.open_group(tmp, mode="w", zarr_format=3)
        image = group.create_array("image", shape=(n,), dtype=str, chunks=(max(n, 1),), dimension_names=["image"])
        if n:
            image[:] = np.asarray(image_ids, dtype=object)
        for name, kind in (("done", bool), ("failed", bool)):
            group.create_array(name, shape=(n,), dtype=kind, chunks=(chunk,), dimension_names=["image"], fill_value=False)
        for name in ("image_height", "image_width"):
            group.create_array(name, shape=(n,), dtype="int32", chunks=(chunk,), dimension_names=["image"], fill_value=0)
        compressors = [zarr.codecs.ZstdCodec(level=1)]
        for name, (dims, shape) in arrays.items():
            group.create_array(
                name,
                shape=(n, *shape),
                dtype=dtype,
                chunks=(chunk, *shape),
                dimension_names=["image", *dims],
                fill_value=np.nan,
                compressors=compressors,
            )
        group.attrs["manifest"] = manifest
        consolidate(tmp)
        tmp.rename(path)
        return StoreWriter(path)


def describe_store(path: str | Path) -> list[tuple[str, str]]:
    """Rows for ``probe info``: completeness, arrays with shapes, manifest fields, results."""
    ds = open_store(path, done_only=False)
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
    for name in ("views", "interpolation", "attention", "dtype", "chunk", "image_source", "image_list_sha256", "toolkit_version", "git_revision", "date"):
        rows.append((name, str(meta.get(name))))
    for name, var in ds.data_vars.items():
        if name not in ("done", "failed", "image_height", "image_width"):
            rows.append((f"array {name}", f"{dict(zip(var.dims, var.shape))} {var.dtype}"))
    rows.append(("results", ", ".join(list_results(path)) or "none yet"))
    return rows
