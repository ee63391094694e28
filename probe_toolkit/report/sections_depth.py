"""The report section of linear depth (``results/linear-depth``): the NYUv2 metrics with the
schedule that produced them, beside the published RMSE of released weights (marked as other
weights), and the figure: the first val images, their ground truth, the trained head's prediction
and the absolute error at the valid pixels (Eigen crop, depth in range), with the training loss.
It reads only what ``probe depth`` saved after its ledgered read (the report opens no label file)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure as MplFigure

from . import figures
from .content import Figure, Note, Section, Table
from .sections_kit import lacking, results_section

HOW = "run `probe depth CHECKPOINT --train PANEL --val PANEL` (NYU panels: probe panel add NAME --nyu DIR)"
SHOWN = 3  # val images in the figure


def depth_maps(rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]], losses: np.ndarray) -> figures.Drawing:
    """Rows: a val photograph, its ground truth, the prediction (one depth scale, metres) and
    |truth − prediction| at the valid pixels (grey: not scored); a last row of the training loss."""
    fig = MplFigure(figsize=(8.4, 1.9 * max(len(rows), 1) + 1.6), layout="constrained")
    grid = fig.add_gridspec(len(rows) + 1, 4, height_ratios=[*([1.0] * len(rows)), 0.8])
    for r, (image_id, picture, truth, predicted, valid) in enumerate(rows):
        scored = np.where(valid, truth, np.nan)
        top = float(np.nanmax([np.nanmax(scored) if valid.any() else 0.0, np.nanmax(predicted)]))
        error = np.where(valid, np.abs(truth - predicted), np.nan)
        cells = (
            (picture, figures.wrap(image_id.rsplit("/", 1)[-1], 18), None),
            (scored, "ground truth (m)", "magma_r"),
            (predicted, "prediction (m)", "magma_r"),
            (error, "|error| (m)", "viridis"),
        )
        for c, (shown, title, cmap) in enumerate(cells):
            ax = fig.add_subplot(grid[r, c])
            if cmap is None:
                ax.imshow(shown)
            else:
                ax.set_facecolor("0.8")
                image = ax.imshow(shown, cmap=cmap, vmin=0, vmax=top if c < 3 else np.nanmax(error) if valid.any() else 1.0)
                fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
            ax.set_title(title, fontsize=7)
            ax.set_axis_off()
    ax = fig.add_subplot(grid[len(rows), :])
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8)
    ax.set_xlabel("iteration", fontsize=7)
    ax.set_ylabel("SigLoss", fontsize=7)
    ax.tick_params(labelsize=6)
    return figures.png(fig)


def _value(metric: str, v) -> str:
    from ..results.tables_depth import value

    return value(metric, float(v))


def depth(ctx) -> Section:
    from ..analyses.depth_published import PUBLISHED
    from ..results.tables_depth import SHOWN as COLUMNS

    section, found = results_section(ctx, "linear-depth", "Linear depth on NYUv2 (DINOv3 / DINOv2 linear head)", "linear-depth", "linear depth results", HOW)
    for label, (_store, ds) in found.items():
        schedule, settings = ds.attrs.get("schedule", {}), ds.attrs.get("settings", {})
        preset = settings.get("preset", "dinov3")
        rows = [[f"{label} ({schedule.get('label', '?')})", *(_value(m, ds[m].values) for m, _ in COLUMNS)]]
        rows += [[f"published, other weights: {name}", f"{rmse:.3f}", *("–" for _ in COLUMNS[1:])] for name, p, rmse in PUBLISHED if p == preset]
        counts, pan, led = ds.attrs.get("counts", {}), ds.attrs.get("panels", {}), ds.attrs.get("ledger", {})
        section.blocks.append(
            Table(
                ["", *(h for _, h in COLUMNS)],
                rows,
                f"{label}: preset {preset}, {pan.get('train', {}).get('name', '?')} ({counts.get('train', '?')} images, "
                f"{schedule.get('iterations', '?')} iterations of {schedule.get('batch', '?')} crops of "
                f"{'×'.join(map(str, settings.get('crop', ['?'])))} px) → {pan.get('val', {}).get('name', '?')} "
                f"({counts.get('val', '?')} images{', with their mirror' if settings.get('tta', True) else ''}); Eigen crop, depth in "
                f"(0.001, 10) m, metrics per image averaged over images; δ in %."
                + (
                    ""
                    if not schedule.get("unpublished_settings")
                    else " Settings other than the published: " + ", ".join(f"{k} {v}" for k, v in schedule["unpublished_settings"].items()) + "."
                )
                + " Published rows: released weights on the full data set with the published settings, not this network.",
            )
        )
        section.blocks.append(
            Note(
                f"{label}: features — {ds.attrs.get('feature', '?')}; head — 1×1 convolution to 256 bins over [0.001, 10] m "
                f"(AdaBins' linear normalisation), AdamW lr {settings.get('lr', '?')} weight decay {settings.get('weight_decay', '?')}, "
                f"{schedule.get('kind', '?')} schedule, warm-up {schedule.get('warmup', '?')}; labels: train "
                f"{ctx.book.describe(led.get('train'))}; val {ctx.book.describe(led.get('val'))}."
            )
        )
        if ds.sizes.get("shown", 0):
            section.blocks.append(_figure(ctx, ds, label))
    return lacking(section, ctx, found, "linear depth results", HOW)


def _figure(ctx, ds, label: str) -> Figure:
    sizes = ds.attrs.get("sizes") or [list(ds.truth.shape[1:])] * ds.sizes["shown"]
    rows = []
    for j, image_id in enumerate(str(v) for v in ds.shown.values[:SHOWN]):
        h, w = sizes[j]
        rows.append((image_id, ds.picture.values[j, :h, :w], ds.truth.values[j, :h, :w], ds.prediction.values[j, :h, :w], ds.valid.values[j, :h, :w].astype(bool)))
    caption = (
        f"{label}: the first {len(rows)} val images of results/linear-depth, their ground truth, the trained head's prediction "
        f"(one scale per row, metres) and its absolute error at the scored pixels (Eigen crop, depth in range; grey: not scored), "
        f"and the training loss per iteration."
    )
    return ctx.figure("linear-depth", depth_maps(rows, ds.loss.values), caption)
