"""Selection rules: which patches an anchor is pulled towards (positives) or pushed from (negatives).

The one home of these rules: ``probe neighbours`` measures them and ``training/`` trains with
them, so the statistics describe exactly the sets the losses see (SelfPatch: Yun et al.,
CVPR 2022, alinlab/SelfPatch; and the contrastive rule below). Everything is batched and
without gradient, on torch tensors (any device: training) or numpy arrays (``probe neighbours``,
which then never imports torch), each written once in the operations of ``arrays``: a result is
of its input's library. ``tokens`` is (B, N, D) of one crop size, N = G² patches, and the
similarity of two patches is the cosine of their L2-normalised tokens, computed in float32.
Ties are broken towards the lower patch index (or window position): a row whose top values
hold a tie is ranked again (``arrays.Torch.select``; numpy sorts stably), so a selection never
depends on a kernel's tie order, on CPU or GPU, in either library.

Public API (shapes for B crops of N = G² patches):

    window(grid, wrap=True, device=None) -> Window(index (N, 8) int64, valid (N, 8) bool,
                                                   wrapped (N, 8) bool), numpy arrays, or
                                                   torch tensors on ``device`` when given
    cosine(tokens) -> (B, N, N) float32
    window_cosine(tokens, grid, wrap=True, similarity=None) -> (B, N, 8) float32, -inf where invalid
    window_topk(tokens, grid, k=4, wrap=True, similarity=None)
        -> WindowTopK(position (B, N, k) int64, index (B, N, k) int64, valid (B, N, k) bool)
    window_theta(cosines, mode="batch-median"|"crop-quantile", q=0.5) -> (B,) float32
    window_threshold(tokens, grid, theta=None, mode="crop-quantile", q=0.5, wrap=True,
                     similarity=None) -> (B, N, 8) bool
    most_similar(similarity, n) -> (B, N, n) int64, the n most similar OTHER patches
    contrastive(tokens, k=4, negative_quantile=0.2, max_negatives=48, similarity=None)
        -> Contrastive(positive (B, N, k) int64, positive_valid (B, N, k) bool,
                       negative (B, N, M) int64, negative_valid (B, N, M) bool, theta (B,) float32)
    quantile(values, q) -> linear-interpolated quantile along the last axis (numpy's default)

Invalid entries of an index array are -1 and their mask is False.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from .arrays import library, without_grad
from .grid import grid_shape

if TYPE_CHECKING:
    import torch

WINDOW_SIZE = 8  # the 3×3 window without its centre (SelfPatch `get_local_index(N, k_size=3)`)
MODES = ("batch-median", "crop-quantile")


class Window(NamedTuple):
    """The candidate table of a G × G grid.

    index:   (N, 8) int64 candidate patch indices per anchor, valid ones in ascending order
             first, -1 padding after them (only with ``wrap=False``).
    valid:   (N, 8) bool, False on the padding. All True with ``wrap=True``.
    wrapped: (N, 8) bool, True where the link crosses the border of the grid (all False with
             ``wrap=False``, where such links do not exist).
    """

    index: np.ndarray | torch.Tensor
    valid: np.ndarray | torch.Tensor
    wrapped: np.ndarray | torch.Tensor


class WindowTopK(NamedTuple):
    """SelfPatch's positives: ``position`` in the window table (0..7), patch ``index``, ``valid``
    (False only without the wrap, where a border anchor has fewer than k candidates; -1 there)."""

    position: np.ndarray | torch.Tensor
    index: np.ndarray | torch.Tensor
    valid: np.ndarray | torch.Tensor


class Contrastive(NamedTuple):
    """The contrastive rule's sets; ``theta`` is each crop's low threshold of pairwise cosine."""

    positive: np.ndarray | torch.Tensor
    positive_valid: np.ndarray | torch.Tensor
    negative: np.ndarray | torch.Tensor
    negative_valid: np.ndarray | torch.Tensor
    theta: np.ndarray | torch.Tensor


# ----------------------------------------------------------------------------------------------
# the window


@functools.lru_cache(maxsize=32)
def _window(rows: int, cols: int, wrap: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = np.arange(rows * cols)
    row, col = flat // cols, flat % cols
    offsets = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]
    r = row[:, None] + np.array([dr for dr, _ in offsets])[None, :]
    c = col[:, None] + np.array([dc for _, dc in offsets])[None, :]
    inside = (r >= 0) & (r < rows) & (c >= 0) & (c < cols)
    if wrap:
        # SelfPatch: offsets modulo the grid side, then `nonzero()` of the flattened 3×3 mask,
        # that is the 8 flat indices in ascending order
        index = np.sort((r % rows) * cols + (c % cols), axis=1)
        valid = np.ones_like(index, dtype=bool)
        crow, ccol = index // cols, index % cols
        wrapped = (np.abs(crow - row[:, None]) > 1) | (np.abs(ccol - col[:, None]) > 1)
    else:
        big = rows * cols
        index = np.sort(np.where(inside, r * cols + c, big), axis=1)
        valid = index < big
        index = np.where(valid, index, -1)
        wrapped = np.zeros_like(valid)
    return index.astype(np.int64), valid, wrapped


def window(grid: int | tuple[int, int], wrap: bool = True, device: torch.device | str | None = None) -> Window:
    """The (N, 8) candidate table, exactly as SelfPatch's ``get_local_index`` builds it: numpy
    arrays, or torch tensors on ``device`` when one is given.

    ``grid`` is the side G of a square grid (N = G²) or (rows, cols) of a rectangular one
    (patch i at row i // cols, column i % cols). With ``wrap`` (SelfPatch's code) the window
    continues on the opposite edge, so every anchor has 8 candidates and 12G − 4 of the 8G²
    links wrap (6(rows + cols) − 4 on a rectangle). Without it, border anchors have 3 or 5
    candidates and the rest of their row is padding (-1, ``valid`` False).
    """
    rows, cols = grid_shape(grid)
    if min(rows, cols) < 3:
        raise ProbeError("grid", f"{rows}×{cols} is too small for a 3×3 window", "use a grid side of at least 3")
    tables = _window(rows, cols, bool(wrap))
    if device is None:
        return Window(*(table.copy() for table in tables))
    import torch

    return Window(*(torch.tensor(table, device=device) for table in tables))


def _window_like(grid, wrap: bool, like) -> Window:
    """The candidate table in ``like``'s library, on its device."""
    xp = library(like)
    return Window(*(xp.table(table, like) for table in window(grid, wrap)))


# ----------------------------------------------------------------------------------------------
# similarity


def _tokens(tokens):
    tokens = library(tokens).asarray(tokens)
    if tokens.ndim != 3:
        raise ProbeError("tokens", f"have shape {tuple(tokens.shape)}", "pass (crops, patches, channels)")
    return tokens


@without_grad
def cosine(tokens):
    """(B, N, N) float32 cosine of every pair of patches of each crop (float32 even under autocast)."""
    tokens = _tokens(tokens)
    return library(tokens).cosine(tokens)


def _similarity(tokens, similarity):
    if similarity is not None:
        return similarity
    if tokens is None:
        raise ProbeError("selection", "neither tokens nor similarity given", "pass one of them")
    return cosine(tokens)


@without_grad
def window_cosine(tokens, grid: int, wrap: bool = True, similarity=None):
    """(B, N, 8) float32 cosine of each anchor to its window candidates; -inf on padding."""
    sim = _similarity(tokens, similarity)
    xp = library(sim)
    table = _window_like(grid, wrap, sim)
    n = sim.shape[-1]
    if n != table.index.shape[0]:
        rows, cols = grid_shape(grid)
        raise ProbeError("tokens", f"have {n} patches, not {table.index.shape[0]} of a {rows}×{cols} grid", "pass the grid of the view")
    index = xp.fill(table.index, ~table.valid, 0)
    return xp.fill(xp.gather(sim, xp.expand(index, (sim.shape[0], n, WINDOW_SIZE))), ~table.valid, float("-inf"))


def _largest(values, n: int):
    """Indices of the n largest along the last axis, largest first, ties to the lower index."""
    return library(values).select(values, n, largest=True)


def _smallest(values, n: int):
    """Indices of the n smallest along the last axis, smallest first, ties to the lower index."""
    return library(values).select(values, n, largest=False)


# ----------------------------------------------------------------------------------------------
# the rules


@without_grad
def window_topk(tokens, grid: int, k: int = 4, wrap: bool = True, similarity=None) -> WindowTopK:
    """SelfPatch's rule: each anchor's k most similar window candidates (k = 4, ``k_num``)."""
    if not 1 <= k <= WINDOW_SIZE:
        raise SettingError("k", f"k must lie in 1..{WINDOW_SIZE}, got {k!r}", f"choose how many of the {WINDOW_SIZE} candidates to keep")
    values = window_cosine(tokens, grid, wrap, similarity)
    xp = library(values)
    position = _largest(values, k)
    table = _window_like(grid, wrap, values)
    index = xp.gather(table.index, position)
    valid = xp.gather(table.valid, position)
    return WindowTopK(xp.fill(position, ~valid, -1), xp.fill(index, ~valid, -1), valid)


def quantile(values, q: float):
    """Quantile along the last axis with linear interpolation (numpy's default method).

    One selection (k-th value) and one pass for the next order statistic, not a sort; any size
    (``torch.quantile`` refuses inputs above 2^24 values), on any device, in either library.
    """
    if not 0.0 <= q <= 1.0:
        raise ProbeError("quantile", f"{q} is outside [0, 1]", "pass a fraction")
    n = values.shape[-1]
    if n == 0:
        raise ProbeError("quantile", "no values", "pass at least one value")
    xp = library(values)
    position = q * (n - 1)
    lo = int(np.floor(position))
    frac = position - lo
    low = xp.kth(values, lo + 1)
    if frac == 0.0:
        return low
    # the next order statistic: low itself when it occurs beyond rank lo, else the least value above it
    at_or_below = values <= low[..., None]
    repeated = at_or_below.sum(-1) > lo + 1
    above = xp.row_min(xp.fill(values, at_or_below, float("inf")))
    high = xp.where(repeated, low, above)
    return low + frac * (high - low)


@without_grad
def window_theta(cosines, mode: str = "batch-median", q: float = 0.5):
    """θ of the threshold rule from window cosines (B, N, 8) (-inf = padding, ignored).

    ``batch-median``: one median over every valid anchor–candidate link of the batch; pass a
    list of cosines of several crop sizes (grids 14 and 6) to take one median over all of them,
    as the earlier selector study did (1,392,640 links per step). ``crop-quantile``: each
    crop's own quantile ``q`` of its links. Returns θ per crop, (B,) float32 (a list with one
    (B_i,) array per input when a list is given).
    """
    if mode not in MODES:
        raise ProbeError("mode", f"unknown threshold mode {mode!r}", f"use one of {', '.join(MODES)}")
    many = isinstance(cosines, (list, tuple))
    parts = list(cosines) if many else [cosines]
    xp = library(parts[0])
    if mode == "batch-median":
        links = xp.concat([p[xp.isfinite(p)].reshape(-1) for p in parts])
        theta = quantile(links, 0.5)
        out = [xp.copy(xp.expand(theta, (p.shape[0],))) for p in parts]
    else:
        out = []
        for p in parts:
            flat = p.reshape(p.shape[0], -1)
            finite = xp.isfinite(flat)
            if bool((finite == finite[:1]).all()):  # the padding (no wrap) is the same in every crop
                out.append(quantile(flat[:, finite[0]], q))
            else:
                out.append(xp.stack([quantile(row[ok], q) for row, ok in zip(flat, finite)]))
    return out if many else out[0]


@without_grad
def window_threshold(tokens, grid: int, theta=None, mode: str = "crop-quantile", q: float = 0.5, wrap: bool = True, similarity=None):
    """(B, N, 8) bool: keep the window candidates with cosine ≥ θ (the selector study's rule).

    θ is ``theta`` when given (a number, or a (B,) array from ``window_theta`` when one median
    must cover several crop sizes), else set by ``mode`` over this call's crops.
    """
    values = window_cosine(tokens, grid, wrap, similarity)
    if theta is None:
        theta = window_theta(values, mode, q)
    theta = library(values).asarray_like(theta, values)
    if theta.ndim == 1:
        theta = theta[:, None, None]
    return values >= theta  # -inf padding never passes


@without_grad
def most_similar(similarity, n: int):
    """(B, N, n) int64: each anchor's n most similar other patches of its crop, most similar first."""
    xp = library(similarity)
    return _largest(xp.fill(similarity, xp.eye(similarity.shape[-1], similarity), float("-inf")), n)


def _pair_quantile(similarity, q: float):
    return quantile(library(similarity).upper(similarity), q)


@without_grad
def contrastive(tokens=None, k: int = 4, negative_quantile: float = 0.2, max_negatives: int = 48, similarity=None) -> Contrastive:
    """The contrastive rule: positives and negatives anywhere in the crop.

    Positives: the k most similar OTHER patches of the crop, ties to the lower index.
    Negatives: the patches j ≠ i whose cosine to the anchor is at or below θ, never one of its
    positives, the least similar first (ties to the lower index), at most ``max_negatives``.
    θ is the crop's ``negative_quantile`` (20th percentile) of its pairwise cosines, over the
    N(N − 1)/2 unordered off-diagonal pairs i < j (the matrix is symmetric; the diagonal of
    self-similarities is left out), with numpy's linear interpolation.
    Shapes: positive (B, N, k), negative (B, N, max_negatives); -1 where invalid.
    """
    sim = _similarity(tokens, similarity)
    xp = library(sim)
    b, n, _ = sim.shape
    if not 1 <= k < n:
        raise ProbeError("k", f"{k} positives cannot be drawn from {n - 1} other patches", f"use 1 <= k < {n}")
    eye = xp.eye(n, sim)
    positive = _largest(xp.fill(sim, eye, float("-inf")), k)
    theta = _pair_quantile(sim, negative_quantile)
    allowed = xp.cleared((sim <= theta[:, None, None]) & ~eye, positive)
    m = min(max_negatives, n)
    negative = _smallest(xp.fill(sim, ~allowed, float("inf")), m)
    negative_valid = xp.gather(allowed, negative)
    if m < max_negatives:  # tiny grids: pad to the promised width
        negative = xp.pad_last(negative, max_negatives - m, -1)
        negative_valid = xp.pad_last(negative_valid, max_negatives - m, False)
    negative = xp.fill(negative, ~negative_valid, -1)
    return Contrastive(positive, xp.ones_bool(positive), negative, negative_valid, theta)
