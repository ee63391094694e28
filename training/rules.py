"""Which patches each anchor learns from: the configured rule, through ``probe_toolkit.analyses.selection``.

No selection code lives here; this module only calls the shared rules (the ones ``probe
neighbours`` measures) on the teacher's raw last-block tokens, one crop size at a time, and hands
the losses index tensors. Rules:

- ``selfpatch``: ``window_topk`` — the 3×3 window (wrap-around), the top 4 of 8 by cosine.
- ``threshold``: ``window_threshold`` — the same window, kept where cosine ≥ θ; θ is one median
  over every window link of the whole step (all micro-batches and processes: the selector study's
  batch median) or each crop's own quantile.
- ``contrastive``: ``contrastive`` — top k anywhere in the crop; negatives at or below the crop's
  20th percentile of pairwise cosine, never a positive, at most 48, least similar first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from probe_toolkit.analyses import selection

from .config import RuleCfg


@dataclass
class Selection:
    """One crop group's sets: (B, N, K) patch indices with validity masks (-1 where invalid)."""

    positive: torch.Tensor
    positive_valid: torch.Tensor
    negative: torch.Tensor | None = None
    negative_valid: torch.Tensor | None = None


def grid_of(tokens: torch.Tensor) -> int:
    return int(round(tokens.shape[1] ** 0.5))


def batch_theta(tokens: list[torch.Tensor], rule: RuleCfg, distributed: bool) -> torch.Tensor | None:
    """θ of the threshold rule's batch median over every window link of a step (``tokens``: every group of every micro-batch).

    Under DDP the window cosines of all processes are gathered first, so θ is the median of the
    whole global batch, as on one card (``selection.window_theta`` over the list). Other rules
    and modes: None.
    """
    if rule.name != "threshold" or rule.theta_mode != "batch-median":
        return None
    cosines = [selection.window_cosine(t, grid_of(t), rule.wrap) for t in tokens]
    if distributed:
        gathered = []
        for c in cosines:
            parts = [torch.empty_like(c) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, c.contiguous())
            gathered.append(torch.cat(parts))
        cosines = gathered
    return selection.window_theta(cosines, mode="batch-median")[0][0]


def select(tokens: torch.Tensor, rule: RuleCfg, theta: torch.Tensor | None = None) -> Selection:
    """The sets of one group of crops (B, N, D) of the teacher's tokens, by ``rule``."""
    grid = grid_of(tokens)
    if rule.name == "selfpatch":
        top = selection.window_topk(tokens, grid, k=rule.k, wrap=rule.wrap)
        return Selection(top.index, top.valid)
    if rule.name == "threshold":
        keep = selection.window_threshold(tokens, grid, theta=theta, mode=rule.theta_mode, q=rule.quantile, wrap=rule.wrap)
        table = selection.window(grid, rule.wrap, device=tokens.device)
        index = table.index.expand(keep.shape).masked_fill(~keep, -1)
        return Selection(index, keep)
    if rule.name == "contrastive":
        sets = selection.contrastive(tokens, k=rule.k, negative_quantile=rule.negative_quantile, max_negatives=rule.max_negatives)
        return Selection(sets.positive, sets.positive_valid, sets.negative, sets.negative_valid)
    raise ValueError(f"rule {rule.name!r} selects nothing")
