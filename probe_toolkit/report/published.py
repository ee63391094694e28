"""Published numbers in the report: beside a score only when protocol and data match
(``references.matches``), every other one in the "published elsewhere" table, once each."""

from __future__ import annotations

from typing import TYPE_CHECKING

import xarray as xr

from . import references
from .content import Note, Section, Table

if TYPE_CHECKING:
    from .context import Context

# the score table's row keys that a published metric may sit beside
SCORE_KEYS = {"corloc": "CorLoc", "bbox_AP50": "bbox AP50", "segm_AP": "segm AP"}


def measurement(ctx: Context, label: str, ds: xr.Dataset, statistic: str) -> references.Measurement:
    """What a saved score was measured with: decoder preset and view, architecture, panel."""
    store = next(s for s in ctx.stores if s.label == label)
    decoder = store.result("decoder")
    view = ds.attrs.get("size") or (decoder.attrs.get("size") if decoder is not None else None)
    arch = references.arch_name(store.manifest.get("arch") or {})
    images = int((ds.attrs.get("counts") or {}).get("images", -1))
    preset = str((ds.attrs.get("settings") or {}).get("preset", "?"))
    return references.Measurement(statistic, preset, str(view), arch, images, (str(ds.attrs.get("panel", "")),))


def comparable(ctx: Context, found: dict[str, xr.Dataset], rows: list[list[str]]) -> bool:
    """Append a column of the references that match these scores; False (and nothing) when none does."""
    cells: dict[str, list[str]] = {}
    for label, ds in found.items():
        for key, text in SCORE_KEYS.items():
            for ref in references.beside(measurement(ctx, label, ds, key)):
                ctx.shown.add(ref)
                cells.setdefault(text, []).append(f"{label}: {ref.cell()}")
    if not cells:
        return False
    for row in rows:
        row.append("; ".join(cells.get(row[0], [])) or "–")
    return True


def reference_values(ctx: Context) -> Section:
    """Every published number not printed beside a measurement, with its protocol, data and source."""
    section = Section("references", "Published elsewhere: numbers on other data or protocols")
    rest = references.elsewhere(ctx.shown)
    rows = [[r.label, f"{r.value:g}", r.protocol.method + (f" ({r.note})" if r.note else ""), r.protocol.arch, r.protocol.view, r.data.name, r.source] for r in rest]
    section.blocks.append(
        Table(
            ["metric", "value", "method", "network", "input", "data", "source"],
            rows,
            "Published numbers measured on other data or with another protocol than the scores above; none of them is comparable to a score of this report.",
        )
    )
    if ctx.shown:
        section.blocks.append(Note(f"{len(ctx.shown)} published number(s) match a score's protocol and data and are printed beside it."))
    return section
