"""What a protocol's run returns: its typed result (a subclass of ``Outcome``) holding the ``Run``
that says what was asked, where it ran and which records it wrote.

In results/, before protocols/ and commands/ in the flow, so that a table (``results/tables*.py``)
takes a protocol's result type and reads its fields; ``protocols/context.py`` builds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..infra.placement import Placement
from . import records


class Inputs:
    """A run's inputs by their declared names (``inputs.store``, ``inputs.train``); a name the
    protocol does not declare is an AttributeError, not a silent None."""

    def __init__(self, values: dict[str, Any]):
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"no input named {name!r} (declared: {', '.join(self.__dict__['_values'])})") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Inputs({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


@dataclass
class Run:
    """One run of a protocol: what it was asked, where it ran, what it saved, what it reported."""

    protocol: str
    run_id: str
    settings: Any
    placement: Placement
    report: Any
    records: list[records.Record]
    inputs: Inputs = field(default_factory=lambda: Inputs({}))


class Outcome:
    """Base of a protocol's result type: ``finish`` sets ``run`` (the ``Run``: settings, inputs,
    records) on it, so its table reads what the run was asked from the result itself."""

    run: Run | None = None

    @property
    def saved(self) -> Path | None:
        """Where the run's last record went (None: a shard that waits for the others, or nothing saved)."""
        return self.run.records[-1].path if self.run is not None and self.run.records else None

    @property
    def pending(self) -> bool:
        """A shard done before the others: it has no numbers yet, so no ``--json`` is written."""
        return bool(getattr(self, "waiting", None))

    def summary(self) -> dict[str, Any]:  # overridden: the numbers ``--json`` writes
        raise NotImplementedError
