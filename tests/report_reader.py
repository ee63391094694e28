"""Read a report as its reader would: no path of the machine, no element of a figure outside its axes,
captions that say what the records say. Shared by the demo's test and the report's tests."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Polygon, Rectangle


def absolute_paths(text: str, roots: list[str | Path]) -> list[str]:
    """Every place ``text`` names a path under one of ``roots`` (the machine's folders: the test's tmp, the
    working folder, the home) or any absolute POSIX path of three parts or more."""
    found = [m.group(0) for root in roots for m in re.finditer(re.escape(str(Path(root).resolve())) + r"[^\s|`)\"']*", text)]
    found += re.findall(r"(?<![\w.~/:…])/(?:tmp|home|root|work|usr|var|opt)/[^\s|`)\"']+", text)
    return sorted(set(found))


def _data_extent(artist, ax) -> np.ndarray | None:
    """An artist's points in the axes' data coordinates, when it is drawn in them (None otherwise)."""
    if artist.get_transform() != ax.transData and not (isinstance(artist, (Polygon, Rectangle)) and artist.get_transform().contains_branch(ax.transData)):
        return None
    if isinstance(artist, Line2D):
        points = np.asarray(artist.get_xydata(), dtype=float)
    elif isinstance(artist, (Polygon, Rectangle)):
        points = artist.get_patch_transform().transform(artist.get_path().vertices)
    else:
        return None
    return points[np.isfinite(points).all(axis=1)] if points.size else None


def outside_axes(fig) -> list[str]:
    """Data artists (lines, histogram outlines and bars) that reach past their axes' view limits, so that clipping
    hides part of them (texts need no check: the figure is saved with its tight bounding box)."""
    fig.canvas.draw()
    problems = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        tx, ty = 1e-6 * max(x1 - x0, 1e-12), 1e-6 * max(y1 - y0, 1e-12)
        for artist in [*ax.lines, *ax.patches]:
            if not artist.get_visible():
                continue
            points = _data_extent(artist, ax)
            if points is None or not len(points):
                continue
            if (points[:, 0] < x0 - tx).any() or (points[:, 0] > x1 + tx).any() or (points[:, 1] < y0 - ty).any() or (points[:, 1] > y1 + ty).any():
                problems.append(f"{type(artist).__name__} in '{ax.get_title()}' reaches past its axes "
                                f"(x {points[:, 0].min():.4g}..{points[:, 0].max():.4g} of {x0:.4g}..{x1:.4g}, "
                                f"y {points[:, 1].min():.4g}..{points[:, 1].max():.4g} of {y0:.4g}..{y1:.4g})")
    return problems


def figures_of(report) -> list[tuple[str, object]]:
    """(name, matplotlib figure) of every figure a gathered report holds (``figures.png`` keeps the figure)."""
    return [(f.name, f.png.figure) for s in report.sections for f in s.figures() if getattr(f.png, "figure", None) is not None]
