"""``probe info --verify`` and ``probe extract --repair``: read every chunk of a store, and mark the
images of damaged chunks unfinished so that extraction writes exactly those again.

What counts as damage, and the one line that names it, is ``store.integrity``'s: this module
reads a whole store with it (``verify``), removes probe's own unreadable chunk files and clears the
flags of the images they cover (``repair``), and gives ``probe info`` its chunk row (``chunk_summary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from ..infra.errors import IntegrityError, ProbeError
from .group import array_names as _names
from .group import open_read
from .integrity import DamagedChunk, _chunk_keys, _view, describe, flag_damage, has_checksums, install, kind, missing_chunks


@dataclass
class Verified:
    store: str
    damaged: list[tuple[str, int, str]]  # (array, image chunk, why)
    chunks: int  # chunks read
    checksummed: bool  # every array carries crc32c

    def line(self) -> str:
        if self.damaged:
            return "{}: {}; {}".format(*describe(self.store, self.damaged))
        what = "checksums verified" if self.checksummed else "written before chunks carried checksums: presence and decodability checked, not content"
        return f"{self.store}: {self.chunks} chunks read, none damaged ({what})"


def verify(store: str | Path, views: list[str] | None = None) -> Verified:
    """Read every chunk of the store's arrays (of ``views`` and the shared ones, if given)."""
    install()
    store = str(store)
    if not (Path(store) / "zarr.json").is_file():
        raise ProbeError(store, "is not a probe store (no zarr.json)", "run `probe extract` first")
    group = open_read(store)
    damaged, read, checksummed, memo = list(flag_damage(store, group)), 0, True, {}
    for name in _names(group):
        if views is not None and kind(name) in ("data",) and _view(name) not in views:
            continue
        array = group[name]
        checksummed &= has_checksums(array)
        gone = set(missing_chunks(store, group, name, None, memo))
        damaged += [(name, c, "is missing, though it holds finished images") for c in sorted(gone)]
        if not array.shape or array.shape[0] == 0:
            continue
        size = int(array.chunks[0])
        for c in range(array.cdata_shape[0]):
            if c in gone:
                continue
            try:
                array[c * size : (c + 1) * size]
                read += 1
            except DamagedChunk as error:
                damaged.append((name, c, error.why))
    return Verified(store, damaged, read, checksummed)


def repair(store: str | Path, views: list[str], check=None) -> int:
    """Before ``probe extract --repair``: remove the damaged chunk files of ``views`` (and of the
    shared flags and sizes) and mark the images they cover unfinished in those views, so the
    extraction writes them again. ``check(positions)`` runs first, before anything changes (the
    photographs must be those extracted). The number of images marked."""
    found = verify(store, views)
    if not found.damaged:
        return 0
    store = str(store)
    if any(kind(a) == "whole" for a, _, _ in found.damaged):
        raise IntegrityError(store, "its image list or grids are damaged, which --repair cannot write again", "extract it again into a new --store")
    group = zarr.open_group(store, mode="r+", use_consolidated=False)
    if check is not None:
        n = int(group["image"].shape[0])
        spans = [(c * int(group[a].chunks[0]), min((c + 1) * int(group[a].chunks[0]), n)) for a, c, _ in found.damaged]
        check(sorted({i for lo, hi in spans for i in range(lo, hi)}))
    marked: set[int] = set()
    for name, chunk, _ in found.damaged:
        array = group[name]
        for key in _chunk_keys(array, chunk):
            (Path(store) / name / key).unlink(missing_ok=True)  # probe's own chunk file, unreadable
        size = int(array.chunks[0])
        lo, hi = chunk * size, min((chunk + 1) * size, int(array.shape[0]))
        again = views if kind(name) in ("flag", "sizes") else [_view(name)]
        _clear(store, group, "done", lo, hi)  # first: ``done`` true over an absent ``done_<view>`` chunk reads as damage
        for view in again:
            if f"done_{view}" in group:
                _clear(store, group, f"done_{view}", lo, hi)
        marked.update(range(lo, hi))
    return len(marked)


def _clear(store: str, group: zarr.Group, name: str, lo: int, hi: int) -> None:
    """``name[lo:hi] = False``, whole chunks at a time (a damaged chunk of it was removed first)."""
    array = group[name]
    size = int(array.chunks[0])
    for c in range(lo // size, (hi - 1) // size + 1):
        a, b = c * size, min((c + 1) * size, int(array.shape[0]))
        try:
            values = np.asarray(array[a:b], dtype=bool)
        except DamagedChunk:
            for key in _chunk_keys(array, c):
                (Path(store) / name / key).unlink(missing_ok=True)
            values = np.zeros(b - a, dtype=bool)
        values[max(lo, a) - a : min(hi, b) - a] = False
        array[a:b] = values


def chunk_summary(store: str | Path) -> str:
    """``probe info``'s row: chunk files of finished images present or missing (stat only, no read)."""
    group = open_read(store)
    memo: dict = {}
    gone = [(n, c, "is missing, though it holds finished images") for n in _names(group) for c in missing_chunks(store, group, n, None, memo)]
    gone += flag_damage(store, group)
    sums = all(has_checksums(group[n]) for n in _names(group))
    tail = "crc32c checksums" if sums else "no checksums (written before they were added)"
    if not gone:
        return f"every chunk of a finished image present; {tail}; `probe info --verify` reads them all"
    return "MISSING: {1}; {2}".format(*describe(store, gone))
