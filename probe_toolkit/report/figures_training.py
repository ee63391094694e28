"""The companion training runs' curves: each logged quantity (losses, positives and negatives
per anchor, θ, learning rate, EMA momentum, gradient norm, throughput) against the optimiser
step, one line per run in the store palette."""

from __future__ import annotations

import matplotlib
import matplotlib.ticker
from matplotlib.figure import Figure

from .figures import png, store_colour

CURVES = (
    ("loss", "total loss"),
    ("loss_image", "image loss L_global"),
    ("loss_patch", "patch loss"),
    ("loss_contrastive", "contrastive loss"),
    ("positives_per_anchor", "positives per anchor"),
    ("negatives_per_anchor", "negatives per anchor"),
    ("theta", "θ (batch median)"),
    ("lr_backbone", "learning rate, backbone"),
    ("momentum", "teacher EMA momentum"),
    ("grad_norm", "gradient norm (before clipping)"),
    ("images_per_s", "images per second"),
)


def training_curves(runs: dict[str, list[dict]]) -> bytes:
    """Each logged quantity against the optimiser step, one line per run (the title names it)."""
    present = [(field, label) for field, label in CURVES if any(field in r for rows in runs.values() for r in rows)]
    columns = min(3, max(1, len(present)))
    n_rows = -(-len(present) // columns)
    fig = Figure(figsize=(2.3 * columns + 0.3, 1.8 * n_rows + 0.7), layout="constrained")
    axes = fig.subplots(n_rows, columns, squeeze=False)
    for k in range(n_rows * columns):
        ax = axes[k // columns, k % columns]
        if k >= len(present):
            ax.set_visible(False)
            continue
        field, label = present[k]
        for i, (name, rows) in enumerate(runs.items()):
            points = [(r["step"], r[field]) for r in rows if field in r and r[field] is not None and "step" in r]
            if points:
                x, y = zip(*points)
                ax.plot(x, y, color=store_colour(i), linewidth=1.3, label=name, marker="o" if len(x) < 40 else None, markersize=3)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True, nbins=4))
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=4))
        if k // columns == n_rows - 1 or k + columns >= len(present):
            ax.set_xlabel("step", fontsize=9)
        ax.set_title(label, fontsize=9)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(2, len(names)), fontsize=9, frameon=False)
    return png(fig)
