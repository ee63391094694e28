"""What every report section shares: the command that produces each missing piece (``HOW``), the
percentage format, the one line naming the stores that lack something, and the followed
image's grid (the first store's, and a line per store on another)."""

from __future__ import annotations

import numpy as np

from .content import Section
from .context import Context
from .sources import StoreView

# the command that produces each missing piece
HOW = {
    "tokens": "run `probe extract CKPT --views 224`",
    "attention": "run `probe extract CKPT --views 224 --attention last`",
    "blocks": "run `probe extract CKPT --views 224 --attention all`",
    "entropy": "run `probe entropy STORE... --patch {patch}`",
    "neighbours_g14": "run `probe neighbours STORE...` (the 224 view, at the grid the store holds)",
    "neighbours_g6": "run `probe neighbours STORE... --view 96` (needs `--views 96`)",
    "decoder": "run `probe decode STORE` (needs `--views 480`)",
    "scores": "run `probe decode STORE --panel NAME` or `probe score MASKS.json --panel NAME`",
    "sweep": "run `probe decode-sweep STORE --panel NAME`",
    "linear_patch": "run `probe linear STORE... --train PANEL --val PANEL`",
    "linear_image": "run `probe linear STORE... --train PANEL --val PANEL --level image`",
    "training": "only checkpoints trained with `probe train` (training/) have `log.jsonl` beside them",
}
MAX_MASK_IMAGES = 4
MASK_WIDTH = 320  # display width of the decoder overlays, pixels


def _pct(x: float, digits: int = 1) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * float(x):.{digits}f} %"


def _names(stores: list[StoreView]) -> str:
    return ", ".join(s.label for s in stores)


def _lacking(section: Section, stores: list[StoreView], what: str, how: str) -> None:
    """One line naming the stores that lack something and the command that makes it."""
    if stores:
        section.missing(f"No {what} for {_names(stores)}: {how}.")


def results_section(ctx: Context, key: str, title: str, result: str, what: str, how: str) -> tuple[Section, dict[str, tuple[StoreView, object]]]:
    """A protocol's section and each store's saved ``result`` ({label: (store, result)}); when no
    store has one, the section says so, with the command that makes it (``how``)."""
    section = Section(key, title)
    found = {s.label: (s, s.result(result)) for s in ctx.stores if s.result(result) is not None}
    if not found:
        section.missing(f"No {what} yet: {how}.")
    return section, found


def lacking(section: Section, ctx: Context, found: dict, what: str, how: str) -> Section:
    """The section, with a line naming the stores without the result when others have it."""
    if found:
        _lacking(section, [s for s in ctx.stores if s.label not in found], what, how)
    return section


def _grid_of(ctx: Context) -> int:
    """The side of the first store's 224 grid: the one the followed image is drawn with and ``--patch`` reads."""
    for found in ctx.followed.values():
        return found.rows
    return 14


def _other_grids(ctx: Context) -> list[str]:
    """One line per store on another grid than the first: which patch it follows (patches.py)."""
    grids = {f.grid for f in ctx.followed.values()}
    return [f.line for f in list(ctx.followed.values())[1:]] if len(grids) > 1 else []
