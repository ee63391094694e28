"""Label hygiene: watch every file a run opens, and say in the manifest that no annotation was among them.

Training reads images only: no label may reach a self-supervised run. A ``sys.addaudithook`` hook sees every ``open``
event of the process, and of each data-loader worker (installed again by ``worker_init``). Each
path is sorted: an image of the run's list, the config, a checkpoint the run reads, the run's own
outputs, code and system files (the Python installation, the two packages' sources, ``/proc``,
``/sys``, ``/dev``, ``/etc``, ``/usr``, multiprocessing's ``pymp-*`` scratch), or *other*. Any
*other* file is appended to ``other-opens.txt`` in the run folder at once (so workers report
too) and listed in the manifest; an empty list is what ``no_annotation_opened: true`` rests on.
"""

from __future__ import annotations

import os
import site
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

OTHER = "other-opens.txt"
SYSTEM = ("/proc/", "/sys/", "/dev/", "/etc/", "/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/")
CODE_SUFFIXES = (".py", ".pyc", ".so", ".pth", ".pyi", ".typed")

_installed = False
_active: Watch | None = None
_guard = threading.local()


def _prefixes() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), site.getusersitepackages()}
    here = Path(__file__).resolve().parent
    roots |= {str(here), str(here.parent / "probe_toolkit")}
    scratch = os.path.join(tempfile.gettempdir(), "pymp-")  # multiprocessing's own scratch folders
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots if r) + SYSTEM + (scratch,)


@dataclass
class Watch:
    """What a run may open; picklable, so data-loader workers can install the same watch."""

    run_dir: str
    images: frozenset[str]
    config: str | None = None
    checkpoints: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = field(default_factory=_prefixes)
    images_opened: int = 0
    other: list[str] = field(default_factory=list)

    def classify(self, path: str) -> str:
        if path in self.images:
            return "image"
        if path == self.config:
            return "config"
        if path in self.checkpoints:
            return "checkpoint"
        if path.startswith(os.path.join(self.run_dir, "")):
            return "output"
        if path.startswith(self.prefixes) or path.endswith(CODE_SUFFIXES):
            return "code"
        return "other"

    def seen(self, path: str) -> None:
        kind = self.classify(path)
        if kind == "image":
            self.images_opened += 1
        elif kind == "other":
            self.other.append(path)
            _report(os.path.join(self.run_dir, OTHER), path)

    def __enter__(self) -> Watch:
        install(self)
        return self

    def __exit__(self, *exc) -> None:
        global _active
        _active = None

    def worker_init(self, worker_id: int) -> None:
        """``DataLoader(worker_init_fn=...)``: the same watch inside a worker process."""
        install(self)

    def others(self) -> list[str]:
        """Every *other* file opened by any process of the run (read from the run folder's report)."""
        report = Path(self.run_dir) / OTHER
        found = report.read_text().splitlines() if report.exists() else []
        return sorted(set(found) | set(self.other))


def _report(report: str, line: str) -> None:
    _guard.busy = True
    try:
        fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    finally:
        _guard.busy = False


def _hook(event: str, args: tuple) -> None:
    if event != "open" or _active is None or getattr(_guard, "busy", False):
        return
    path = args[0]
    if isinstance(path, int) or path is None:
        return  # an already-open descriptor
    try:
        _active.seen(os.path.abspath(os.fsdecode(path)))
    except Exception:  # noqa: BLE001 - an audit hook must never break the open it watches
        pass


def install(watch: Watch) -> None:
    """Make ``watch`` the active one in this process (the hook is added once and stays)."""
    global _installed, _active
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    _active = watch


def summary(watch: Watch, image_list_sha256: str, n_images: int) -> dict:
    others = watch.others()
    return {
        "image_list_sha256": image_list_sha256,
        "n_images": n_images,
        "watched": "sys.addaudithook 'open' events in the main process and every data-loader worker",
        "config": watch.config,
        "checkpoints_read": sorted(watch.checkpoints),
        "images_opened_in_main_process": watch.images_opened,
        "other_files_opened": others,
        "no_annotation_opened": not others,
    }
