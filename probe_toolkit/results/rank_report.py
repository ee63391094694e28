"""What ``probe rank`` returns (``commands/rank.py`` fills it; ``results/tables_labelfree.rank`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .outcome import Outcome

RESULT = "rank"


@dataclass
class StoreRank:
    store: Path
    block: int
    rankme: dict[str, float]
    rows: dict[str, int]
    curve: dict[str, dict[int, float]]
    lidar: float
    lidar_note: str
    width: int


@dataclass
class RankReport(Outcome):
    view: str
    stores: list[StoreRank] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "analysis": RESULT,
            "view": self.view,
            "stores": {
                str(s.store): {
                    "block": s.block,
                    "rankme": s.rankme,
                    "rows": s.rows,
                    "width": s.width,
                    "curve": {k: {str(n): v for n, v in c.items()} for k, c in s.curve.items()},
                    "lidar": None if not np.isfinite(s.lidar) else s.lidar,
                    "lidar_note": s.lidar_note,
                }
                for s in self.stores
            },
        }
