"""Keep a long run's memory flat, and let a forward pass reuse its blocks (glibc's ``mallopt``).

glibc raises its mmap threshold after the first large block is freed (up to 32 MiB); from then
on, blocks of a chunk's size come from the heap and stay resident after they are freed, so a
long run's resident memory grows with every image. Pinning the threshold at glibc's own
starting value, 128 KiB, stops the drift (measured: docs/history.md). Elsewhere than glibc this does nothing.

A forward pass is the opposite case: every batch allocates the same few dozen activations, each
above that threshold, so under the pin each one is a fresh mapping whose pages the kernel faults
in and zeroes, batch after batch (a large share of the forward's CPU time). ``reusing_blocks`` keeps freed blocks in the heap while
extraction runs, so from the second batch on the same pages serve again (no faults), and the
pin (or glibc's steady state) is restored when it ends. Resident memory is then the heap's
high-water mark, reached within a few chunks and flat after.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameter numbers
THRESHOLD = 128 * 1024
MMAP_MAX = 65536  # glibc's default count of mapped blocks
CEILING = 32 * 1024 * 1024  # where glibc's own rule stops raising the threshold (64-bit)
NO_TRIM = 2**31 - 1  # (bytes) freed memory at the top of the heap is kept


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018  (glibc's, not every libc has them)
    except (OSError, AttributeError):
        return None
    return libc


def _mallopt(param: int, value: int) -> bool:
    libc = _libc()
    return bool(libc is not None and libc.mallopt(param, value))


@lru_cache(maxsize=1)
def keep_memory_flat() -> bool:
    """Fix glibc's mmap threshold once per process; True when it took effect."""
    return _mallopt(M_MMAP_THRESHOLD, THRESHOLD)


@contextmanager
def reusing_blocks() -> Iterator[bool]:
    """Inside: large blocks come from the heap and stay there when freed (no mapping, no trim).

    On exit the process's policy is set back: the 128 KiB pin when ``keep_memory_flat`` had
    taken effect (the command line), else the values glibc's own rule settles at (threshold at
    its 32 MiB ceiling, trim at twice that), and freed heap memory is handed back.
    """
    applied = _mallopt(M_MMAP_MAX, 0)
    if applied:
        _mallopt(M_TRIM_THRESHOLD, NO_TRIM)
    try:
        yield applied
    finally:
        if applied:
            threshold = THRESHOLD if keep_memory_flat.cache_info().currsize and keep_memory_flat() else CEILING
            _mallopt(M_MMAP_THRESHOLD, threshold)
            _mallopt(M_TRIM_THRESHOLD, 2 * threshold)
            _mallopt(M_MMAP_MAX, MMAP_MAX)
            _libc().malloc_trim(0)
