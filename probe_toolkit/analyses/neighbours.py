"""Do a patch's most similar patches lie in SelfPatch's 3×3 window? (Yun et al., CVPR 2022; alinlab/SelfPatch)

The premise statistics of a checkpoint's tokens, per image and over the set, with the
selection rules of ``selection`` (the very code ``training/`` uses). Similarity is the cosine
of the last-block tokens (float32 from the stored float16); an anchor's ranking covers the
N − 1 other patches of its crop, ties to the lower index.

Results (``probe neighbours`` saves them as ``results/neighbours_g<G>`` in the store,
``neighbours_g<G>_nowrap`` with ``--no-wrap``; settings in the attrs):

  per image (dim ``image``):
    top_in_window          share of each anchor's ``top`` (8) most similar patches of the crop
                           that lie in its window, averaged over anchors
    top_distance           their mean grid distance to the anchor, in patch units, with the
                           metric named in attrs ``distance``
    topk_in_window         the same share for the ``k`` (4) most similar
    positive_cosine        mean cosine of SelfPatch's window positives (top k of the window)
    other_cosine           mean cosine of the window candidates left out
    wrapped_positive_share share of SelfPatch's positives reached through the wrap
    contrastive_in_window  share of the contrastive rule's positives inside the window
    contrastive_distance   their mean grid distance to the anchor
    negative_count_mean    the contrastive rule's negatives per anchor, averaged
    negative_theta         the crop's low threshold (``negative_quantile`` of pairwise cosine)
  per image and anchor (dims ``image``, ``patch``):
    top_in_window_count    how many of the anchor's ``top`` most similar lie in its window (uint8)
    negative_count         the contrastive rule's negatives of the anchor (int16; positives are
                           always ``k``)
  over the set:
    summary_mean, summary_low, summary_high (``statistic``): mean over images of every
        per-image statistic above, and its seeded percentile-bootstrap interval over images
    anchor_top_in_window (``patch``): top_in_window per anchor position, mean over images
    negative_count_histogram (``count`` = 0..max_negatives): anchors with that many negatives
    links, wrapped_links, wrapped_share: the window's anchor–candidate links and how many wrap
        (structural: 12G − 4 of 8G² with the wrap, 0 without)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..infra import runner
from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from ..store.plain import Results
from . import selection
from .grid import grid_distance, grid_side
from .stats import Bootstrap

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreArray

# the views whose tokens the store holds; the grid follows from the view and the patch
# (224 px: 14 × 14 at /16, 28 × 28 at /8, 16 × 16 at /14; 96 px: 6 × 6 at /16, 12 × 12 at /8)
VIEWS = ("224", "96")

STATISTICS = (
    "top_in_window",
    "top_distance",
    "topk_in_window",
    "positive_cosine",
    "other_cosine",
    "wrapped_positive_share",
    "contrastive_in_window",
    "contrastive_distance",
    "negative_count_mean",
    "negative_theta",
)


def view_array(view: str | int) -> str:
    """The store array read for ``--view``."""
    if str(view) not in VIEWS:
        raise SettingError("view", f"view {view} has no stored tokens", f"use one of {', '.join(VIEWS)}")
    return f"tokens_{view}"


def _membership(grid: int, wrap: bool) -> np.ndarray:
    """(N, N) bool: candidate j lies in anchor i's window."""
    table = selection.window(grid, wrap)
    n = table.index.shape[0]
    inside = np.zeros((n, n + 1), dtype=bool)
    np.put_along_axis(inside, np.where(table.valid, table.index, n), True, axis=1)
    return inside[:, :n]


def _take(matrix: np.ndarray, index: np.ndarray) -> np.ndarray:
    """matrix (N, N) or (B, N, N) read at each anchor's columns ``index`` (B, N, m)."""
    return np.take_along_axis(np.broadcast_to(matrix, index.shape[:2] + matrix.shape[-1:]), index, axis=2)


def _masked_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per image (first axis) mean of ``values`` where ``mask``; NaN where nothing is kept."""
    mask = np.broadcast_to(mask, values.shape).astype(values.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (values * mask).reshape(len(values), -1).sum(1) / mask.reshape(len(values), -1).sum(1)


def _mean(values: np.ndarray) -> np.ndarray:
    """Per image mean over anchors and their picks, in float32."""
    return values.astype(np.float32).mean((1, 2), dtype=np.float32)


def image_statistics(
    tokens,
    grid: int,
    k: int = 4,
    top: int = 8,
    wrap: bool = True,
    metric: str = "chebyshev",
    negative_quantile: float = 0.2,
    max_negatives: int = 48,
) -> dict[str, np.ndarray]:
    """The premise statistics of a batch of crops ``tokens`` (B, N, D): numpy arrays, first axis B.

    Computed with numpy (a CPU torch tensor is read as one): the selection rules are the ones
    training runs on torch tensors, and this process never needs torch's import."""
    sim = selection.cosine(np.asarray(tokens))
    b, n, _ = sim.shape
    if n != grid * grid:
        raise SettingError("grid", f"the tokens have {n} patches, not the {grid * grid} of grid {grid}", "drop grid (the view sets it)")
    if not 1 <= top < n:
        raise SettingError("top", f"top must lie in 1..{n - 1} with {n} patches, got {top!r}", f"use top in 1..{n - 1}")
    if not 1 <= k < n:
        raise SettingError("k", f"k must lie in 1..{n - 1} with {n} patches, got {k!r}", f"use k in 1..{n - 1}")
    inside = _membership(grid, wrap)
    distance = np.asarray(grid_distance(grid, metric, torus=wrap))

    ranked = selection.most_similar(sim, max(top, k))
    top_inside = _take(inside, ranked[..., :top])
    out = {
        "top_in_window": _mean(top_inside),
        "top_distance": _take(distance, ranked[..., :top]).mean((1, 2)),
        "topk_in_window": _mean(_take(inside, ranked[..., :k])),
        "top_in_window_count": top_inside.sum(-1).astype(np.uint8),
    }

    # SelfPatch's rule: the k most similar of the window, against the candidates it leaves out
    table = selection.window(grid, wrap)
    candidates = selection.window_cosine(None, grid, wrap, similarity=sim)
    chosen = selection.window_topk(None, grid, k, wrap, similarity=sim)
    slots = np.arange(selection.WINDOW_SIZE)
    picked = (chosen.position[..., None] == slots).any(-2)  # (B, N, 8); invalid positions are -1
    others = table.valid & ~picked
    finite = np.where(np.isfinite(candidates), candidates, np.float32(0))
    out["positive_cosine"] = _masked_mean(finite, picked)
    out["other_cosine"] = _masked_mean(finite, others)
    out["wrapped_positive_share"] = _masked_mean(np.broadcast_to(table.wrapped, picked.shape).astype(np.float32), picked)

    # our rule: positives and negatives anywhere in the crop
    rule = selection.contrastive(None, k, negative_quantile, max_negatives, similarity=sim)
    counts = rule.negative_valid.sum(-1)
    out["contrastive_in_window"] = _mean(_take(inside, rule.positive))
    out["contrastive_distance"] = _take(distance, rule.positive).mean((1, 2))
    out["negative_count_mean"] = counts.astype(np.float32).mean(1, dtype=np.float32)
    out["negative_theta"] = rule.theta
    out["negative_count"] = counts.astype(np.int16)
    return out


# image_statistics's settings and their defaults (SelfPatch's k_num = 4 and its 3 × 3 window on the torus)
PREMISE = {name: p.default for name, p in inspect.signature(image_statistics).parameters.items() if p.default is not p.empty}


def _chunk(tokens: np.ndarray, **settings) -> dict[str, np.ndarray]:
    return image_statistics(np.asarray(tokens), **settings)


def structure(grid: int, wrap: bool) -> dict[str, float]:
    """The window's links: 8 per anchor, and how many of them wrap (12G − 4 with the wrap)."""
    table = selection.window(grid, wrap)
    links = int(table.valid.sum())
    wrapped = int(table.wrapped.sum())
    return {"links": links, "wrapped_links": wrapped, "wrapped_share": wrapped / links}


def neighbours(
    tokens: xr.DataArray | StoreArray,
    grid: int,
    *,
    boot: Bootstrap = Bootstrap(),
    run_blocks: Callable[..., dict[str, np.ndarray]] | None = None,
    **premise: Any,
) -> Results:
    """Premise statistics of a store's tokens (image, patch, channel), chunk by chunk over images:
    a ``store.plain.Results`` (``.to_xarray()`` for a Dataset), saved in xarray's layout without
    importing xarray and pandas. ``boot``: the summary's bootstrap over images. ``run_blocks``: where the per-image block function runs
    (``infra.runner.per_image``); by default in this process, a store chunk at a time.
    ``premise``: ``image_statistics``'s settings (``PREMISE``: k, top, wrap, metric,
    negative_quantile, max_negatives), SelfPatch's by default."""
    unknown = sorted(set(premise) - set(PREMISE))
    if unknown:
        raise TypeError(f"neighbours() got unexpected keyword arguments {unknown}")
    settings = {"grid": grid, **PREMISE, **premise}
    top, wrap, metric, max_negatives = settings["top"], settings["wrap"], settings["metric"], settings["max_negatives"]
    if tokens.ndim != 3:
        raise ProbeError(tokens.name, f"has dims {tokens.dims}", "pass (image, patch, channel) tokens")
    side = grid_side(tokens.shape[1], str(tokens.name))
    if side != grid:
        raise SettingError("grid", f"{tokens.name} holds {side}×{side} patches, not grid {grid}×{grid}", f"use grid={side}, or drop grid (the view sets it)")
    grid_distance(grid, metric)  # validates the metric name before any work
    fn = functools.partial(_chunk, **settings)
    per_image = (run_blocks or runner.per_image())(fn, {"tokens": tokens})  # in this process unless told

    n = grid * grid
    summarised, images, described = boot.summary(tokens, np.stack([per_image[name] for name in STATISTICS], axis=1))
    histogram = np.bincount(per_image["negative_count"].ravel().astype(np.int64), minlength=max_negatives + 1)
    data = {name: ("image", per_image[name].astype(np.float32)) for name in STATISTICS}
    data.update(
        top_in_window_count=(("image", "patch"), per_image["top_in_window_count"]),
        negative_count=(("image", "patch"), per_image["negative_count"]),
        **summarised,
        anchor_top_in_window=("patch", per_image["top_in_window_count"].mean(0) / top),
        negative_count_histogram=("count", histogram[: max_negatives + 1]),
        **{name: ((), value) for name, value in structure(grid, wrap).items()},
    )
    coords = {"image": images, "patch": np.arange(n), "statistic": list(STATISTICS), "count": np.arange(max_negatives + 1)}
    attrs = dict(
        settings,
        distance=f"{metric} ({'torus' if wrap else 'plain grid'}), patch units",
        **described,
        positives_per_anchor=settings["k"],
    )
    return Results(data, coords=coords, attrs=attrs)
