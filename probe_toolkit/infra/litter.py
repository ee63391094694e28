"""Temporary names a killed run leaves (``.NAME.tmp-PID``, ``.NAME.old-PID``): recognised, never
read, and removed by the next run once the process that made them is gone."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

LITTER = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old|creating)-(?P<pid>\d+)$")


def is_litter(name: str) -> bool:
    """A hidden temporary name of an atomic write (never a result, a report or a store)."""
    return LITTER.match(name) is not None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: str | Path, name: str | None = None) -> list[Path]:
    """Remove the temporary names in ``folder`` (only those of ``name`` when given) whose process
    is dead; a live process's (a concurrent run) are left to it. Returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in folder.iterdir():
        found = LITTER.match(entry.name)
        if found is None or (name is not None and found["name"] != name) or _alive(int(found["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed
