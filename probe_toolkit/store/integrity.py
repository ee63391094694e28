"""Damaged stores: every chunk carries a checksum, a finished image's chunk must be there, and damage is one line.

zarr reads a missing chunk as its fill value without a word (a store's data arrays are NaN-filled,
so a deleted chunk file turns into NaN tokens and other numbers), and a truncated or corrupt chunk
surfaces as a codec's exception deep inside zarr's event loop. This module turns both into one
line that names the store, the array, the chunk, the images it covers and the command that
re-extracts only those:

- **Checksums.** A store's arrays end their codec chain with zarr v3's ``crc32c`` codec
  (``store.codec.compressors``): a chunk whose bytes changed fails its checksum on read. Stores written
  before checksums were added keep reading (their chunks are checked for presence and
  decodability only: a flipped byte inside a zstd frame may still decode).
- **Presence.** ``extract`` writes every chunk of a data array that holds a finished image
  (``StoreWriter`` writes all-NaN chunks too), so a finished image whose chunk file is absent
  is damage. ``check_present`` stats those files before a command reads an array
  (``cache.require``; the image list, grids and sizes in ``cache.open_store``) and on every
  worker before it reads its block (``cluster.proven_read``).
- **Decoding.** ``install`` makes ``CheckedPipeline`` zarr's codec pipeline (zarr's own
  extension point, ``codec_pipeline.path``): a chunk that fails to decode raises ``DamagedChunk``,
  whose line is worked out only when it is printed (outside zarr's event loop).
- **Flags.** A deleted completion-flag chunk is damage too, where the flags' write order proves
  it (``flag_damage``), not images dropped or extracted again as unfinished.
- **Verify and repair** (``store.verify``) read a whole store with these checks.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.codec_pipeline import BatchedCodecPipeline

from ..infra.errors import IntegrityError
from .group import array_names as _names
from .group import listed_names, open_read, whole
from .hints import extract_arguments
from .sources import DIGESTS, STATS

CHECKSUM = "crc32c"
WHOLE = ("image",)  # one chunk, written when the store is created (with the grids)
FLAG_PREFIXES = ("done", "failed")
SIZES = ("image_height", "image_width")


def has_checksums(array: zarr.Array) -> bool:
    return any(getattr(codec, "to_dict", lambda: {})().get("name") == CHECKSUM for codec in array.metadata.codecs)


# ----------------------------------------------------------------------------------------------
# reading: a chunk that does not decode is one line


class DamagedChunk(IntegrityError):
    """A chunk of a store's array that is missing or does not decode. Its line (the images it
    covers and the command that re-extracts them) is worked out when first asked for, since the
    error is raised on zarr's event loop, where the store cannot be read again."""

    def __init__(self, store: str, array: str, chunk: int, why: str, line: str | None = None):
        Exception.__init__(self, f"{store}: chunk {chunk} of {array} {why}")
        self.store, self.array, self.chunk, self.why, self._line = store, array, chunk, why, line

    def __reduce__(self):
        return (type(self), (self.store, self.array, self.chunk, self.why, self.line()))

    def _parts(self) -> tuple[str, str, str]:
        return describe(self.store, [(self.array, self.chunk, self.why)])

    @property
    def where(self) -> str:  # ProbeError's three parts, for code that reads them
        return self._parts()[0]

    @property
    def problem(self) -> str:
        return self._parts()[1]

    @property
    def fix(self) -> str:
        return self._parts()[2]

    def line(self) -> str:
        if self._line is None:
            where, problem, fix = self._parts()
            self._line = f"{where}: {problem}; {fix}"
        return self._line

    def __str__(self) -> str:
        return self.line()


def _locate(byte_getter) -> tuple[str, str, int] | None:
    """(store root, array, chunk index along ``image``) of a chunk key such as ``tokens_224/c/3/0/0``."""
    root, key = getattr(getattr(byte_getter, "store", None), "root", None), str(getattr(byte_getter, "path", ""))
    array, sep, coords = key.rpartition("/c/")
    if root is None or not sep:
        return None
    first = coords.split("/")[0]
    return (str(root), array, int(first)) if first.isdigit() else None


def _why(error: BaseException) -> str:
    if "checksum" in str(error).lower():
        return "fails its checksum"
    return f"cannot be decoded ({type(error).__name__})"


class CheckedPipeline(BatchedCodecPipeline):
    """zarr's batched pipeline; a batch that fails to read is searched for the chunk that fails,
    which is raised as ``DamagedChunk``. The read of a whole store costs nothing more."""

    async def read_batch(self, batch_info, out, drop_axes=()):
        batch_info = list(batch_info)
        try:
            await super().read_batch(batch_info, out, drop_axes)
        except DamagedChunk:
            raise
        except Exception as error:
            raise (await self._culprit(batch_info)) or error from None

    async def _culprit(self, batch_info) -> DamagedChunk | None:
        for byte_getter, spec, *_ in batch_info:
            try:
                data = await byte_getter.get(prototype=spec.prototype)
                if data is not None:
                    list(await self.decode_batch([(data, spec)]))
            except Exception as error:  # the codec's own exception: a bad zstd frame, a checksum, a short chunk
                where = _locate(byte_getter)
                if where is None:
                    return None
                return DamagedChunk(*where, _why(error))
        return None


@lru_cache(maxsize=1)
def install() -> None:
    """Make ``CheckedPipeline`` the process's codec pipeline (once; arrays opened after it use it)."""
    name = f"{CheckedPipeline.__module__}.{CheckedPipeline.__qualname__}"
    zarr.registry.register_pipeline(CheckedPipeline)
    zarr.config.set({"codec_pipeline.path": name})


# ----------------------------------------------------------------------------------------------
# which chunks must exist


def _finished(group: zarr.Group, view: str | None) -> np.ndarray:
    """Images finished (done, not failed) in ``view`` (None: in any view: their sizes were written)."""

    def flag(name: str) -> np.ndarray:
        return np.asarray(whole(group[name]), dtype=bool) if name in group else np.zeros(int(group["image"].shape[0]), bool)

    if view is None:
        views = [n[len("done_") :] for n in _names(group) if n.startswith("done_")]
        if not views:
            return flag("done") & ~flag("failed")
        return np.logical_or.reduce([flag(f"done_{v}") & ~flag(f"failed_{v}") for v in views])
    if f"done_{view}" in group:
        return flag(f"done_{view}") & ~flag(f"failed_{view}")
    return flag("done") & ~flag("failed")


def kind(name: str) -> str:
    """``whole`` (one chunk written at creation), ``flag``, ``sizes`` or ``data``."""
    if name in WHOLE or name.startswith(("grid_rows_", "grid_cols_")):
        return "whole"
    if name in FLAG_PREFIXES or name.startswith(tuple(f"{p}_" for p in FLAG_PREFIXES)) or name in (DIGESTS, STATS):
        return "flag"  # written after the images it describes: not required to be there
    if name in SIZES:
        return "sizes"
    return "data"


def _view(name: str) -> str:
    from .grids import view_of

    return view_of(name)


def _chunk_keys(array: zarr.Array, chunk: int) -> list[str]:
    """Every chunk key of image-chunk ``chunk`` (all chunks along the other dimensions)."""
    rest = [range(n) for n in array.cdata_shape[1:]]
    return [array.metadata.encode_chunk_key((chunk, *more)) for more in itertools.product(*rest)]


def required_chunks(group: zarr.Group, name: str, positions: np.ndarray | None = None, memo: dict | None = None) -> list[int]:
    """Image chunks of array ``name`` that must exist: those holding a finished image, judged by
    the store's flags; with ``positions``, those holding these images, which the caller has proven
    finished (a worker, ``cluster.proven_read``: no flag is read again for each block)."""
    array = group[name]
    n = int(array.shape[0]) if array.shape else 0
    if n == 0 or kind(name) == "flag":
        return []
    if kind(name) == "whole":
        return list(range(array.cdata_shape[0]))
    if positions is not None:
        return sorted({int(i) // int(array.chunks[0]) for i in np.asarray(positions, dtype=np.int64)})
    view = None if kind(name) == "sizes" else _view(name)
    memo = {} if memo is None else memo  # one read of a view's flags for all its arrays
    if view not in memo:
        memo[view] = _finished(group, view)
    finished = memo[view]
    return sorted({int(i) // int(array.chunks[0]) for i in np.flatnonzero(finished)})


def missing_chunks(store: str | Path, group: zarr.Group, name: str, positions: np.ndarray | None = None, memo: dict | None = None) -> list[int]:
    """Image chunks of ``name`` that hold a finished image and whose file is not there."""
    array = group[name]
    folder = Path(store) / name
    return [c for c in required_chunks(group, name, positions, memo) if not all((folder / key).is_file() for key in _chunk_keys(array, c))]


FLAG_GONE = "is missing, though the store's other flags say its images were extracted"


def _chunk_present(store: str | Path, array: zarr.Array, name: str, chunk: int) -> bool:
    return all((Path(store) / name / key).is_file() for key in _chunk_keys(array, chunk))


def flag_damage(store: str | Path, group: zarr.Group, digests: bool = True) -> list[tuple[str, int, str]]:
    """Completion flags whose chunk was deleted: ``(array, chunk, why)``.

    A flag chunk of all False is never written (zarr's fill value), so an absent flag chunk alone
    reads as "not extracted yet". The flags are written in one order (``store.writer``: each
    ``done_<view>``, then ``done``, which is true only where every view is), so two cases are
    certain damage, never an interrupted extraction:

    - ``done`` true in a chunk whose ``done_<view>`` chunk is absent (``done`` follows ``done_<view>``);
    - ``done`` absent where every ``done_<view>`` is true for an image whose sha256 was recorded
      (``image_sha256``: written after an image's flags, ``store.writer``). ``digests=False`` skips
      this case (a writer checking before it writes: it reads only the views' own flags).
    """
    names = set(_names(group))
    views = sorted(n[len("done_") :] for n in names if n.startswith("done_"))
    if "done" not in names or not views or not group["done"].shape or group["done"].shape[0] == 0:
        return []
    done_array = group["done"]
    n, size = int(done_array.shape[0]), int(done_array.chunks[0])
    cached: dict[str, np.ndarray] = {}

    def values(name: str) -> np.ndarray:
        if name not in cached:
            cached[name] = np.asarray(whole(group[name]), dtype=bool) if name in names else np.zeros(n, dtype=bool)
        return cached[name]

    def recorded() -> np.ndarray:
        if "recorded" not in cached:
            cached["recorded"] = whole(group["image_sha256"]).any(axis=1) if "image_sha256" in names else np.zeros(n, dtype=bool)
        return cached["recorded"]

    damage = []
    flags = {v: group[f"done_{v}"] for v in views}  # opened once: a store has a flag chunk per few images
    for c in range(int(done_array.cdata_shape[0])):
        lo, hi = c * size, min((c + 1) * size, n)
        if _chunk_present(store, done_array, "done", c):
            if values("done")[lo:hi].any():
                damage += [(f"done_{v}", c, FLAG_GONE) for v in views if not _chunk_present(store, flags[v], f"done_{v}", c)]
        elif digests and all(_chunk_present(store, flags[v], f"done_{v}", c) for v in views):
            every = np.logical_and.reduce([values(f"done_{v}")[lo:hi] for v in views])
            if (every & recorded()[lo:hi]).any():
                damage.append(("done", c, FLAG_GONE))
    return damage


class MissingArray(IntegrityError):
    """An array the store's metadata lists whose folder is gone (deleted from outside)."""


def check_listed(store: str | Path, group: zarr.Group, *, growing: bool = False) -> None:
    """Before a store is read or grown: every array its metadata lists is there. A deleted data
    array is extracted again by the same ``probe extract`` (``growing``: the writer creates it
    anew); a deleted flag, image list, grid or size array is not (what was finished went with
    it): a new store."""
    gone = sorted(set(listed_names(store)) - set(_names(group)))
    if growing:
        gone = [name for name in gone if kind(name) != "data"]
    if not gone:
        return
    meta = dict(group.attrs.get("manifest", {}))
    from .sources import image_folder_or_none

    source = image_folder_or_none(store, meta) or "IMAGES"
    args = extract_arguments(meta, _store_views(meta), source)
    named = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
    problem = f"its array {named} is gone" if len(gone) == 1 else f"its arrays {named} are gone"
    problem += " (deleted from outside probe: the store's metadata lists it)"
    if all(kind(name) == "data" for name in gone):
        fix = f"extract it again into this store: `probe extract {shlex.join([*args, '--store', str(store)])}`"
    else:
        fix = f"what was finished went with it: extract the images again into a new store: `probe extract {shlex.join(args)} --store NEW.zarr`"
    raise MissingArray(str(store), problem, fix)


def check_flags(store: str | Path, group: zarr.Group, digests: bool = True) -> None:
    """Before the flags are read as what is finished: a deleted flag chunk is ``DamagedChunk``
    (the images it covers and ``--repair``), not images silently dropped or extracted again."""
    found = flag_damage(store, group, digests)
    if found:
        name, chunk, why = found[0]
        raise DamagedChunk(str(store), name, chunk, why + (f" ({len(found)} such chunks)" if len(found) > 1 else ""))


def shared_arrays(group: zarr.Group) -> list[str]:
    """The arrays every reader reads beside its own: the image list, the grids, the sizes."""
    return [name for name in _names(group) if kind(name) in ("whole", "sizes")]


def worker_check(store: str, names: Iterable[str] = (), positions: np.ndarray | None = None, group: zarr.Group | None = None) -> None:
    """What a worker runs before it reads a block (``infra.cluster.proven_read``, handed this by
    ``cache.require`` through the arrays' attrs, so the execution layer needs no store module):
    first (no group yet) chunks that do not decode become one line there as here; then every
    chunk holding one of the block's images is there."""
    install()
    if group is not None:
        check_present(store, names, positions, group)


def check_present(store: str | Path, names: Iterable[str], positions: np.ndarray | None = None, group: zarr.Group | None = None) -> None:
    """Before a read: every chunk of ``names`` holding a finished image is there (a stat per
    chunk), else ``DamagedChunk`` for the first one missing."""
    store = str(store)
    if not (Path(store) / "zarr.json").is_file():
        return  # not a store on this machine's disk (any more): its reader says so, not a chunk of it
    if group is None:
        group = open_read(store)
    memo: dict = {}  # each view's flags read once for all its arrays
    for name in names:
        if name not in group or name == "image":
            continue
        gone = missing_chunks(store, group, name, positions, memo)
        if gone:
            raise DamagedChunk(store, name, gone[0], "is missing, though it holds finished images" + (f" ({len(gone)} such chunks)" if len(gone) > 1 else ""))
    if "image" in group and missing_chunks(store, group, "image", None):
        raise DamagedChunk(store, "image", 0, "is missing")


# ----------------------------------------------------------------------------------------------
# the line: the images a chunk covers, and how to re-extract only those


def _store_views(meta: dict[str, Any]) -> list[str]:
    return [str(v) for v in meta.get("views", [])]


def describe(store: str | Path, damage: list[tuple[str, int, str]]) -> tuple[str, str, str]:
    """(where, problem, fix) for damaged chunks ``(array, chunk, why)`` of ``store``."""
    store = str(store)
    array, chunk, why = damage[0]
    try:
        group = open_read(store)
        meta = dict(group.attrs.get("manifest", {}))
        ids = _ids(group)
        size = int(group[array].chunks[0]) if kind(array) != "whole" else len(ids)
    except Exception:  # the store's own metadata is gone too: name the chunk alone
        return store, f"chunk {chunk} of {array} {why}", "the store cannot be read: extract it again into a new --store"
    covered = ids[chunk * size : (chunk + 1) * size]
    images = ", ".join(covered[:3]) + (f" and {len(covered) - 3} more" if len(covered) > 3 else "")
    more = f" (and {len(damage) - 1} more damaged chunks)" if len(damage) > 1 else ""
    problem = f"chunk {chunk} of {array} (images {images or '?'}) {why}{more}"
    return store, problem, repair_hint(store, meta, [a for a, _, _ in damage])


def _ids(group: zarr.Group) -> list[str]:
    try:
        return [str(v) for v in group["image"][:]]
    except Exception:  # the id list itself is damaged: positions stand in
        n = int(group["image"].shape[0])
        return [f"#{i}" for i in range(n)]


def repair_hint(store: str, meta: dict[str, Any], arrays: list[str]) -> str:
    """The command that re-extracts only the damaged images (``probe extract ... --repair``)."""
    if any(kind(a) == "whole" for a in arrays):
        return "its image list or grids are damaged: extract it again into a new --store"
    views = _store_views(meta)
    hit = [v for v in views if any(kind(a) in ("flag", "sizes") or _view(a) == v for a in arrays)] or views
    from .sources import image_folder_or_none  # (sources itself imports no integrity)

    source = image_folder_or_none(store, meta) or "IMAGES"
    return f"re-extract only those images: probe extract {' '.join(extract_arguments(meta, hit, source))} --store {store} --repair"
