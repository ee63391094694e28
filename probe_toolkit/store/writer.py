"""Filling a created store (``store.create``) chunk by chunk: chunks are filled in any order (by
shards, by reruns). Each view has its own ``done_<view>`` / ``failed_<view>`` flags, written
after its arrays; the global ``done`` (every view done) and ``failed`` (any view failed) follow.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import zarr

from . import grids, layout
from .cache import FLAGS, PER_VIEW, array_names
from .codec import encode_without_gil
from .sources import DIGESTS, STATS


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
        self.views = sorted(name[len("done_") :] for name in array_names(self.group) if name.startswith("done_"))
        self._opened: dict[tuple[str, bool], zarr.Array] = {}

    def _array(self, name: str, every_chunk: bool = False) -> zarr.Array:
        """An array to write, opened once per writer: each ``group[name]`` reads and parses its
        metadata again, and an array's metadata does not change once the store is created. ``every_chunk`` (the data arrays): each chunk is written,
        all-NaN or not (the same values read back), as zarr's test for an all-fill chunk passes
        over it once more, much of the CPU of writing attention (docs/history.md)."""
        key = (name, every_chunk)
        array = self._opened.get(key)
        if array is None:  # threads writing at once may both open it: the same array either way
            array = self.group[name]
            self._opened[key] = array = array.with_config({"write_empty_chunks": True}) if every_chunk else array
        return array

    def arrays(self) -> list[str]:
        return [name for name in array_names(self.group) if name not in FLAGS and not name.startswith(PER_VIEW)]

    def stored(self, plan: dict[str, tuple]) -> dict[str, tuple]:
        """Each planned array (named as in a view's first part) under the name the store holds it
        by: a later part's where the view grew (``store.layout``), with its spec."""
        held: dict[tuple[str, str, int | None], str] = {}
        for name in self.arrays():
            found = layout.parse(name)
            held.setdefault((found.kind, found.view, found.block), name)
        out = {}
        for name, spec in plan.items():
            found = layout.parse(name)
            out[held.get((found.kind, found.view, found.block), name)] = spec
        return out

    def done(self, view: str | None = None) -> np.ndarray:
        name = "done" if view is None else f"done_{view}"
        return np.asarray(self.group[name][:], dtype=bool)

    def grid(self, view: str) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.group[f"grid_rows_{view}"][:]), np.asarray(self.group[f"grid_cols_{view}"][:])

    def chunk_ranges(self, shard: tuple[int, int] = (0, 1)) -> list[tuple[int, int]]:
        """The chunk-aligned (start, stop) ranges of shard i of n, contiguous and disjoint."""
        return chunk_ranges(self.n_images, self.chunk, shard)

    def todo(self, shard: tuple[int, int] = (0, 1), views: list[str] | None = None, done: dict[str, np.ndarray] | None = None) -> list[tuple[int, int, tuple[str, ...]]]:
        """Runs (start, stop, views lacking) of images some of ``views`` still lack, never crossing
        a chunk; the images of a run lack the same views. Flags are read once (``done``: each
        view's, read already)."""
        views = self.views if views is None else views
        done = done or {}
        missing = np.stack([~(done[view] if view in done else self.done(view)) for view in views], axis=1) if views else np.zeros((self.n_images, 0), dtype=bool)
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

    def write_views(self, start: int, views: dict[str, tuple[dict[str, np.ndarray], np.ndarray]], sizes: np.ndarray, files=None) -> None:
        """Write some views of images ``start:stop``: each view's arrays and ``failed_<view>``, then
        the sizes, then each ``done_<view>``, then the global flags, then what ``files``
        (``extract_load.FileFacts``) says the files decoded were."""
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
        if files is not None:
            self._record_files(start, stop, files)

    def _record_files(self, start: int, stop: int, files) -> None:
        """Each file's sha256 and stat as decoded, after the flags: a recorded sha256 means its
        image's flags were written (``integrity.flag_damage`` reads a missing ``done`` chunk
        beside one as damage). An image not read now keeps what an earlier run recorded."""
        read = files.sha256.any(axis=1)
        if not read.any():
            return
        for name, values in ((DIGESTS, files.sha256), (STATS, files.stat)):
            array = self._array(name)
            array[start:stop] = values if read.all() else np.where(read[:, None], values, np.asarray(array[start:stop]))

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


def shared_views(views: dict[str, tuple[dict[str, np.ndarray], np.ndarray]]) -> dict:
    """The arrays of ``write_views``'s ``views`` that are whole views of a shared-memory torch
    tensor (``extract_forward.forward_view(shared=True)``) as that tensor, so that they reach a
    writing process as a file handle, not as pickled bytes; any other array goes as it is."""
    import torch

    def handle(values: np.ndarray):
        base = values.base
        if isinstance(base, torch.Tensor) and base.is_shared() and base.data_ptr() == values.ctypes.data and base.numel() == values.size:
            return base.view(values.shape)
        return values

    return {view: ({name: handle(values) for name, values in data.items()}, failed) for view, (data, failed) in views.items()}


class SharedBuffers:
    """Shared-memory host tensors, each reused once given back: a run's decoded pixels
    (``extract_load.load_run``), given back after its forward pass, and the device's copies
    (``forward_view``), given back once the process that wrote them is done. A fresh shared
    tensor's pages are mapped and faulted in anew, which cost the command's process as much as
    the copy itself."""

    def __init__(self) -> None:
        self._free: dict[tuple, list] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype):
        import torch

        with self._lock:
            free = self._free.get((tuple(shape), dtype))
            if free:
                return free.pop()
        numel = int(np.prod(shape))
        try:  # allocated in shared memory at once, as torch's own default_collate does (share_memory_ copies into it)
            empty = torch.empty(0, dtype=dtype)
            return empty.new(empty._typed_storage()._new_shared(numel, device="cpu")).view(shape)
        except (AttributeError, TypeError):  # pragma: no cover  (a torch without the method)
            return torch.empty(shape, dtype=dtype).share_memory_()

    def give_back(self, tensors) -> None:
        """Tensors ``take`` gave, once nothing reads or writes them any more."""
        with self._lock:
            for values in tensors:
                self._free.setdefault((tuple(values.shape), values.dtype), []).append(values)


def shared_tensors(views: dict) -> list:
    """The shared tensors among ``shared_views``'s arrays."""
    import torch

    return [values for data, _ in views.values() for values in data.values() if isinstance(values, torch.Tensor)]


_WRITERS: dict[str, StoreWriter] = {}  # a writing process's writer of each store (opened once per process)


def write_in_process(path: str, start: int, views: dict, sizes: np.ndarray, files=None) -> None:
    """``StoreWriter.write_views`` in a writing process (``extract_load.host_pool``): the same
    writes in the same order, arrays then flags (``done`` last), from the shared tensors."""
    writer = _WRITERS.get(path)
    if writer is None:
        writer = _WRITERS[path] = StoreWriter(Path(path))
    arrays = {
        view: ({name: values if isinstance(values, np.ndarray) else values.numpy() for name, values in data.items()}, failed) for view, (data, failed) in views.items()
    }
    writer.write_views(start, arrays, sizes, files)
