"""The forward pass on a CPU's cores as streams: each core runs its share of a batch's images on
one thread, rather than every operation being split over all the cores.

torch splits each operation of a pass over its threads, which meet after every operation
(hundreds a pass); a core lent for a moment to the threads that decode and write beside the
forward pass holds its partners waiting at each meeting, spinning. Streams meet once a batch,
and each runs the pass on its own copy of the network (the weights shared, not copied), since
the hooks a pass registers (``Backbone.capture``) must see that stream's images only. A stored
value does not depend on which images share its batch nor on how many threads computed it, so
the store holds the same bytes either way (tests hold it).

Each stream is a thread of its own that takes its shares in the order they are given, so two
callers may run passes at once (``store.ahead``: the next run's pass given while this run's
last share still computes): a stream that finishes its share early goes on to its share of the
next batch rather than waiting for its partner, and no copy of the network serves two passes at
once.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


def cpu_streams(device: torch.device) -> int:
    """How many streams a pass on ``device`` runs: torch's threads on the CPU (the user's
    ``torch.set_num_threads`` then sets the cores taken), one on any other device."""
    return torch.get_num_threads() if device.type == "cpu" else 1


def replica(model: nn.Module) -> nn.Module:
    """Another copy of ``model``'s modules over the very same parameter and buffer tensors."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=shared)


class Streams:
    """``count`` single-threaded streams over ``model`` (``run``); a context manager whose exit
    ends its threads. Made on the thread that later calls ``run`` (the pass's own)."""

    def __init__(self, model: nn.Module, count: int) -> None:
        self.models = [model] + [replica(model) for _ in range(count - 1)]
        # a copy for each thread that runs a single image itself, made from one no pass ever runs
        # on (a copy of a network in the middle of a pass would keep that pass's hooks)
        self._callers, self._pristine = threading.local(), replica(model) if count > 1 else None
        # one thread a stream, each with its own copy of the network: its shares in the order given
        self.pools = [ThreadPoolExecutor(1, thread_name_prefix=f"probe-stream-{i}") for i in range(count)] if count > 1 else []
        if not self.pools:  # one stream: the pass on the caller's thread, with torch's threads
            return
        threads = torch.get_num_threads()
        # torch keeps one thread count per OS thread, and a new thread takes the last one set
        # anywhere: each stream sets its own to 1 (all of them, before any goes on), then this
        # thread puts the process's back as it was
        ready = threading.Barrier(count)
        for future in [pool.submit(_one_thread, ready) for pool in self.pools]:
            future.result()
        torch.set_num_threads(threads)

    @property
    def parallel(self) -> bool:
        """Whether passes run on streams of their own (the CPU's), so two callers may give them work at once."""
        return bool(self.pools)

    def run(self, batch: torch.Tensor, work: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``work(model, images)`` on contiguous shares of ``batch``, one per stream (fewer for a
        smaller batch), joined in image order; a single image (or one stream) on this thread,
        with torch's threads, on a copy of the network of this thread's own."""
        if not self.pools:
            return work(self.models[0], batch)
        if batch.shape[0] == 1:
            if not hasattr(self._callers, "model"):
                self._callers.model = replica(self._pristine)
            return work(self._callers.model, batch)
        shares = torch.arange(batch.shape[0]).tensor_split(min(len(self.models), batch.shape[0]))
        pending = [pool.submit(work, model, batch[rows[0] : rows[-1] + 1]) for pool, model, rows in zip(self.pools, self.models, shares)]
        parts = [future.result() for future in pending]
        return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc) -> None:
        for pool in self.pools:
            pool.shutdown(wait=True)


def _one_thread(ready: threading.Barrier) -> None:
    torch.set_num_threads(1)
    torch.get_num_threads()  # torch's first look on this thread fixes its count (at the 1 just set)
    ready.wait()
