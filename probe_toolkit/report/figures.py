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
figure as a ``Drawing``, drawn to PNG bytes (``Drawn``, which keep the figure, so the report can
write the same figure as PDF and SVG beside it) only when they are first asked for: a caveat
stamped over a figure before then (``report.caveats``) costs no second drawing.

The figures themselves live beside it, one family each: ``figures_attention`` (attention rows,
blocks, e^H), ``figures_maps`` (maps over the image: followed image, PCA, cosines, shares,
masks, Fiedler vectors), ``figures_training`` (training curves).
"""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Sequence

import matplotlib
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
    """A store label or image id broken at its slashes and spaces so that it fits over one small
    panel (a word longer than ``width`` stays whole on its line)."""
    if len(label) <= width:
        return label
    spaced = re.sub(r"(?<! )/", " /", label)  # a slash may begin a line
    lines = textwrap.wrap(spaced, width, break_long_words=False, break_on_hyphens=False)
    return "\n".join(line.replace(" /", "/") for line in lines) or label


def head_style(h: int) -> dict:
    """Colour and line style of head ``h`` (styles cycle once the colours run out)."""
    return {"color": HEAD_PALETTE[h % len(HEAD_PALETTE)], "linestyle": HEAD_STYLES[(h // len(HEAD_PALETTE)) % len(HEAD_STYLES)]}


def colour_table(name: str) -> bytes:
    """256 RGB triplets (768 bytes) of a matplotlib colour map, for the explorer's canvases."""
    cmap = matplotlib.colormaps[name]
    rgb = (cmap(np.linspace(0.0, 1.0, 256))[:, :3] * 255.0 + 0.5).astype(np.uint8)
    return rgb.tobytes()


class Drawn(bytes):
    """PNG bytes that still hold their figure, so it can be saved again as PDF or SVG."""

    figure: Figure

    def vector(self, fmt: str) -> bytes:
        out = io.BytesIO()
        self.figure.savefig(out, format=fmt, dpi=DPI, bbox_inches="tight", metadata=_metadata(fmt))
        return out.getvalue()


class Drawing:
    """A figure, drawn to PNG the first time its bytes are asked for (``png``), then kept."""

    def __init__(self, figure: Figure) -> None:
        FigureCanvasAgg(figure)  # the Agg canvas, whatever matplotlib's default backend is
        self.figure = figure
        self._drawn: Drawn | None = None

    def png(self) -> Drawn:
        if self._drawn is None:
            out = io.BytesIO()
            legible(self.figure)
            self.figure.savefig(out, format="png", dpi=DPI, bbox_inches="tight")
            self._drawn = Drawn(out.getvalue())
            self._drawn.figure = self.figure
        return self._drawn

    def vector(self, fmt: str) -> bytes:
        return self.png().vector(fmt)


def _metadata(fmt: str) -> dict | None:
    """No date (the same figure gives the same bytes); the creator names probe's version."""
    if fmt not in ("pdf", "svg"):
        return None
    from .._version import __version__

    return {"Date": None, "Creator": f"probe {__version__}"}


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
    """The figure, to be drawn to PNG when its bytes are first asked for (``Drawing.png``)."""
    return Drawing(fig)


def image_png(rgb: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 picture as PNG bytes (the explorer's background)."""
    out = io.BytesIO()
    Image.fromarray(np.asarray(rgb, dtype=np.uint8)).save(out, format="PNG", optimize=True)
    return out.getvalue()


# ----------------------------------------------------------------------------------------------
# the shared grid helpers: patch p of a G × G grid is the unit square at column p % G, row p // G


def tile_row(axes: Sequence, cells: int) -> Sequence:
    """One row of a tile figure: every axis without ticks, those past ``cells`` hidden; the axes
    that hold the row's tiles."""
    for c, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_visible(c < cells)
    return axes[:cells]


def patch_map(ax, values: np.ndarray, grid: int, cmap: str, vmin: float | None = None, vmax: float | None = None, labels: bool = False):
    """Draw one value per patch, row-major, on the [0, G] × [0, G] square (patch p at (p % G, p // G))."""
    image = ax.imshow(np.asarray(values, dtype=np.float32).reshape(grid, grid), cmap=cmap, vmin=vmin, vmax=vmax, extent=(0, grid, grid, 0), interpolation="nearest")
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
