"""The forward pass on a CPU's cores as streams: each core runs its share of a batch's images on
one thread, rather than every operation being split over all the cores.

torch splits each operation of a pass over its threads, which meet after every operation
(hundreds a pass); a core lent for a moment to the threads that decode and write beside the
forward pass holds its partners waiting at each meeting, spinning. Streams meet once a batch,
and each runs the pass on its own copy of the network (the weights shared, not copied), since
the hooks a pass registers (``Backbone.capture``) must see that stream's images only. A stored
value does not depend on which images share its batch nor on how many threads computed it, so
the store holds the same bytes either way (tests hold it).
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
        self.pool = ThreadPoolExecutor(count, thread_name_prefix="probe-stream") if count > 1 else None
        if self.pool is None:  # one stream: the pass on this thread, with torch's threads
            return
        threads = torch.get_num_threads()
        # torch keeps one thread count per OS thread, and a new thread takes the last one set
        # anywhere: each stream sets its own to 1 (all of them, before any goes on), then this
        # thread puts the process's back as it was
        ready = threading.Barrier(count)
        for future in [self.pool.submit(_one_thread, ready) for _ in range(count)]:
            future.result()
        torch.set_num_threads(threads)

    def run(self, batch: torch.Tensor, work: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``work(model, images)`` on contiguous shares of ``batch``, one per stream (fewer for a
        smaller batch; a single image on this thread, with torch's threads), joined in image order."""
        shares = [rows for rows in torch.arange(batch.shape[0]).tensor_split(len(self.models)) if len(rows)]
        if len(shares) == 1 or self.pool is None:
            return work(self.models[0], batch)
        pending = [self.pool.submit(work, model, batch[rows[0] : rows[-1] + 1]) for model, rows in zip(self.models, shares)]
        parts = [future.result() for future in pending]
        return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _one_thread(ready: threading.Barrier) -> None:
    torch.set_num_threads(1)
    torch.get_num_threads()  # torch's first look on this thread fixes its count (at the 1 just set)
    ready.wait()
