"""What ``probe knn`` returns (``commands/knn.py`` fills it; ``results/tables.knn`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import knn
from ..store import arrays, images
from .outcome import Outcome


def view_text(view: str, extract: str = "") -> str:
    """What the features saw, and, off DINO's view, how to get it (``extract``: the whole command that
    adds it to the stores read, for the terminal; the record keeps the short form, the report naming no folder)."""
    text = f"{view} view: {arrays.geometry(view)}"
    if view != images.EVAL:
        text += f"; not DINO's (facebookresearch/dino eval_knn.py: short side 256, centre crop 224): `{extract or f'probe extract --views {images.EVAL}'}` adds that view"
    return text


@dataclass
class KnnReport(Outcome):
    """What ``probe knn`` measured: accuracies per k with the feature, view and panels that produced them."""

    store: Path
    name: str
    result: knn.KnnResult | None  # None: a shard done before the others
    feature: str
    classes: list[str]
    counts: dict[str, int]
    ledger: dict[str, str]
    temperature: float
    view: str
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing
    extract: str = ""  # off DINO's view: the probe extract (joined by &&) that adds it to every store read

    @property
    def view_line(self) -> str:
        return view_text(self.view, self.extract)

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "name": self.name,
            "feature": self.feature,
            "view": self.view,
            "view_text": view_text(self.view),
            "temperature": self.temperature,
            "ledger": self.ledger,
            "counts": self.counts,
            "classes": self.classes,
            "k": list(self.result.ks),
            "top1": [float(v) for v in self.result.top1],
            "top5": [None if not np.isfinite(v) else float(v) for v in self.result.top5],
        }
