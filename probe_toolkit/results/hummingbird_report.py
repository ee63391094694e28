"""What ``probe hummingbird`` returns (``commands/hummingbird.py`` fills it; ``results/tables.hummingbird`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyses import hummingbird as hb
from ..labels import voc_segmentation
from .outcome import Outcome


@dataclass
class HummingbirdReport(Outcome):
    """mIoU at each memory size of one store on one pair of segmentation panels, with the memory's rows and the data set's kind."""

    store: Path
    name: str
    memory: list[str]
    scores: list[hb.MiouResult]
    bank_rows: list[int]
    per_view: list[int]
    classes: tuple[str, ...]
    counts: dict[str, int]
    ledger: dict[str, str]
    matching: str
    kind: str = voc_segmentation.KIND  # the panels' kind: published numbers exist for VOC only
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing

    def headline(self) -> list[float]:
        return [s.miou_hungarian if self.matching == "hungarian" else s.miou for s in self.scores]

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "name": self.name,
            "memory": self.memory,
            "matching": self.matching,
            "miou": [s.miou for s in self.scores],
            "miou_hungarian": [s.miou_hungarian for s in self.scores],
            "iou": [s.iou.tolist() for s in self.scores],
            "bank_rows": self.bank_rows,
            "per_view": self.per_view,
            "classes": list(self.classes),
            "counts": self.counts,
            "ledger": self.ledger,
        }
