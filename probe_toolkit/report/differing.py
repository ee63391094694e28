"""Every table and figure caption of the report says the settings that moved its numbers.

A section is built, then each of its tables and figures gets, in its caption, the settings that
differ from the protocol's defaults (``results.differ``) of every record the section read (the
stores' ``ReadResults`` log them). No section writes this text itself: a section added later, or
a setting added to a protocol, is covered without an edit.
"""

from __future__ import annotations

from collections.abc import Callable

from ..results.differ import differing_text
from .content import Figure, Note, Section, Table
from .context import Context

LEAD = "Settings other than the defaults"


def moved(ctx: Context) -> list[str]:
    """``"<store>: <protocol> <settings>"`` for each record read since the last call that ran
    with other than its protocol's default settings (each once)."""
    found: dict[str, None] = {}
    for store in ctx.stores:
        for name in list(store.results.read):
            ds = dict.get(store.results, name)
            text = differing_text(ds) if ds is not None else ""
            if text:
                protocol = (ds.attrs.get("record") or {}).get("protocol") or name
                found[f"{store.label}: {protocol} {text}"] = None
        store.results.read.clear()
    return list(found)


def shown(build: Callable[[Context], Section], ctx: Context) -> Section:
    """Build one section and put the settings that moved its numbers into each caption (a note
    when the section has no table or figure)."""
    moved(ctx)  # what earlier builders (or the report's own reads) touched is theirs
    section = build(ctx)
    lines = moved(ctx)
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
