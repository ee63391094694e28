"""DINOv2's register tokens in the attention figures: where the class token and each register look.

Darcet et al. 2024 ("Vision Transformers Need Registers", Fig. 9) show the last block's
attention of the class token and of each register over the patches, mean over heads: with
registers, the class token's map loses its high-norm artefact patches and the registers take
them. The figure is drawn from the stored rows (``attention_224``, prefix = class + registers).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from . import figures
from .followed import Attention


def register_maps(att: Attention, grid: int, title: str) -> bytes:
    """One map per prefix token (class token first, then each register), mean over heads, each to its own maximum."""
    prefix = att.start
    cls = prefix - att.registers
    names = (["class token"] if cls else []) + [f"register {r}" for r in range(att.registers)]
    fig = Figure(figsize=(2.3 * prefix + 0.6, 2.9), layout="constrained")
    axes = fig.subplots(1, prefix, squeeze=False)[0]
    image = None
    for q, (ax, name) in enumerate(zip(axes, names)):
        row = att.patch_rows(q).mean(0)
        top = float(row.max()) if row.size else 1.0
        image = figures.patch_map(ax, row / (top if top > 0 else 1.0), grid, figures.WEIGHT_CMAP, 0.0, 1.0)
        share = float(att.weights[:, q, prefix:].sum(-1).mean())
        ax.set_title(f"{name}: {100 * share:.0f} % on patches", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=list(axes), orientation="vertical", fraction=0.03, pad=0.02, label="weight / the map's largest")
    fig.suptitle(title, fontsize=10)
    return figures.png(fig)
