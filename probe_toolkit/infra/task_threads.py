"""The thread counts a task computes under, whatever the process loaded before it.

A matmul or an eigensolver with a long inner dimension is split between threads and rounds
otherwise, so every task runs under the same counts in the command's process as on a worker.
threadpoolctl sets the libraries already loaded; a BLAS a task loads itself (scipy's, imported
where a decoder solves) reads ``OPENBLAS_NUM_THREADS`` when it loads, so that is set for the
task too, and such a library is given the process's count back after it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LOAD_TIME_COUNT = "OPENBLAS_NUM_THREADS"  # what an OpenBLAS (numpy's, scipy's) reads when it loads


@contextmanager
def task_threads(threads: int = 1) -> Iterator[None]:
    """Every task computes under ``threads`` BLAS / OpenMP threads and as many torch threads, in
    this process as on a worker, so its arithmetic is the same at any worker count. Restored after:
    torch's count is read before the OpenMP limit (inside it torch reports the limit, and
    "restoring" that left MKL on one thread for what ran later, e.g. a linear probe)."""
    from threadpoolctl import ThreadpoolController, threadpool_limits

    torch = sys.modules.get("torch")  # not imported here: a task that needs it brought it
    before = torch.get_num_threads() if torch is not None else None
    loaded = ThreadpoolController()
    known = {lib.filepath for lib in loaded.lib_controllers}
    outside = max((lib.num_threads for lib in loaded.lib_controllers if lib.internal_api == "openblas"), default=None)
    setting = os.environ.get(LOAD_TIME_COUNT)
    os.environ[LOAD_TIME_COUNT] = str(threads)
    try:
        with threadpool_limits(limits=threads):
            if torch is None:
                yield
                return
            torch.set_num_threads(threads)
            try:
                yield
            finally:
                torch.set_num_threads(before)
    finally:
        if setting is None:
            del os.environ[LOAD_TIME_COUNT]
        else:
            os.environ[LOAD_TIME_COUNT] = setting
        if outside is not None:  # a BLAS the task loaded: the count this process's others have
            for lib in ThreadpoolController().lib_controllers:
                if lib.filepath not in known and lib.internal_api == "openblas":
                    lib.set_num_threads(outside)
