"""The report's section for ``probe correspond``: PCK by viewpoint bin beside the published number
(other weights), and one pair's matched keypoints drawn from the saved record (nothing recomputed:
the keypoints, predictions and errors are ``results/correspond``'s; the pictures are the square800
view of the image files, made as extraction makes it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure as MplFigure
from PIL import Image

from . import figures
from .content import Note, Section, Table
from .sources import shown_path

PUBLISHED = (
    "SPair-71k keypoint correspondence, DINOv3 ViT-S/16: 50.4 (facebookresearch/dinov3 MODEL_CARD.md; its own protocol, "
    "other weights). mbanani/probe3d reports PCK@0.10 of the target box by viewpoint bin for its backbones (El Banani et al., CVPR 2024)."
)
HOW = "run `probe correspond STORE --panel NAME` on a SPair-71k panel (its store extracted with `--views square800`)"
BIN_TITLES = {"0": "viewpoint 0", "1": "viewpoint 1", "2": "viewpoint 2", "all": "all pairs"}


def _cell(v: float) -> str:
    return f"{v:.1f}" if np.isfinite(v) else "–"


def square_picture(path: Path, side: int = 800) -> np.ndarray:
    """The square800 view's pixels (white-padded square, bicubic to ``side``), before normalisation."""
    from ..store.images import load_image

    image = load_image(path)
    big = max(image.size)
    canvas = Image.new("RGB", (big, big), (255, 255, 255))
    canvas.paste(image, (0, 0))
    return np.asarray(canvas.resize((side, side), Image.Resampling.BICUBIC))


def matches_drawing(
    source: np.ndarray, target: np.ndarray, source_xy: np.ndarray, target_xy: np.ndarray, predicted: np.ndarray, error: np.ndarray, threshold: float, title: str
) -> figures.Drawing:
    """Source and target side by side: each scored keypoint joined to its match in the target,
    green when within ``threshold`` of the box (a hit), red otherwise; the true target keypoint ringed."""
    side = source.shape[1]
    fig = MplFigure(figsize=(7.0, 3.8), layout="constrained")
    ax = fig.subplots()
    ax.imshow(np.concatenate([source, target], axis=1))
    ax.axvline(side - 0.5, color="black", linewidth=1.0)  # the white padding of one view must not run into the other
    for k in np.flatnonzero(np.isfinite(error)):
        hit = error[k] < threshold
        colour = "#009E73" if hit else "#D55E00"
        px, py = predicted[k] * side
        ax.plot([source_xy[k, 0], side + px], [source_xy[k, 1], py], color=colour, linewidth=1.1)
        ax.scatter([source_xy[k, 0]], [source_xy[k, 1]], s=14, color=colour)
        ax.scatter([side + target_xy[k, 0]], [target_xy[k, 1]], s=40, facecolors="none", edgecolors="white", linewidths=1.2, zorder=2)
        ax.scatter([side + px], [py], s=30, color="black", marker="x", linewidths=2.4, zorder=3)  # the match: above the ring, edged
        ax.scatter([side + px], [py], s=24, color=colour, marker="x", linewidths=1.3, zorder=4)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=8)
    return figures.png(fig)


def pair_figure(ctx, label: str, ds):
    """The first pair of the first category's 'all' sample, or a line saying why there is none."""
    main = list(ds.threshold.values).index(0.1) if 0.1 in list(ds.threshold.values) else 0
    sampled = np.flatnonzero(ds.sampled.sel(bin="all").values)
    if not sampled.size:
        return Note(f"{label}: no pair was matched, so no picture.", "missing")
    i = int(sampled[0])
    source_dir = Path(str(ds.attrs.get("image_source", "")))
    src, trg = str(ds.source.values[i]), str(ds.target.values[i])
    gone = [p for p in (source_dir / src, source_dir / trg) if not p.is_file()]
    if gone:
        return Note(f"{label}: no picture of pair {ds.pair.values[i]}: {shown_path(gone[0])} is gone.", "missing")
    threshold = float(ds.threshold.values[main])
    error = ds.error.values[i]
    hits = int((error[np.isfinite(error)] < threshold).sum())
    scored = int(np.isfinite(error).sum())
    drawing = matches_drawing(
        square_picture(source_dir / src),
        square_picture(source_dir / trg),
        ds.source_xy.values[i],
        ds.target_xy.values[i],
        ds.predicted.values[i],
        error,
        threshold,
        f"{figures.wrap(label, 40)}: {ds.pair.values[i]}",
    )
    caption = (
        f"{label}: pair {ds.pair.values[i]} ({ds.pair_category.values[i]}, viewpoint {int(ds.viewpoint.values[i])}), source {src} left, "
        f"target {trg} right, both in the square800 view: each keypoint annotated in both joined to the target patch its token matched "
        f"(×), green within {threshold:g} of the target box's larger side ({hits} of {scored}), red beyond; white rings: the annotated targets."
    )
    return ctx.figure("correspond-pair", drawing, caption)


def correspond(ctx) -> Section:
    section = Section("correspond", "Keypoint correspondence on SPair-71k (mbanani/probe3d evaluate_spair_correspondence.py)")
    found = {s.label: s.result("correspond") for s in ctx.stores if s.result("correspond") is not None}
    if not found:
        section.missing(f"No keypoint correspondence yet: {HOW}.")
        return section
    bins = ["0", "1", "2", "all"]
    rows = []
    for label, ds in found.items():
        for t, threshold in enumerate(ds.threshold.values):
            rows.append([label, f"{float(threshold):g}", *[_cell(float(ds.pck_mean.sel(bin=b).values[t])) for b in bins]])
    section.blocks.append(
        Table(
            ["store", "PCK@", *[BIN_TITLES[b] for b in bins]],
            rows,
            "Percent of keypoints matched within the threshold × the target box's larger side; mean over the categories with pairs, "
            "each category's sample of pairs per viewpoint bin drawn as probe3d draws it.",
        )
    )
    for label, ds in found.items():
        main = list(ds.threshold.values).index(0.1) if 0.1 in list(ds.threshold.values) else 0
        per = [[str(c), *[_cell(float(ds.pck.sel(category=c, bin=b).values[main])) for b in bins]] for c in ds.category.values]
        counts = ds.attrs.get("counts", {})
        section.blocks.append(
            Table(
                ["category", *[BIN_TITLES[b] for b in bins]],
                per,
                f"{label}: PCK@{float(ds.threshold.values[main]):g} per category, on panel {ds.attrs.get('panel', {}).get('name', '?')} "
                f"({counts.get('pairs_matched', '?')} of {counts.get('pairs_in_panel', '?')} pairs, "
                f"{counts.get('keypoints_scored', '?')} keypoints).",
            )
        )
        section.blocks.append(
            Note(
                f"{label}: view — {ds.attrs.get('view_text', '?')}; features — {ds.attrs.get('feature', '?')}; tokens "
                f"{ds.attrs.get('tokens_dtype', '?')}. Labels: {ctx.book.describe(ds.attrs.get('ledger'))}."
            )
        )
        section.blocks.append(pair_figure(ctx, label, ds))
    section.blocks.append(Note(f"published elsewhere (other weights and data; not comparable with the numbers above): {PUBLISHED}", "reference"))
    missing = [s.label for s in ctx.stores if s.label not in found]
    if missing:
        section.missing(f"No keypoint correspondence for {', '.join(missing)}: {HOW}.")
    return section
