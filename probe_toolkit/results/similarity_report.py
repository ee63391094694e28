"""What ``probe similarity``'s run returns (``commands/similarity.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .outcome import Outcome

RESULT = "similarity"


@dataclass
class SimilarityReport(Outcome):
    store: Path
    other: Path | None
    sets: list[str]
    cka: np.ndarray
    cka_minibatch: np.ndarray
    examples: int
    minibatch_note: str

    def summary(self) -> dict:
        def plain(m):
            return [[None if not np.isfinite(v) else float(v) for v in row] for row in m]

        return {
            "analysis": RESULT,
            "store": str(self.store),
            "other": str(self.other) if self.other else None,
            "sets": self.sets,
            "cka": plain(self.cka),
            "cka_minibatch": plain(self.cka_minibatch),
            "examples": self.examples,
            "minibatch_note": self.minibatch_note,
        }
