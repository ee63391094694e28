"""A large array every block of a run needs (k-NN's train bank), shipped to each worker once as
a file it maps, not inside every block's task (``infra/runner.py``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import worker_name


@dataclass(frozen=True)
class Shared:
    """A large array every block needs (k-NN's train bank), shipped to each worker once: a
    ``.npy`` file that a worker (a local process, or a dask worker that mounts the store) maps on
    first use and checks by its sha256; a block then carries only this small handle."""

    path: str
    sha256: str

    def __post_init__(self) -> None:
        from .runner import for_workers

        object.__setattr__(self, "path", for_workers(self.path))  # a dask worker's directory is not this process's

    def value(self) -> np.ndarray:
        if self.sha256 not in _shared:
            from .errors import IntegrityError

            try:
                with open(self.path, "rb") as handle:
                    digest = hashlib.file_digest(handle, "sha256").hexdigest()
            except OSError as error:
                raise IntegrityError(worker_name(), f"cannot read {self.path} ({type(error).__name__})",
                                     "mount the store at the same path on every worker (or run without --dask-address)") from None
            if digest != self.sha256:
                raise IntegrityError(worker_name(), f"reads another file at {self.path} than the client wrote", "rerun the command (another run wrote there)")
            _forget_gone()  # a long-lived dask worker lets the files of finished runs go
            _shared[self.sha256] = np.load(self.path, mmap_mode="r")
            _paths[self.sha256] = self.path
        return _shared[self.sha256]


_shared: dict[str, np.ndarray] = {}  # per process: sha256 → the mapped array (the current run's)
_paths: dict[str, str] = {}  # sha256 → its file: a run's arrays (k-NN's bank; Hummingbird's bank and labels) stay while their files do


def _forget_gone() -> None:
    """Drop the arrays whose files are gone (their run ended), keep the others: two handles of one
    run used in turn (a bank and its labels) must not evict each other and be hashed again every block."""
    for digest in [d for d, path in _paths.items() if not os.path.exists(path)]:
        _shared.pop(digest, None)
        _paths.pop(digest, None)


# a shell that outlives this process by at most half a second: it removes the files once this
# process is no longer its parent (a SIGKILL runs no ``finally``); $0 is this process's pid
JANITOR = 'while read -r _ _ _ p _ < /proc/$$/stat && [ "$p" = "$0" ]; do sleep 0.5; done; rm -f -- "$@"'


def janitor(paths: list[Path]) -> subprocess.Popen | None:
    """Start the process that removes ``paths`` should this one be killed (None where there is
    no ``/proc`` or no ``sh``: the next run sweeps them, ``litter.sweep``). In a session of its
    own, so a Ctrl-C to the terminal's group leaves it to do its one job."""
    if not Path("/proc/self/stat").is_file() or shutil.which("sh") is None:
        return None
    return subprocess.Popen(["sh", "-c", JANITOR, str(os.getpid()), *map(str, paths)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


@contextmanager
def shared(array: np.ndarray, folder: str | Path, name: str) -> Iterator[Shared]:
    """``array`` as a ``Shared`` file ``folder/.NAME.tmp-PID``, removed when the run ends however
    it ends: by the run itself, or after a SIGKILL by its ``janitor`` within a second (else, where
    no janitor runs, swept as litter by the next run that saves a result there)."""
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{name}.tmp-{os.getpid()}"
    cleaner = janitor([path])
    try:
        with open(path, "wb") as handle:
            np.save(handle, np.ascontiguousarray(array))
        with open(path, "rb") as handle:
            handle_ = Shared(str(path), hashlib.file_digest(handle, "sha256").hexdigest())
        _shared[handle_.sha256] = np.asarray(array)  # this process already holds it
        _paths[handle_.sha256] = str(path)
        yield handle_
    finally:
        path.unlink(missing_ok=True)
        _forget_gone()
        if cleaner is not None:
            cleaner.kill()
            cleaner.wait()
