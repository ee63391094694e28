"""A large array every block of a run needs (k-NN's train bank, Hummingbird's memory), shipped to
each worker once as a file, not inside every block's task (``infra/runner.py``); written and read
in blocks of rows (``shared_blocks``, ``Shared.rows``), so neither side need hold it whole."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import worker_name


@dataclass(frozen=True)
class Shared:
    """A large array every block needs (k-NN's train bank), shipped to each worker once: a
    ``.npy`` file that a worker (a local process, or a dask worker that mounts the store) maps on
    first use and checks by its sha256; a block then carries only this small handle."""

    path: str
    sha256: str
    shape: tuple[int, ...] = ()
    dtype: str = "<f4"
    offset: int = 0  # bytes of the .npy header: where row 0 begins

    def _verified(self) -> None:
        """The file is the one the client wrote (sha256), checked once per process."""
        if self.sha256 in _verified:
            return
        from .errors import IntegrityError

        try:
            with open(self.path, "rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
        except OSError as error:
            raise IntegrityError(
                worker_name(), f"cannot read {self.path} ({type(error).__name__})", "mount the store at the same path on every worker (or run without --dask-address)"
            ) from None
        if digest != self.sha256:
            raise IntegrityError(worker_name(), f"reads another file at {self.path} than the client wrote", "rerun the command (another run wrote there)")
        _forget_gone()  # a long-lived dask worker lets the files of finished runs go
        _verified.add(self.sha256)
        _paths[self.sha256] = self.path

    def __post_init__(self) -> None:
        from .runner import for_workers

        object.__setattr__(self, "path", for_workers(self.path))  # a dask worker's directory is not this process's

    def value(self) -> np.ndarray:
        """The whole array, mapped (for small arrays: label distributions, a photo table)."""
        if self.sha256 not in _shared:
            self._verified()
            _shared[self.sha256] = np.load(self.path, mmap_mode="r")
        return _shared[self.sha256]

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows a..b, read from the file into a fresh array (no mapping: a worker's memory holds
        the rows it asked for, not the pages of every block it read before)."""
        self._verified()
        width = int(np.prod(self.shape[1:], dtype=np.int64))
        dtype = np.dtype(self.dtype)
        out = np.empty((b - a) * width, dtype)
        view = memoryview(out).cast("B")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            done, start = 0, self.offset + a * width * dtype.itemsize
            while done < view.nbytes:
                got = os.preadv(fd, [view[done:]], start + done)
                if got <= 0:
                    raise EOFError(f"{self.path} ends before row {b}")
                done += got
        finally:
            os.close(fd)
        return out.reshape((b - a, *self.shape[1:]))


_shared: dict[str, np.ndarray] = {}  # per process: sha256 → the mapped array (the current run's)
_verified: set[str] = set()  # per process: the files checked against their sha256
_paths: dict[str, str] = {}  # sha256 → its file: a run's arrays (k-NN's bank; Hummingbird's bank and labels) stay while their files do


def _forget_gone() -> None:
    """Drop the arrays whose files are gone (their run ended), keep the others: two handles of one
    run used in turn (a bank and its labels) must not evict each other and be hashed again every block."""
    for digest in [d for d, path in _paths.items() if not os.path.exists(path)]:
        _shared.pop(digest, None)
        _verified.discard(digest)
        _paths.pop(digest, None)


class Spool:
    """An array of known shape written block by block, in row order, to ``folder/.NAME.tmp-PID``
    and hashed as it is written (``spooled``); ``shared()`` is its ``Shared`` handle once every
    row is in. Memory: the block being written."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype) -> None:
        self.path, self.shape, self.dtype = path, tuple(int(n) for n in shape), np.dtype(dtype)
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape})
        self.offset, self.rows = len(header.getvalue()), 0
        self._digest = hashlib.sha256(header.getvalue())
        self._handle = open(path, "wb")
        self._handle.write(header.getvalue())

    def append(self, block: np.ndarray) -> None:
        data = np.ascontiguousarray(block, self.dtype)
        if data.shape[1:] != self.shape[1:] or self.rows + data.shape[0] > self.shape[0]:
            raise ValueError(f"a block of {data.shape} does not continue an array of {self.shape} at row {self.rows}")
        self._digest.update(memoryview(data).cast("B"))
        self._handle.write(memoryview(data).cast("B"))
        self.rows += data.shape[0]

    def shared(self) -> Shared:
        """The finished file as a ``Shared`` handle (every row written)."""
        if self.rows != self.shape[0]:
            raise ValueError(f"{self.rows} rows written for an array of {self.shape[0]}")
        self._handle.close()
        handle = Shared(str(self.path), self._digest.hexdigest(), self.shape, self.dtype.str, self.offset)
        _verified.add(handle.sha256)  # this process wrote it
        _paths[handle.sha256] = str(self.path)
        return handle


# a shell that outlives this process by at most half a second: it removes the files once this
# process is no longer its parent (a SIGKILL runs no ``finally``); $0 is this process's pid
JANITOR = 'while read -r _ _ _ p _ < /proc/$$/stat && [ "$p" = "$0" ]; do sleep 0.5; done; rm -f -- "$@"'


def janitor(paths: list[Path]) -> subprocess.Popen | None:
    """Start the process that removes ``paths`` should this one be killed (None where there is
    no ``/proc`` or no ``sh``: the next run sweeps them, ``litter.sweep``). In a session of its
    own, so a Ctrl-C to the terminal's group leaves it to do its one job."""
    if not Path("/proc/self/stat").is_file() or shutil.which("sh") is None:
        return None
    return subprocess.Popen(
        ["sh", "-c", JANITOR, str(os.getpid()), *map(str, paths)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


@contextmanager
def spooled(shape: tuple[int, ...], dtype, folder: str | Path, name: str) -> Iterator[Spool]:
    """A ``Spool`` at ``folder/.NAME.tmp-PID`` (absolute: workers are handed its path), removed
    when the run ends however it ends: by the run itself, or after a SIGKILL by its ``janitor``
    within a second (where no janitor runs, swept as litter by the next run that saves there)."""
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{name}.tmp-{os.getpid()}"
    spool, cleaner = None, janitor([path])
    try:
        spool = Spool(path, shape, dtype)
        yield spool
    finally:
        if spool is not None:
            spool._handle.close()
        path.unlink(missing_ok=True)
        _forget_gone()
        if cleaner is not None:
            cleaner.kill()
            cleaner.wait()


@contextmanager
def shared_blocks(blocks: Iterable[np.ndarray], shape: tuple[int, ...], dtype, folder: str | Path, name: str) -> Iterator[Shared]:
    """The array of ``shape`` whose rows ``blocks`` yields in order, as a ``Shared`` file written
    block by block (``spooled``); removed when the run ends. Memory: one block."""
    with spooled(shape, dtype, folder, name) as spool:
        for block in blocks:
            spool.append(block)
        yield spool.shared()


@contextmanager
def shared(array: np.ndarray, folder: str | Path, name: str) -> Iterator[Shared]:
    """``array`` as a ``Shared`` file (``shared_blocks`` in one block); this process keeps it as given."""
    array = np.ascontiguousarray(array)
    with shared_blocks([array], array.shape, array.dtype, folder, name) as handle:
        _shared[handle.sha256] = array  # this process already holds it
        yield handle
