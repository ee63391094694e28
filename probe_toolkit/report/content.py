"""The report as plain data: sections of tables, figures and notes, rendered twice.

Sections are gathered once (``sections.py``) into these blocks, then written as Markdown
(``markdown.py``) and as self-contained HTML (``html.py``); neither renderer decides what a
report says, so the two can never disagree about which sections exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    caption: str = ""
    settings: str = ""  # the settings that moved its numbers (``differing.shown``): in the caption, and a column of every CSV row


@dataclass
class Figure:
    name: str  # file name of the PNG beside the report, e.g. "03-attention.png"
    image: Any  # PNG bytes, or a drawing (``report.figures.Drawing``) that gives them when first asked for
    caption: str

    @property
    def png(self) -> bytes:
        """The PNG bytes (a drawing is drawn here, once: after any caveat was stamped over it)."""
        draw = getattr(self.image, "png", None)
        return draw() if callable(draw) else self.image


@dataclass
class Note:
    """One paragraph. ``kind``: ``text``; ``missing`` (what is not there and the command that
    would produce it); ``reference`` (numbers measured on other weights); ``caveat`` (what the numbers
    beside it cannot mean: random weights, synthetic images)."""

    text: str
    kind: str = "text"


@dataclass
class Explorer:
    """The interactive patch explorer's data (JSON-ready; large arrays as base64 uint8)."""

    data: dict[str, Any]


Block = Table | Figure | Note | Explorer


@dataclass
class Section:
    key: str  # stable id: anchors in the HTML, ``data-section`` for tests
    title: str
    blocks: list[Block] = field(default_factory=list)
    sources: list[tuple[str, str, Any]] = field(default_factory=list)  # (store label, result, dataset) of every record it read: what its captions may claim

    @property
    def present(self) -> bool:
        """A section is present when it shows something beyond lines saying what is missing."""
        return any(not (isinstance(b, Note) and b.kind == "missing") for b in self.blocks)

    def missing(self, text: str) -> None:
        self.blocks.append(Note(text, "missing"))

    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


@dataclass
class Report:
    title: str
    stores: list[str]  # labels, in the order given
    follow: str | None
    patch: int
    sections: list[Section]
    version: str = ""  # probe's version and git revision that wrote the report

    def section(self, key: str) -> Section:
        return next(s for s in self.sections if s.key == key)
