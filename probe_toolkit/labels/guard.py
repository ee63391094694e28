"""The guard that proves the labels rule: within ``forbid_label_reads``, an annotation file opened
anywhere but inside a reader of ``panels`` (or ``davis_folders``), which set ``inside.active``
while they read, raises ProbeError. For tests, and for stages that want the rule enforced."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError

inside = threading.local()  # ``active`` while a reader opens the annotation files it is allowed to


@contextlib.contextmanager
def forbid_label_reads(paths: Iterable[str | Path]) -> Iterator[list[str]]:
    """Within the block, opening any of ``paths`` outside ``read_labels`` raises ProbeError.

    Patches ``builtins.open``, ``io.open`` and ``os.open`` (``Path.open``/``read_bytes``/
    ``read_text`` and ``json.load`` on a file all pass through them). Yields the list of
    annotation paths ``read_labels`` opened meanwhile. For tests, and for stages that want
    the rule enforced while they run.
    """
    forbidden = {os.path.realpath(p) for p in paths}
    allowed: list[str] = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

    def check(file: Any) -> None:
        if isinstance(file, int):
            return
        try:
            name = os.path.realpath(os.fspath(file))
        except TypeError:
            return
        if name in forbidden:
            if getattr(inside, "active", False):
                allowed.append(name)
                return
            raise ProbeError(name, "an annotation file was opened outside panels.read_labels", "read labels only through read_labels (it writes the ledger)")

    def guarded_open(file, *args, **kwargs):
        check(file)
        return real_open(file, *args, **kwargs)

    def guarded_os_open(path, *args, **kwargs):
        check(path)
        return real_os_open(path, *args, **kwargs)

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    try:
        yield allowed
    finally:
        builtins.open, io.open, os.open = real_open, real_io_open, real_os_open
