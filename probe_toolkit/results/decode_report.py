"""What ``probe decode``'s run returns (``commands/decode.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyses.decoder_settings import Settings
from ..labels.scoring import Scores
from .outcome import Outcome


@dataclass
class DecodeReport(Outcome):
    """What ``probe decode`` decoded, with which resolved settings, and the panel's scores when one was given."""

    store: Path
    settings: Settings
    settings_source: str
    n_images: int
    n_masks: int
    degenerate: int
    dense_solves: int
    seconds: float
    masks_file: Path | None
    scores: Scores | None = None
    ledger_entry: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, repr=False)  # the keys read (``decode_keys.open_keys``), for the masks JSON and the scores
    encoded: Any = field(default=None, repr=False)  # every mask as a COCO result (``decode_keys.BlockResults``)
    unit: str = ""  # the id the decoder record, the masks JSON and the scores share

    @property
    def pending(self) -> bool:
        return self.masks_file is None  # a shard done before the others

    def summary(self) -> dict[str, Any]:
        out = {
            "store": str(self.store),
            "settings": self.settings.as_dict(),
            "settings_source": self.settings_source,
            "images": self.n_images,
            "masks": self.n_masks,
            "degenerate": self.degenerate,
            "dense_solves": self.dense_solves,
            "seconds": round(self.seconds, 3),
            "masks_file": str(self.masks_file) if self.masks_file else None,
            **self.extra,
        }
        if self.scores is not None:
            out.update(scores=self.scores.table(), counts=self.scores.counts, ledger_entry=self.ledger_entry)
        out.update(self.extra)
        return out
