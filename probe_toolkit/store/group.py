"""A store's zarr group on disk: the names of its arrays, read from its folder, and its
consolidated metadata. The lowest piece of the store room: the cache, the integrity checks, the
image sources and the writers all list or consolidate a store, and none of them owns that.
Also how a whole per-image array is read (``whole``): a few chunks at a time, once a protocol run.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

PORTION = 64  # chunks read at once by ``whole``
_SNAPSHOT: ContextVar[tuple[frozenset[str], dict] | None] = ContextVar("probe_store_snapshot", default=None)


@contextmanager
def snapshot(stores: Iterable[str | Path]) -> Iterator[None]:
    """Whole arrays of these stores read once while the block lasts (a protocol run on its input
    stores: ``protocols.api.run``). A run checks the same per-image flags up to a dozen times (the
    photographs, completion, integrity and the record's provenance each read them), and a flag
    array is a chunk per run of images: 6,250 chunk files for 100 k images at 16 an image run,
    about 1.5 s CPU a read. A protocol writes no array of the stores it reads (results go to
    their own groups); another process growing a store while the run lasts is not seen after the
    first read: the run reads one state of its flags."""
    roots = frozenset(os.path.realpath(s) for s in stores if (Path(s) / "zarr.json").is_file())
    token = _SNAPSHOT.set((roots, {}) if roots else None)
    try:
        yield
    finally:
        _SNAPSHOT.reset(token)


def _kept(array: Any) -> tuple[tuple[str, str], dict] | None:
    """(key, memo) for a whole read of ``array`` under a ``snapshot`` of its store, else None."""
    held = _SNAPSHOT.get()
    root = getattr(getattr(array, "store", None), "root", None)
    if held is None or root is None or os.path.realpath(root) not in held[0]:
        return None
    return (os.path.realpath(root), str(array.path)), held[1]


def whole(array: Any, rows: slice = slice(None), rest: tuple = ()) -> np.ndarray:
    """Rows ``rows`` (all by default) of a zarr array, ``rest`` indexing the other axes, read
    ``PORTION`` chunks along the first axis at a time. zarr starts a read of every chunk a selection
    touches at once; the flags and sizes of a large store are thousands of small chunks, and the
    memory of those reads stays with the process (a local worker forked later maps it too). A
    whole array of a store under ``snapshot`` is read once; each call gets its own copy."""
    kept = _kept(array) if rows == slice(None) and not rest else None
    if kept is not None and kept[0] in kept[1]:
        return kept[1][kept[0]].copy()
    start, stop, _ = rows.indices(int(array.shape[0]))
    step = int(array.chunks[0]) * PORTION
    edges = [start, *range(start - start % step + step, stop, step), stop]
    parts = [np.asarray(array[(slice(a, b), *rest)]) for a, b in zip(edges[:-1], edges[1:])]
    out = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if kept is not None:
        kept[1][kept[0]] = out.copy()
    return out


@dataclass(frozen=True)
class ReadGroup(zarr.Group):
    """A store's root group opened to read (``open_read``): each member's metadata read from its
    folder once, at its first lookup, then kept for this opening.

    Opening a store for a protocol runs its checks (listing, present chunks, flags, damage), and
    they look the same arrays up again and again: 386 lookups before ``hummingbird``'s first
    image on the demo's three stores (``name in group`` included), each a ``zarr.json`` read and
    parsed through zarr's event loop. A fresh lookup per call would only matter for a store whose arrays change while
    one opening lasts, which no reader does (a protocol writes its results beside the arrays, and
    reads one state of a store: ``snapshot``); a new opening reads the folder again. A name not
    found is not kept: it is looked for again at its next lookup."""

    _members: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getitem__(self, path: str) -> Any:
        held = self._members.get(path)
        if held is None:
            held = self._members[path] = super().__getitem__(path)
        return held

    def __contains__(self, member: str) -> bool:
        try:  # zarr's own test is this lookup: one read serves the test and the member's use
            self[member]
        except KeyError:
            return False
        return True


def open_read(store: str | Path) -> ReadGroup:
    """The root group of the store at ``store``, to read: its own ``zarr.json`` files, never the
    consolidated metadata (which a writer rewrites only when it finishes: ``consolidate``)."""
    return ReadGroup(zarr.open_group(str(store), mode="r", use_consolidated=False)._async_group)


def consolidate(store: str | Path) -> None:
    """Rewrite the consolidated metadata after arrays or groups change, so that a plain
    ``xarray.open_zarr(store)`` opens without a warning (probe's own readers never use it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note that consolidation is not yet in the v3 spec
        zarr.consolidate_metadata(str(store))


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


def listed_names(store: str | Path) -> list[str]:
    """The arrays the store's consolidated metadata lists (every array it held when a writer last
    consolidated it; none for a store written without consolidated metadata). A name listed here
    whose folder is gone is an array deleted from outside: probe never deletes one of a store."""
    try:
        meta = json.loads((Path(store) / "zarr.json").read_text()).get("consolidated_metadata") or {}
    except (OSError, ValueError):
        return []  # the root's own reader says what is wrong with it
    nodes = meta.get("metadata") if isinstance(meta, dict) else None
    if not isinstance(nodes, dict):
        return []
    return sorted(name for name, node in nodes.items() if "/" not in name and isinstance(node, dict) and node.get("node_type") == "array")
