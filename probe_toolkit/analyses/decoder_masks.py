"""From a Fiedler vector to a mask, and what certifies it: orientation, the bipartition at the
mean, the foreground rule (TokenCut's or MaskCut's), the seed's 4-connected component, the
certificate that no vector within the error bound gives another mask, and the mask's score."""

from __future__ import annotations

import numpy as np

from .decoder_cut import Cut
from .decoder_graph import Graph
from .decoder_settings import Settings
from .grid import components


def shape_of(grid: int | tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of a grid given as its side G or as (rows, cols)."""
    return (int(grid), int(grid)) if np.isscalar(grid) else (int(grid[0]), int(grid[1]))


def corners(grid: int | tuple[int, int]) -> np.ndarray:
    """The flat indices of the top-left, top-right, bottom-left and bottom-right patches."""
    rows, cols = shape_of(grid)
    n = rows * cols
    return np.array([0, cols - 1, n - cols, n - 1])


def orient(x: np.ndarray) -> np.ndarray:
    """x with x[argmax |x|] > 0 (lowest index on ties): the solver's sign no longer matters."""
    return -x if x[int(np.argmax(np.abs(x)))] < 0 else x


def foreground(x: np.ndarray, grid: int | tuple[int, int], rule: str) -> tuple[np.ndarray, int, bool]:
    """(side, seed, reversed) for an oriented x: B = {x > mean}, then the rule."""
    side = x > x.mean()
    if rule == "maskcut" and int(side[corners(grid)].sum()) >= 3:
        return ~side, int(np.argmax(-x)), True
    return side, int(np.argmax(x)), False


def component(side: np.ndarray, seed: int, grid: int | tuple[int, int]) -> np.ndarray:
    """The 4-connected component of ``side`` (flat, on the grid) that holds ``seed``."""
    labels, _ = components(side.reshape(shape_of(grid)))
    flat = labels.ravel()
    return flat == flat[seed]


def certified(x: np.ndarray, error: np.ndarray, mask: np.ndarray, seed: int, reversed_: bool) -> bool:
    """True when no x within ``error`` of this one (same sign) could give another mask."""
    if not np.isfinite(error).all():
        return False
    mean_shift = error.mean()
    if (np.abs(x - x.mean()) <= error + mean_shift).any():
        return False  # a patch could cross the threshold (corners included)
    peak = int(np.argmax(np.abs(x)))
    rivals = np.abs(x) >= abs(x[peak]) - (error + error[peak])
    if (x[rivals] < 0).any():
        return False  # the orientation could flip
    signed = -x if reversed_ else x
    rivals = signed >= signed[seed] - (error + error[seed])
    return bool(mask[rivals].all())  # another seed candidate would pick the same component


def certified_cut(cut: Cut, scale: np.ndarray, grid: int | tuple[int, int], settings: Settings) -> tuple[np.ndarray, int, np.ndarray, bool]:
    """(oriented x, seed, mask, certified) of one cut under the settings' rule; certified also
    asks an eigengap of at least ``gap_tol``."""
    x = orient(cut.x)
    side, seed, reversed_ = foreground(x, grid, settings.rule)
    found = component(side, seed, grid)
    ok = cut.gap >= settings.gap_tol and certified(x, cut.error(scale), found, seed, reversed_)
    return x, seed, found, ok


def ncut_value(graph: Graph, mask: np.ndarray) -> float:
    """cut(M, M̄)/vol(M) + cut(M, M̄)/vol(M̄) on this graph; 2 (the worst) when M̄ is empty."""
    m = mask.astype(np.float64)
    vol = float(graph.degree @ m)
    rest = float(graph.degree.sum()) - vol
    if vol <= 0 or rest <= 0 or not mask.any() or mask.all():
        return 2.0
    cut = vol - float(m @ graph.matvec(m))
    return max(cut, 0.0) / vol + max(cut, 0.0) / rest


def mask_score(cut: Cut, ncut: float) -> float:
    """(1 − λ2/λ3)·(1 − ncut/2), in [0, 1]; see the module docstring."""
    relative_gap = (cut.lambda3 - cut.lambda2) / cut.lambda3 if cut.lambda3 > 0 else 0.0
    return float(np.clip(relative_gap, 0.0, 1.0) * np.clip(1.0 - ncut / 2.0, 0.0, 1.0))


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0
