"""Results written as a run makes them, a block of images at a time, in the layout ``store.plain.write`` gives.

``probe decode`` on a large store would otherwise keep every image's masks and numbers until the
last block, then join them: memory growing with the images. ``Rows`` creates each array (every
dimension but the first, ``image``, known from the first block) with the chunks zarr picks for
the whole array, as ``plain.write`` does, so each chunk is written once, with the bytes a write of
the whole array gives (``tests/test_plain_rows.py`` compares every file).

A chunk holds rows of many blocks, and zarr picks taller chunks for a larger array, so the rows
waiting for their chunk would grow with the store. They wait on disk instead, in an anonymous
temporary file laid out chunk by chunk (``_Spool``), and each chunk is read back and written
alone once its rows are in: memory holds one block and one chunk, whatever the number of images.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from .plain import _attr, create, stored


class _Spool:
    """One array's rows of its current chunk row (every chunk that begins at the same image), kept
    in an anonymous temporary file where each chunk's part is contiguous, so a chunk is read back
    in one piece. Gone with the file's handle (closed by ``close`` or with the process)."""

    def __init__(self, array: Any) -> None:
        self.array, self.step = array, int(array.chunks[0])
        self.dtype = np.dtype(array.dtype)
        spans = [[slice(a, min(a + c, s)) for a in range(0, s, c)] for s, c in zip(array.shape[1:], array.chunks[1:])]
        self.parts = [tuple(part) for part in product(*spans)]  # each chunk's columns (every axis but image)
        self.row_bytes = [self.dtype.itemsize * int(np.prod([p.stop - p.start for p in part])) for part in self.parts]
        self.offsets = np.concatenate([[0], np.cumsum([self.step * b for b in self.row_bytes])])[:-1].tolist()
        self.file = tempfile.TemporaryFile()  # unlinked at once
        self.start = self.held = 0  # the chunk row's first image; its rows on disk

    def add(self, values: np.ndarray) -> None:
        """Rows after those given before; each chunk row written as soon as its rows are in."""
        given = 0
        while given < len(values):
            take = min(len(values) - given, self.step - self.held)
            rows = values[given : given + take]
            for part, offset, size in zip(self.parts, self.offsets, self.row_bytes):
                os.pwrite(self.file.fileno(), np.ascontiguousarray(rows[(slice(None), *part)]).data, offset + self.held * size)
            self.held, given = self.held + take, given + take
            if self.held == self.step:
                self.flush()

    def flush(self) -> None:
        """Write every chunk of the rows on disk, one chunk in memory at a time."""
        if not self.held:
            return
        for part, offset, size in zip(self.parts, self.offsets, self.row_bytes):
            data = _read(self.file.fileno(), self.held * size, offset)
            shape = (self.held, *(p.stop - p.start for p in part))
            self.array[(slice(self.start, self.start + self.held), *part)] = np.frombuffer(data, self.dtype).reshape(shape)
        self.start, self.held = self.start + self.held, 0

    def close(self) -> None:
        self.file.close()


def _read(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` (a short read, which a regular file gives only past its end, is an error)."""
    data = os.pread(fd, size, offset)
    while len(data) < size:
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise OSError(f"a temporary file of rows ended {size - len(data)} bytes short")
        data += more
    return data


class Rows:
    """A zarr group at ``folder`` filled along ``image``, ``n`` rows in all, block after block."""

    def __init__(self, folder: str | Path, n: int) -> None:
        import zarr

        self.folder, self.n = Path(folder), int(n)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        self.group = zarr.open_group(str(self.folder), mode="w", zarr_format=3)
        self.arrays: dict[str, Any] = {}
        self.spools: dict[str, _Spool] = {}
        self.given = 0  # rows handed in

    def add(self, variables: dict[str, tuple[tuple[str, ...] | str, np.ndarray]]) -> None:
        """The next rows of every variable (each with ``image`` first; the same variables each time)."""
        rows = {len(np.asarray(values)) for _, values in variables.values()}
        if len(rows) != 1 or (self.arrays and set(variables) != set(self.arrays)):
            raise ValueError(f"a block's variables disagree: {sorted(variables)} with {sorted(rows)} rows")
        if self.given + next(iter(rows)) > self.n:
            raise ValueError(f"{self.given + next(iter(rows))} rows handed in for {self.n}")
        for name, (dims, values) in variables.items():
            dims, values = (dims,) if isinstance(dims, str) else tuple(dims), np.asarray(values)
            if name not in self.arrays:
                if dims[0] != "image" or values.ndim != len(dims) or values.dtype.kind == "O":
                    raise ValueError(f"{name}: dimensions {dims} for {values.ndim} axes of {values.dtype}, image first, numbers")
                self.arrays[name] = create(self.group, name, dims, values, (self.n, *values.shape[1:]))
                self.spools[name] = _Spool(self.arrays[name])
            self.spools[name].add(values)
        self.given += rows.pop()

    def written(self, coords: dict[str, Any], attrs: dict[str, Any], drop: tuple[str, ...] = ()) -> Written:
        """Every row in: the last rows written, the coordinates beside them, the variables in ``drop``
        removed (a variable known to be absent only once every image is seen), as results to save."""
        if self.given != self.n:
            raise ValueError(f"{self.given} rows written of {self.n}")
        for spool in self.spools.values():
            spool.flush()
            spool.close()
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
