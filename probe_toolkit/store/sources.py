"""Where a store's photographs are, as an absolute folder, and what their bytes were.

``probe extract`` records ``image_source`` absolute. Stores written before recorded it as typed,
relative to whatever folder the command ran in; such a path is resolved against the store's own
location (the store's folder and each folder above it, nearest first), taking the first folder
that holds every image of the store, never against the current directory, and refused in one
line when none does. ``digests`` hashes the photographs a command is about to hand to workers, so
each worker proves it read the same bytes (``check``) instead of whatever its machine holds at that path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..infra.errors import IntegrityError, ProbeError, worker_name


def _holds(folder: Path, ids: list[str]) -> bool:
    return folder.is_dir() and all((folder / i).is_file() for i in ids)


def _ids(store: str | Path) -> list[str]:
    import zarr

    group = zarr.open_group(str(store), mode="r", use_consolidated=False)
    return [str(v) for v in group["image"][:]] if "image" in group else []


def image_folder(store: str | Path, meta: dict[str, Any], ids: list[str] | None = None) -> Path:
    """The store's photographs' folder, absolute; one line when it cannot be found."""
    source = meta.get("image_source")
    if not source:
        raise ProbeError(store, "does not say where its photographs are (no image_source)", "extract it from an image folder")
    path = Path(str(source))
    if path.is_absolute():
        if not path.is_dir():
            raise ProbeError(store, f"was extracted from {path}, which is gone", f"restore the photographs at {path}")
        return path
    ids = _ids(store) if ids is None else ids
    for above in [Path(store).resolve(), *Path(store).resolve().parents]:
        if _holds(above / path, ids):
            return above / path
    from .hints import extract_arguments

    again = " ".join(extract_arguments(meta, [str(v) for v in meta.get("views", [])], f"/absolute/path/to/{path.name}"))
    raise ProbeError(store, f"records its photographs' folder as {source!r}, relative to wherever it was extracted, and no folder of that "
                            "name beside the store or above it holds its images",
                     f"record the folder (nothing is extracted again): probe extract {again} --store {store}")


def image_folder_or_none(store: str | Path, meta: dict[str, Any]) -> Path | None:
    try:
        return image_folder(store, meta)
    except Exception:
        return None


def file_digest(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def digests(folder: Path, names: Iterable[str]) -> dict[str, str]:
    """sha256 of each photograph (by its id), read once here."""
    return {str(n): file_digest(folder / str(n)) for n in names}


def read_checked(path: str | Path, sha256: str) -> bytes:
    """A file's bytes on a worker, checked against the digest the client took: another file at
    that path (another machine's folder, a changed photograph) is one line, never another number."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise IntegrityError(worker_name(), f"cannot read {path} ({type(error).__name__})",
                             "give every worker the folder at the path the command was given (absolute)") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError(worker_name(), f"reads other bytes at {path} than the command hashed (sha256 {sha256[:12]})",
                             "give every worker the same folder at that path, and leave it alone while the run lasts")
    return data


def record_absolute(store: str | Path, source: str | Path) -> bool:
    """A store written before sources were recorded absolute, extracted again from ``source`` (its
    image list agreed, ``create.create_store``): its manifest now names that folder, absolute.
    True when it changed."""
    import zarr

    from .group import consolidate

    group = zarr.open_group(str(store), mode="r+", use_consolidated=False)
    meta = dict(group.attrs.get("manifest", {}))
    if Path(str(meta.get("image_source") or "")).is_absolute():
        return False
    meta["image_source"] = str(Path(source).resolve())
    group.attrs["manifest"] = meta
    consolidate(store)
    return True


# ----------------------------------------------------------------------------------------------
# each photograph's sha256, recorded beside the store's arrays

DIGESTS = "image_sha256"  # (image, byte) uint8: the sha256 of each image's file as extracted; zeros: not recorded


def record_digests(store: str | Path, folder: str | Path) -> int:
    """After ``probe extract``: the sha256 of every finished image's file that has none recorded
    yet (an older store gets them on its next extraction), in ``image_sha256``. Each shard
    writes its own chunks (an image's row is written by whoever finds it finished and unrecorded:
    the same bytes either way). The number recorded now."""
    import fcntl

    import numpy as np
    import zarr

    from .codec import compressors
    from .group import consolidate

    store, folder = Path(store), Path(folder)
    with open(store.parent / f".{store.name}.lock", "w") as lock:  # the lock under which the store is created or grown
        fcntl.flock(lock, fcntl.LOCK_EX)
        group = zarr.open_group(str(store), mode="r+", use_consolidated=False)
        n, chunk = int(group["image"].shape[0]), int(group["done"].chunks[0])
        if DIGESTS not in group:
            group.create_array(DIGESTS, shape=(n, 32), dtype="uint8", chunks=(chunk, 32), dimension_names=["image", "sha256_byte"],
                               fill_value=0, compressors=compressors())
            consolidate(store)  # plain xarray.open_zarr lists it too
    array = group[DIGESTS]
    ids = [str(v) for v in group["image"][:]]
    finished = np.asarray(group["done"][:], dtype=bool) & ~np.asarray(group["failed"][:], dtype=bool)
    recorded = 0
    for c in range(-(-n // chunk)):
        lo, hi = c * chunk, min((c + 1) * chunk, n)
        rows = np.asarray(array[lo:hi])
        todo = [i for i in range(lo, hi) if finished[i] and not rows[i - lo].any() and (folder / ids[i]).is_file()]
        if not todo:
            continue
        for i in todo:
            rows[i - lo] = np.frombuffer(bytes.fromhex(file_digest(folder / ids[i])), dtype=np.uint8)
        array[lo:hi] = rows
        recorded += len(todo)
    return recorded


def recorded_digests(store: str | Path, positions) -> list[str | None]:
    """The sha256 recorded for the images at ``positions`` (None: not recorded)."""
    import numpy as np
    import zarr

    group = zarr.open_group(str(store), mode="r", use_consolidated=False)
    if DIGESTS not in group:
        return [None] * len(positions)
    rows = np.asarray(group[DIGESTS].get_orthogonal_selection((np.asarray(positions, dtype=np.int64),)))
    return [row.tobytes().hex() if row.any() else None for row in rows]


def check_unchanged(store: str | Path, folder: str | Path, ids: list[str], positions) -> None:
    """The files of images ``ids`` (at ``positions`` of the store) in ``folder`` are the bytes the
    store was extracted from, where it recorded them: else one line naming the first that differs."""
    folder = Path(folder)
    for name, want in zip(ids, recorded_digests(store, positions)):
        if want is None:
            continue
        path = folder / name
        if not path.is_file():
            raise ProbeError(path, "is gone, but the store was extracted from it", f"restore the photographs at {folder}")
        if file_digest(path) != want:
            raise ProbeError(path, f"is not the photograph the store was extracted from (sha256 {want[:12]} recorded)",
                             "restore the photographs the store was extracted from (or extract a new store from these)")
