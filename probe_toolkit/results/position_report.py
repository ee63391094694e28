"""What ``probe position`` returns (``commands/position.py`` fills it; ``results/tables_labelfree.position`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..analyses import position
from .outcome import Outcome

RESULT = "position"


@dataclass
class StorePosition:
    store: Path
    block: int
    fit: position.PositionResult
    grid: int
    images: dict[str, int]


@dataclass
class PositionReport(Outcome):
    view: str
    stores: list[StorePosition] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "analysis": RESULT,
            "view": self.view,
            "stores": {
                str(s.store): {
                    "block": s.block,
                    "loss": s.fit.loss,
                    "l1": s.fit.l1,
                    "l1_row": s.fit.l1_row,
                    "l1_col": s.fit.l1_col,
                    "chance": s.fit.chance,
                    "grid": s.grid,
                    "images": s.images,
                }
                for s in self.stores
            },
        }
