"""What ``probe depth``'s run returns (``commands/depth.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .outcome import Outcome


@dataclass
class DepthReport(Outcome):
    store: Path
    name: str
    preset: str
    metrics: dict[str, float]
    iterations: int
    full_schedule: bool
    losses: np.ndarray
    counts: dict[str, int]
    ledger: dict[str, str]
    blocks: tuple[int, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    unpublished: dict[str, Any] = field(default_factory=dict)  # settings other than the preset's published values

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "name": self.name,
            "preset": self.preset,
            "metrics": self.metrics,
            "iterations": self.iterations,
            "full_schedule": self.full_schedule,
            "unpublished": self.unpublished,
            "blocks": list(self.blocks),
            "loss_first": float(self.losses[0]),
            "loss_last": float(self.losses[-1]),
            "counts": self.counts,
            "ledger": self.ledger,
            "settings": self.settings,
        }
