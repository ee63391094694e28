"""Run a per-image analysis over a store chunk by chunk, so memory stays bounded by a chunk.

An analysis gives a function from numpy blocks (the image chunks of one or more arrays of the
store, aligned along ``image``) to a dict of numpy arrays whose first axis is ``image``. This
module feeds it the chunks of the lazily opened store (xarray's lazy zarr arrays, read one
chunk along ``image`` per call) a few at a time, on local threads or on a dask.distributed
cluster (imported only then), and
concatenates the small per-image results in image order. Only the chunks in flight are ever in
memory, never the store.

On a cluster every chunk task reads its own images (a worker that reads what another worker
read could hide a worker that sees nothing): it opens the store by path, proves it is the store
the client opened (a fingerprint of the manifest), that its images are listed and finished
(its views' ``done`` set, ``failed`` not), and only then reads them. A worker without the store, with
another store at that path or with an unfinished copy fails the command with one line naming
the worker (zarr would otherwise hand it NaN fill values). Every wait on the cluster is bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from .errors import IntegrityError, ProbeError, worker_name
from .memory import keep_memory_flat

if TYPE_CHECKING:
    import xarray as xr

ChunkFn = Callable[..., dict[str, np.ndarray]]

CONNECT_SECONDS = 10.0  # a scheduler answers its identity within this, or it is not one
STALL_SECONDS = 30.0  # no chunk finished and no worker alive this long: the run is given up
POLL_SECONDS = 1.0


def fingerprint(manifest: dict) -> str:
    """What a worker compares to prove it opened the client's store (sha256 of the manifest)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()


def store_source(array: xr.DataArray) -> tuple[str, str] | None:
    """(store path, fingerprint) that ``store.cache.require`` attached to a store array, if any."""
    path, mark = array.attrs.get("probe_store"), array.attrs.get("probe_fingerprint")
    return (str(path), str(mark)) if path and mark else None


def _store_chunk(array) -> int:
    """Images per call when the caller names none: the array's own chunks along ``image`` (zarr's,
    as the store was written), else 16."""
    chunks = getattr(array, "encoding", {}).get("chunks")
    return int(chunks[0]) if chunks else 16


def _bounds(arrays: Mapping[str, xr.DataArray], chunk: int | None) -> list[int]:
    """Where the image calls start and stop: ``chunk`` images each, else the first array's own
    chunking (a dask array's chunks, a stored array's zarr chunks)."""
    first = next(iter(arrays.values()))
    n = int(first.shape[0])
    for name, array in arrays.items():
        if array.shape[0] != n:
            raise ProbeError(name, f"has {array.shape[0]} images, not {n}", "pass arrays of one store")
    own = getattr(first, "chunks", None) if chunk is None else None
    if own:  # a dask-backed array: its own chunks, as before
        return [int(v) for v in np.cumsum((0,) + tuple(own[0]))]
    step = chunk if chunk is not None else _store_chunk(first)
    return [*range(0, n, step), n] if n else [0]


def image_chunk_edges(array) -> list[int]:
    """Where the store's chunks begin along ``image``, in the array's own positions, and its end:
    a dask array's chunks, or those ``store.cache.open_store`` recorded (the zarr chunks, after
    unfinished images were dropped); [] when unknown. Readers use them to read each chunk once."""
    chunks = getattr(array, "chunks", None)
    if chunks:
        return [int(e) for e in np.cumsum((0, *chunks[array.dims.index("image")]))]
    edges = getattr(array, "encoding", {}).get("probe_image_edges")
    return [int(e) for e in edges] if edges is not None else []


def _block(array, a: int, b: int) -> np.ndarray:
    """Images ``a:b`` of an array (lazy, dask-backed, read with zarr alone, or in memory), read now."""
    part = array[a:b]
    return np.asarray(getattr(part, "values", part))  # an xarray DataArray or a store.direct.StoreArray: read now


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
    (default 2), each reading and holding one chunk at a time (no dask: a local run never pays
    for importing it), under one BLAS thread: the workers are the parallelism (OpenBLAS called
    from two threads at once with two threads each ran neighbours' numpy at half speed), and a
    chunk's arithmetic is the same at any worker count. ``progress(n_images)`` is called as
    chunks finish.
    """
    keep_memory_flat()
    bounds = _bounds(arrays, chunk)
    names = list(arrays)
    n_chunks = len(bounds) - 1
    if n_chunks <= 0:
        raise ProbeError(None, "no finished images in the store", "run `probe extract` first")

    def task(i: int) -> dict[str, np.ndarray]:
        a, b = bounds[i], bounds[i + 1]
        return _call(fn, names, *[_block(arrays[name], a, b) for name in names])

    parts: list[dict[str, np.ndarray] | None] = [None] * n_chunks
    if client is not None:
        sources = {store_source(array) for array in arrays.values()}
        if len(sources) != 1 or None in sources:
            raise ProbeError(None, "a cluster run needs arrays opened from one store (store.cache.require)", "open the store with probe_toolkit.store.cache.open_store")
        (store, mark), = sources
        first = next(iter(arrays.values()))
        ids = [str(i) for i in first.coords["image"].values]
        stored = {name: str(array.name) for name, array in arrays.items()}
        calls = [(_proven_call, fn, stored, store, mark, ids[bounds[i]:bounds[i + 1]]) for i in range(n_chunks)]
        parts = on_cluster(client, calls, f"probe-chunk-{mark[:8]}", lambda i, result: progress(_length(result)) if progress else None)
    else:
        from threadpoolctl import threadpool_limits

        workers = workers or min(2, os.cpu_count() or 1)
        with threadpool_limits(limits=1), ThreadPoolExecutor(max_workers=workers) as pool:
            running = {pool.submit(task, i): i for i in range(n_chunks)}
            for future in as_completed(running):
                parts[running[future]] = future.result()
                if progress:
                    progress(_length(parts[running[future]]))
    return {key: np.concatenate([p[key] for p in parts], axis=0) for key in parts[0]}


def _call(fn: ChunkFn, names: list[str], *blocks: np.ndarray) -> dict[str, np.ndarray]:
    return fn(**dict(zip(names, blocks)))


def _length(result: dict[str, np.ndarray]) -> int:
    return len(next(iter(result.values())))


# ----------------------------------------------------------------------------------------------
# on the cluster: proven reads, bounded waits

_known_ids: dict[tuple[str, str], dict[str, int]] = {}  # per worker process: (store, fingerprint) → id → position


def _proven_call(fn: ChunkFn, stored: dict[str, str], store: str, mark: str, ids: list[str]) -> dict[str, np.ndarray]:
    """On a worker: prove this is the client's store and the images are finished, then read them."""
    return fn(**proven_read(stored, store, mark, ids))


def _rows(array, positions: np.ndarray) -> np.ndarray:
    """Rows ``positions`` of a zarr array: a slice when they are consecutive (zarr then copies
    each chunk's part once, not element by element as an orthogonal selection does)."""
    if positions.size and int(positions[-1]) - int(positions[0]) == positions.size - 1 and bool((np.diff(positions) == 1).all()):
        return np.asarray(array[int(positions[0]) : int(positions[-1]) + 1])
    return np.asarray(array.get_orthogonal_selection((positions,)))


def _view_of(group, name: str) -> str:
    """The view an array belongs to, as the store's flags name it: the longest tail of its name
    with a ``done_<tail>`` flag (``keys_native_crop`` → native_crop, not crop), else its last part."""
    parts = name.split("_")
    tails = ["_".join(parts[k:]) for k in range(1, len(parts))]
    return next((tail for tail in tails if f"done_{tail}" in group), parts[-1])


def _flags(group, arrays, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(done, failed) of the images at ``positions`` for the views the arrays belong to (their
    name's view, ``keys_480`` → 480), as ``store.cache.open_store`` judged them: a store
    growing another view stays readable for the views it has; else the store's own flags."""
    views = sorted({_view_of(group, name) for name in arrays if name != "image"})
    if views and all(f"done_{v}" in group and f"failed_{v}" in group for v in views):
        done = np.logical_and.reduce([np.asarray(_rows(group[f"done_{v}"], positions), dtype=bool) for v in views])
        failed = np.logical_or.reduce([np.asarray(_rows(group[f"failed_{v}"], positions), dtype=bool) for v in views])
        return done, failed
    return np.asarray(_rows(group["done"], positions), dtype=bool), np.asarray(_rows(group["failed"], positions), dtype=bool)


def proven_read(stored: dict[str, str], store: str, mark: str, ids: list[str]) -> dict[str, np.ndarray]:
    """Images ``ids`` of the store arrays ``stored`` (argument name → array), read by this process
    (a dask worker, or a local worker process of ``infra.runner``) once it has proven that the
    store at ``store`` is the client's (its manifest's ``mark``) and that the images are finished."""
    import zarr

    worker = worker_name()
    fix = "mount the store at the same path on every worker (or run without --dask-address)"
    try:
        group = zarr.open_group(store, mode="r", use_consolidated=False)
        manifest = dict(group.attrs["manifest"])
    except Exception as error:  # missing path, permission, not a store: all mean "cannot read"
        raise IntegrityError(worker, f"cannot read the store {store} ({type(error).__name__}: {error})", fix) from None
    if fingerprint(manifest) != mark:
        raise IntegrityError(worker, f"sees another store at {store} (its manifest differs from the client's)", fix)
    known = _known_ids.get((store, mark))
    if known is None:
        known = _known_ids[(store, mark)] = {str(v): i for i, v in enumerate(group["image"][:])}
    missing = [i for i in ids if i not in known]
    if missing:
        raise IntegrityError(worker, f"finds no image {missing[0]!r} in {store}", fix)
    positions = np.asarray([known[i] for i in ids], dtype=np.int64)
    done, failed = _flags(group, stored.values(), positions)
    if not done.all() or failed.any():
        bad = ids[int(np.flatnonzero(~done | failed)[0])]
        raise IntegrityError(worker, f"reads {int((~done | failed).sum())} of {len(ids)} images of {store} as unfinished (e.g. {bad!r})", fix)
    return {name: _rows(group[array], positions) for name, array in stored.items()}


def on_cluster(client, calls: list[tuple], tag: str, done: Callable[[int, dict], None] | None = None) -> list[dict[str, np.ndarray]]:
    """Every call ``(fn, *args)`` as a task on the cluster; their results in order. ``done(i,
    result)`` as each finishes. A scheduler gone before or during the run, a cluster with no
    workers left or a lost task ends the wait with one line (``gather``)."""
    stamp = time.monotonic_ns()
    try:
        futures = [client.submit(*call, key=f"{tag}-{i}-{stamp}", pure=False) for i, call in enumerate(calls)]
    except Exception as error:  # a client whose scheduler is gone
        raise lost_cluster(client, f"went away before the run ({type(error).__name__})") from None
    parts: list[dict[str, np.ndarray] | None] = [None] * len(calls)
    for i, result in gather(client, futures):
        parts[i] = result
        if done:
            done(i, result)
    return parts


def lost_cluster(client, why: str) -> ProbeError:
    """The command that waited says what it kept (``propagate`` writes sequences as they finish)."""
    return ProbeError(getattr(client, "_probe_address", "the dask scheduler"), why, "check the scheduler and its workers, then rerun")


def _alive_workers(client) -> int | None:
    """Workers the scheduler knows now (None when the scheduler does not answer in time)."""
    try:
        info = client.sync(client.scheduler.identity, callback_timeout=POLL_SECONDS * 5)
        return len(info.get("workers", {}))
    except Exception:
        return None


def gather(client, futures):
    """(index, result) as a cluster's futures finish; a lost scheduler, a cluster with no workers
    left or a task's failure ends the wait with one line."""
    from distributed import wait

    index = {f.key: i for i, f in enumerate(futures)}
    pending = set(futures)
    quiet_since = time.monotonic()
    while pending:
        try:
            finished, pending = wait(pending, timeout=POLL_SECONDS, return_when="FIRST_COMPLETED")
        except TimeoutError:
            finished = set()
        except Exception as error:
            raise lost_cluster(client, f"went away mid-run ({type(error).__name__})") from None
        for future in finished:
            try:
                result = future.result(timeout=POLL_SECONDS * 5)
            except ProbeError:
                raise
            except Exception as error:
                name = type(error).__name__
                if name in ("KilledWorker", "CancelledError", "FutureCancelledError", "CommClosedError", "TimeoutError"):
                    raise lost_cluster(client, f"lost a chunk task mid-run ({name}: {error})") from None
                raise
            yield index[future.key], result
        if finished:
            quiet_since = time.monotonic()
            continue
        if client.status not in ("running", "connecting"):
            raise lost_cluster(client, f"went away mid-run (client {client.status})")
        if time.monotonic() - quiet_since > STALL_SECONDS:
            workers = _alive_workers(client)
            if workers is None:
                raise lost_cluster(client, f"stopped answering for {STALL_SECONDS:.0f} s mid-run")
            if workers == 0:
                raise lost_cluster(client, f"has no workers left (none for {STALL_SECONDS:.0f} s)")
            quiet_since = time.monotonic()


async def _identity(address: str, seconds: float) -> dict:
    from distributed.comm import connect as comm_connect

    comm = await comm_connect(address, timeout=seconds)
    try:
        await comm.write({"op": "identity", "reply": True})
        return await comm.read()
    finally:
        comm.abort()


def connect(address: str | None):
    """A dask.distributed Client for ``--dask-address`` (None: run on local threads).

    The address must parse, answer a scheduler's identity within ``CONNECT_SECONDS`` (a port
    that accepts connections but speaks something else would otherwise hang the client) and
    have at least one worker."""
    if not address:
        return None
    import logging

    from distributed import Client

    # the failure is reported as one line, not as the client's log: distributed's own logging
    # config gives its loggers levels of their own (distributed.client: warning), so the parent's
    # level alone would let a lost scheduler print two tracebacks before probe's line
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)

    fix = "start one with `dask scheduler` (and `dask worker ADDRESS`) or drop --dask-address"
    try:
        identity = asyncio.run(asyncio.wait_for(_identity(address, CONNECT_SECONDS), CONNECT_SECONDS))
    except (ValueError, TypeError) as error:
        raise ProbeError(address, f"is not a dask scheduler address ({error})", "use --dask-address tcp://HOST:8786") from None
    except (OSError, asyncio.TimeoutError) as error:
        raise ProbeError(address, f"no dask scheduler answers ({type(error).__name__}{': ' + str(error) if str(error) else ''})", fix) from None
    except Exception as error:
        raise ProbeError(address, f"does not speak the dask protocol ({type(error).__name__})", fix) from None
    if not isinstance(identity, dict) or identity.get("type") != "Scheduler":
        raise ProbeError(address, "answers, but is not a dask scheduler", fix)
    if not identity.get("workers"):
        raise ProbeError(address, "is a dask scheduler with no workers", "start workers with `dask worker ADDRESS`")
    try:
        client = Client(address, timeout=f"{CONNECT_SECONDS:.0f}s")
    except (OSError, TimeoutError) as error:
        raise ProbeError(address, f"no dask scheduler answers ({error})", fix) from None
    client._probe_address = address
    return client
