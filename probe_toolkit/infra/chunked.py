"""Run a per-image analysis over a store chunk by chunk, so memory stays bounded by a chunk.

An analysis gives a function from numpy blocks (the image chunks of one or more arrays of the
store, aligned along ``image``) to a dict of numpy arrays whose first axis is ``image``. This
module feeds it the chunks of the lazily opened store (xarray over dask, chunked along
``image``) a few at a time, on local threads or on a dask.distributed cluster, and
concatenates the small per-image results in image order. Only the chunks in flight are ever in
memory, never the store.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Mapping

import dask
import dask.array as da
import numpy as np
import xarray as xr

from .errors import ProbeError
from .memory import keep_memory_flat

ChunkFn = Callable[..., dict[str, np.ndarray]]


def _dask(array: xr.DataArray, chunk: int | None) -> da.Array:
    data = array.data
    if not isinstance(data, da.Array):
        data = da.from_array(np.asarray(data), chunks=(chunk or 16,) + tuple(-1 for _ in data.shape[1:]))
    return data


def _aligned(arrays: Mapping[str, xr.DataArray], chunk: int | None) -> dict[str, da.Array]:
    """Dask arrays of every input on one common chunking along ``image``, whole along the rest."""
    out = {name: _dask(array, chunk) for name, array in arrays.items()}
    first = next(iter(out.values()))
    target = chunk if chunk is not None else first.chunks[0]
    for name, data in out.items():
        if data.shape[0] != first.shape[0]:
            raise ProbeError(name, f"has {data.shape[0]} images, not {first.shape[0]}", "pass arrays of one store")
        whole = all(len(c) == 1 for c in data.chunks[1:])
        if chunk is not None or data.chunks[0] != first.chunks[0] or not whole:
            out[name] = data.rechunk({0: target, **{axis: -1 for axis in range(1, data.ndim)}})
    return out


def map_images(
    fn: ChunkFn,
    arrays: Mapping[str, xr.DataArray],
    *,
    chunk: int | None = None,
    client=None,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, np.ndarray]:
    """``fn(**blocks)`` on every image chunk of ``arrays``; results concatenated along ``image``.

    ``chunk``: images per call (default: the store's own chunks). ``client``: a
    ``dask.distributed.Client`` to run the calls on its workers; else ``workers`` local threads
    (default 2), each holding one chunk at a time. ``progress(n_images)`` is called as chunks
    finish.
    """
    keep_memory_flat()
    data = _aligned(arrays, chunk)
    names = list(data)
    n_chunks = len(next(iter(data.values())).chunks[0])
    if n_chunks == 0 or next(iter(data.values())).shape[0] == 0:
        raise ProbeError(None, "no finished images in the store", "run `probe extract` first")

    def task(i: int):
        return dask.delayed(_call)(fn, names, *[data[name].blocks[i] for name in names])

    parts: list[dict[str, np.ndarray] | None] = [None] * n_chunks
    if client is not None:
        from distributed import as_completed as dist_completed

        futures = client.compute([task(i) for i in range(n_chunks)])
        order = {f.key: i for i, f in enumerate(futures)}
        for future, result in dist_completed(futures, with_results=True):
            parts[order[future.key]] = result
            if progress:
                progress(_length(result))
    else:
        workers = workers or min(2, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            running = {pool.submit(_local, task(i)): i for i in range(n_chunks)}
            for future in as_completed(running):
                parts[running[future]] = future.result()
                if progress:
                    progress(_length(parts[running[future]]))
    return {key: np.concatenate([p[key] for p in parts], axis=0) for key in parts[0]}


def _call(fn: ChunkFn, names: list[str], *blocks: np.ndarray) -> dict[str, np.ndarray]:
    return fn(**dict(zip(names, blocks)))


def _local(task) -> dict[str, np.ndarray]:
    return task.compute(scheduler="synchronous")


def _length(result: dict[str, np.ndarray]) -> int:
    return len(next(iter(result.values())))


def connect(address: str | None):
    """A dask.distributed Client for ``--dask-address`` (None: run on local threads)."""
    if not address:
        return None
    from distributed import Client

    try:
        return Client(address, timeout="10s")
    except OSError as error:
        raise ProbeError(address, f"no dask scheduler answers ({error})", "start one with `dask scheduler` or drop --dask-address") from None
