"""Every table and figure caption of the report says the settings that moved its numbers.

A section is built, then each of its tables and figures gets, in its caption, the settings that
differ from the protocol's defaults (``results.differ``) of every record the section read (the
stores' ``ReadResults`` log them). No section writes this text itself: a section added later, or
a setting added to a protocol, is covered without an edit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..results.differ import differing_text
from .content import Figure, Note, Section, Table
from .context import Context

LEAD = "Settings other than the defaults"


def read(ctx: Context) -> list[tuple[str, str, Any]]:
    """(store label, result, dataset) of each record read since the last call; the stores' logs are cleared."""
    found = []
    for store in ctx.stores:
        for name in list(store.results.read):
            ds = dict.get(store.results, name)
            if ds is not None:
                found.append((store.label, name, ds))
        store.results.read.clear()
    return found


def moved(records: list[tuple[str, str, Any]]) -> list[str]:
    """``"<store>: <protocol> <settings>"`` for each record that ran with other than its protocol's
    default settings (each once)."""
    found: dict[str, None] = {}
    for label, name, ds in records:
        text = differing_text(ds)
        if text:
            protocol = (ds.attrs.get("record") or {}).get("protocol") or name
            found[f"{label}: {protocol} {text}"] = None
    return list(found)


def shown(build: Callable[[Context], Section], ctx: Context) -> Section:
    """Build one section and put the settings that moved its numbers into each caption (a note
    when the section has no table or figure); the section keeps the records it read (``sources``)."""
    read(ctx)  # what earlier builders (or the report's own reads) touched is theirs
    section = build(ctx)
    section.sources = read(ctx)
    lines = moved(section.sources)
    if not lines or not section.present:
        return section
    text = f"{LEAD}: {'; '.join(lines)}."
    captioned = [b for b in section.blocks if isinstance(b, (Table, Figure))]
    for block in captioned:
        block.caption = f"{block.caption.rstrip()} {text}".strip()
        if isinstance(block, Table):
            block.settings = "; ".join(lines)
    if not captioned:
        section.blocks.append(Note(text))
    return section
