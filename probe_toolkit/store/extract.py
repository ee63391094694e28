"""Checkpoint + images → the store: one forward pass per view, written run by run.

What a store will hold is ``extract_plan``; decoding images, ``extract_load``; the forward
pass, ``extract_forward``; writing, ``store.writer``.

Work is cut into runs of images inside the store's chunks; a run's arrays are written whole and
its ``done_<view>`` flags last, so a killed run resumes where it stopped and gives the same store
as an uninterrupted one, and shards (``--shard i/n``, or torchrun's RANK/WORLD_SIZE) write
disjoint, chunk-aligned ranges of one store. A store grows: a later run with new views adds them
beside the existing ones. Decoding the next run and writing the last one run in threads beside
the forward pass (the first run already while the checkpoint is read); where the forward pass
leaves cores free (beside a GPU), images are decoded by several processes and several runs
written at once by others (``extract_load.host_pool``; pixels and the device's copies cross as
shared memory, ``writer.SharedBuffers``), so that the loop launching the network's kernels does
not wait on Python's lock; on a CPU-only machine these are threads, and the forward pass runs as
one single-threaded stream per torch thread, each on its share of a batch (``store.streams``), so
that a core lent to them does not hold the others at every operation. None of this ever changes a
stored value. An image is marked done only when every value of its arrays is finite.
"""

from __future__ import annotations

import errno
import shutil
import time
from collections import deque
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError, os_fix
from ..infra.memory import reusing_blocks
from ..infra.placement import parse_shard
from ..infra.progress import bar
from . import cache, footprint, images, layout, sources
from . import views as view_table
from .ahead import Ahead
from .backbone import Backbone
from .checkpoints import load_checkpoint
from .create import create_store, lock_file
from .extract_forward import finite_images, resolve_device, view_data
from .extract_load import Loaded, decoder_processes, decoder_threads, host_pool, load_run, pixel_bytes, shared_memory_room
from .extract_plan import OnError, Settings, at_least, build_manifest, kept_layout, native_grids, plan_arrays
from .streams import Streams, cpu_streams
from .writer import SharedBuffers, chunk_ranges, shared_tensors, shared_views, write_in_process

SAVERS = 4  # runs compressed and written at once, at most (and at most one per decoding thread)


@dataclass
class Report:
    store: Path
    n_images: int
    written: int = 0
    skipped: list[str] = field(default_factory=list)
    done: int = 0  # extracted in every view (not recorded as failed)
    failed: int = 0  # recorded as failed (--on-error skip), now or by an earlier run
    views: list[str] = field(default_factory=list)
    left: int = 0  # images of this shard still to do after a --limit run
    limit: int | None = None
    # wall seconds: "setup" (checkpoint read and hash, network, store) and "images" (decode,
    # forward, writes), so that a benchmark can tell fixed costs from per-image ones
    seconds: dict[str, float] = field(default_factory=dict)


def _written(pending: Future, path: Path) -> None:
    """Wait for a chunk write; a full disk or a failing device becomes one clear line."""
    try:
        pending.result()
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ProbeError(
                path, "ran out of disk space while writing a chunk", "free space and rerun the same command: finished chunks are kept, the rest resumes"
            ) from None
        raise ProbeError(path, f"could not be written ({error.strerror or error})", os_fix(error, "rerun the same command to resume")) from None


def _limited(runs: list[tuple[int, int, tuple[str, ...]]], limit: int | None) -> tuple[list[tuple[int, int, tuple[str, ...]]], int]:
    """At most ``limit`` images: the last run is cut inside its chunk. Returns (runs, images left)."""
    total = sum(b - a for a, b, _ in runs)
    if limit is None:
        return runs, 0
    kept, taken = [], 0
    for a, b, views in runs:
        if taken >= limit:
            break
        take = min(b - a, limit - taken)
        kept.append((a, a + take, views))
        taken += take
    return kept, total - taken


def _decode_first_run(
    refs: list[images.ImageRef],
    views: list[str],
    settings: Settings,
    shard: tuple[int, int],
    limit: int | None,
    on_error: OnError,
    pool: Executor,
    shared: SharedBuffers | None = None,
) -> tuple[tuple[int, int, tuple[str, ...]], Future] | None:
    """Start decoding the run a new store begins with while the checkpoint is read and the network
    built (the fixed views only: the own-size views need the checkpoint's patch size).

    Returns (run, future); the loop takes the future only when its first run is this one (a
    resumed store starts elsewhere and decodes its own), so the same images are decoded the
    same way either way, and a bad image's error comes where it came before, when the run is
    taken. The thread ends once the run is decoded.
    """
    ranges = chunk_ranges(len(refs), settings.chunk, shard)
    if any(v in images.OWN_SIZE or view_table.view(v).family == "padded" for v in views) or not ranges:  # square800 pads to the patch size
        return None
    a, b = ranges[0]
    run = (a, min(b, a + limit) if limit is not None else b, tuple(views))
    decoder = ThreadPoolExecutor(1)
    future = decoder.submit(load_run, refs[run[0] : run[1]], list(views), settings, 0, None, on_error, pool, shared)
    decoder.shutdown(wait=False)
    return run, future


def _views_of(units: tuple[str, ...]) -> list[str]:
    """The views of some parts (``224.p1`` → ``224``), each once, in order."""
    return list(dict.fromkeys(layout.split_unit(u)[0] for u in units))


def extract(
    checkpoint_path: str | Path,
    image_dir: str | Path,
    *,
    settings: Settings = Settings(),
    network: str = "teacher",
    convert: bool = False,
    heads: int | None = None,
    cache_dir: str | Path | None = None,
    store: str | Path | None = None,
    shard: str | None = None,
    on_error: OnError = "fail",
    limit: int | None = None,
    batch_size: int = 16,
    device: str = "auto",
    decoders: int | None = None,
    quiet: bool = False,
    repair: bool = False,
    processes: bool | None = None,
    revision: str | None = None,
) -> Report:
    """``probe extract``: fill (or grow) the store of ``checkpoint_path`` with the views of ``image_dir``.
    ``checkpoint_path``: a file, a transformers / timm folder or a Hugging Face Hub name (``store.hub``; ``revision`` for a Hub name).
    ``repair``: first mark the images of damaged chunks unfinished (``store.verify.repair``), so they are extracted again.
    ``processes``: decode and write in processes rather than threads (default: beside a GPU; ``extract_load.host_pool``)."""
    started = time.perf_counter()
    at_least("--batch-size", batch_size, 1, "16")
    at_least("--limit", limit, 1, "100")
    at_least("--heads", heads, 1, "6")
    # freed blocks are reused from the first decoded image on (under the command line's pinned
    # mmap threshold every decoded view was a fresh mapping: decoding ran 1.6x slower, and its
    # threads queued on the kernel's mapping lock)
    threads = decoder_threads(decoders, device)
    savers = min(SAVERS, threads)
    processes = decoder_processes(device) if processes is None else processes
    # processes only with several of them, and room in shared memory for three runs' pixels
    # (being decoded, being read, one ahead); the writing processes' room is checked below
    pixels = 3 * settings.chunk * pixel_bytes(list(settings.names), settings, 16)
    processes = processes and threads > 1 and shared_memory_room(pixels)
    with reusing_blocks(), host_pool(threads, processes) as decoding:
        shard_range = parse_shard(shard)
        views = settings.names
        try:
            refs, unlisted = images.list_images(image_dir), None
        except ProbeError as error:  # told after the checkpoint's own errors, as before
            refs, unlisted = [], error
        # beside a GPU, shared memory for the decoded pixels and the device's copies, each buffer reused
        buffers = SharedBuffers() if processes else None
        early = _decode_first_run(refs, views, settings, shard_range, limit, on_error, decoding, buffers)
        checkpoint = load_checkpoint(checkpoint_path, network=network, heads=heads, convert=convert, revision=revision)
        if unlisted is not None:
            raise unlisted
        patch = checkpoint.arch.patch
        for view in views:  # a size the network's patch does not divide: one line with the nearest that it does
            misfit = view_table.check_size(view, patch)
            if misfit:
                raise ProbeError(None, *misfit)
        settings.requests(checkpoint.arch)  # its blocks and facets, against the network's, before any image is read
        own_views = tuple(v for v in views if v in images.OWN_SIZE)
        grids = {v: (np.full(len(refs), r, np.int32), np.full(len(refs), c, np.int32)) for v in views if v not in own_views for r, c in [images.fixed_grid(v, patch)]}
        if own_views:
            grids.update(native_grids(refs, patch, on_error, own_views))
        own_patches = {v: int((grids[v][0] * grids[v][1]).max(initial=0)) for v in own_views}
        torch_device = resolve_device(device)
        footprint.check_own_views([r.id for r in refs], grids, own_views, checkpoint.arch, torch_device.type)
        footprint.check_maps(settings.requests(checkpoint.arch), grids, checkpoint.arch, batch_size, torch_device.type)
        backbone = Backbone.from_checkpoint(checkpoint, settings.interpolation).to(torch_device)

        name = network + ("-converted" if convert else "")
        path = Path(store) if store else cache.store_path(cache.cache_root(cache_dir), checkpoint.stem, checkpoint.sha256, name)
        plan = kept_layout(path, plan_arrays(checkpoint.arch, settings, own_patches))
        # paths absolute at the boundary: a later command or a worker elsewhere reads the same files (store/sources.py)
        manifest = build_manifest(checkpoint, settings, refs, str(Path(image_dir).resolve()), own_patches)
        # a Hub snapshot's file is a link into the cache's blobs: the snapshot path keeps the commit and the file name
        manifest["checkpoint"]["path"] = str(checkpoint.path.absolute() if checkpoint.source else checkpoint.path.resolve())
        existed = (path / "zarr.json").is_file()
        unrecorded: list[int] = []  # finished images whose files' sha256 or stat an older extraction did not record
        if existed:  # its photographs changed in place: growing it would pair old features with new pixels, and "0 written" would hide it
            held = set(sources.finished(path))
            sources.check_current(path, [(r.id, r.path) for r in refs if r.id in held], unrecorded=unrecorded)
        try:
            writer = create_store(path, manifest, [r.id for r in refs], plan, grids, repair=repair)
            sources.record_arrays(path)  # each file's sha256 and stat, written with its image's flags
        except OSError as error:  # a read-only folder while the store is created: nothing is left but swept names
            raise ProbeError(path, f"could not be created ({error.strerror or error})", os_fix(error, "rerun (or choose another --store)")) from None
        if existed:  # once the store's settings were found to agree (create_store)
            from .verify import repair as mark_damaged

            sources.record_absolute(path, image_dir)  # a store that recorded its folder relative names it absolute from now on
            if repair:  # its photographs were checked unchanged above (their sha256), before any change
                mark_damaged(path, list(views))
        stored = writer.stored(plan)  # each array under the name the store holds it by (a later part's where a view grew)
        units = sorted({layout.unit_of(name) for name in stored}, key=lambda u: (views.index(layout.split_unit(u)[0]), u))
        flags = {unit: writer.done(unit) for unit in units}  # a data set's store has a flag chunk per few images: read once where nothing is written
        todo, left = _limited(writer.todo(shard_range, units, flags), limit)
        report = Report(store=path, n_images=len(refs), views=views, left=left, limit=limit)
        # the device's copies of the runs being written (and two more) beside the pixels, in shared memory
        outputs = (savers + 2) * writer.chunk * sum(int(np.prod(spec[1])) for spec in plan.values()) * np.dtype(settings.dtype).itemsize
        writing = processes and shared_memory_room(pixels + outputs)

        def load(run: tuple[int, int, tuple[str, ...]]) -> Loaded:
            a, b, needed = run
            own = {v: (grids[v][0][a:b], grids[v][1][a:b]) for v in own_views}
            return load_run(refs[a:b], _views_of(needed), settings, patch, own, on_error, decoding, buffers)

        report.seconds["setup"] = time.perf_counter() - started
        try:
            with (
                ThreadPoolExecutor(1) as loader,
                host_pool(savers, writing, "probe-write") as saver,
                bar("images", quiet) as progress,
                Streams(backbone, cpu_streams(torch_device)) as streams,
                ExitStack() as stack,
            ):
                task = progress.add_task(f"extract {path.parent.name}/{path.name}", total=sum(b - a for a, b, _ in todo))
                writes: deque[tuple[int, Future]] = deque()  # (chunk, write) of the runs being written, oldest first
                decodes: dict[int, Future] = {0: early[1]} if todo and early and early[0] == todo[0] else {}
                # on the CPU's streams each run's pass begins before the run before it is collected
                # (store.ahead), and its decoding one run earlier still, so that it is ready then; not
                # with an image's own size, passed an image at a time: two such passes at once would
                # hold twice the memory footprint.check_maps allows one
                ahead = 1 if streams.parallel and not own_views else 0

                def take(i: int) -> Loaded:  # run i's decoded pixels; the decoding of the runs after it begins
                    pending = decodes.pop(i, None) or loader.submit(load, todo[i])
                    for j in range(i + 1, min(i + 2 + ahead, len(todo))):
                        if j not in decodes:
                            decodes[j] = loader.submit(load, todo[j])
                    return pending.result()

                def forward(i: int, loaded: Loaded) -> tuple[dict[str, tuple[dict, dict[str, np.ndarray]]], list[float]]:
                    """Run i's arrays of each view it lacks (view → (the arrays wanted, their values)), and its progress."""
                    start, stop, lacking = todo[i]
                    needed, ticked = list(loaded.failed), [0.0]

                    def tick(count: int, share: float = 1.0 / len(needed)) -> None:
                        ticked[0] += count * share
                        progress.advance(task, count * share)

                    arrays = {}
                    for view in needed:
                        wanted = {name: spec for name, spec in stored.items() if layout.unit_of(name) in lacking and layout.view_of(name) == view}
                        shared = buffers if writing else None
                        arrays[view] = (
                            wanted,
                            view_data(backbone, loaded, view, wanted, stop - start, settings, batch_size, torch_device, tick, shared=shared, streams=streams),
                        )
                    return arrays, ticked

                runs = stack.enter_context(Ahead(len(todo), take, forward, depth=ahead, ready=lambda i: i in decodes and decodes[i].done()))
                for index, (start, stop, _) in enumerate(todo):
                    loaded, (arrays, ticked) = runs.get(index)
                    n, needed = stop - start, list(loaded.failed)
                    if existed:  # its files were checked unchanged when the run began: still the same bytes?
                        sources.check_decoded(path, writer.group, start, [r.path for r in refs[start:stop]], loaded.files.sha256)
                    out: dict[str, tuple[dict[str, np.ndarray], np.ndarray]] = {}
                    any_ok = np.zeros(n, dtype=bool)
                    for view in needed:
                        wanted, data = arrays[view]
                        ok = ~loaded.failed[view]
                        good = finite_images(data, wanted, grids[view][0][start:stop], grids[view][1][start:stop], ok, checkpoint.arch.prefix)
                        for i in np.flatnonzero(ok & ~good):
                            error = ProbeError(
                                refs[start + i].path,
                                f"gives non-finite values in the {view} view",
                                "check the checkpoint's weights and --dtype (float16 overflows past 65504), or record it as failed with --on-error skip",
                            )
                            if on_error == "fail":
                                raise error
                            loaded.errors.append(error.line())
                            for values in data.values():
                                values[i] = np.nan
                        for unit in {layout.unit_of(name) for name in wanted}:  # each part of the view: its own arrays and flags
                            out[unit] = ({name: values for name, values in data.items() if layout.unit_of(name) == unit}, ~good)
                        any_ok |= good
                    if buffers is not None:  # the run's pixels are read: their buffers serve a later run
                        buffers.give_back(loaded.shared)
                    # runs of other chunks are written at once (their arrays and flags share no chunk);
                    # two runs of one chunk never are
                    home = start // writer.chunk
                    while writes and (len(writes) >= savers or writes[-1][0] == home):
                        _written(writes.popleft()[1], path)
                    if writing:  # the arrays cross as shared memory (writer.shared_views), the process writes them
                        sent = shared_views(out)
                        writes.append((home, saver.submit(write_in_process, str(path), start, sent, loaded.original, loaded.files)))
                        writes[-1][1].add_done_callback(lambda _, sent=sent: buffers.give_back(shared_tensors(sent)))
                    else:
                        writes.append((home, saver.submit(writer.write_views, start, out, loaded.original, loaded.files)))
                    report.written += int(any_ok.sum())
                    report.skipped += loaded.errors
                    progress.advance(task, n - ticked[0])
                while writes:
                    _written(writes.popleft()[1], path)
        except BaseException:
            # a run that made the store and then failed before finishing any image leaves nothing
            # behind, so the corrected command starts clean (an unsharded run only: a shard's store
            # may already be another shard's)
            if not existed and shard_range == (0, 1) and not any(writer.done(v).any() for v in units):
                shutil.rmtree(path, ignore_errors=True)
                lock_file(path).unlink(missing_ok=True)  # the store's lock goes with it (docs/guarantees.md, "Leftovers")
            raise
        if unrecorded:  # images finished by an extraction before sha256 were recorded as files were decoded
            sources.record_digests(path, image_dir, unrecorded)
        fresh = todo or shard_range != (0, 1)  # another shard's workers may be writing theirs
        finished = np.logical_and.reduce([writer.done(v) if fresh else flags[v] for v in units])
        failed = np.asarray(writer.group["failed"][:], dtype=bool) if "failed" in writer.group else np.zeros_like(finished)
        report.done, report.failed = int((finished & ~failed).sum()), int((finished & failed).sum())
        report.seconds["images"] = time.perf_counter() - started - report.seconds["setup"]
        return report
