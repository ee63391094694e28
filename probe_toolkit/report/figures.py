"""The report's figures: pure functions, numpy arrays in, PNG bytes out (matplotlib, Agg).

One home for how a patch grid is drawn (``patch_map``, ``outline``, ``grid_lines``), for the
colour map of each quantity and for the store palette, so that every map of the report reads
the same way; the interactive explorer takes its colour tables from the same colour maps
(``colour_table``). Figures are built on ``matplotlib.figure.Figure`` and drawn by the Agg
canvas explicitly, never through pyplot, so nothing depends on a global backend or display,
and no figure stays open.

Colours: attention weights use ``inferno`` (perceptually uniform, brighter = more weight, as the
course draws them); cosine uses ``RdBu_r`` on the fixed range [-1, 1] (a diverging map that
stays readable with the common colour-vision deficiencies); shares use ``viridis``. Stores and
masks take the Okabe–Ito palette. Marks are told apart by line style and luminance, not hue alone.
"""

from __future__ import annotations

import io
from typing import Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

WEIGHT_CMAP = "inferno"
COSINE_CMAP = "RdBu_r"
SHARE_CMAP = "viridis"
# Okabe & Ito (2008): distinguishable under the common colour-vision deficiencies
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
TOP_COLOUR = "#56B4E9"  # the five largest weights: sky blue, bright against inferno's dark end
DPI = 100


def store_colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def colour_table(name: str) -> bytes:
    """256 RGB triplets (768 bytes) of a matplotlib colour map, for the explorer's canvases."""
    cmap = matplotlib.colormaps[name]
    rgb = (cmap(np.linspace(0.0, 1.0, 256))[:, :3] * 255.0 + 0.5).astype(np.uint8)
    return rgb.tobytes()


def png(fig: Figure) -> bytes:
    out = io.BytesIO()
    FigureCanvasAgg(fig)  # the Agg canvas, whatever matplotlib's default backend is
    fig.savefig(out, format="png", dpi=DPI, bbox_inches="tight")
    return out.getvalue()


def image_png(rgb: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 picture as PNG bytes (the explorer's background)."""
    out = io.BytesIO()
    Image.fromarray(np.asarray(rgb, dtype=np.uint8)).save(out, format="PNG", optimize=True)
    return out.getvalue()


# ----------------------------------------------------------------------------------------------
# the shared grid helpers: patch p of a G × G grid is the unit square at column p % G, row p // G


def patch_map(ax, values: np.ndarray, grid: int, cmap: str, vmin: float | None = None, vmax: float | None = None, labels: bool = False):
    """Draw one value per patch, row-major, on the [0, G] × [0, G] square (patch p at (p % G, p // G))."""
    image = ax.imshow(np.asarray(values, dtype=np.float32).reshape(grid, grid), cmap=cmap, vmin=vmin, vmax=vmax,
                      extent=(0, grid, grid, 0), interpolation="nearest")
    if labels:
        ticks = list(range(0, grid, max(1, grid // 7)))
        ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=7)
        ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=7)
        ax.set_xlabel("column")
        ax.set_ylabel("row")
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    return image


def outline(ax, patches: Sequence[int], grid: int, colour: str, width: float = 1.5, style: str = "-") -> None:
    """Outline patches (negative indices, such as the class token, are skipped)."""
    for p in patches:
        p = int(p)
        if p < 0:
            continue
        ax.add_patch(Rectangle((p % grid, p // grid), 1, 1, fill=False, edgecolor=colour, linewidth=width, linestyle=style))


def grid_lines(ax, grid: int, colour: str = "white", alpha: float = 0.5, width: float = 0.5) -> None:
    for k in range(1, grid):
        ax.axhline(k, color=colour, alpha=alpha, linewidth=width)
        ax.axvline(k, color=colour, alpha=alpha, linewidth=width)


def _picture(ax, rgb: np.ndarray, grid: int) -> None:
    ax.imshow(rgb, extent=(0, grid, grid, 0), interpolation="bilinear")
    ax.set_xlim(0, grid)
    ax.set_ylim(grid, 0)


# ----------------------------------------------------------------------------------------------
# the followed image


def followed_image(rgb: np.ndarray, grid: int, patch: int, title: str) -> bytes:
    """The 224 view with its G × G grid, every patch's number, and the followed patch outlined."""
    import matplotlib.patheffects as effects

    fig = Figure(figsize=(7, 7))
    ax = fig.add_subplot()
    _picture(ax, rgb, grid)
    grid_lines(ax, grid, alpha=0.6)
    halo = [effects.withStroke(linewidth=1.5, foreground="black")]
    for p in range(grid * grid):
        ax.text(p % grid + 0.5, p // grid + 0.5, str(p), ha="center", va="center", fontsize=7 if grid <= 14 else 5,
                color="white", path_effects=halo)
    outline(ax, [patch], grid, "#F0E442", width=3)
    ticks = list(range(grid))
    ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=7)
    ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=7)
    ax.set_xlabel("column c")
    ax.set_ylabel("row r  (patch = G·r + c)")
    ax.set_title(title)
    return png(fig)


def tokens_picture(tokens: np.ndarray, grid: int, size: int = 224) -> np.ndarray:
    """A stand-in for a missing image file: the tokens' first three principal components as RGB."""
    x = np.asarray(tokens, dtype=np.float64)
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    comps = x @ vt[:3].T
    if comps.shape[1] < 3:
        comps = np.pad(comps, ((0, 0), (0, 3 - comps.shape[1])))
    low, high = comps.min(0), comps.max(0)
    rgb = (comps - low) / np.where(high > low, high - low, 1.0)
    cells = (rgb.reshape(grid, grid, 3) * 255.0 + 0.5).astype(np.uint8)
    return np.asarray(Image.fromarray(cells).resize((size, size), Image.Resampling.NEAREST))


# ----------------------------------------------------------------------------------------------
# attention


def _weight_map(ax, row: np.ndarray, grid: int, tops: Sequence[int], patch: int | None, title: str, labels: bool = False):
    top = float(np.max(row)) if row.size else 1.0
    image = patch_map(ax, row / (top if top > 0 else 1.0), grid, WEIGHT_CMAP, 0.0, 1.0, labels=labels)
    outline(ax, tops, grid, TOP_COLOUR, width=1.6 if not labels else 2.2)
    if patch is not None:
        outline(ax, [patch], grid, "white", width=1.2, style="--")
    ax.set_title(title, fontsize=8 if not labels else 10)
    return image


def attention_rows(
    rows: np.ndarray, tops: np.ndarray, effective: np.ndarray, grid: int, patch: int | None, title: str,
    cls_weight: np.ndarray | None = None,
) -> bytes:
    """One row of attention: the mean over heads in a large map, each head in a small map.

    ``rows`` (head, N) are the weights on the N patch keys, ``tops`` (head, 5) the five largest
    keys of each head (patch indices, -1 for the class token), ``effective`` (head,) each row's e^H,
    ``cls_weight`` (head,) the weight the row puts on the class token. Every map is scaled to its
    own largest weight (brightest = largest); the largest weights are outlined in sky blue and
    the followed patch is dashed white.
    """
    heads = rows.shape[0]
    columns = max(1, -(-heads // 2))
    fig = Figure(figsize=(3.8 + 2.0 * columns, 4.6), layout="constrained")
    spec = fig.add_gridspec(2, 2 + columns)
    big = fig.add_subplot(spec[:, :2])
    mean = rows.mean(0)
    order = np.argsort(-mean, kind="stable")[:5]
    image = _weight_map(big, mean, grid, order, patch, "mean over heads", labels=True)
    for h in range(heads):
        ax = fig.add_subplot(spec[h // columns, 2 + h % columns])
        extra = f", [CLS] {cls_weight[h]:.2f}" if cls_weight is not None else ""
        _weight_map(ax, rows[h], grid, tops[h], patch, f"head {h}: e^H {effective[h]:.1f}{extra}")
    fig.colorbar(image, ax=big, orientation="horizontal", fraction=0.05, pad=0.02, label="weight / the map's largest weight")
    fig.suptitle(title, fontsize=10)
    return png(fig)


def block_rows(rows: np.ndarray, effective: np.ndarray, blocks: Sequence[int], grid: int, patch: int, title: str) -> bytes:
    """The followed patch's row in every block (rows) and head (columns), each map to its own maximum."""
    n_blocks, heads = rows.shape[:2]
    fig = Figure(figsize=(1.3 * heads + 0.8, 1.45 * n_blocks + 0.4), layout="constrained")
    axes = fig.subplots(n_blocks, heads, squeeze=False)
    for b in range(n_blocks):
        for h in range(heads):
            ax = axes[b, h]
            row = rows[b, h]
            tops = np.argsort(-row, kind="stable")[:5]
            _weight_map(ax, row, grid, tops, patch, (f"head {h}: " if b == 0 else "") + f"e^H {effective[b, h]:.1f}")
            if h == 0:
                ax.set_ylabel(f"block {blocks[b]}", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return png(fig)


def effective_histograms(per_store: dict[str, np.ndarray], keys: dict[str, int], marks: Sequence[tuple[float, str]] = ()) -> bytes:
    """Per head, the distribution over images of the mean e^H of a patch row, stores overlaid.

    ``per_store`` maps a store label to its (image, head) array; ``keys`` to its T (the row
    length, the largest possible e^H); ``marks`` are (share of T, label) reference lines.
    """
    heads = max(v.shape[1] for v in per_store.values())
    columns = min(heads, 3)
    rows = -(-heads // columns)
    fig = Figure(figsize=(3.4 * columns, 2.6 * rows + 0.4))
    axes = fig.subplots(rows, columns, squeeze=False)
    top = max(keys.values())
    bins = np.linspace(1.0, float(top), 25)
    for h in range(rows * columns):
        ax = axes[h // columns, h % columns]
        if h >= heads:
            ax.set_visible(False)
            continue
        for i, (label, values) in enumerate(per_store.items()):
            if h < values.shape[1]:
                ax.hist(values[:, h], bins=bins, histtype="step", linewidth=1.6, color=store_colour(i), label=label)
        for share, text in marks:
            ax.axvline(share * top, color="0.4", linestyle=":", linewidth=1)
            ax.text(share * top, ax.get_ylim()[1] * 0.95, text, rotation=90, fontsize=6, va="top", ha="right", color="0.3")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("mean e^H of a patch row (tokens)", fontsize=8)
        ax.set_ylabel("images", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    fig.suptitle("How many patches a row is worth: e^H, per image (mean over its patch rows)", fontsize=10)
    fig.tight_layout()
    return png(fig)


def block_spread(per_store: dict[str, np.ndarray], blocks: dict[str, Sequence[int]]) -> bytes:
    """Mean e^H of the patch rows per block, one line per head, one panel per store."""
    n = len(per_store)
    fig = Figure(figsize=(4.2 * n, 3.2))
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, (label, values) in zip(axes, per_store.items()):
        for h in range(values.shape[1]):
            ax.plot(blocks[label], values[:, h], marker="o", markersize=3, color=PALETTE[h % len(PALETTE)], label=f"head {h}")
        ax.set_xlabel("block")
        ax.set_ylabel("mean e^H of a patch row (tokens)")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return png(fig)


# ----------------------------------------------------------------------------------------------
# neighbours


def cosine_maps(maps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], grid: int, anchor: int, window: np.ndarray) -> bytes:
    """Cosine of the anchor's token to every patch, one panel per store.

    ``maps``: (label, cosine (N,), top k of the window (k,), top 8 of the crop (8,)). Marks: the
    anchor (white ×), its 3×3 window with SelfPatch's wrap (dashed), the window's top k (thick
    black), and the crop's 8 most similar (black dots: the ones outside the window are the
    course's point in §4.8).
    """
    n = len(maps)
    fig = Figure(figsize=(4.0 * n + 0.8, 4.3))
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, (label, cos, topk, top8) in zip(axes, maps):
        image = patch_map(ax, cos, grid, COSINE_CMAP, -1.0, 1.0, labels=True)
        outline(ax, window, grid, "black", width=1.0, style="--")
        outline(ax, topk, grid, "black", width=2.6)
        for p in top8:
            ax.plot(p % grid + 0.5, p // grid + 0.5, "o", color="black", markersize=3.5)
        ax.plot(anchor % grid + 0.5, anchor // grid + 0.5, "x", color="white", markersize=9, markeredgewidth=2.5)
        inside = len(set(int(p) for p in top8) & set(int(p) for p in window))
        ax.set_title(f"{label}\ntop {len(top8)} of the crop in the window: {inside} of {len(top8)}", fontsize=9)
    fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label="cosine to the anchor's token")
    return png(fig)


def share_maps(per_store: dict[str, np.ndarray], grid: int, title: str, label: str) -> bytes:
    """One value in [0, 1] per anchor position, one panel per store (e.g. top 8 inside the window)."""
    n = len(per_store)
    fig = Figure(figsize=(3.8 * n + 0.8, 3.9))
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, (name, values) in zip(axes, per_store.items()):
        image = patch_map(ax, values, grid, SHARE_CMAP, 0.0, 1.0, labels=True)
        ax.set_title(name, fontsize=9)
    fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label=label)
    fig.suptitle(title, fontsize=10)
    return png(fig)


# ----------------------------------------------------------------------------------------------
# decoder masks


def mask_overlays(pictures: list[tuple[str, np.ndarray]], masks: dict[str, list[np.ndarray | None]]) -> bytes:
    """Images (rows) × stores (columns): each decoder mask filled in its own colour over the image.

    ``pictures``: (image id, RGB at display size); ``masks[label][i]``: (masks, H, W) bool at that
    display size, or None when the store has no decoder result for the image.
    """
    n_rows, n_cols = len(pictures), len(masks)
    fig = Figure(figsize=(3.2 * n_cols, 2.8 * n_rows + 0.3))
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for c, (label, per_image) in enumerate(masks.items()):
        for r, (image_id, rgb) in enumerate(pictures):
            ax = axes[r, c]
            ax.imshow(rgb)
            found = per_image[r]
            if found is None:
                ax.text(0.5, 0.5, "no decoder result", transform=ax.transAxes, ha="center", color="white",
                        bbox=dict(facecolor="black", alpha=0.6))
            else:
                for k, mask in enumerate(found):
                    colour = matplotlib.colors.to_rgb(PALETTE[(k + 1) % len(PALETTE)])
                    overlay = np.zeros((*mask.shape, 4))
                    overlay[mask] = (*colour, 0.5)
                    ax.imshow(overlay)
                    if mask.any():
                        ax.contour(mask.astype(float), levels=[0.5], colors=[colour], linewidths=1.5)
            ax.set_xticks([])
            ax.set_yticks([])
            n = 0 if found is None else len(found)
            ax.set_title(f"{label}\n{image_id}: {n} mask{'s' if n != 1 else ''}" if r == 0 else f"{image_id}: {n} mask{'s' if n != 1 else ''}", fontsize=8)
    fig.tight_layout()
    return png(fig)


# ----------------------------------------------------------------------------------------------
# training

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
    """Each logged quantity against the optimiser step, one line per run."""
    present = [(field, label) for field, label in CURVES if any(field in r for rows in runs.values() for r in rows)]
    columns = min(3, max(1, len(present)))
    n_rows = -(-len(present) // columns)
    fig = Figure(figsize=(4.0 * columns, 2.7 * n_rows + 0.3))
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
        ax.set_xlabel("step")
        ax.set_ylabel(label, fontsize=8)
        ax.set_title(label, fontsize=9)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return png(fig)
