"""The first module a forkserver of probe's imports (``store.extract_load.host_pool``).

A forkserver imports its preloaded modules (torch among them: seconds) before it starts to watch
the command that started it; a command killed meanwhile would leave it importing on, and only
then ending. Imported first, this module gives it a lifeline (``infra.lifeline``): it ends as
soon as the command is gone. (multiprocessing imports the command's main module before any
other, which for ``probe`` is its light command-line module.) Imported anywhere else it does
nothing.
"""

from __future__ import annotations

import os
import sys


def _in_a_forkserver() -> bool:
    """The forkserver runs ``python -c 'from multiprocessing.forkserver import main; main(...)'``."""
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


if _in_a_forkserver():
    from .lifeline import follow_parent

    follow_parent(os.getppid())
