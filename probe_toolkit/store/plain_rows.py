"""Results written as a run makes them, a block of images at a time, in the layout ``store.plain.write`` gives.

``probe decode`` on a large store would otherwise keep every image's masks and numbers until the
last block, then join them: memory growing with the images. ``Rows`` creates each array (every
dimension but the first, ``image``, known from the first block) with the chunks zarr picks for
the whole array, as ``plain.write`` does, and writes whole chunk rows as the blocks come in: a
chunk is written once, with the bytes a write of the whole array gives (``tests/test_startup.py``
compares every file). Memory holds at most one chunk row of each array beside a block.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .plain import _attr, create, stored

PENDING_PARTS = 64  # blocks' rows held apart before they are joined into one array


class Rows:
    """A zarr group at ``folder`` filled along ``image``, ``n`` rows in all, block after block."""

    def __init__(self, folder: str | Path, n: int) -> None:
        import zarr

        self.folder, self.n = Path(folder), int(n)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        self.group = zarr.open_group(str(self.folder), mode="w", zarr_format=3)
        self.arrays: dict[str, Any] = {}
        self.pending: dict[str, list[np.ndarray]] = {}
        self.done: dict[str, int] = {}  # rows written to zarr
        self.given = 0  # rows handed in

    def add(self, variables: dict[str, tuple[tuple[str, ...] | str, np.ndarray]]) -> None:
        """The next rows of every variable (each with ``image`` first; the same variables each time)."""
        rows = {len(np.asarray(values)) for _, values in variables.values()}
        if len(rows) != 1 or (self.arrays and set(variables) != set(self.arrays)):
            raise ValueError(f"a block's variables disagree: {sorted(variables)} with {sorted(rows)} rows")
        for name, (dims, values) in variables.items():
            dims, values = (dims,) if isinstance(dims, str) else tuple(dims), np.asarray(values)
            if name not in self.arrays:
                if dims[0] != "image" or values.ndim != len(dims):
                    raise ValueError(f"{name}: dimensions {dims} for {values.ndim} axes, image first")
                self.arrays[name] = create(self.group, name, dims, values, (self.n, *values.shape[1:]))
                self.pending[name], self.done[name] = [], 0
            # a view (a column of a block's array) would keep its whole block alive until its chunk row
            # fills, which for a small array's one chunk is the last block: its own rows are kept instead
            self.pending[name].append(values if values.base is None else values.copy())
            self._flush(name, last=False)
        self.given += rows.pop()

    def _flush(self, name: str, last: bool) -> None:
        """Write the whole chunk rows pending (every row pending once the last block is in)."""
        held = sum(len(v) for v in self.pending[name])
        step = int(self.arrays[name].chunks[0])
        ready = held if last else held // step * step
        if not ready:
            if len(self.pending[name]) > PENDING_PARTS:  # one array, not thousands of small ones
                self.pending[name] = [np.concatenate(self.pending[name])]
            return
        joined = np.concatenate(self.pending[name]) if len(self.pending[name]) > 1 else self.pending[name][0]
        start = self.done[name]
        self.arrays[name][start : start + ready] = joined[:ready]
        self.pending[name] = [joined[ready:]] if ready < held else []
        self.done[name] = start + ready

    def written(self, coords: dict[str, Any], attrs: dict[str, Any], drop: tuple[str, ...] = ()) -> Written:
        """Every row in: the last rows written, the coordinates beside them, the variables in ``drop``
        removed (a variable known to be absent only once every image is seen), as results to save."""
        if self.given != self.n:
            raise ValueError(f"{self.given} rows written of {self.n}")
        for name in list(self.arrays):
            self._flush(name, last=True)
        for name, values in coords.items():
            values = np.asarray(values)
            create(self.group, name, (name,), values)[...] = stored(values)
        for name in drop:
            if name in self.arrays:
                del self.group[name]
                del self.arrays[name]
        return Written(self.folder, dict(attrs))


class Written:
    """A results group already on disk (``Rows.written``): ``records.save`` gives it attributes and
    moves it into the record (``store.plain.write``) instead of writing arrays."""

    def __init__(self, folder: Path, attrs: dict[str, Any]) -> None:
        self.folder, self.attrs = folder, attrs

    def copy(self) -> Written:
        return Written(self.folder, dict(self.attrs))

    def move(self, path: str | Path) -> None:
        import zarr

        if Path(path).exists():
            shutil.rmtree(path)
        self.folder.rename(path)
        zarr.open_group(str(path), mode="r+", zarr_format=3).attrs.put({k: _attr(v) for k, v in self.attrs.items()})
