"""What ``probe decode-sweep``'s run returns (``commands/decode_sweep.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyses.decoder_settings import Settings
from .outcome import Outcome


@dataclass
class SweepReport(Outcome):
    """Every setting of the grid scored on the val panel, the best by the metric, and where it was written."""

    table: list[dict[str, Any]]  # one row per setting: settings + scores
    best: Settings | None
    best_row: dict[str, Any]
    metric: str
    ledger_entry: str
    settings_file: Path | None
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing

    def summary(self) -> dict[str, Any]:
        return {"metric": self.metric, "ledger_entry": self.ledger_entry, "table": self.table}
