"""What ``probe linear_dinov2``'s run returns (``commands/linear_dinov2.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import linear_dinov2 as ld
from .outcome import Outcome


@dataclass
class LinearDinov2Report(Outcome):
    store: Path
    name: str
    classifiers: list[ld.Classifier]
    top1_val: np.ndarray
    top5_val: np.ndarray
    evaluated: list[int]
    chosen: int | None
    accuracy: float  # the chosen classifier's, on test where given, else on val
    reported_on: str  # val or test
    counts: dict[str, int]
    ledger: dict[str, str]

    @property
    def chosen_name(self) -> str:
        return self.classifiers[self.chosen].name if self.chosen is not None else ""

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "name": self.name,
            "chosen": self.chosen_name,
            "accuracy": self.accuracy,
            "reported_on": self.reported_on,
            "classifiers": [
                {"name": c.name, "blocks": c.blocks, "avgpool": c.avgpool, "rate": c.rate, "top1_val": float(t1), "top5_val": float(t5), "evaluated": i in self.evaluated}
                for i, (c, t1, t5) in enumerate(zip(self.classifiers, self.top1_val, self.top5_val))
            ],
            "counts": self.counts,
            "ledger": self.ledger,
        }
