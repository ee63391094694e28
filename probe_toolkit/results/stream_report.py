"""What ``probe stream``'s run returns (``commands/stream.py`` fills it; its table in results/ shows it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..analyses.decoder import Decoded
from ..analyses.decoder_settings import Settings
from .outcome import Outcome


@dataclass
class StreamReport(Outcome):
    """How far a stream came: the masks store, its images done, and the masks file once every one is."""

    store: Path  # the masks store
    n_images: int
    written: int
    done: int
    seconds: float
    masks_file: Path | None  # written once every image is done
    decoded: Decoded | None
    chosen: Settings | None = None  # the decoder's settings, resolved

    def summary(self) -> dict:
        return {
            "store": str(self.store),
            "images": self.n_images,
            "done": self.done,
            "written": self.written,
            "masks_file": str(self.masks_file) if self.masks_file else None,
            "settings": self.chosen.as_dict() if self.chosen else None,
        }
