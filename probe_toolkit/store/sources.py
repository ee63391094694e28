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
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..infra.errors import IntegrityError, ProbeError, worker_name


def _holds(folder: Path, ids: list[str]) -> bool:
    return folder.is_dir() and all((folder / i).is_file() for i in ids)


def _ids(store: str | Path) -> list[str]:
    from .group import open_read

    group = open_read(store)
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
    raise ProbeError(
        store,
        f"records its photographs' folder as {source!r}, relative to wherever it was extracted, and no folder of that name beside the store or above it holds its images",
        f"record the folder (nothing is extracted again): probe extract {again} --store {store}",
    )


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
        raise IntegrityError(
            worker_name(), f"cannot read {path} ({type(error).__name__})", "give every worker the folder at the path the command was given (absolute)"
        ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError(
            worker_name(),
            f"reads other bytes at {path} than the command hashed (sha256 {sha256[:12]})",
            "give every worker the same folder at that path, and leave it alone while the run lasts",
        )
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
# each photograph's sha256 (and its size and mtime), taken as it is decoded (``images.load_photo``)
# and recorded beside the store's arrays (``store.writer``): every
# read path that pairs stored features with files read now (labels, masks, pictures) checks that
# the files are still the ones extracted (``changed``), and ``probe extract`` refuses to grow a
# store whose photographs changed in place

DIGESTS = "image_sha256"  # (image, byte) uint8: the sha256 of each image's file as extracted; zeros: not recorded
STATS = "image_stat"  # (image, 2) int64: the file's size and mtime (ns) when its sha256 was taken; zeros: not recorded
CHECKED_AT_ONCE = 4096  # images whose records ``changed`` holds at a time


def _stat(path: Path) -> tuple[int, int]:
    found = path.stat()
    return int(found.st_size), int(found.st_mtime_ns)


def record_arrays(store: str | Path) -> None:
    """``image_sha256`` and ``image_stat`` in the store, made once (under the lock shards create
    and grow a store by; an older store gets them on its next extraction)."""
    import fcntl

    import zarr

    from .codec import compressors
    from .create import lock_file
    from .group import consolidate

    with open(lock_file(store), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        group = zarr.open_group(str(store), mode="r+", use_consolidated=False)
        n, chunk = int(group["image"].shape[0]), int(group["done"].chunks[0])
        made = False
        for name, width, dtype in ((DIGESTS, 32, "uint8"), (STATS, 2, "int64")):
            if name not in group:
                group.create_array(
                    name, shape=(n, width), dtype=dtype, chunks=(chunk, width), dimension_names=["image", f"{name}_part"], fill_value=0, compressors=compressors()
                )
                made = True
        if made:
            consolidate(store)  # plain xarray.open_zarr lists them too


def check_decoded(store: Path, group, start: int, paths: list[Path], sha256) -> None:
    """While ``probe extract`` grows a store: one line when a file decoded now is not the bytes
    recorded for it (checked unchanged when the run began, replaced since), before anything of it
    is written; the store would otherwise pair its old views with the new file's."""
    import numpy as np

    held = np.asarray(group[DIGESTS][start : start + len(paths)])
    for i in np.flatnonzero(held.any(axis=1) & sha256.any(axis=1) & (held != sha256).any(axis=1)):
        raise ProbeError(
            paths[i],
            f"has changed while the run lasted (sha256 {held[i].tobytes().hex()[:12]} when extracted): the store holds the features of the old file",
            stale_fix(Path(store)),
        )


def record_digests(store: str | Path, folder: str | Path, positions=None) -> int:
    """After ``probe extract`` grew a store: the sha256 of every finished image's file that has
    none recorded yet (finished by an extraction before sha256 were recorded as images were
    decoded, ``store.writer``), with the file's size and mtime in ``image_stat`` (an image recorded
    before stats were gets them once its hash is found unchanged). Each shard writes its own
    chunks (an image's row is written by whoever finds it finished and unrecorded: the same bytes
    either way). ``positions``: only these images (those ``check_current`` found unrecorded when the
    run began; the run's own are recorded as they are written). The number recorded now."""
    import numpy as np
    import zarr

    store, folder = Path(store), Path(folder)
    record_arrays(store)
    group = zarr.open_group(str(store), mode="r+", use_consolidated=False)
    digests, stats = group[DIGESTS], group[STATS]
    n, chunk = int(group["image"].shape[0]), int(group["done"].chunks[0])
    finished = np.asarray(group["done"][:], dtype=bool) & ~np.asarray(group["failed"][:], dtype=bool)
    if positions is not None:
        finished &= np.isin(np.arange(n), np.asarray(positions, dtype=np.int64))
    ids = None
    recorded = 0
    step = max(1, CHECKED_AT_ONCE // chunk) * chunk  # rows read a portion at a time (one call over its chunks), written a chunk at a time
    for a in range(0, n, step):
        b = min(a + step, n)
        if not finished[a:b].any():
            continue
        rows, sizes = np.asarray(digests[a:b]), np.asarray(stats[a:b])
        hashed, stated = rows.any(axis=1), sizes.any(axis=1)
        if not (finished[a:b] & ~(hashed & stated)).any():  # every finished image recorded (as extraction records them now)
            continue
        ids = [str(v) for v in group["image"][:]] if ids is None else ids
        for lo in range(a, b, chunk):
            hi = min(lo + chunk, b)
            new = [i for i in range(lo, hi) if finished[i] and not hashed[i - a] and (folder / ids[i]).is_file()]
            unstated = [i for i in range(lo, hi) if finished[i] and hashed[i - a] and not stated[i - a] and (folder / ids[i]).is_file()]
            for i in new:
                sizes[i - a] = _stat(folder / ids[i])
                rows[i - a] = np.frombuffer(bytes.fromhex(file_digest(folder / ids[i])), dtype=np.uint8)
            for i in unstated:  # recorded before stats were: the stat of these very bytes only
                stat = _stat(folder / ids[i])
                if file_digest(folder / ids[i]) == rows[i - a].tobytes().hex():
                    sizes[i - a] = stat
            if new:  # this chunk alone: another shard may be writing the chunks beside it
                digests[lo:hi] = rows[lo - a : hi - a]
            if new or unstated:
                stats[lo:hi] = sizes[lo - a : hi - a]
            recorded += len(new)
    return recorded


def recorded_digests(store: str | Path, positions) -> list[str | None]:
    """The sha256 recorded for the images at ``positions`` (None: not recorded)."""
    return [digest for digest, _ in recorded(store, positions)]


def recorded(store: str | Path, positions) -> list[tuple[str | None, tuple[int, int] | None]]:
    """(sha256, (size, mtime ns)) recorded for the images at ``positions`` (None where not recorded)."""
    import numpy as np

    from .group import open_read

    group = open_read(store)
    at = (np.asarray(positions, dtype=np.int64),)
    if DIGESTS not in group:
        return [(None, None)] * len(positions)
    rows = np.asarray(group[DIGESTS].get_orthogonal_selection(at))
    stats = np.asarray(group[STATS].get_orthogonal_selection(at)) if STATS in group else np.zeros((len(rows), 2), np.int64)
    return [(row.tobytes().hex() if row.any() else None, (int(st[0]), int(st[1])) if st.any() else None) for row, st in zip(rows, stats)]


def positions_of(store: str | Path, ids: Sequence[str]):
    """The store positions of images ``ids`` (as the store names them; a name held twice: its last),
    looked up as sorted arrays (``infra.names``); KeyError for a name the store lacks."""
    import numpy as np

    from ..infra.names import lookup
    from .group import open_read

    group = open_read(store)
    at, found = lookup(group["image"][:] if "image" in group else [], ids)  # the names as read, not a list of them
    if not found.all():
        raise KeyError(ids[int(np.argmin(found))])
    return at


class Pairs(Sequence[tuple[str, str]]):
    """(store id, file path) pairs for ``changed``, made when asked: ``store_ids[k]`` and ``folder`` /
    ``names[k]`` for each k of ``at`` (a list of a data set's pairs is tens of MiB of tuples and paths)."""

    def __init__(self, store_ids: Sequence[str], folder: str, names: Sequence[str], at):
        self._ids, self._folder, self._names, self._at = store_ids, folder, names, at

    def __len__(self) -> int:
        return len(self._at)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        i = int(self._at[k])
        return self._ids[i], os.path.join(self._folder, self._names[i])


def changed(store: str | Path, files: list[tuple[str, Path]], unrecorded: list[int] | None = None) -> list[tuple[Path, str]]:
    """Of ``(store id, file now)`` pairs, the files that are not the bytes the store was extracted
    from, with why: gone, or another sha256. A file whose size and mtime are those recorded is
    taken as unchanged without reading it; any other is hashed (``benchmarks/freshness.py``
    measures both). Images the store recorded nothing of are not judged; ``unrecorded`` (a list)
    gets the store positions of those, and of those without a stat, from the same read."""
    found = []
    positions = positions_of(store, [i for i, _ in files]) if files else []
    for a in range(0, len(files), CHECKED_AT_ONCE):  # the records of a portion at a time: a data set's whole is large as Python objects
        wanted = recorded(store, positions[a : a + CHECKED_AT_ONCE])
        found += _changed(files[a : a + CHECKED_AT_ONCE], wanted)
        if unrecorded is not None:
            unrecorded += [int(positions[a + k]) for k, (digest, stat) in enumerate(wanted) if digest is None or stat is None]
    return found


def _changed(files: list[tuple[str, Path]], wanted: list[tuple[str | None, tuple[int, int] | None]]) -> list[tuple[Path, str]]:
    """``changed`` of files whose records are ``wanted``."""
    found = []
    for (_, path), (digest, stat) in zip(files, wanted):
        if digest is None:
            continue
        path = Path(path)
        if not path.is_file():
            found.append((path, "is gone"))
            continue
        now = _stat(path)
        if stat is not None and now == stat:
            continue
        if stat is not None and now[0] != stat[0]:
            found.append((path, f"has changed ({now[0]} bytes, {stat[0]} when extracted)"))
        elif file_digest(path) != digest:
            found.append((path, f"has changed (sha256 {digest[:12]} when extracted)"))
    return found


def check_current(store: str | Path, files: list[tuple[str, Path]], fix: str = "", unrecorded: list[int] | None = None) -> None:
    """One line when any of the files differs from what the store was extracted from: its stored
    features are of the old file, and pairing them with labels, masks or pictures read now would
    give another image's number. The fix names the extraction of the new files into a new store."""
    found = changed(store, files, unrecorded)
    if found:
        path, why = found[0]
        more = f"; {len(found) - 1} more changed ({', '.join(p.name for p, _ in found[1:4])}{', …' if len(found) > 4 else ''})" if len(found) > 1 else ""
        raise ProbeError(
            path,
            f"{why} since {store} was extracted from it{more}: the store holds the features of the old file",
            fix or stale_fix(Path(store)),
        )


def stale_fix(store: Path) -> str:
    """A panel sibling (``<network>-panel-<panel>.zarr``) is found by its name: the new extraction
    must take that name, or the rerun reads the old one again (a fix that loops)."""
    if "-panel-" in store.name:
        again = new_store_command(store, store)
        return f"restore the photographs the store was extracted from, or move {store} aside and extract them again at its name, where the protocols look: `{again}`"
    return f"restore the photographs the store was extracted from, or extract these into a new store: `{new_store_command(store)}`"


def new_store_command(store: str | Path, into: str | Path | None = None) -> str:
    """``probe extract`` of the store's photographs as they are now, with its settings, into a new store beside it (or ``into``)."""
    import shlex

    from .group import open_read
    from .hints import extract_arguments

    store = Path(store)
    meta = dict(open_read(store).attrs.get("manifest", {}))
    source = image_folder_or_none(store, meta) or meta.get("image_source") or "IMAGES"
    views = [str(v) for v in meta.get("views", [])]
    return "probe extract " + shlex.join([*extract_arguments(meta, views, source), "--store", str(into or store.with_name(store.stem + "-new.zarr"))])


def finished(store: str | Path) -> list[str]:
    """The ids of the store's finished images (done, not failed)."""
    import numpy as np

    from .group import open_read

    group = open_read(store)
    if "done" not in group:
        return []
    ok = np.asarray(group["done"][:], dtype=bool) & ~(np.asarray(group["failed"][:], dtype=bool) if "failed" in group else False)
    return [i for i, good in zip(_ids(store), ok) if good]
