"""What ``probe overcluster``'s run returns (``commands/overcluster.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .outcome import Outcome


@dataclass
class OverclusterReport(Outcome):
    store: Path
    panel: str
    ks: list[int]
    miou: list[float]
    miou_seed: np.ndarray
    matching: list[str]
    counts: dict[str, int]
    ledger: str

    def summary(self) -> dict:
        return {
            "store": str(self.store),
            "panel": self.panel,
            "k": self.ks,
            "miou": self.miou,
            "miou_seed": self.miou_seed.tolist(),
            "matching": self.matching,
            "counts": self.counts,
            "ledger": self.ledger,
        }
