"""What ``probe correspond`` returns on a SPair-71k panel (``commands/correspond.py`` fills it; ``results/tables.correspond`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .outcome import Outcome

BIN_NAMES = ("0", "1", "2", "all")


@dataclass
class CorrespondReport(Outcome):
    """PCK of one store on one SPair-71k panel, by category, viewpoint bin and threshold."""

    store: Path
    name: str
    panel: str
    categories: list[str]
    thresholds: tuple[float, ...]
    pck: np.ndarray  # (category, bin, threshold)
    mean: np.ndarray  # (bin, threshold)
    counts: dict[str, int]
    ledger: str
    seconds: float
    dtype: str = "float16"
    extra: dict[str, Any] = field(default_factory=dict)
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing

    def summary(self) -> dict[str, Any]:
        def clean(v: float) -> float | None:
            return None if not np.isfinite(v) else float(v)

        return {
            "store": str(self.store),
            "name": self.name,
            "panel": self.panel,
            "ledger": self.ledger,
            "counts": self.counts,
            "bins": list(BIN_NAMES),
            "thresholds": list(self.thresholds),
            "tokens_dtype": self.dtype,
            "mean": {f"{t:g}": [clean(self.mean[b, i]) for b in range(len(BIN_NAMES))] for i, t in enumerate(self.thresholds)},
            "categories": {
                c: {f"{t:g}": [clean(self.pck[k, b, i]) for b in range(len(BIN_NAMES))] for i, t in enumerate(self.thresholds)} for k, c in enumerate(self.categories)
            },
        }
