"""What every section builder reads: the stores, the followed image and patch, the ledgers, and
the running figure numbers (one object, so a builder's signature is ``builder(ctx) -> Section``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from .content import Figure
from .followed import Attention, Neighbours
from .patches import Followed
from .sources import LedgerBook, Picture, StoreView


@dataclass
class Context:
    stores: list[StoreView]
    follow: str | None
    patch: int
    picture: Picture | None
    book: LedgerBook
    attention: dict[str, Attention | None] = field(default_factory=dict)
    neighbours: dict[str, Neighbours | None] = field(default_factory=dict)
    followed: dict[str, Followed] = field(default_factory=dict)  # each store's followed patch on its own grid (patches.py)
    numbers: itertools.count = field(default_factory=lambda: itertools.count(1))
    shown: set = field(default_factory=set)  # published numbers printed beside a measurement
    cache_dir: str | Path | None = None  # where the ledger of a label read for a figure goes

    def figure(self, stem: str, png: bytes, caption: str) -> Figure:
        return Figure(f"{next(self.numbers):02d}-{stem}.png", png, caption)

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.stores]

    def patch_of(self, store: StoreView) -> int | None:
        """The followed patch on ``store``'s own 224 grid (``--patch`` reads the first store's); None when it follows none."""
        found = self.followed.get(store.label)
        return found.patch if found is not None else self.patch
