"""Label propagation through frozen patch features, as DINO's ``eval_video_segmentation.py`` does it.

Each frame's patch features (L2-normalised) are compared with those of its context: the first
frame and the ``n_last`` previous frames, whose *soft* segmentations (not their argmax) are kept
in a queue. Affinity exp(cos / 0.1), zero outside a window of radius ``radius`` patches
(Chebyshev, clipped at the border); for every target patch the ``topk`` largest affinities are
chosen jointly over all context frames, every source at or above the k-th value kept (ties at
the cut-off stay, as the script's ``aff[aff < min] = 0`` keeps them); the kept affinities are
normalised per target and carry the context's soft labels. The prediction is upsampled
bilinearly by the patch size, each label's map min-max normalised, argmaxed, and resized to the
original frame with nearest neighbour.

Frames are made as the script makes them (``frame_tensor``: from OpenCV's decoded BGR pixels,
its 8-bit INTER_LINEAR resize), so the network sees the same input to the last grey level;
otherwise pure torch over tensors, the frames and features coming from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

N_LAST = 7
RADIUS = 12
TOPK = 5
TEMPERATURE = 0.1
SHORT_SIDE = 480
MEAN = (0.485, 0.456, 0.406)
STD = (0.228, 0.224, 0.225)  # eval_video_segmentation.py's color_normalize (0.228, not 0.229)


def frame_size(width: int, height: int, short: int = SHORT_SIDE) -> tuple[int, int]:
    """(width, height) of the network's input: short side ``short``, long side floored to a multiple of 64."""
    if height > width:
        return short, int((short * height / width) // 64 * 64)
    return int((short * width / height) // 64 * 64), short


def frame_tensor(bgr: np.ndarray, short: int = SHORT_SIDE) -> torch.Tensor:
    """(H, W, 3) uint8 BGR, as ``cv2.imread`` decodes a frame → (3, h, w) normalised network input
    at ``frame_size``, as the script's ``read_frame`` makes it: ``cv2.resize`` with its default
    INTER_LINEAR on the 8-bit image (the input rounded to whole grey levels), then float32 / 255,
    BGR → RGB, and the mean and std subtracted and divided channel by channel in place."""
    import cv2

    height, width = bgr.shape[:2]
    w, h = frame_size(width, height, short)
    img = cv2.resize(np.ascontiguousarray(bgr, dtype=np.uint8), (w, h)).astype(np.float32) / 255.0
    x = torch.from_numpy(np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1))).float()
    for channel, m, s in zip(x, MEAN, STD):
        channel.sub_(m)
        channel.div_(s)
    return x


def window(rows: int, cols: int, radius: int) -> torch.Tensor:
    """(rows·cols, rows·cols) 0/1: source within ``radius`` patches of the target in both directions."""
    r = torch.arange(rows).repeat_interleave(cols)
    c = torch.arange(cols).repeat(rows)
    near = ((r[:, None] - r[None, :]).abs() <= radius) & ((c[:, None] - c[None, :]).abs() <= radius)
    return near.float()


def one_hot(labels: np.ndarray, n_labels: int | None = None) -> torch.Tensor:
    """(h, w) ints → (labels, h, w) float one-hot (labels = max + 1 unless given)."""
    t = torch.as_tensor(np.array(labels, dtype=np.int64))
    n = int(t.max()) + 1 if n_labels is None else n_labels
    return F.one_hot(t, n).permute(2, 0, 1).float()


def first_labels(annotation: np.ndarray, rows: int, cols: int) -> torch.Tensor:
    """The first frame's indexed annotation resized to the patch grid with nearest (PIL), one-hot."""
    small = np.asarray(Image.fromarray(np.asarray(annotation, np.uint8)).resize((cols, rows), Image.Resampling.NEAREST))
    return one_hot(small)


@dataclass
class Propagated:
    soft: torch.Tensor  # (labels, rows, cols) the propagated soft segmentation
    labels: np.ndarray  # (height, width) uint8 at the original size


def propagate_frame(
    target: torch.Tensor, context: torch.Tensor, segs: torch.Tensor, near: torch.Tensor | None, topk: int, temperature: float = TEMPERATURE
) -> torch.Tensor:
    """One target frame. ``target`` (N, D) and ``context`` (M, N, D) normalised; ``segs`` (M, C, N) → (C, N).

    Laid out target-major (target, context · source) so that the cut-off runs along contiguous memory.
    """
    m, n, _ = context.shape
    aff = torch.exp(target @ context.reshape(m * n, -1).T / temperature)  # (target, M·source)
    if near is not None:
        aff = (aff.view(-1, m, n) * near.unsqueeze(1)).view(-1, m * n)
    cut = aff.topk(topk, dim=1).values[:, -1:]
    aff = torch.where(aff < cut, torch.zeros((), dtype=aff.dtype), aff)
    aff = aff / aff.sum(1, keepdim=True)
    return (aff @ segs.permute(0, 2, 1).reshape(m * n, -1)).T


def to_labels(soft: torch.Tensor, patch: int, size: tuple[int, int]) -> np.ndarray:
    """Upsample bilinearly by ``patch``, min-max each label's map, argmax, nearest-resize to ``size`` (width, height)."""
    up = F.interpolate(soft.unsqueeze(0), scale_factor=patch, mode="bilinear", align_corners=False, recompute_scale_factor=False)[0]
    lo = up.amin((1, 2), keepdim=True)
    hi = (up - lo).amax((1, 2), keepdim=True)
    normed = torch.where(up.amax((1, 2), keepdim=True) > 0, (up - lo) / torch.where(hi > 0, hi, torch.ones_like(hi)), up)
    labels = torch.max(normed, dim=0).indices.numpy().astype(np.uint8)  # the script's torch.max
    return np.asarray(Image.fromarray(labels).resize(size, Image.Resampling.NEAREST))


def propagate(
    features: Iterable[torch.Tensor],
    first: torch.Tensor,
    rows: int,
    cols: int,
    patch: int,
    size: tuple[int, int],
    *,
    n_last: int = N_LAST,
    radius: int = RADIUS,
    topk: int = TOPK,
    temperature: float = TEMPERATURE,
    near: torch.Tensor | None = None,
    labels: Callable[[torch.Tensor, tuple[int, int]], np.ndarray] | None = None,
) -> Iterator[Propagated]:
    """Frames 1.. of a sequence: ``features`` yields (rows·cols, D) per frame, the first frame first.

    ``first`` (C, rows, cols) is the first frame's one-hot labels; ``size`` the original (width, height).
    ``near``: another window than DINO's square of ``radius`` (DINOv3's circle, ``analyses.tracking``);
    ``labels``: another rule from a soft grid to labels than ``to_labels``.
    """
    stream = iter(features)
    first_feat = next(stream).float()
    if near is None:
        near = window(rows, cols, radius) if radius > 0 else None
    first_seg = first.reshape(first.shape[0], -1)
    queue: list[tuple[torch.Tensor, torch.Tensor]] = []  # raw features (normalised where used, as the script does)
    for feat in stream:
        feat = feat.float()
        context = F.normalize(torch.stack([first_feat, *[f for f, _ in queue]]), dim=2)
        segs = torch.stack([first_seg, *[s for _, s in queue]])
        soft = propagate_frame(F.normalize(feat, dim=1), context, segs, near, topk, temperature)
        if len(queue) == n_last:
            queue.pop(0)
        queue.append((feat, soft))
        grid = soft.reshape(-1, rows, cols)
        yield Propagated(grid, labels(grid, size) if labels is not None else to_labels(grid, patch, size))
