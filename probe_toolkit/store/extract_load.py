"""Decoding and cutting images beside the forward pass (``probe extract``, ``probe decode-stream``):
each file decoded alone on a thread or process of its own, its views cut, a run's images stacked
in image order; an image that cannot be read or cut is recorded as failed, never dropped silently.

Beside a GPU the images are decoded in processes (``host_pool``): decoding threads hold
Python's lock for part of every image (PIL's file handling, numpy's lookups, the stacking), so
fifteen of them decoded only about four times what one does, and the loop that launches the
network's kernels waited on the same lock. A process decodes by the same code, so the pixels
are the same bits whichever pool decodes them.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..infra.errors import ProbeError
from . import images
from .extract_plan import OnError, Settings, at_least, own_grid, skippable

if TYPE_CHECKING:
    from .writer import SharedBuffers


@dataclass
class FileFacts:
    """Each file of a run as decoded (``images.load_photo``): the sha256 of its bytes and its
    (size, mtime ns), zeros where it could not be read; ``store.writer`` records them."""

    sha256: np.ndarray  # (n, 32) uint8
    stat: np.ndarray  # (n, 2) int64


@dataclass
class Loaded:
    """One run's decoded images: the fixed views stacked, each own-size view's tensors one by one."""

    fixed: dict[str, tuple[list[int], torch.Tensor | None]]
    own: dict[str, list[tuple[int, torch.Tensor]]]  # own-size view -> (image, pixels)
    original: np.ndarray  # (n, 2) height, width; 0 where the file could not be read
    files: FileFacts  # what the files decoded were
    failed: dict[str, np.ndarray]  # per view: images that cannot have it
    errors: list[str]
    shared: list = field(default_factory=list)  # shared-memory tensors the pixels were decoded into, to give back after the forward pass


@dataclass
class _Picture:
    """One file decoded and cut: its size, its fixed views, its own-size views, or why not."""

    size: tuple[int, int] = (0, 0)  # height, width
    sha256: bytes = b""  # of the bytes decoded
    stat: tuple[int, int] = (0, 0)  # the file's size and mtime (ns) as it was opened
    fixed: dict[str, torch.Tensor] = field(default_factory=dict)
    own: dict[str, torch.Tensor] = field(default_factory=dict)  # own-size view -> pixels
    error: ProbeError | None = None  # the file cannot be read: no view
    own_error: dict[str, ProbeError] = field(default_factory=dict)  # own-size views it has not (too small, or changed)


def _picture(ref: images.ImageRef, expected: dict[str, tuple[int, int]], *, fixed: list[str], resample: str, patch: int) -> _Picture:
    """Decode and cut one image (runs on a decoding thread: PIL and numpy release the GIL);
    ``expected``: its grid in each own-size view asked for, as the store was created with."""
    try:
        photo = images.load_photo(ref.path)
    except ProbeError as error:
        return _Picture(error=error)
    picture = photo.image
    out = _Picture(size=(picture.height, picture.width), sha256=photo.sha256, stat=photo.stat)
    for v in fixed:
        out.fixed[v] = images.fixed_pixels(picture, v, resample, ref.id, patch)
    for view, grid in expected.items():
        try:
            if own_grid(ref, picture.width, picture.height, patch, view) != grid:
                raise ProbeError(
                    ref.path, f"is now {picture.width}x{picture.height} px, not the size the store was created with", "restore the file, or extract into a new --store"
                )
            out.own[view] = images.native(picture, patch, view)
        except ProbeError as error:
            out.own_error[view] = error
    return out


def _picture_sent(ref: images.ImageRef, expected: dict[str, tuple[int, int]], **how) -> _Picture:
    """``_picture`` in a decoding process: pixels as numpy arrays, which cross the pipe by value
    (a torch tensor would cross as a shared-memory file handle, one per image)."""
    out = _picture(ref, expected, **how)
    out.fixed = {v: t.numpy() for v, t in out.fixed.items()}
    out.own = {v: t.numpy() for v, t in out.own.items()}
    return out


def _picture_into(ref: images.ImageRef, expected: dict[str, tuple[int, int]], slot: int, *, into: dict[str, torch.Tensor], **how) -> _Picture:
    """``_picture`` in a decoding process, its fixed views written into row ``slot`` of the run's
    shared-memory tensors ``into`` (nothing of them crosses the pipe, and the run needs no
    stacking); its own-size views as numpy arrays."""
    out = _picture(ref, expected, **how)
    for view, pixels in out.fixed.items():
        row = into[view][slot]
        if pixels.shape != row.shape or pixels.dtype != row.dtype:  # a copy_ would cast or broadcast without a word
            raise AssertionError(f"{ref.path}: {view} pixels are {tuple(pixels.shape)} {pixels.dtype}, the run's are {tuple(row.shape)} {row.dtype}")
        row.copy_(pixels)
    out.fixed = dict.fromkeys(out.fixed)
    out.own = {v: t.numpy() for v, t in out.own.items()}
    return out


@functools.cache
def _fixed_layout(view: str, resample: str, patch: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of one image's pixels in a fixed view: every image's are the same (a run
    stacks them), so a blank picture's tell."""
    from PIL import Image

    pixels = images.fixed_pixels(Image.new("RGB", (64, 48)), view, resample, "layout", patch)
    return tuple(pixels.shape), pixels.dtype


def _as_tensor(pixels) -> torch.Tensor:
    return pixels if isinstance(pixels, torch.Tensor) else torch.from_numpy(pixels)


def _decoder_start(command: int) -> None:
    """A decoding or writing process's start: one torch thread; Ctrl-C left to the command (which
    then stops handing out work and waits for the tasks under way, so a write is never cut, and
    no worker prints a traceback of its own); and an exit as soon as its forkserver (its
    parent, which itself ends with the command) is gone, or at once when the command already
    is (``infra.lifeline``: no process of a run outlives it)."""
    import signal

    from ..infra.lifeline import STATUS, follow_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.kill(command, 0)
    except ProcessLookupError:
        os._exit(STATUS)
    follow_parent(os.getppid())
    torch.set_num_threads(1)


SHM = "/dev/shm"  # where torch's shared tensors live (shm_open)


def shared_memory_room(needed: int, folder: str = SHM) -> bool:
    """Whether ``needed`` bytes of shared memory fit in half of what ``folder`` has free. A tensor
    there is only backed when it is first written: one that does not fit would end its process
    with a bus error, not an error to tell, so a run that would not fit decodes and writes on
    threads instead (the same store; containers often give /dev/shm 64 MB)."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return needed <= stats.f_bavail * stats.f_frsize // 2


def pixel_bytes(views: list[str], settings: Settings, patch: int) -> int:
    """Bytes of one image's decoded fixed views (``_fixed_layout``)."""
    total = 0
    for view in views:
        if view not in images.OWN_SIZE:
            shape, dtype = _fixed_layout(view, settings.resample, patch)
            total += int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    return total


def decoder_processes(device: str) -> bool:
    """Decode and write in processes (``host_pool``) where the forward pass runs on a GPU."""
    return (device in ("auto", "cuda") or str(device).startswith("cuda:")) and torch.cuda.is_available()


@contextmanager
def host_pool(workers: int, processes: bool, name: str = "probe-decode") -> Iterator[Executor]:
    """Where images are decoded (or runs written): ``workers`` threads, or (``processes``)
    ``workers`` processes forked from a forkserver that has imported the decoding and writing
    modules and the command's main module once (a fork then starts in milliseconds, without CUDA
    or the command's threads, and does not import the main module again)."""
    if not processes:
        with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
            yield pool
        return
    context = multiprocessing.get_context("forkserver")
    # the lifeline first: the forkserver ends with the command even while it imports the rest
    context.set_forkserver_preload(["probe_toolkit.infra.forkserver_lifeline", "__main__", __name__, f"{__package__}.writer"])
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_decoder_start, initargs=(os.getpid(),)) as pool:
        yield pool


def decoder_threads(asked: int | None, device: str) -> int:
    """Threads (beside a GPU: processes, ``host_pool``) that decode and cut images beside the
    forward pass (``--decoders``).

    By default the cores the forward pass leaves free: all but torch's threads on the CPU (one
    when torch takes every core, as it does by default), all but one beside a GPU, where a
    single thread (decoding and cutting about 60 images/s at 224 + 480 px, writing about 250 at
    224 px: ``benchmarks/extract.py --decoding``) would starve the network; at most 16. As
    many runs, up to ``SAVERS``, are written at once. More of them never change a value: each
    image is decoded alone, each run assembled in image order and written to its own chunks.
    """
    at_least("--decoders", asked, 1, "4")
    if asked:
        return int(asked)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    gpu = device in ("auto", "cuda") and torch.cuda.is_available()
    return max(1, min(16, cores - (1 if gpu else torch.get_num_threads())))


def load_run(
    refs: list[images.ImageRef],
    views: list[str],
    settings: Settings,
    patch: int,
    grid: dict[str, tuple[np.ndarray, np.ndarray]] | None,
    on_error: OnError,
    pool: Executor | None = None,
    shared: SharedBuffers | None = None,
) -> Loaded:
    """Decode and cut the views of one run (on ``pool``'s threads or processes when given, else
    here), in image order; failed images are recorded, not silently dropped, and the first one
    (in image order) fails the run when ``on_error`` is fail. ``grid``: each own-size view's
    (rows, cols) of these images. ``shared`` (with a process pool): the fixed views are decoded
    into shared-memory tensors taken from it (``Loaded.shared``, to give back after the forward pass)."""
    fixed_views = [v for v in views if v not in images.OWN_SIZE]
    own_views = [v for v in views if v in images.OWN_SIZE]
    fixed: dict[str, list[torch.Tensor]] = {v: [] for v in fixed_views}
    where: dict[str, list[int]] = {v: [] for v in fixed}
    own: dict[str, list[tuple[int, torch.Tensor]]] = {v: [] for v in own_views}
    original = np.zeros((len(refs), 2), dtype=np.int32)
    files = FileFacts(np.zeros((len(refs), 32), dtype=np.uint8), np.zeros((len(refs), 2), dtype=np.int64))
    failed = {v: np.zeros(len(refs), dtype=bool) for v in views}
    errors: list[str] = []

    def fail(i: int, error: ProbeError, which: list[str]) -> None:
        if on_error == "fail":
            raise skippable(error)
        for v in which:
            failed[v][i] = True
        errors.append(error.line())

    expected = [{v: (int(grid[v][0][i]), int(grid[v][1][i])) for v in own_views} for i in range(len(refs))]
    how = {"fixed": fixed_views, "resample": settings.resample, "patch": patch}
    into: dict[str, torch.Tensor] = {}
    if isinstance(pool, ProcessPoolExecutor):  # a few images per message: one each costs more than it saves
        chunks = max(1, len(refs) // (4 * pool._max_workers))
        if shared is not None and refs:
            into = {v: shared.take((len(refs), *shape), dtype) for v in fixed_views for shape, dtype in [_fixed_layout(v, settings.resample, patch)]}
            pictures = pool.map(functools.partial(_picture_into, into=into, **how), refs, expected, range(len(refs)), chunksize=chunks)
        else:
            pictures = pool.map(functools.partial(_picture_sent, **how), refs, expected, chunksize=chunks)
    else:
        decode = functools.partial(_picture, **how)
        pictures = pool.map(decode, refs, expected) if pool is not None else map(decode, refs, expected)
    for i, picture in enumerate(pictures):
        if picture.error is not None:
            fail(i, picture.error, views)
            continue
        original[i] = picture.size
        files.sha256[i] = np.frombuffer(picture.sha256, dtype=np.uint8)
        files.stat[i] = picture.stat
        for v in fixed:
            if v not in into:
                fixed[v].append(_as_tensor(picture.fixed[v]))
            where[v].append(i)
        for view in own_views:
            if view in picture.own_error:
                fail(i, picture.own_error[view], [view])
            else:
                own[view].append((i, _as_tensor(picture.own[view])))
    stacked = {v: (where[v], images.stack(t) if t else None) for v, t in fixed.items()}
    for v, whole in into.items():  # every image there: the tensor as it is; else the decoded rows
        stacked[v] = (where[v], whole if len(where[v]) == len(refs) else whole[where[v]] if where[v] else None)
    return Loaded(stacked, own, original, files, failed, errors, list(into.values()))
