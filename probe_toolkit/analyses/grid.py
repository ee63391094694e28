"""Patch-grid geometry: where patch i sits, and how far apart two patches are.

Patches are numbered row-major on a G × G grid (as timm's patch embedding flattens them): patch i sits at row i // G,
column i % G; a rectangular grid (an own-size view: native, native_crop, native_resized) is given as (rows, cols), patch i at row
i // cols, column i % cols. Distances are in patch units (one grid step = the patch size in
pixels: 16 at ViT-S/16, 8 at ViT-S/8, 14 at DINOv2). One home
for this geometry, shared by the window statistics (``neighbours``) and the mean attention
distance (``entropy``).
"""

from __future__ import annotations

import functools

import numpy as np

from ..infra.errors import ProbeError
from ..infra.settings import SettingError

METRICS = ("chebyshev", "euclidean")


def grid_side(n_patches: int, where: str = "grid") -> int:
    """G for a square grid of ``n_patches`` patches, or an error when it is not square."""
    side = int(round(n_patches**0.5))
    if side * side != n_patches:
        raise ProbeError(where, f"{n_patches} patches do not form a square grid", "store square views only")
    return side


def grid_shape(grid: int | tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of a grid given as its side G (square) or as (rows, cols)."""
    return (int(grid), int(grid)) if np.ndim(grid) == 0 else (int(grid[0]), int(grid[1]))


def positions(grid: int | tuple[int, int]) -> np.ndarray:
    """(N, 2) int64 (row, column) of every patch, row-major."""
    rows, cols = grid_shape(grid)
    flat = np.arange(rows * cols)
    return np.stack([flat // cols, flat % cols], axis=1)


@functools.lru_cache(maxsize=32)
def _distance(shape: tuple[int, int], metric: str, torus: bool) -> np.ndarray:
    pos = positions(shape)
    delta = np.abs(pos[:, None, :] - pos[None, :, :])
    if torus:
        delta = np.minimum(delta, np.asarray(shape) - delta)
    if metric == "chebyshev":
        out = delta.max(-1).astype(np.float32)
    else:
        out = np.sqrt((delta**2).sum(-1)).astype(np.float32)
    out.setflags(write=False)
    return out


def grid_distance(grid: int | tuple[int, int], metric: str = "chebyshev", torus: bool = True) -> np.ndarray:
    """(N, N) float32 distance between patch centres, in patch units (read-only).

    ``metric``: ``chebyshev`` (max of row and column steps: the 3×3 window is distance ≤ 1)
    or ``euclidean``. ``torus``: measure on the wrapped grid, as SelfPatch's window wraps
    (a step across the border counts 1); else on the plain grid.
    """
    if metric not in METRICS:
        raise SettingError("distance", f"distance must be one of {', '.join(METRICS)}, got {metric!r}", f"use distance={METRICS[0]!r}")
    return _distance(grid_shape(grid), metric, bool(torus))


def components(mask: np.ndarray, eight: bool = False) -> tuple[np.ndarray, int]:
    """(labels, count) of a 2-D bool mask's 4- (or 8-) connected components: ``scipy.ndimage.label``'s
    answer (0 outside, components numbered from 1 in the row-major order of their first patch),
    found by ``scipy.sparse.csgraph``, which the decoder's eigensolvers load anyway (scipy.ndimage
    would slow every decoding command's start-up, ``benchmarks/startup.py``)."""
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    mask = np.asarray(mask, dtype=bool)
    rows, cols = mask.shape
    on = np.flatnonzero(mask.ravel())
    index = np.full(mask.size, -1, dtype=np.int64)
    index[on] = np.arange(on.size)
    grid = index.reshape(rows, cols)
    steps = [(grid[:, :-1], grid[:, 1:]), (grid[:-1, :], grid[1:, :])]  # right, down
    if eight:
        steps += [(grid[:-1, :-1], grid[1:, 1:]), (grid[:-1, 1:], grid[1:, :-1])]  # down-right, down-left
    a = np.concatenate([p.ravel() for p, _ in steps])
    b = np.concatenate([q.ravel() for _, q in steps])
    linked = (a >= 0) & (b >= 0)
    graph = coo_array((np.ones(int(linked.sum())), (a[linked], b[linked])), shape=(on.size, on.size))
    count, numbers = connected_components(graph, directed=False)  # numbered as first met, lowest patch first
    labels = np.zeros(mask.size, dtype=np.int32)
    labels[on] = numbers + 1
    return labels.reshape(rows, cols), int(count)
