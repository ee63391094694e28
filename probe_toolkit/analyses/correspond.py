"""Semantic keypoint correspondence on frozen patch features, as mbanani/probe3d's SPair-71k evaluation does it.

``evaluate_spair_correspondence.py`` (``compute_errors``, ``evaluate_dataset``) with the images read
by ``evals/datasets/spair.py`` at ``use_bbox=False``, ``image_size=800`` (``configs/spair_correspondence.yaml``):

- keypoints: each image's whole-pixel keypoints, moved into the 800 × 800 square the image was
  padded (white, right and bottom) and resized to: ``trunc(float32(x · 800) / float32(side))``,
  ``side = max(width, height)`` (integer tensors, as the reference scales them);
- features: the last block's patch tokens (before any final norm), L2-normalised per patch; the
  source keypoint's feature is sampled bilinearly at ``x / 800`` of the grid with
  ``align_corners=True`` (``grid_sample``), and matched to the target patch of largest dot
  product (the first in row-major order on ties, as ``argmax``);
- the prediction is that patch's top-left corner as a fraction of the grid, ``(col, row) / cols``;
  the error is its distance to the target keypoint's ``x / 800``, divided by
  ``max(box width, box height) / max(width, height)`` of the target: PCK at threshold t counts
  errors below t, i.e. within t of the larger side of the target's box;
- a pair scores the keypoints annotated in both images.

Pure torch over arrays; the store, the panel and the sampling of pairs are the caller's. Float32
throughout, with the reference's operations in its order, so errors equal the reference's. torch is
imported where a pair is matched or a PCK counted, not with the module: the pairs are chosen and
their keypoints placed (numpy) before the first image is read.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

SIDE = 800  # configs/spair_correspondence.yaml image_size
THRESHOLD = 0.10  # evaluate_spair_correspondence.py thresh
BINS = (0, 1, 2, None)  # viewpoint_variation; None: every pair (its own sample)


def view_keypoints(points: Sequence[tuple[float, float] | None], size: tuple[int, int], side: int = SIDE) -> np.ndarray:
    """(K, 3) int32 [x, y, visible] in the square view's pixels, as ``process_keypoints`` and
    ``__getitem__`` make them (whole pixels, then scaled in float32 and truncated)."""
    out = np.zeros((len(points), 3), np.int32)
    big = np.float32(max(size))
    for i, point in enumerate(points):
        if point is None:
            continue
        xy = np.trunc(np.asarray(point, np.float64)).astype(np.int32)  # torch.tensor(...).int()
        out[i, :2] = np.trunc((xy * side).astype(np.float32) / big).astype(np.int32)
        out[i, 2] = 1
    return out


def threshold_scale(box: Sequence[int], size: tuple[int, int]) -> float:
    """``max(box side) / max(image side)``, the reference's ``thresh_scale`` at ``use_bbox=False``."""
    left, top, right, bottom = box
    return float(max(right - left, bottom - top)) / max(size)


def normalised(tokens: np.ndarray | torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(rows · cols, D) tokens → (D, rows, cols) float32, L2-normalised per patch (``F.normalize``)."""
    import torch
    import torch.nn.functional as F

    t = torch.as_tensor(np.asarray(tokens)).float().reshape(rows, cols, -1).permute(2, 0, 1)
    return F.normalize(t, p=2, dim=0)


@dataclass
class Matched:
    """One pair's keypoints annotated in both images."""

    index: np.ndarray  # (n,) keypoint indices
    predicted: np.ndarray  # (n, 2) float32 predicted (x, y) as a fraction of the view's side
    error: np.ndarray  # (n,) float32 error in units of the target box's larger side


def match(source: torch.Tensor, target: torch.Tensor, source_kps: np.ndarray, target_kps: np.ndarray, scale: float, side: int = SIDE) -> Matched:
    """``source`` / ``target`` (D, rows, cols) from ``normalised``; keypoints from ``view_keypoints``."""
    import torch
    import torch.nn.functional as F

    cols = target.shape[-1]
    src = torch.from_numpy(source_kps).float()
    trg = torch.from_numpy(target_kps).float()
    src[:, :2] = src[:, :2] / side
    trg[:, :2] = trg[:, :2] / side
    both = (src[:, 2] * trg[:, 2]) == 1
    grid = (src[:, :2] * 2 - 1)[None, None]
    sampled = F.grid_sample(source[None], grid, mode="bilinear", align_corners=True)[0, :, 0].t()  # (K, D)
    heat = sampled @ target.reshape(target.shape[0], -1)  # (K, rows · cols)
    flat = heat.argmax(dim=1)
    predicted = torch.stack((flat % cols, flat // cols), dim=1).float() / cols
    error = (predicted - trg[:, :2]).norm(p=2, dim=-1) / scale
    keep = both.nonzero().squeeze(1)
    return Matched(keep.numpy().astype(np.int32), predicted[keep].numpy(), error[keep].numpy())


def sample(pairs: Sequence, category: str, viewpoint: int | None, instances: int | None, seed: int) -> list:
    """The pairs the reference scores for one category and viewpoint bin: those of the category
    (and bin), in the given order, shuffled by Python's ``random`` seeded ``seed``, the first
    ``instances`` kept (``evals/datasets/spair.py``; None or 0: all, unshuffled)."""
    chosen = [p for p in pairs if p.category == category and (viewpoint is None or p.viewpoint == viewpoint)]
    if instances:
        random.Random(seed).shuffle(chosen)
        chosen = chosen[:instances]
    return chosen


def pck(errors: np.ndarray, threshold: float) -> float:
    """Percentage of errors below ``threshold`` (the reference's recall, ``(errors < thresh).mean() * 100``); NaN when none."""
    import torch

    errors = torch.as_tensor(np.asarray(errors, np.float32))
    return float("nan") if errors.numel() == 0 else (errors < threshold).float().mean().item() * 100.0


def class_average(table: np.ndarray) -> np.ndarray:
    """(category, ...) → (...): the mean over the categories that had pairs (NaN rows skipped), as the reference averages."""
    valid = np.isfinite(table)
    count = valid.sum(axis=0)
    total = np.where(valid, table, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
