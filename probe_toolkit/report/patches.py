"""The followed patch in every store of a report, each on its own 224 grid.

``--patch N`` names a patch of the *first* store's 224 grid (patch = cols·row + column), the grid
the followed image is drawn with. A store on another grid (ViT-S/8: 28 × 28, DINOv2 /14:
16 × 16, beside ViT-S/16's 14 × 14) follows the patch under that patch's centre, in pixels of
the 224 view; a centre on a border between two of its patches goes to the upper / left one
(so patch (r, c) of 14 × 14 becomes (2r, 2c) of 28 × 28). A store whose grid leaves that pixel
unused (a patch size that does not divide 224: the last pixels are cropped, as DINO's
``visualize_attention.py`` crops) follows no patch, and the report says so in one line.

The page's explorer applies the same rule (``assets/explorer.js``, ``under``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.errors import ProbeError
from ..store import grids
from .sources import VIEW, StoreView


@dataclass(frozen=True)
class Followed:
    """One store's followed patch: its 224 grid, patch size in pixels, the index (None: refused) and how it was found."""

    rows: int
    cols: int
    size: int
    patch: int | None
    line: str

    @property
    def grid(self) -> tuple[int, int]:
        return self.rows, self.cols


def store_grid(store: StoreView) -> tuple[int, int, int] | None:
    """(rows, cols, patch size in pixels) of the store's 224 view, from its grid arrays; None without a 224 view."""
    if "patch_224" not in store.ds.dims:
        return None
    rows, cols = grids.fixed_grid(store.ds, "224")
    size = int(store.manifest.get("arch", {}).get("patch") or VIEW // max(rows, cols))
    return int(rows), int(cols), size


def under(index: int, size: int, ref_size: int) -> int:
    """Row (or column) of a grid of ``size``-pixel patches under the centre of row ``index`` of ``ref_size``-pixel patches.

    The centre sits at (index + ½)·ref_size pixels; exact integer arithmetic, a centre on a border
    goes to the patch before it (ceil(centre / size) − 1).
    """
    return -((-(2 * index + 1) * ref_size) // (2 * size)) - 1


def follow_patches(stores: list[StoreView], patch: int) -> dict[str, Followed]:
    """The followed patch of every store with a 224 view; ``patch`` is read on the first such store's grid."""
    found = {s.label: g for s in stores if (g := store_grid(s)) is not None}
    if not found:
        return {}
    ref_label = next(iter(found))
    R0, C0, p0 = found[ref_label]
    if not 0 <= patch < R0 * C0:
        raise ProbeError(
            "--patch",
            f"{patch} is outside 0..{R0 * C0 - 1} of {ref_label}'s {R0} × {C0} grid (the first store's 224 view)",
            "pick a patch of that grid, patch = columns·row + column, 0 at the top left",
        )
    r0, c0 = divmod(patch, C0)
    out = {}
    for label, (R, C, p) in found.items():
        if label == ref_label:
            out[label] = Followed(R, C, p, patch, f"{label}: patch {patch} (row {r0}, column {c0}) of its {R} × {C} grid, as given by --patch")
            continue
        r, c = under(r0, p, p0), under(c0, p, p0)
        if not (0 <= r < R and 0 <= c < C):
            out[label] = Followed(
                R,
                C,
                p,
                None,
                f"{label}: follows no patch: the centre of patch {patch} of {ref_label} lies in pixels its {R} × {C} grid of {p}-pixel patches leaves unused",
            )
            continue
        out[label] = Followed(
            R,
            C,
            p,
            r * C + c,
            f"{label}: patch {r * C + c} (row {r}, column {c}) of its {R} × {C} grid, the one under the centre of patch {patch} of {ref_label}'s {R0} × {C0}",
        )
    return out
