"""The one runner: a per-image analysis on every local core, on a dask.distributed cluster, or as one shard.

An analysis hands the runner a pure, picklable function ``fn(**blocks) -> dict[str, ndarray]``
over an image block of its arrays, whose results have ``image`` as their first axis. The runner
cuts the images into blocks and calls ``fn``

- in this process (``workers=1``), or on ``workers`` local processes, each limited to one BLAS
  thread (per-image problems are small, and a busy machine makes multi-threaded BLAS spin);
  this process ships each block's coordinates (``StoreBlock``) and the worker reads and
  decompresses the block itself, with the proofs a dask worker makes, so this process's one core
  never serialises the reads of every core's work;
- on a dask.distributed cluster (``client``), whose workers read their own blocks with the same
  proofs (``cluster.proven_read``; ``map_blocks`` with a ``client``, for blocks that are not a
  store's, e.g. DAVIS sequences, ships them and waits the same way);

and concatenates the results in image order. Every image is computed alone by the same code
with one BLAS thread and one torch thread (``task_threads``, in this process too), so the results
are bit-identical whatever the worker count or cluster.
``shard_range`` gives the contiguous, block-aligned image range of shard i of n (``--shard i/n``
or torchrun's RANK/WORLD_SIZE, parsed as ``probe extract`` parses them).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ProbeError
from .task_threads import task_threads

if TYPE_CHECKING:
    from .placement import Placement

BlockFn = Callable[..., dict[str, np.ndarray]]


def for_workers(path: str | os.PathLike[str]) -> str:
    """A path as it is handed to a worker: absolute, from this process's working directory. A
    worker (a dask worker above all) runs in a directory of its own, where a relative path names
    another file or none; every handle a worker receives (``Shared``, ``StoreBlock``, a block's
    file list) passes its paths through here."""
    return os.path.abspath(os.fspath(path))


def local_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def shard_range(n_images: int, block: int, shard: tuple[int, int]) -> tuple[int, int]:
    """Images [start, stop) of shard i of n: whole blocks, contiguous, disjoint, covering all."""
    i, n = shard
    blocks = -(-n_images // block)
    return min(n_images, (i * blocks) // n * block), min(n_images, ((i + 1) * blocks) // n * block)


def store_chunk(array) -> int:
    """Images per block when the caller names none: the array's own chunks along ``image`` (zarr's,
    as the store was written), else 16."""
    chunks = getattr(array, "encoding", {}).get("chunks")
    return int(chunks[0]) if chunks else 16


def blocks(n_images: int, block: int) -> list[tuple[int, int]]:
    return [(a, min(a + block, n_images)) for a in range(0, n_images, block)]


def block_size(n_images: int, workers: int, largest: int = 16) -> int:
    """Images per block: at most ``largest`` (a store chunk), small enough to keep every worker
    busy; halved from ``largest`` while that stays even, so blocks tile the store's chunks."""
    want, size = max(1, -(-n_images // (4 * workers))), max(1, largest)
    while size > want and size % 2 == 0:
        size //= 2
    return min(size, want)


def tapered(ranges: list[tuple[int, int]], workers: int) -> list[tuple[int, int]]:
    """The last ``workers`` blocks cut in halves when every worker has several blocks: the run
    ends with small blocks, so a worker that finishes first waits half a block for the others,
    not a whole one (a split block's chunk is read twice, about 1 % of its decode time)."""
    if workers <= 1 or len(ranges) < 3 * workers:
        return ranges
    cut = len(ranges) - workers
    last = [[(a, (a + b) // 2), ((a + b) // 2, b)] if b - a > 1 else [(a, b)] for a, b in ranges[cut:]]
    return ranges[:cut] + [part for parts in last for part in parts]


@dataclass(frozen=True)
class Where:
    """Where a per-image analysis runs: ``workers`` local processes, or a dask ``client``."""

    workers: int = 1
    client: Any = None


@contextmanager
def placed(placement: Placement) -> Iterator[Where]:
    """A run's placement (checked when the run was built: ``Placement.check``, its errors spelled
    per caller) as a ``Where``: its local workers (a GPU's one process, ``Placement.local_workers``)
    or its cluster's client, closed after."""
    if placement.dask_address:
        from .cluster import connect

        client = connect(placement.dask_address)
        try:
            yield Where(client=client)
        finally:
            client.close()
    else:
        workers = placement.local_workers()
        yield Where(workers=local_cores() if workers is None else workers)


def _one_thread(parent: int | None = None) -> None:
    """Worker start: one BLAS thread (numpy/scipy's OpenBLAS, and torch's pool if it is loaded),
    the command line's collection thresholds before the tasks' imports, and an exit as soon as
    the command's process (``parent``) is gone (``lifeline``: a killed run leaves no worker)."""
    from threadpoolctl import threadpool_limits

    from .collector import fewer_full_collections
    from .lifeline import follow_parent

    if parent is not None:
        follow_parent(parent)

    fewer_full_collections()
    threadpool_limits(limits=1)
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(1)


def _in_task_threads(fn: BlockFn, **arrays: np.ndarray) -> dict[str, np.ndarray]:
    """``fn`` on a dask worker, under one thread as a local task (``task_threads``)."""
    with task_threads(1):
        return fn(**arrays)


def _call(fn: BlockFn, arrays: dict[str, np.ndarray] | StoreBlock, threads: int = 1) -> dict[str, np.ndarray]:
    if isinstance(arrays, StoreBlock):  # on a worker: it reads its own block
        arrays = arrays.load()
    with task_threads(threads):
        return fn(**arrays)


@contextmanager
def process_pool(workers: int, torch_free: bool = False) -> Iterator[ProcessPoolExecutor | None]:
    """``workers`` local processes with one BLAS thread each (None when ``workers`` ≤ 1).

    fork starts a worker in milliseconds (spawn: a second or more of imports each); zarr starts
    a fresh I/O loop in a forked worker (its ``register_at_fork`` hook). torch's thread pools do not
    survive a fork, so once torch is loaded the workers are spawned, unless the caller says its
    blocks compute nothing with torch (``torch_free``: numpy / scipy only).
    """
    if workers <= 1:
        yield None
        return
    context = multiprocessing.get_context("spawn" if "torch" in sys.modules and not torch_free else "fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_one_thread, initargs=(os.getpid(),)) as pool:
        yield pool


def map_blocks(
    fn: BlockFn,
    read: Callable[[int, int], dict[str, np.ndarray]],
    ranges: list[tuple[int, int]],
    *,
    workers: int = 1,
    threads: int = 1,
    pool: ProcessPoolExecutor | None = None,
    progress: Callable[[int], None] | None = None,
    torch_free: bool = False,
    each: Callable[[int, int, dict[str, np.ndarray]], None] | None = None,
    client: Any = None,
    keep: bool = True,
) -> dict[str, np.ndarray]:
    """``fn(**read(a, b))`` for every range, here, on ``workers`` processes or on a dask
    ``client``'s workers; results in order.

    ``threads``: BLAS threads when this process computes (``workers=1``); workers use one.
    ``pool``: an open ``process_pool`` to reuse across calls (streaming calls once per chunk).
    ``read`` runs in this process (it may hold an open store); at most two blocks per worker are
    in flight, so memory stays bounded by a few blocks however large the set. ``read`` may return
    a ``StoreBlock`` instead of arrays: the worker then reads the block itself. ``each(a, b,
    result)``: called here with every block's result, in order, while the workers compute the next
    ones (a command assembles its output as the blocks come, not after the last). ``client``:
    every block is read here and runs on the cluster under one thread (``task_threads``), as a
    local worker runs it; results wait as ``map_images``'s do (a lost scheduler or worker is
    one line). ``keep`` False: results go to ``each`` only and nothing is returned (``{}``), so
    memory holds a few blocks' results however many blocks there are.
    """
    if not ranges:
        raise ProbeError(None, "no images to process", "run `probe extract` first, or check --shard")
    parts: list[dict[str, np.ndarray]] = []
    workers = min(workers, len(ranges))  # one block: no process is worth starting
    if client is not None:
        parts = _on_cluster(client, fn, read, ranges, progress)
        if each:
            for (a, b), part in zip(ranges, parts):
                each(a, b, part)
    elif workers <= 1:
        for a, b in ranges:
            result = _call(fn, read(a, b), threads)
            if keep:
                parts.append(result)
            if each:
                each(a, b, result)
            if progress:
                progress(b - a)
    else:
        with process_pool(workers, torch_free) if pool is None else _reuse(pool) as running:
            for (a, b), result in _bounded(running, fn, read, ranges, 2 * workers):
                if keep:
                    parts.append(result)
                if each:
                    each(a, b, result)
                if progress:
                    progress(b - a)
    if not parts:
        return {}
    return {key: np.concatenate([p[key] for p in parts], axis=0) for key in parts[0]}


def _on_cluster(client, fn: BlockFn, read, ranges: list[tuple[int, int]], progress) -> list[dict[str, np.ndarray]]:
    from .cluster import on_cluster

    calls = [(_call, fn, read(a, b), 1) for a, b in ranges]
    return on_cluster(client, calls, f"probe-block-{ranges[0][0]}", lambda i, _: progress(ranges[i][1] - ranges[i][0]) if progress else None)


@contextmanager
def _reuse(pool: ProcessPoolExecutor) -> Iterator[ProcessPoolExecutor]:
    yield pool


def _bounded(pool: ProcessPoolExecutor, fn: BlockFn, read, ranges, depth: int) -> Iterator[tuple[tuple[int, int], dict]]:
    """Submit blocks ahead (``depth`` at most) and yield results in submission order."""
    pending: deque[tuple[tuple[int, int], Future]] = deque()
    todo = iter(ranges)
    for rng in todo:
        pending.append((rng, pool.submit(_call, fn, read(*rng))))
        if len(pending) >= depth:
            break
    while pending:
        rng, future = pending.popleft()
        yield rng, future.result()
        nxt = next(todo, None)
        if nxt is not None:
            pending.append((nxt, pool.submit(_call, fn, read(*nxt))))


def map_images(
    fn: BlockFn,
    arrays: Mapping[str, Any],
    *,
    where: Where = Where(),
    image_range: tuple[int, int] | None = None,
    block: int = 16,
    threads: int = 1,
    progress: Callable[[int], None] | None = None,
    fixed: bool = False,
    torch_free: bool = False,
    each: Callable[[int, int, dict[str, np.ndarray]], None] | None = None,
    keep: bool = True,
    pool: ProcessPoolExecutor | None = None,
) -> dict[str, np.ndarray]:
    """``fn`` over the images of lazily opened arrays (xarray, dim ``image`` first), in order.

    ``image_range`` restricts the run to images [start, stop) (a shard). On a dask ``client``
    the blocks (``block`` images each) are read by the cluster's workers (``_on_store_cluster``);
    locally each worker reads its own (below), and this process reads when it computes. ``fixed``: blocks of exactly ``block`` images
    whatever the worker count, for an ``fn`` whose batched math (a matmul over the block) could
    round differently on another block shape. ``torch_free``: ``fn`` computes nothing with
    torch, so local workers may be forked even once torch is loaded (``process_pool``). ``each``,
    ``keep``, ``pool``: as in ``map_blocks``.

    Local workers read their own blocks (``StoreBlock``) when every array is one store's; arrays
    made in memory are read here and shipped.
    """
    from .memory import keep_memory_flat

    keep_memory_flat()
    first = next(iter(arrays.values()))
    for name, array in arrays.items():
        if array.shape[0] != first.shape[0]:
            raise ProbeError(name, f"has {array.shape[0]} images, not {first.shape[0]}", "pass arrays of one store")
    start, stop = image_range if image_range is not None else (0, first.sizes["image"])
    if where.client is not None:
        ranges = [(start + a, start + b) for a, b in blocks(stop - start, block)]
        return _on_store_cluster(where.client, fn, arrays, ranges, progress, each, keep)

    size = block if fixed else block_size(stop - start, where.workers, block)
    ranges = [(start + a, start + b) for a, b in blocks(stop - start, size)]
    if not fixed:
        ranges = tapered(ranges, where.workers)
    source = _one_store(arrays) if min(where.workers, len(ranges)) > 1 else None
    read = _Coordinates(arrays, *source) if source else _ChunkReader(arrays, start, stop)
    return map_blocks(fn, read, ranges, workers=where.workers, threads=threads, pool=pool, progress=progress, torch_free=torch_free, each=each, keep=keep)


def _on_store_cluster(
    client, fn: BlockFn, arrays: Mapping[str, Any], ranges: list[tuple[int, int]], progress, each: Callable | None = None, keep: bool = True
) -> dict[str, np.ndarray]:
    """Every block on the cluster, read by the worker that computes it (``cluster.proven_read``)
    under one thread (``task_threads``), as a local worker reads and computes it. With ``each``,
    the blocks are submitted a few ahead of the one handed over and go to ``each`` in order as
    they come (``cluster.in_order``), kept only with ``keep``, as ``map_blocks`` hands them."""
    from .cluster import in_order, on_cluster, proven_call

    source = _one_store(arrays)
    if not ranges:
        raise ProbeError(None, "no images to process", "run `probe extract` first, or check --shard")
    if source is None:
        raise ProbeError(None, "a cluster run needs arrays opened from one store (store.cache.require)", "open the store with probe_toolkit.store.cache.open_store")
    store, mark = source
    read = _Coordinates(arrays, store, mark)
    task = partial(_in_task_threads, fn)
    calls = [(proven_call, task, read.stored, store, mark, list(read(a, b).ids), read.check) for a, b in ranges]
    if each is None:
        parts = on_cluster(client, calls, f"probe-chunk-{mark[:8]}", lambda i, _: progress(ranges[i][1] - ranges[i][0]) if progress else None)
    else:
        parts = []
        for (a, b), part in zip(ranges, in_order(client, calls, f"probe-chunk-{mark[:8]}", 2 * _cluster_threads(client))):
            each(a, b, part)
            if keep:
                parts.append(part)
            if progress:
                progress(b - a)
        if not parts:
            return {}
    return {key: np.concatenate([p[key] for p in parts], axis=0) for key in parts[0]}


def _cluster_threads(client) -> int:
    """The cluster's worker threads (4 where the scheduler does not say)."""
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:
        return 4


def per_image(where: Where = Where(), *, block: int | None = None, progress: Callable[[int], None] | None = None) -> Callable[..., dict[str, np.ndarray]]:
    """The runner as a summary's ``per_image`` argument (``analyses.entropy``, ``analyses.neighbours``):
    ``(fn, arrays) -> fn's per-image arrays``, over blocks of ``block`` images (default: the store's
    own chunks, whatever the placement, so every placement gives the same bits), placed by ``where``.
    Their block functions compute with numpy alone, so local workers may be forked."""

    def run(fn: BlockFn, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
        size = block or store_chunk(next(iter(arrays.values())))
        return map_images(fn, arrays, where=where, block=size, fixed=True, progress=progress, torch_free=True)

    return run


@dataclass(frozen=True)
class StoreBlock:
    """A block as its coordinates (the store, its fingerprint, the arrays, the images' ids): what
    this process ships to a local worker, which reads and decompresses the block itself with the
    proofs a dask worker makes (``cluster.proven_read``). This process then neither reads nor
    pickles the block's arrays, and the reads run on every core, not on this process's one."""

    stored: dict[str, str]  # fn's argument name → the store array
    store: str
    mark: str
    ids: tuple[str, ...]
    check: str | None = None  # the store's check before a read, as module:function (``cluster.store_check``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", for_workers(self.store))

    def load(self) -> dict[str, np.ndarray]:
        from .cluster import proven_read

        return proven_read(self.stored, self.store, self.mark, list(self.ids), self.check)


def _one_store(arrays: Mapping[str, Any]) -> tuple[str, str] | None:
    """(store, fingerprint) when every array is one store's (``cache.require``'s attrs), else None
    (arrays made in memory: this process reads and ships them)."""
    from .cluster import store_source

    sources = {store_source(array) if hasattr(array, "attrs") else None for array in arrays.values()}
    return next(iter(sources)) if len(sources) == 1 and None not in sources else None


class _Coordinates:
    """``read(a, b)`` as a ``StoreBlock``: the ids of images a..b (the arrays' own positions)."""

    def __init__(self, arrays: Mapping[str, Any], store: str, mark: str) -> None:
        from .cluster import store_check

        # an array that is one block of a stored one names that block too (``store.cache.checked``'s pick)
        self.stored = {name: str(array.name) + (f"#{array.attrs['probe_pick']}" if array.attrs.get("probe_pick") else "") for name, array in arrays.items()}
        self.store, self.mark = store, mark
        first = next(iter(arrays.values()))
        self.ids = first.coords["image"].values  # as stored: a block's ids become Python strings when it is shipped
        self.check = store_check(first)

    def __call__(self, a: int, b: int) -> StoreBlock:
        return StoreBlock(self.stored, self.store, self.mark, tuple(str(i) for i in self.ids[a:b]), self.check)


class _ChunkReader:
    """``read(a, b)`` for blocks in order: each store chunk the blocks fall in is read (and
    decompressed) once, not once per block when blocks are smaller than a chunk."""

    def __init__(self, arrays: Mapping[str, Any], start: int, stop: int) -> None:
        self.arrays, self.span, self.held = arrays, (0, 0), {}
        from .cluster import image_chunk_edges

        edges = {start, stop}
        for array in arrays.values():
            edges.update(image_chunk_edges(array))  # dask's chunks, or the store's as open_store recorded them
        self.edges = np.array(sorted(e for e in edges if start <= e <= stop))

    def __call__(self, a: int, b: int) -> dict[str, np.ndarray]:
        lo, hi = self.span
        if not (lo <= a and b <= hi):
            lo = int(self.edges[self.edges <= a].max())
            hi = int(self.edges[self.edges >= b].min())
            if hi - lo > 4 * (b - a) + 64:  # a chunk far larger than the block: read the block alone
                lo, hi = a, b
            self.span = lo, hi
            self.held = {name: np.asarray(array.isel(image=slice(lo, hi)).values) for name, array in self.arrays.items()}
        return {name: np.ascontiguousarray(v[a - lo : b - lo]) for name, v in self.held.items()}


@contextmanager
def torch_threads(n: int = 1) -> Iterator[None]:
    """In a worker process, torch's intra-op threads set to ``n`` for a block whose code imported
    torch itself (after ``task_threads`` looked). In the command's own process ``task_threads``
    has set (and will restore) them already."""
    if multiprocessing.parent_process() is None:
        yield
        return
    import torch

    torch.set_num_threads(n)
    yield
