"""What ``probe segment``'s run returns (``commands/segment.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import segment as seg
from .outcome import Outcome


@dataclass
class SegmentReport(Outcome):
    """The trained head's mIoU with the schedule and the settings that produced it."""

    store: Path
    name: str
    kind: str
    preset: str
    scores: seg.Scores
    classes: tuple[str, ...]
    iterations: int
    full_schedule: bool
    losses: np.ndarray
    counts: dict[str, int]
    ledger: dict[str, str]
    settings: dict[str, Any] = field(default_factory=dict)
    unpublished: dict[str, Any] = field(default_factory=dict)  # settings other than the preset's published values

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "name": self.name,
            "kind": self.kind,
            "preset": self.preset,
            "miou": self.scores.miou,
            "accuracy": self.scores.accuracy,
            "iou": [None if np.isnan(v) else float(v) for v in self.scores.iou],
            "classes": list(self.classes),
            "iterations": self.iterations,
            "full_schedule": self.full_schedule,
            "unpublished": self.unpublished,
            "loss_first": float(self.losses[0]),
            "loss_last": float(self.losses[-1]),
            "counts": self.counts,
            "ledger": self.ledger,
            "settings": self.settings,
        }
