"""The report's figures: pure functions, numpy arrays in, PNG bytes out (matplotlib, Agg).

One home for how a patch grid is drawn (``patch_map``, ``outline``, ``grid_lines``), for the
colour map of each quantity and for the store palette, so that every map of the report reads
the same way; the interactive explorer takes its colour tables from the same colour maps
(``colour_table``). Figures are built on ``matplotlib.figure.Figure`` and drawn by the Agg
canvas explicitly, never through pyplot, so nothing depends on a global backend or display,
and no figure stays open.

Colours, one colour-blind-safe scheme per quantity in every figure: attention weights use
``inferno`` (perceptually uniform, brighter = more weight) on one scale per figure, starting at
0, so a near-uniform row looks uniform; cosine uses ``RdBu_r`` on the fixed range [-1, 1];
shares and Fiedler vectors use ``viridis`` / ``cividis``; stores take the Okabe–Ito palette
(Okabe & Ito 2008), heads Paul Tol's "bright" scheme, masks Tol's "vibrant" one. Marks are also
told apart by line style and luminance, not hue alone.

Print size. Every figure is rendered so that, shrunk to a single column (3.5 in), no text is
below 6 pt (``legible``: text smaller than that is enlarged before saving). ``png`` returns the
PNG bytes together with the figure (``Drawing``), so the report can write the same figure as
PDF and SVG beside it.
"""

from __future__ import annotations

import io
from typing import Sequence

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

WEIGHT_CMAP = "inferno"
COSINE_CMAP = "RdBu_r"
SHARE_CMAP = "viridis"
FIEDLER_CMAP = "cividis"
# Okabe & Ito (2008): distinguishable under the common colour-vision deficiencies (stores)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
# Paul Tol's "bright" (heads) and "vibrant" (masks) schemes, also colour-blind safe
HEAD_PALETTE = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#BBBBBB")
HEAD_STYLES = ("-", "--", ":", "-.")
MASK_PALETTE = ("#EE7733", "#0077BB", "#33BBEE", "#EE3377", "#CC3311", "#009988")
TRUTH_COLOUR = "#FFFFFF"  # ground-truth outlines: white, dashed, over a dark halo
TOP_COLOUR = "#56B4E9"  # the five largest weights: sky blue, bright against inferno's dark end
DPI = 150
COLUMN_IN = 3.5  # a single column of a two-column paper
MIN_PT = 6.0  # the smallest text allowed once the figure is shrunk to one column
FORMATS = ("png", "pdf", "svg")


def store_colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def wrap(label: str, width: int = 22) -> str:
    """A store label or image id broken at its slashes so that it fits over one small panel."""
    if len(label) <= width:
        return label
    parts, lines = label.split("/"), [""]
    for part in parts:
        piece = part if not lines[-1] else "/" + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append(piece)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def head_style(h: int) -> dict:
    """Colour and line style of head ``h`` (styles cycle once the colours run out)."""
    return {"color": HEAD_PALETTE[h % len(HEAD_PALETTE)], "linestyle": HEAD_STYLES[(h // len(HEAD_PALETTE)) % len(HEAD_STYLES)]}


def colour_table(name: str) -> bytes:
    """256 RGB triplets (768 bytes) of a matplotlib colour map, for the explorer's canvases."""
    cmap = matplotlib.colormaps[name]
    rgb = (cmap(np.linspace(0.0, 1.0, 256))[:, :3] * 255.0 + 0.5).astype(np.uint8)
    return rgb.tobytes()


class Drawing(bytes):
    """PNG bytes that still hold their figure, so it can be saved again as PDF or SVG."""

    figure: Figure

    def vector(self, fmt: str) -> bytes:
        out = io.BytesIO()
        self.figure.savefig(out, format=fmt, dpi=DPI, bbox_inches="tight", metadata={"Date": None} if fmt in ("pdf", "svg") else None)
        return out.getvalue()


def smallest_text(fig: Figure) -> float:
    """The smallest font size (pt) of the figure's visible text once shrunk to one column."""
    from matplotlib.text import Text

    scale = COLUMN_IN / fig.get_figwidth()
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t.get_gid() != "dense"]
    return min(sizes, default=MIN_PT / scale) * scale


def legible(fig: Figure) -> None:
    """Enlarge any text that would be under ``MIN_PT`` at one column's width (dense grid labels excepted)."""
    from matplotlib.text import Text

    floor = MIN_PT * fig.get_figwidth() / COLUMN_IN
    fig.draw_without_rendering()  # tick labels exist only once the figure has been laid out
    for t in fig.findobj(Text):
        if t.get_text().strip() and t.get_gid() != "dense" and t.get_fontsize() < floor:
            t.set_fontsize(floor)


def png(fig: Figure) -> Drawing:
    out = io.BytesIO()
    FigureCanvasAgg(fig)  # the Agg canvas, whatever matplotlib's default backend is
    legible(fig)
    fig.savefig(out, format="png", dpi=DPI, bbox_inches="tight")
    drawing = Drawing(out.getvalue())
    drawing.figure = fig
    return drawing


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

    fig = Figure(figsize=(4.6, 4.8))
    ax = fig.add_subplot()
    _picture(ax, rgb, grid)
    grid_lines(ax, grid, alpha=0.6)
    halo = [effects.withStroke(linewidth=1.5, foreground="black")]
    for p in range(grid * grid):  # numbers of a grid finer than 16 × 16 are too dense to print large
        ax.text(p % grid + 0.5, p // grid + 0.5, str(p), ha="center", va="center", fontsize=8 if grid <= 16 else 3,
                color="white", path_effects=halo, gid=None if grid <= 16 else "dense")
    outline(ax, [patch], grid, "#F0E442", width=3)
    ticks = list(range(0, grid, 1 if grid <= 16 else 4))
    ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=8)
    ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=8)
    ax.set_xlabel("column c")
    ax.set_ylabel("row r  (patch = G·r + c)")
    ax.set_title(title)
    return png(fig)


def principal_rgb(token_sets: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The first three principal components of every patch token of a set of images, as RGB.

    One PCA over all the images' tokens together (as DINOv2's and dino-vit-features' figures
    do), so a colour means the same direction in every image of the set; each component is
    signed so that its largest projection is positive and scaled to [0, 1] over the set.
    Returns each image's (N, 3) colours and the three components' shares of the variance.
    """
    x = np.concatenate([np.asarray(t, dtype=np.float64) for t in token_sets])
    x = x - x.mean(0)
    _, sv, vt = np.linalg.svd(x, full_matrices=False)
    comps = x @ vt[:3].T
    comps *= np.where(comps[np.abs(comps).argmax(0), range(comps.shape[1])] < 0, -1.0, 1.0)
    if comps.shape[1] < 3:
        comps = np.pad(comps, ((0, 0), (0, 3 - comps.shape[1])))
    low, high = comps.min(0), comps.max(0)
    rgb = (comps - low) / np.where(high > low, high - low, 1.0)
    share = (sv[:3] ** 2) / max(float((sv**2).sum()), 1e-300)
    bounds = np.cumsum([0] + [len(t) for t in token_sets])
    return [rgb[bounds[i]:bounds[i + 1]] for i in range(len(token_sets))], np.pad(share, (0, 3 - share.size))


def tokens_picture(tokens: np.ndarray, grid: int, size: int = 224) -> np.ndarray:
    """A stand-in for a missing image file: the tokens' first three principal components as RGB."""
    (rgb,), _ = principal_rgb([tokens])
    cells = (rgb.reshape(grid, grid, 3) * 255.0 + 0.5).astype(np.uint8)
    return np.asarray(Image.fromarray(cells).resize((size, size), Image.Resampling.NEAREST))


def pca_grids(pictures: list[tuple[str, np.ndarray | None]], per_store: dict[str, tuple[list[np.ndarray | None], np.ndarray]], grid: int) -> bytes:
    """Images (rows): the picture, then each store's PCA colours of its patch tokens (columns).

    ``per_store[label]`` = (per image (N, 3) colours or None, the components' variance shares).
    """
    n_rows, n_cols = len(pictures), 1 + len(per_store)
    fig = Figure(figsize=(1.75 * n_cols + 0.2, 1.75 * n_rows + 0.5), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for r, (image_id, rgb) in enumerate(pictures):
        ax = axes[r, 0]
        if rgb is not None:
            ax.imshow(rgb)
        ax.set_title(image_id.rsplit("/", 1)[-1], fontsize=8)
        for c, (label, (colours, share)) in enumerate(per_store.items(), 1):
            ax = axes[r, c]
            if colours[r] is not None:
                ax.imshow(colours[r].reshape(grid, grid, 3), interpolation="nearest")
            if r == 0:
                ax.set_title(f"{wrap(label)}\nPC 1–3: {100 * share.sum():.0f} % of var.", fontsize=8)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    return png(fig)


# ----------------------------------------------------------------------------------------------
# attention


def weight_scale(*rows: np.ndarray) -> float:
    """One upper end for every attention map of a figure (or a section): the largest weight shown."""
    top = max((float(np.max(r)) for r in rows if np.size(r)), default=1.0)
    return top if top > 0 else 1.0


def _weight_map(ax, row: np.ndarray, grid: int, tops: Sequence[int], patch: int | None, title: str, vmax: float, labels: bool = False):
    image = patch_map(ax, row, grid, WEIGHT_CMAP, 0.0, vmax, labels=labels)
    outline(ax, tops, grid, TOP_COLOUR, width=1.6 if not labels else 2.2)
    if patch is not None:
        outline(ax, [patch], grid, "white", width=1.2, style="--")
    ax.set_title(title, fontsize=9 if not labels else 10)
    return image


def _weight_bar(fig, image, axes, n_keys: int, **where) -> None:
    """The colour bar of the weights, in weight units, with the uniform row 1/N marked."""
    bar = fig.colorbar(image, ax=axes, label="attention weight", **where)
    uniform = 1.0 / max(n_keys, 1)
    if uniform <= image.norm.vmax:
        (bar.ax.axvline if bar.orientation == "horizontal" else bar.ax.axhline)(uniform, color="white", linewidth=1.5, linestyle="--")
        bar.ax.text(*((uniform, 1.15) if bar.orientation == "horizontal" else (1.6, uniform)), f"uniform 1/{n_keys}",
                    transform=bar.ax.get_xaxis_transform() if bar.orientation == "horizontal" else bar.ax.get_yaxis_transform(),
                    ha="center" if bar.orientation == "horizontal" else "left", va="bottom" if bar.orientation == "horizontal" else "center", fontsize=8)


def attention_rows(
    rows: np.ndarray, tops: np.ndarray, effective: np.ndarray, grid: int, patch: int | None, title: str,
    cls_weight: np.ndarray | None = None, vmax: float | None = None,
) -> bytes:
    """One row of attention: the mean over heads in a large map, each head in a small map.

    ``rows`` (head, N) are the weights on the N patch keys, ``tops`` (head, 5) the five largest
    keys of each head (patch indices, -1 for the class token), ``effective`` (head,) each row's e^H,
    ``cls_weight`` (head,) the weight the row puts on the class token. Every map shares one scale,
    0 to ``vmax`` (default: the largest weight drawn; pass one value for every store of a
    section), shown on the colour bar with the uniform row 1/N marked: a row spread evenly looks
    evenly dark instead of stretched into structure. The largest weights are outlined in sky
    blue and the followed patch is dashed white.
    """
    heads = rows.shape[0]
    columns = max(1, -(-heads // 2))
    mean = rows.mean(0)
    vmax = weight_scale(rows, mean) if vmax is None else vmax
    fig = Figure(figsize=(3.2 + 1.55 * columns, 4.4), layout="constrained")
    spec = fig.add_gridspec(2, 2 + columns)
    big = fig.add_subplot(spec[:, :2])
    order = np.argsort(-mean, kind="stable")[:5]
    image = _weight_map(big, mean, grid, order, patch, "mean over heads", vmax, labels=True)
    for h in range(heads):
        ax = fig.add_subplot(spec[h // columns, 2 + h % columns])
        extra = f"\n[CLS] {cls_weight[h]:.2f}" if cls_weight is not None else ""
        _weight_map(ax, rows[h], grid, tops[h], patch, f"head {h}: $e^H$ {effective[h]:.0f}{extra}", vmax)
    _weight_bar(fig, image, big, rows.shape[-1] + (1 if cls_weight is not None else 0), orientation="horizontal", fraction=0.05, pad=0.02)
    fig.suptitle(title, fontsize=10)
    return png(fig)


def block_rows(rows: np.ndarray, effective: np.ndarray, blocks: Sequence[int], grid: int, patch: int, title: str,
               vmax: float | None = None) -> bytes:
    """The followed patch's row in every block (rows) and head (columns), all maps on one scale."""
    n_blocks, heads = rows.shape[:2]
    vmax = weight_scale(rows) if vmax is None else vmax
    fig = Figure(figsize=(1.2 * heads + 1.2, 1.3 * n_blocks + 0.9), layout="constrained")
    axes = fig.subplots(n_blocks, heads, squeeze=False)
    image = None
    for b in range(n_blocks):
        for h in range(heads):
            ax = axes[b, h]
            row = rows[b, h]
            tops = np.argsort(-row, kind="stable")[:5]
            image = _weight_map(ax, row, grid, tops, patch, (f"head {h}\n" if b == 0 else "") + f"$e^H$ {effective[b, h]:.0f}", vmax)
            if h == 0:
                ax.set_ylabel(f"block {blocks[b]}", fontsize=9)
    _weight_bar(fig, image, list(axes.ravel()), rows.shape[-1], orientation="vertical", fraction=0.04, pad=0.02)
    fig.suptitle(title, fontsize=10)
    return png(fig)


def shared_bins(arrays: Sequence[np.ndarray], count: int = 20) -> np.ndarray:
    """Bin edges over the range the data fill (every store alike), padded when the range is flat."""
    values = np.concatenate([np.ravel(a) for a in arrays if np.size(a)]) if arrays else np.zeros(1)
    values = values[np.isfinite(values)]
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = 0.05 * (high - low) if high > low else max(1e-3 * abs(high), 0.5)
    return np.linspace(low - pad, high + pad, count + 1)


def effective_histograms(per_store: dict[str, np.ndarray], keys: dict[str, int]) -> bytes:
    """Per head, the distribution over images of the mean e^H of a patch row, one outline per store.

    ``per_store`` maps a store label to its (image, head) array; ``keys`` to its T (the row
    length, the largest possible e^H). The bins are shared by every store and head and span the
    values actually found, so neither store's outline hides the other's and close stores stay
    apart; each store is a step outline (its own colour and line style) over a light fill. T is
    marked (dotted) when it lies in the range shown.
    """
    heads = max(v.shape[1] for v in per_store.values())
    columns = min(heads, 3)
    rows = -(-heads // columns)
    fig = Figure(figsize=(2.4 * columns + 0.3, 1.9 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    bins = shared_bins(list(per_store.values()))
    styles = ("-", "--", "-.", ":")
    for h in range(rows * columns):
        ax = axes[h // columns, h % columns]
        if h >= heads:
            ax.set_visible(False)
            continue
        for i, (label, values) in enumerate(per_store.items()):
            if h < values.shape[1]:
                colour = store_colour(i)
                ax.hist(values[:, h], bins=bins, histtype="stepfilled", color=colour, alpha=0.18)
                ax.hist(values[:, h], bins=bins, histtype="step", linewidth=1.8, color=colour, linestyle=styles[i % len(styles)], label=label)
        for t in sorted(set(keys.values())):
            if bins[0] <= t <= bins[-1]:
                ax.axvline(t, color="0.3", linestyle=":", linewidth=1.2)
        ax.set_xlim(bins[0], bins[-1])
        ax.set_title(f"head {h}", fontsize=10)
        if h // columns == rows - 1 or h + columns >= heads:
            ax.set_xlabel("mean $e^H$ (tokens)", fontsize=9)
        if h % columns == 0:
            ax.set_ylabel("images", fontsize=9)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(2, len(names)), fontsize=9, frameon=False)
    fig.suptitle("$e^H$ of a patch row, per image (mean over its rows)", fontsize=10)
    return png(fig)


def per_block(per_store: dict[str, np.ndarray], blocks: dict[str, Sequence[int]], ylabel: str, title: str = "") -> bytes:
    """One quantity per block, one line per head (Tol's colours and line styles), one panel per store."""
    n = len(per_store)
    fig = Figure(figsize=(3.0 * n + 0.4, 3.0), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False, sharey=True)[0]
    for ax, (label, values) in zip(axes, per_store.items()):
        for h in range(values.shape[1]):
            ax.plot(blocks[label], values[:, h], marker="o", markersize=3.5, linewidth=1.5, label=f"head {h}", **head_style(h))
        ax.set_xticks(list(blocks[label]))  # blocks are whole numbers
        ax.set_xlabel("block", fontsize=9)
        ax.set_title(wrap(label), fontsize=9)
    axes[0].set_ylabel(ylabel, fontsize=9)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right center", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return png(fig)


def block_spread(per_store: dict[str, np.ndarray], blocks: dict[str, Sequence[int]]) -> bytes:
    """Mean e^H of the patch rows per block, one line per head, one panel per store."""
    return per_block(per_store, blocks, "mean $e^H$ of a patch row (tokens)")


# ----------------------------------------------------------------------------------------------
# neighbours


def cosine_maps(maps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], grid: int, anchor: int, window: np.ndarray) -> bytes:
    """Cosine of the anchor's token to every patch, one panel per store.

    ``maps``: (label, cosine (N,), top k of the window (k,), top 8 of the crop (8,)). Marks: the
    anchor (white ×), its 3×3 window with SelfPatch's wrap (dashed), the window's top k (thick
    black), and the crop's 8 most similar (black dots: those outside the window are the
    similar patches SelfPatch's window cannot reach).
    """
    n = len(maps)
    fig = Figure(figsize=(2.7 * n + 0.9, 3.4), layout="constrained")
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
        ax.set_title(f"{wrap(label)}\n{inside} of the top {len(top8)} in the window", fontsize=9)
    fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label="cosine to the anchor's token")
    return png(fig)


def share_maps(per_store: dict[str, np.ndarray], grid: int, title: str, label: str) -> bytes:
    """One value in [0, 1] per anchor position, one panel per store (e.g. top 8 inside the window)."""
    n = len(per_store)
    fig = Figure(figsize=(2.6 * n + 0.9, 3.2), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, (name, values) in zip(axes, per_store.items()):
        image = patch_map(ax, values, grid, SHARE_CMAP, 0.0, 1.0, labels=True)
        ax.set_title(wrap(name), fontsize=9)
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
    fig = Figure(figsize=(2.2 * n_cols + 0.2, 2.0 * n_rows + 0.4), layout="constrained")
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
                _masks_over(ax, found)
            ax.set_xticks([])
            ax.set_yticks([])
            n = 0 if found is None else len(found)
            text = f"{image_id.rsplit('/', 1)[-1]}: {n} mask{'s' if n != 1 else ''}"
            ax.set_title(f"{wrap(label)}\n{text}" if r == 0 else text, fontsize=8)
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


# ----------------------------------------------------------------------------------------------
# the decoder's Fiedler vector, and masks against the ground truth


def fiedler_panels(items: list[tuple[str, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray | None]], grid: int, title: str) -> bytes:
    """Per image (rows): the Fiedler vector on the patch grid with the seed marked, beside its masks.

    ``items``: (image id, x (N,) oriented so x[seed side] > 0, seed patch, RGB at display size,
    masks (M, H, W) at that size, ground truth (H, W) bool or None). The vector uses a
    sequential map centred nowhere (cividis), the seed is a white ×, the cut at mean(x) is the
    contour; masks are filled in Tol's colours, the ground truth (when a panel was scored) is
    outlined white and dashed.
    """
    fig = Figure(figsize=(4.6, 2.0 * len(items) + 0.6), layout="constrained")
    axes = fig.subplots(len(items), 2, squeeze=False)
    image = None
    for r, (image_id, x, seed, rgb, masks, truth) in enumerate(items):
        ax = axes[r, 0]
        image = patch_map(ax, x, grid, FIEDLER_CMAP)
        ax.contour(np.arange(grid) + 0.5, np.arange(grid) + 0.5, np.asarray(x, dtype=np.float64).reshape(grid, grid),
                   levels=[float(np.mean(x))], colors="white", linewidths=1.0)
        if seed >= 0:
            ax.plot(seed % grid + 0.5, seed // grid + 0.5, "x", color="white", markersize=9, markeredgewidth=2.5)
            ax.plot(seed % grid + 0.5, seed // grid + 0.5, "x", color="black", markersize=6, markeredgewidth=1.0)
        ax.set_title(f"{image_id.rsplit('/', 1)[-1]}: Fiedler vector", fontsize=8)
        ax = axes[r, 1]
        ax.imshow(rgb)
        _masks_over(ax, masks)
        if truth is not None and truth.any():
            ax.contour(truth.astype(float), levels=[0.5], colors="black", linewidths=2.6)
            ax.contour(truth.astype(float), levels=[0.5], colors=TRUTH_COLOUR, linewidths=1.4, linestyles="--")
        ax.set_title(f"{len(masks)} mask{'s' if len(masks) != 1 else ''}" + (", ground truth dashed" if truth is not None else ""), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(image, ax=list(axes[:, 0]), location="bottom", fraction=0.04, pad=0.02, label="x (seed side > 0)")
    fig.suptitle(title, fontsize=9)
    return png(fig)


def _masks_over(ax, masks: np.ndarray) -> None:
    for k, mask in enumerate(masks):
        colour = matplotlib.colors.to_rgb(MASK_PALETTE[k % len(MASK_PALETTE)])
        overlay = np.zeros((*mask.shape, 4))
        overlay[mask] = (*colour, 0.5)
        ax.imshow(overlay)
        if mask.any():
            ax.contour(mask.astype(float), levels=[0.5], colors=[colour], linewidths=1.5)
