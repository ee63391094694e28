"""A rich progress bar that shows items per second and the ETA, or nothing with ``--quiet``.

A command's bar counts its items (images, sequences). Work inside one item can be long too (the
bootstrap's resamples at a large ``--boot``, one very large image): ``within`` adds a line under
the running bar that counts that work's own steps and goes away when it is done, so a long wait on
one item still moves. It reports steps, never a time of its own: the ETA column is rich's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:6.2f} {self.unit}/s" if speed else f"   ?   {self.unit}/s", style="progress.data.speed")


_ACTIVE: list[Bar] = []  # the bars running in this process, innermost last (a process-wide list: work runs on helper threads too)
_LOCK = threading.Lock()


class Bar(Progress):
    """A command's bar; while it runs it is the one ``within`` adds its lines to."""

    def __enter__(self) -> Bar:
        with _LOCK:
            _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        super().__exit__(*exc)


def bar(unit: str = "images", quiet: bool = False, **options) -> Bar:
    return Bar(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(unit),
        TimeRemainingColumn(),
        disable=quiet,
        transient=False,
        **options,
    )


@contextlib.contextmanager
def within(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """``advance(n)`` for ``total`` steps of work inside one item, shown as a line under the
    running bar (``  └ description``) and removed when the work ends; without a running bar (the
    Python API, ``--quiet``) ``advance`` does nothing."""
    with _LOCK:
        active = _ACTIVE[-1] if _ACTIVE else None
    if active is None or active.disable:
        yield lambda n: None
        return
    task: list = []  # added at the first step: the line appears when this work starts, not when it is set up

    def advance(n: int) -> None:
        if not task:
            task.append(active.add_task(f"  └ {description}", total=total))
        active.advance(task[0], n)

    try:
        yield advance
    finally:
        if task:
            active.remove_task(task[0])
