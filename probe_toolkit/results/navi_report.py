"""What ``probe correspond`` returns on a NAVI panel (``commands/correspond_navi.py`` fills it; ``results/tables_correspond.navi`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import navi
from .outcome import Outcome

BIN_NAMES = tuple(f"{a}-{b}" for a, b in zip(navi.BINS[:-1], navi.BINS[1:]))


@dataclass
class NaviReport(Outcome):
    store: Path
    name: str
    panel: str
    recall_cm: np.ndarray
    recall_px: np.ndarray
    binned: np.ndarray
    counts: dict[str, int]
    ledger: str
    seconds: float
    waiting: list[int] = field(default_factory=list)
    dataset: str = "navi"

    @property
    def bins_mean(self) -> float:
        finite = self.binned[np.isfinite(self.binned)]
        return float(finite.mean()) if len(finite) else float("nan")

    def summary(self) -> dict[str, Any]:
        def clean(v: float) -> float | None:
            return None if not np.isfinite(v) else float(v)

        return {
            "store": str(self.store),
            "name": self.name,
            "panel": self.panel,
            "ledger": self.ledger,
            "counts": self.counts,
            "recall_cm": {f"{t * 100:g}": clean(v) for t, v in zip(navi.CM, self.recall_cm)},
            "recall_px": {f"{t:g}": clean(v) for t, v in zip(navi.PX, self.recall_px)},
            "binned_2cm": {b: clean(v) for b, v in zip(BIN_NAMES, self.binned)},
            "bins_mean": clean(self.bins_mean),
        }
