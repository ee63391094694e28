"""What ``probe propagate``'s run returns (``commands/propagate.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..labels import davis
from .outcome import Outcome


@dataclass
class PropagationReport(Outcome):
    """What ``probe propagate`` wrote and scored: the sequences, their J&F, the ledger reads of first frames and scores."""

    out: Path
    sequences: list[str]
    frames: int
    seconds: float
    scores: list[davis.SequenceScores] = field(default_factory=list)
    global_scores: dict[str, float] | None = None
    ledger: dict[str, str] = field(default_factory=dict)
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing

    def summary(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "sequences": self.sequences,
            "frames": self.frames,
            "seconds": self.seconds,
            "ledger": self.ledger,
            "global": self.global_scores,
            "objects": [r for s in self.scores for r in s.rows()],
        }
