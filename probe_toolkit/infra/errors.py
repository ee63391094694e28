"""One kind of error for bad input: it names the file, the problem and the fix.

The CLI prints such an error as one line and exits with status 2; everything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


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
