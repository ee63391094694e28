"""What ``probe linear`` returns (``commands/linear.py`` fills it; ``results/tables.linear`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import linear
from .outcome import Outcome


@dataclass
class StoreScores:
    """One store's probe: its val scores and the regularisation its hold-out chose."""

    store: Path
    name: str
    scores: dict[str, float]
    chosen: float


@dataclass
class LinearReport(Outcome):
    """What ``probe linear`` measured: every store's scores, on one label space, from one pair of ledger reads."""

    level: str
    outcomes: list[StoreScores]
    ledger: dict[str, str]
    label_space: linear.LabelSpace
    settings: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """The table as JSON (NaN scores become null)."""
        saved = {str(r.store): str(r.path) for r in (self.run.records if self.run else [])}
        return {
            "level": self.level,
            "ledger": self.ledger,
            "label_space": self.label_space.as_dict(),
            "settings": self.settings,
            "stores": [
                {"store": str(o.store), "name": o.name, "scores": {k: _finite(v) for k, v in o.scores.items()}, "chosen": o.chosen, "saved": saved.get(str(o.store))}
                for o in self.outcomes
            ],
        }


def _finite(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)
