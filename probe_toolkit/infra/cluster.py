"""The cluster side of the runner (``infra/runner.py``): a dask.distributed scheduler reached
within a bounded wait, image blocks read by the process that computes them with proofs, and
every wait on the cluster bounded.

On a cluster (and in the runner's local worker processes) every block task reads its own
images (a worker that reads what another worker read could hide a worker that sees nothing): it
opens the store by path, proves it is the store the client opened (a fingerprint of the
manifest), that its images are listed and finished (its views' ``done`` set, ``failed`` not),
and only then reads them. A worker without the store, with another store at that path or with an
unfinished copy fails the command with one line naming the worker (zarr would otherwise hand it
NaN fill values).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from .errors import IntegrityError, ProbeError, worker_name
from .names import SortedNames

if TYPE_CHECKING:
    import xarray as xr

ChunkFn = Callable[..., dict[str, np.ndarray]]
ChunkCheck = Callable[..., None]  # (store, names=(), positions=None, group=None): the store's own check before a worker reads

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


def store_check(array: xr.DataArray) -> str | None:
    """The check a worker runs before reading a block of this array's store, as ``module:function``
    (``store.integrity.worker_check``, named by ``store.cache.require``; a name, not the function,
    so that the attrs stay plain JSON wherever an array's attrs are written), if any."""
    return array.attrs.get("probe_check") if hasattr(array, "attrs") else None


def _resolve(check: str | None) -> ChunkCheck | None:
    if not check:
        return None
    import importlib

    module, _, name = check.partition(":")
    return getattr(importlib.import_module(module), name)


def image_chunk_edges(array) -> list[int]:
    """Where the store's chunks begin along ``image``, in the array's own positions, and its end:
    a dask array's chunks, or those ``store.cache.open_store`` recorded (the zarr chunks, after
    unfinished images were dropped); [] when unknown. Readers use them to read each chunk once."""
    chunks = getattr(array, "chunks", None)
    if chunks:
        return [int(e) for e in np.cumsum((0, *chunks[array.dims.index("image")]))]
    edges = getattr(array, "encoding", {}).get("probe_image_edges")
    return [int(e) for e in edges] if edges is not None else []


# ----------------------------------------------------------------------------------------------
# on the cluster: proven reads, bounded waits

_known_ids: dict[tuple[str, str], _Ids] = {}  # per worker process: (store, fingerprint) → the store's image ids


class _Ids(SortedNames):
    """A store's image ids as sorted byte strings (``infra.names``), looked up by bisection: a worker
    keeps them for its whole run, and a dict of Python strings would hold several times the bytes
    of the ids, growing with the store. Not numpy's StringDType: its strings sit behind an allocator
    lock, and its comparisons failed in the runner's workers ("Failed to load string in string
    comparison", tests/test_block_sweep.py)."""

    def __init__(self, ids: np.ndarray) -> None:
        super().__init__([str(i) for i in np.asarray(ids).tolist()])

    def positions(self, ids: list[str]) -> tuple[np.ndarray, list[str]]:
        """(each id's position in the store, the ids it lacks); a repeated id: its last position."""
        at, found = self.find([str(i) for i in ids])
        return at[found], [ids[i] for i in np.flatnonzero(~found)]


def proven_call(fn: ChunkFn, stored: dict[str, str], store: str, mark: str, ids: list[str], check: str | None = None) -> dict[str, np.ndarray]:
    """On a worker: prove this is the client's store and the images are finished, then read them."""
    return fn(**proven_read(stored, store, mark, ids, check))


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


def proven_read(stored: dict[str, str], store: str, mark: str, ids: list[str], check: str | None = None) -> dict[str, np.ndarray]:
    """Images ``ids`` of the store arrays ``stored`` (argument name → array), read by this process
    (a dask worker, or a local worker process of ``infra.runner``) once it has proven that the
    store at ``store`` is the client's (its manifest's ``mark``) and that the images are finished."""
    import zarr

    check = _resolve(check)
    if check is not None:
        check(store)  # before any chunk is decoded: one that does not decode is one line, here as in the client
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
        known = _known_ids[(store, mark)] = _Ids(np.asarray(group["image"][:]))
    positions, missing = known.positions(ids)
    if missing:
        raise IntegrityError(worker, f"finds no image {missing[0]!r} in {store}", fix)
    positions = positions.astype(np.int64)
    arrays = {name: ref.partition("#")[0] for name, ref in stored.items()}  # "<array>#<axis>:<index>": one block of it
    done, failed = _flags(group, arrays.values(), positions)
    if not done.all() or failed.any():
        bad = ids[int(np.flatnonzero(~done | failed)[0])]
        raise IntegrityError(worker, f"reads {int((~done | failed).sum())} of {len(ids)} images of {store} as unfinished (e.g. {bad!r})", fix)
    if check is not None:  # the store's own check: a finished image's chunk file is there, a damaged chunk one line
        check(store, arrays.values(), positions, group)
    return {name: _picked(_rows(group[arrays[name]], positions), ref) for name, ref in stored.items()}


def _picked(values: np.ndarray, ref: str) -> np.ndarray:
    """The block a reference names (``attention_blocks_224#1:3``: index 3 of axis 1), that axis dropped; else the values."""
    pick = ref.partition("#")[2]
    if not pick:
        return values
    axis, index = (int(v) for v in pick.split(":"))
    return np.take(values, index, axis=axis)


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


def in_order(client, calls: list[tuple], tag: str, ahead: int) -> Iterator[dict[str, np.ndarray]]:
    """Every call ``(fn, *args)`` as a task on the cluster, at most ``ahead`` of them submitted and
    not yet handed over; their results yielded in order, so the client holds a few blocks' results
    however many blocks there are (``on_cluster`` submits every call and keeps every result). A
    lost scheduler, worker or task ends the wait with one line (``gather``)."""
    stamp = time.monotonic_ns()
    todo, pending = iter(enumerate(calls)), deque()

    def submit() -> None:
        for i, call in todo:
            try:
                pending.append(client.submit(*call, key=f"{tag}-{i}-{stamp}", pure=False))
            except Exception as error:  # a client whose scheduler is gone
                raise lost_cluster(client, f"went away mid-run ({type(error).__name__})") from None
            return

    for _ in range(max(1, ahead)):
        submit()
    while pending:
        for _, result in gather(client, [pending.popleft()]):
            yield result
        submit()


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
    except (TimeoutError, OSError) as error:
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
