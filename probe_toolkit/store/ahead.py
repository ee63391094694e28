"""Extraction's runs, each one's forward pass started before the run before it is collected.

On the CPU the pass runs as streams (``store.streams``) that share out a batch's images and meet
once the batch is done: the stream that finishes first waits for its partner, which the threads
decoding and writing beside the pass slow at random (``benchmarks/extract.py`` measures what
that cost). Given the next run's pass before this run's last share is done, each stream goes on
to its share of it instead. The runs are still collected, checked and
written one at a time in order; a run whose decoding failed raises when the loop reaches it,
after the runs before it are written, as it did when each run was decoded and passed in turn.
A run is passed ahead only once it is decoded: waiting for its pixels would keep the run before
it, already computed, from being written (a killed run would lose it).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Taken = TypeVar("Taken")
Passed = TypeVar("Passed")
_HELD = object()  # a run not begun because a run before it failed (begun when reached)


class Ahead(Generic[Taken, Passed]):
    """Runs ``0 .. count - 1``: ``take(i)`` (a run's decoded pixels, waited for) and ``forward(i,
    taken)`` (its pass), each started up to ``depth`` runs before ``get`` collects it, once
    ``ready(i)`` says its pixels are there (0: both when collected, on the caller's thread). A
    context manager whose exit waits for the passes started."""

    def __init__(
        self, count: int, take: Callable[[int], Taken], forward: Callable[[int, Taken], Passed], depth: int, ready: Callable[[int], bool] = lambda i: True
    ) -> None:
        self.count, self.take, self.forward, self.depth, self.ready = count, take, forward, depth, ready
        self.pool = ThreadPoolExecutor(depth + 1, thread_name_prefix="probe-forward") if depth else None
        self._started: dict[int, tuple[Taken | None, Future | BaseException | object | None]] = {}
        self._next = 0  # the first run not started

    def get(self, i: int) -> tuple[Taken, Passed]:
        """Run ``i``'s (taken, passed); the runs after it up to ``i + depth`` started first where ready."""
        if self._started.get(i, (None, None))[1] is _HELD:  # a caller went on past a failed run: begin again here
            self._next = i
        while self._next <= min(i + self.depth, self.count - 1) and (self._next <= i or self.ready(self._next)):
            self._start(self._next)
        taken, started = self._started.pop(i)
        if isinstance(started, BaseException):
            raise started
        if started is None:
            return taken, self.forward(i, taken)
        return taken, started.result()

    def _start(self, j: int) -> None:
        self._next = j + 1
        if any(isinstance(s, BaseException) for _, s in self._started.values()):
            self._started[j] = (None, _HELD)  # extraction stops at the failed run; nothing decoded in vain
            return
        try:
            taken = self.take(j)
        except BaseException as error:  # raised when the loop reaches run j
            self._started[j] = (None, error)
            return
        self._started[j] = (taken, self.pool.submit(self.forward, j, taken) if self.pool is not None else None)

    def __enter__(self) -> Ahead[Taken, Passed]:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
