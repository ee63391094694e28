"""What ``probe decode-scores``'s run returns (``commands/decode_scores.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..labels import saliency
from ..labels.scoring import Scores
from .outcome import Outcome


@dataclass
class ScoreReport(Outcome):
    """A masks file's scores on one panel (COCO's, or a saliency panel's)."""

    scores: Scores | saliency.SaliencyScores
    ledger_entry: str
    warnings: list[str] = field(default_factory=list)  # the masks' view is not the one the preset was published on for this panel

    def summary(self) -> dict[str, Any]:
        return {"scores": self.scores.table(), "counts": self.scores.counts, "ledger_entry": self.ledger_entry}
