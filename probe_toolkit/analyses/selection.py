"""Selection rules: which patches an anchor is pulled towards (positives) or pushed from (negatives).

The one home of these rules: ``probe neighbours`` measures them and ``training/`` trains with
them, so the statistics describe exactly the sets the losses see (SelfPatch: Yun et al.,
CVPR 2022, alinlab/SelfPatch; and the contrastive rule below). Everything is batched torch on any device, without gradient: ``tokens`` is a
(B, N, D) tensor (a numpy array is accepted too) of one crop size, N = G² patches, and the
similarity of two patches is the cosine of their L2-normalised tokens, computed in float32.
Ties are broken towards the lower patch index (or window position): a row whose top values
hold a tie is ranked again with unique integer keys (``_select``, ``_order_key``), so a
selection never depends on the kernel's tie order, on CPU or GPU.

Public API (shapes for B crops of N = G² patches):

    window(grid, wrap=True, device=None) -> Window(index (N, 8) int64, valid (N, 8) bool,
                                                   wrapped (N, 8) bool)
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

Invalid entries of an index tensor are -1 and their mask is False. Use ``.cpu().numpy()`` on
any result for numpy.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..infra.errors import ProbeError
from .grid import grid_shape

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

    index: torch.Tensor
    valid: torch.Tensor
    wrapped: torch.Tensor


class WindowTopK(NamedTuple):
    """SelfPatch's positives: ``position`` in the window table (0..7), patch ``index``, ``valid``
    (False only without the wrap, where a border anchor has fewer than k candidates; -1 there)."""

    position: torch.Tensor
    index: torch.Tensor
    valid: torch.Tensor


class Contrastive(NamedTuple):
    """The contrastive rule's sets; ``theta`` is each crop's low threshold of pairwise cosine."""

    positive: torch.Tensor
    positive_valid: torch.Tensor
    negative: torch.Tensor
    negative_valid: torch.Tensor
    theta: torch.Tensor


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
    """The (N, 8) candidate table, exactly as SelfPatch's ``get_local_index`` builds it.

    ``grid`` is the side G of a square grid (N = G²) or (rows, cols) of a rectangular one
    (patch i at row i // cols, column i % cols). With ``wrap`` (SelfPatch's code) the window
    continues on the opposite edge, so every anchor has 8 candidates and 12G − 4 of the 8G²
    links wrap (6(rows + cols) − 4 on a rectangle). Without it, border anchors have 3 or 5
    candidates and the rest of their row is padding (-1, ``valid`` False).
    """
    rows, cols = grid_shape(grid)
    if min(rows, cols) < 3:
        raise ProbeError("grid", f"{rows}×{cols} is too small for a 3×3 window", "use a grid side of at least 3")
    index, valid, wrapped = _window(rows, cols, bool(wrap))
    as_tensor = functools.partial(torch.tensor, device=device)
    return Window(as_tensor(index), as_tensor(valid), as_tensor(wrapped))


# ----------------------------------------------------------------------------------------------
# similarity


def _tokens(tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 3:
        raise ProbeError("tokens", f"have shape {tuple(tokens.shape)}", "pass (crops, patches, channels)")
    return tokens


@torch.no_grad()
def cosine(tokens: torch.Tensor | np.ndarray) -> torch.Tensor:
    """(B, N, N) float32 cosine of every pair of patches of each crop (float32 even under autocast)."""
    unit = F.normalize(_tokens(tokens).float(), dim=-1)
    with torch.autocast(device_type=unit.device.type, enabled=False):
        return torch.bmm(unit, unit.transpose(1, 2))


def _similarity(tokens, similarity) -> torch.Tensor:
    if similarity is not None:
        return similarity
    if tokens is None:
        raise ProbeError("selection", "neither tokens nor similarity given", "pass one of them")
    return cosine(tokens)


@torch.no_grad()
def window_cosine(tokens, grid: int, wrap: bool = True, similarity: torch.Tensor | None = None) -> torch.Tensor:
    """(B, N, 8) float32 cosine of each anchor to its window candidates; -inf on padding."""
    sim = _similarity(tokens, similarity)
    table = window(grid, wrap, device=sim.device)
    n = sim.shape[-1]
    if n != table.index.shape[0]:
        rows, cols = grid_shape(grid)
        raise ProbeError("tokens", f"have {n} patches, not {table.index.shape[0]} of a {rows}×{cols} grid", "pass the grid of the view")
    index = table.index.clamp(min=0).expand(sim.shape[0], n, WINDOW_SIZE)
    values = torch.gather(sim, 2, index)
    return values.masked_fill(~table.valid, float("-inf"))


def _order_key(values: torch.Tensor, largest: bool = True) -> torch.Tensor:
    """Unique int64 keys whose largest come first in the order asked for, ties to the lower index.

    The float's bits are mapped to an int32 of the same order (negative floats have their
    magnitude bits flipped; ``~`` reverses it for ``largest=False``), then scaled by N and given
    N − 1 − index. Every key is unique, so ``torch.topk`` of the keys is exact and deterministic,
    and much cheaper than a stable sort.
    """
    bits = (values.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)
    if not largest:
        ordered = ~ordered
    n = values.shape[-1]
    return ordered * n + (n - 1 - torch.arange(n, device=values.device))


def _select(values: torch.Tensor, n: int, largest: bool) -> torch.Tensor:
    """Indices of the n largest (or smallest) along the last axis, in that order, ties to the
    lower index; infinite values are padding and may come in any order among themselves.

    Fast path: ``torch.topk`` of n + 1 values; when no two finite values among them are equal,
    the n chosen and their order are fully determined by the values. Rows with a tie are redone
    exactly with the unique integer keys of ``_order_key``.
    """
    count = values.shape[-1]
    found = torch.topk(values, min(n + 1, count), dim=-1, largest=largest, sorted=True)
    top = found.values
    tied = ((top[..., 1:] == top[..., :-1]) & torch.isfinite(top[..., 1:])).any(-1)
    index = found.indices[..., :n]
    if bool(tied.any()):
        rows = tied.reshape(-1).nonzero().squeeze(1)
        flat = index.reshape(-1, n).clone()
        exact = torch.topk(_order_key(values.reshape(-1, count)[rows], largest), n, dim=-1).indices
        flat[rows] = exact
        index = flat.view(index.shape)
    return index


def _largest(values: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n largest along the last axis, largest first, ties to the lower index."""
    return _select(values, n, largest=True)


def _smallest(values: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n smallest along the last axis, smallest first, ties to the lower index."""
    return _select(values, n, largest=False)


# ----------------------------------------------------------------------------------------------
# the rules


@torch.no_grad()
def window_topk(tokens, grid: int, k: int = 4, wrap: bool = True, similarity: torch.Tensor | None = None) -> WindowTopK:
    """SelfPatch's rule: each anchor's k most similar window candidates (k = 4, ``k_num``)."""
    if not 1 <= k <= WINDOW_SIZE:
        raise ProbeError("--k", f"{k} is outside 1..8", "choose how many of the 8 candidates to keep")
    values = window_cosine(tokens, grid, wrap, similarity)
    position = _largest(values, k)
    table = window(grid, wrap, device=values.device)
    b, n = values.shape[:2]
    index = torch.gather(table.index.expand(b, n, WINDOW_SIZE), 2, position)
    valid = torch.gather(table.valid.expand(b, n, WINDOW_SIZE), 2, position)
    return WindowTopK(position.masked_fill(~valid, -1), index.masked_fill(~valid, -1), valid)


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """Quantile along the last axis with linear interpolation (numpy's default method).

    One selection (``kthvalue``) and one pass for the next order statistic, not a sort; any size
    (``torch.quantile`` refuses inputs above 2^24 values) and on any device.
    """
    if not 0.0 <= q <= 1.0:
        raise ProbeError("quantile", f"{q} is outside [0, 1]", "pass a fraction")
    n = values.shape[-1]
    if n == 0:
        raise ProbeError("quantile", "no values", "pass at least one value")
    position = q * (n - 1)
    lo = int(np.floor(position))
    frac = position - lo
    low = torch.kthvalue(values, lo + 1, dim=-1).values
    if frac == 0.0:
        return low
    # the next order statistic: low itself when it occurs beyond rank lo, else the least value above it
    repeated = (values <= low.unsqueeze(-1)).sum(-1) > lo + 1
    above = values.masked_fill(values <= low.unsqueeze(-1), float("inf")).min(-1).values
    high = torch.where(repeated, low, above)
    return low + frac * (high - low)


@torch.no_grad()
def window_theta(cosines: torch.Tensor | Sequence[torch.Tensor], mode: str = "batch-median", q: float = 0.5) -> torch.Tensor | list[torch.Tensor]:
    """θ of the threshold rule from window cosines (B, N, 8) (-inf = padding, ignored).

    ``batch-median``: one median over every valid anchor–candidate link of the batch; pass a
    list of cosines of several crop sizes (grids 14 and 6) to take one median over all of them,
    as the earlier selector study did (1,392,640 links per step). ``crop-quantile``: each
    crop's own quantile ``q`` of its links. Returns θ per crop, (B,) float32 (a list with one
    (B_i,) tensor per input when a list is given).
    """
    if mode not in MODES:
        raise ProbeError("mode", f"unknown threshold mode {mode!r}", f"use one of {', '.join(MODES)}")
    many = isinstance(cosines, (list, tuple))
    parts = list(cosines) if many else [cosines]
    if mode == "batch-median":
        links = torch.cat([p[torch.isfinite(p)].reshape(-1) for p in parts])
        theta = quantile(links, 0.5)
        out = [theta.expand(p.shape[0]).clone() for p in parts]
    else:
        out = []
        for p in parts:
            flat = p.reshape(p.shape[0], -1)
            finite = torch.isfinite(flat)
            if bool((finite == finite[:1]).all()):  # the padding (no wrap) is the same in every crop
                out.append(quantile(flat[:, finite[0]], q))
            else:
                out.append(torch.stack([quantile(row[ok], q) for row, ok in zip(flat, finite)]))
    return out if many else out[0]


@torch.no_grad()
def window_threshold(
    tokens,
    grid: int,
    theta: float | torch.Tensor | None = None,
    mode: str = "crop-quantile",
    q: float = 0.5,
    wrap: bool = True,
    similarity: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, N, 8) bool: keep the window candidates with cosine ≥ θ (the selector study's rule).

    θ is ``theta`` when given (a number, or a (B,) tensor from ``window_theta`` when one median
    must cover several crop sizes), else set by ``mode`` over this call's crops.
    """
    values = window_cosine(tokens, grid, wrap, similarity)
    if theta is None:
        theta = window_theta(values, mode, q)
    theta = torch.as_tensor(theta, dtype=values.dtype, device=values.device)
    if theta.ndim == 1:
        theta = theta[:, None, None]
    return values >= theta  # -inf padding never passes


@torch.no_grad()
def most_similar(similarity: torch.Tensor, n: int) -> torch.Tensor:
    """(B, N, n) int64: each anchor's n most similar other patches of its crop, most similar first."""
    eye = torch.eye(similarity.shape[-1], dtype=torch.bool, device=similarity.device)
    return _largest(similarity.masked_fill(eye, float("-inf")), n)


def _pair_quantile(similarity: torch.Tensor, q: float) -> torch.Tensor:
    n = similarity.shape[-1]
    upper = torch.triu_indices(n, n, offset=1, device=similarity.device)
    pairs = similarity[:, upper[0], upper[1]]
    return quantile(pairs, q)


@torch.no_grad()
def contrastive(
    tokens=None,
    k: int = 4,
    negative_quantile: float = 0.2,
    max_negatives: int = 48,
    similarity: torch.Tensor | None = None,
) -> Contrastive:
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
    b, n, _ = sim.shape
    if not 1 <= k < n:
        raise ProbeError("k", f"{k} positives cannot be drawn from {n - 1} other patches", f"use 1 <= k < {n}")
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    positive = _largest(sim.masked_fill(eye, float("-inf")), k)
    theta = _pair_quantile(sim, negative_quantile)
    allowed = (sim <= theta[:, None, None]) & ~eye
    allowed.scatter_(2, positive, False)
    m = min(max_negatives, n)
    negative = _smallest(sim.masked_fill(~allowed, float("inf")), m)
    negative_valid = torch.gather(allowed, 2, negative)
    if m < max_negatives:  # tiny grids: pad to the promised width
        pad = max_negatives - m
        negative = F.pad(negative, (0, pad), value=-1)
        negative_valid = F.pad(negative_valid, (0, pad), value=False)
    negative = negative.masked_fill(~negative_valid, -1)
    positive_valid = torch.ones_like(positive, dtype=torch.bool)
    return Contrastive(positive, positive_valid, negative, negative_valid, theta)
