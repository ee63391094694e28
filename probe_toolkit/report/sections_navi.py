"""The report's section for ``probe correspond`` on a NAVI panel: mbanani/probe3d's ten numbers per
store, the mean of its rotation bins, DINOv3's published number beside them (other weights, and which
of probe3d's numbers it is left open by its sources), and one pair's matches coloured by their 3-D
error, drawn from the record (``results/correspond-navi`` keeps the two views and every match)."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure as MplFigure

from . import figures
from .content import Note, Section, Table

PUBLISHED = (
    "NAVI correspondence, DINOv3 ViT-S/16: 56.3, ViT-L/16: 62.3 (facebookresearch/dinov3 MODEL_CARD.md; other weights). The model card "
    "refers to the paper for the protocol; which of probe3d's numbers (recall at 1, 2, 5 cm, at 5, 25, 50 px, or the rotation bins) it is "
    "was asked of the RADIO authors in NVlabs/RADIO#148 and is not stated in the public code: see docs/commands/correspond.md."
)
HOW = "run `probe correspond STORE --panel NAME` on a NAVI panel (`probe panel add NAME --navi DIR --role test`)"
LIMIT = 0.05  # metres: the colour scale's top (probe3d's largest threshold)


def _cell(v: float) -> str:
    return f"{v:.1f}" if np.isfinite(v) else "–"


def matches_drawing(
    source: np.ndarray, target: np.ndarray, source_uv: np.ndarray, target_uv: np.ndarray, error: np.ndarray, title: str, shown: int = 200
) -> figures.Drawing:
    """The two views side by side (``*_uv`` in their pixels), the first ``shown`` correspondences (the largest
    ratio-test weights) joined, each coloured by its 3-D error from 0 to ``LIMIT`` (and beyond: the scale's top colour)."""
    side = source.shape[1]
    fig = MplFigure(figsize=(7.0, 3.9), layout="constrained")
    ax = fig.subplots()
    ax.imshow(np.concatenate([source, target], axis=1))
    ax.axvline(side - 0.5, color="white", linewidth=1.0)
    colours = colormaps["viridis"]
    keep = np.flatnonzero(np.isfinite(error))[:shown]
    for k in keep:
        colour = colours(min(float(error[k]) / LIMIT, 1.0))
        (x0, y0), (x1, y1) = source_uv[k], target_uv[k]
        ax.plot([x0, side + x1], [y0, y1], color=colour, linewidth=0.6, alpha=0.8)
    mappable = ax.scatter([], [], c=[], cmap="viridis", vmin=0, vmax=LIMIT * 100)
    fig.colorbar(mappable, ax=ax, shrink=0.7, label="3-D error (cm)")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=8)
    return figures.png(fig)


def pair_figure(ctx, label: str, ds):
    if ds.sizes.get("shown", 0) == 0:
        return Note(f"{label}: no pair was scored, so no picture.", "missing")
    i = 0
    error = ds.error_3d.values[i]
    n = int(np.isfinite(error).sum())
    within = int((error[np.isfinite(error)] < 0.02).sum())
    half = ds.source_view.shape[1] / 512  # the record keeps every second pixel of the 512 views
    drawing = matches_drawing(
        ds.source_view.values[i],
        ds.target_view.values[i],
        ds.source_uv.values[i] * half,
        ds.target_uv.values[i] * half,
        error,
        f"{figures.wrap(label, 40)}: {ds.pair.values[i]}",
    )
    caption = (
        f"{label}: pair {ds.pair.values[i]} (relative rotation {float(ds.angle.values[i]):.0f}°), source {ds.source.values[i]} left, target "
        f"{ds.target.values[i]} right, each cut to the square around its object and resized to 512 px as probe3d does (shown at 256): the "
        f"200 correspondences of largest ratio-test weight joined, coloured by their 3-D error (yellow at {LIMIT * 100:g} cm or more); "
        f"{within} of the pair's {n} correspondences lie within 2 cm."
    )
    return ctx.figure("correspond-navi-pair", drawing, caption)


def navi(ctx) -> Section:
    section = Section("correspond-navi", "Multiview correspondence on NAVI (mbanani/probe3d evaluate_navi_correspondence.py)")
    found = {s.label: s.result("correspond-navi") for s in ctx.stores if s.result("correspond-navi") is not None}
    if not found:
        section.missing(f"No NAVI correspondence yet: {HOW}.")
        return section
    rows = []
    for label, ds in found.items():
        values = [*ds.recall_cm.values, *ds.recall_px.values, *ds.binned.values, float(ds.attrs.get("bins_mean", np.nan))]
        rows.append([label, *(_cell(float(v)) for v in values)])
    section.blocks.append(
        Table(
            ["store", "1 cm", "2 cm", "5 cm", "5 px", "25 px", "50 px", "2 cm 0-30°", "30-60°", "60-90°", "90-120°", "bins mean"],
            rows,
            "Recall (%) of the correspondences within each distance, over every pair; the 2 cm recall of each pair averaged per "
            "relative-rotation bin, as probe3d prints them, and the mean of the four bins.",
        )
    )
    for label, ds in found.items():
        counts = ds.attrs.get("counts", {})
        section.blocks.append(
            Note(
                f"{label}: {counts.get('pairs', '?')} pairs of {counts.get('images', '?')} images, {counts.get('correspondences', '?')} "
                f"correspondences; features — {ds.attrs.get('feature', '?')}. Labels: {ctx.book.describe(ds.attrs.get('ledger'))}."
            )
        )
        section.blocks.append(pair_figure(ctx, label, ds))
    section.blocks.append(Note(f"published elsewhere (other weights and data; not comparable with the numbers above): {PUBLISHED}", "reference"))
    return section
