"""No process of a run outlives it: a helper process (a local worker, a torchrun rank) exits as
soon as the process that started it is gone.

A SIGKILL (or an unhandled SIGTERM) of ``probe decode --workers 2`` cannot run any cleanup, and
a forked worker holds both ends of the pool's pipes, so it never sees end-of-file: it would wait
for work, or compute its block, for minutes. torchrun starts each rank in a session of its own,
so a SIGKILL of the launcher never reaches the ranks either. One rule covers both: a daemon
thread compares the parent pid with the one recorded when the helper was started and ends the
process at once (``os._exit``: nothing of the dead run is worth finishing) when they differ.

The parent is passed in, not read at start: a helper whose parent died before the thread
started is re-parented already, and would otherwise take its new parent for the old one.
``prctl(PR_SET_PDEATHSIG)`` is not used: it fires when the *thread* that started the child ends,
which a pool that starts workers from a helper thread would trip while the run goes on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

STATUS = 143  # as a SIGTERM would end it: 128 + 15


def follow_parent(parent: int, *, interval: float = 0.2, say: str | None = None) -> threading.Thread:
    """Exit this process (status 143) once ``parent`` is no longer its parent; ``say``: one line
    for stderr first (a torchrun rank names itself; a pool worker stays silent)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        if say:
            print(say, file=sys.stderr, flush=True)
        os._exit(STATUS)

    thread = threading.Thread(target=watch, name="probe-lifeline", daemon=True)
    thread.start()
    return thread


def launched_by_torchrun(environ=None) -> bool:
    """torchrun's elastic agent sets ``TORCHELASTIC_RUN_ID`` for every rank; a ``RANK`` or
    ``WORLD_SIZE`` left in a shell does not come with it."""
    return "TORCHELASTIC_RUN_ID" in (os.environ if environ is None else environ)


def follow_launcher() -> threading.Thread | None:
    """Under torchrun, stop this rank when the launcher dies (as ``training/distributed.py``'s
    ranks do); elsewhere nothing."""
    if not launched_by_torchrun():
        return None
    parent = os.getppid()
    rank = os.environ.get("RANK", "?")
    say = f"probe rank {rank}: its launcher (pid {parent}) is gone; stopping"
    if parent == 1:  # re-parented to init before this line ran: the launcher is gone already
        print(say, file=sys.stderr, flush=True)
        os._exit(STATUS)
    return follow_parent(parent, interval=0.2, say=say)


class Terminated(KeyboardInterrupt):
    """SIGTERM in the command's own process, raised in its main thread as Ctrl-C is: every cleanup
    a Ctrl-C runs (temporaries removed, workers and clusters stopped) runs for a SIGTERM too."""


_TERMINATED = threading.Event()


def terminated() -> bool:
    """Whether this process was sent SIGTERM (then it exits 143, not Ctrl-C's 130)."""
    return _TERMINATED.is_set()


def terminate_as_interrupt():
    """Install the SIGTERM handler for the command's process; returns the handler it replaced
    (``signal.signal`` accepts it back), or None where a handler cannot be installed (not the
    main thread). A process forked from this one (a pool worker) inherits the handler but dies as
    a plain SIGTERM has it; a second SIGTERM while the first's cleanup runs ends it at once."""
    if threading.current_thread() is not threading.main_thread():
        return None
    owner = os.getpid()

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != owner:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        _TERMINATED.set()
        raise Terminated()

    return signal.signal(signal.SIGTERM, handler)
