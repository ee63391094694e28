"""The errors a user sees as one line, and the exit status each gives.

``ProbeError``: bad input a user can fix; it names the file, the problem and the fix (exit 2).
``IntegrityError``: the data cannot be trusted (a broken ledger chain, a worker that read
another store, masks whose metadata disagree): exit 1. ``Interrupted``: Ctrl-C, with what the
interrupted command left (exit 130). Everything else is a bug and keeps its traceback, except
``OSError`` (a full disk, a file where a folder belongs), which the CLI prints as one line.
``worker_name``: how an error raised on a worker names where it happened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INTEGRITY = 1
EXIT_INTERRUPTED = 130


class ProbeError(Exception):
    """Bad input a user can fix: ``<where>: <problem>; <fix>``."""

    def __init__(self, where: str | Path | None, problem: str, fix: str = ""):
        self.where = str(where) if where is not None else ""
        self.problem = problem
        self.fix = fix
        super().__init__(self.line())

    def __reduce__(self):
        """Pickle by the three parts, so the error crosses a process or cluster boundary intact."""
        return (type(self), (self.where or None, self.problem, self.fix))

    def line(self) -> str:
        head = f"{self.where}: " if self.where else ""
        tail = f"; {self.fix}" if self.fix else ""
        return f"{head}{self.problem}{tail}"


class IntegrityError(ProbeError):
    """What was read or recorded cannot be trusted (exit status 1, not 2)."""


class Interrupted(Exception):
    """Ctrl-C: the message says what the command leaves behind and how to go on."""


_OS_FIXES = {
    errno.ENOSPC: "free disk space and rerun the same command",
    errno.EDQUOT: "free disk space (quota) and rerun the same command",
    errno.EACCES: "make it writable or choose another path",
    errno.EROFS: "choose a path on a writable filesystem",
    errno.ENOTDIR: "a file stands where a folder is needed: move it or choose another path",
    errno.EEXIST: "a file stands where a folder is needed: move it or choose another path",
    errno.EISDIR: "a folder stands where a file is needed: choose another path",
    errno.ENOENT: "check the path",
    errno.ENOTEMPTY: "a non-empty folder stands there: move it or choose another path",
    errno.EFBIG: "a file reached this shell's file-size limit (ulimit -f): raise it (ulimit -f unlimited)",
}


def os_fix(error: OSError, then: str) -> str:
    """The fix for what ``error`` says went wrong (a full disk is not a read-only folder, a
    missing parent or a folder in the way), followed by ``then`` (how to go on)."""
    return f"{_OS_FIXES.get(error.errno or -1, 'check the disk and the path')}, then {then}"


def os_error_line(error: OSError) -> str:
    """An OSError as ``<file>: <strerror>; <fix>``."""
    where = error.filename if error.filename is not None else ""
    problem = error.strerror or str(error) or type(error).__name__
    fix = _OS_FIXES.get(error.errno or -1, "check the disk and the path, then rerun")
    return ProbeError(os.fspath(where) if where != "" else None, problem, fix).line()


@contextlib.contextmanager
def reading(where: str | Path, what: str, fix: str) -> Iterator[None]:
    """Inside, a file's content is being read: any error its bytes cause that is not already
    probe's one line (a JSON decoder's, zarr's, numpy's, a KeyError of a missing field) becomes
    ``<where>: is not a readable <what> (<the error>); <fix>``. A reader that trusts a file's
    format (zarr metadata, a record, the ledger) is wrapped here once, at its entry point, so a
    damaged or foreign file is never a traceback (``tests/test_fuzz_readers.py``)."""
    try:
        yield
    except (ProbeError, KeyboardInterrupt, MemoryError):
        raise
    except OSError as error:  # a disk or a permission: said as such (the CLI's one line), not as damage
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EIO):
            raise
        raise ProbeError(where, f"is not a readable {what} ({type(error).__name__}: {_short(error)})", fix) from None
    except Exception as error:  # noqa: BLE001 - the file's bytes decide what a reader meets
        raise ProbeError(where, f"is not a readable {what} ({type(error).__name__}: {_short(error)})", fix) from None


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:120] + ("…" if len(text) > 120 else "")


def worker_name() -> str:
    """This process as a worker-side error names it: its dask worker, else its process id (a
    local worker never imports distributed to ask)."""
    if "distributed" not in sys.modules:
        return f"worker process {os.getpid()}"
    try:
        from distributed import get_worker

        worker = get_worker()
        return f"dask worker {worker.name} ({worker.address})"
    except (ImportError, ValueError):
        return f"worker process {os.getpid()}"
