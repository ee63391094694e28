"""What ``probe attention-masks`` returns (``commands/attention_masks.py`` fills it; ``results/tables.attention_masks`` shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .outcome import Outcome

ROW_TEXT = {
    "cls": "the class token's row of the last block (DINO's visualize_attention.py)",
    "aggregation": "SelfPatch's aggregation head (ca_head): its last class-attention block's query over the patch tokens",
    "mean": "the mean of the last block's patch rows (no class token, no aggregation head)",
}
RESOLUTION = "the 224 view's pixels; masks nearest-upsampled by the patch size; objects carried into the view by its resize and crop"


@dataclass
class MasksReport(Outcome):
    """What ``probe attention-masks`` made: the masks' rule, and their Jaccards when a panel scored them."""

    store: Path
    row: str
    mass: float
    n_images: int
    scored: int
    jaccard_mean: np.ndarray | None = None
    best_mean: float | None = None
    per_object_mean: float | None = None
    ledger: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing
    looks: dict[str, list] | None = None  # with storage tokens: where the class token and each storage token look (am.looks), by token

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "row": self.row,
            "row_text": ROW_TEXT[self.row],
            "mass": self.mass,
            "resolution": RESOLUTION,
            "images": self.n_images,
            "scored": self.scored,
            "ledger": self.ledger,
            "counts": self.counts,
            "jaccard_per_head": None if self.jaccard_mean is None else [float(v) for v in self.jaccard_mean],
            "best_head": self.best_mean,
            "per_object": self.per_object_mean,
            "looks": self.looks,
        }
