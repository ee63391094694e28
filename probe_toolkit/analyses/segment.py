"""Linear semantic segmentation on a frozen network's last-layer patch tokens, as DINOv3's
``eval/segmentation`` (config-ade20k-linear-training.yaml) and DINOv2's linear ADE20K head
(mmsegmentation ``BNHead``) train and score it: the head, its loss, the learning-rate schedule,
one training step, the sliding-window inference and the mIoU. Tensors in, tensors out; the
network is a callable handed in (``features``), the augmentations are ``segment_augment``.

The head (dinov3 ``models/heads/linear_head.py`` ``LinearHead``; mmseg ``BNHead`` + ``cls_seg``):
channel dropout (DINOv3 0.1, DINOv2 0), BatchNorm over the batch's patches, a 1×1 convolution
(weights N(0, 0.01²), bias 0). Its logits, at the patch grid, are upsampled bilinearly
(align_corners False) to the label map for the loss: cross-entropy with 255 ignored, averaged over
*every* pixel of the batch, ignored ones included (mmseg's ``weight_reduce_loss`` with
``avg_non_ignore=False``, which dinov3 ``loss.py`` keeps). AdamW (β 0.9, 0.999) on the head's
parameters, BatchNorm's and the bias included, no gradient clipping ('inf' in DINOv3's config,
None in DINOv2's).

Scores (dinov3 ``eval.py`` + ``inference.py`` ``slide_inference``; mmseg ``slide_inference``):
windows of 512 with stride 341 over the short-side-512 image, each window's logits upsampled to
the window, summed and divided by the windows covering each pixel, upsampled to the label map's
size, argmax. Per class, intersection and union summed over the val images; IoU = I / U and the
mIoU is the mean over classes whose union is not empty (``nanmean``): a class neither present
nor predicted anywhere does not count, one predicted but absent counts 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .segment_augment import IGNORE
from .segment_published import BATCH, BETAS, CROP, INIT_STD, ITERATIONS, LR, PRESETS, PUBLISHED, SIZE, STRIDE, WARMUP, WARMUP_RATIO, Preset, published_warmup  # noqa: F401

Features = Callable[[torch.Tensor], torch.Tensor]  # (B, 3, H, W) normalised → (B, D, rows, cols), no gradient


def learning_rate(step: int, *, lr: float, iterations: int, warmup: int, decay: str, warmup_ratio: float = WARMUP_RATIO) -> float:
    """The rate of iteration ``step`` (0-based).

    cosine (dinov3 ``schedulers.WarmupOneCycleLR`` as ``train.py`` steps it: not after the first
    iteration, so iterations 0 and 1 share the scheduler's first rate): scheduler step s =
    max(step − 1, 0); during the warm-up lr·(1 − k)·(1 − s/T) with k = (1 − s/W)(1 − ratio), then
    lr·(1 + cos(π(s + 1)/T))/2. poly (mmcv ``PolyLrUpdaterHook`` with linear warm-up): the poly rate
    lr·(1 − step/T), times (1 − k) with k = (1 − step/W)(1 − ratio) during the warm-up.
    """
    if decay == "cosine":
        s = max(step - 1, 0)
        if s < warmup:
            k = (1 - s / warmup) * (1 - warmup_ratio)
            return lr * (1 - k) * (1 - s / iterations)
        return lr / 2.0 * (math.cos(math.pi * (s + 1) / iterations) + 1)
    regular = lr * (1 - step / iterations)
    if step < warmup:
        return regular * (1 - (1 - step / warmup) * (1 - warmup_ratio))
    return regular


class LinearHead(nn.Module):
    """Channel dropout (training only), BatchNorm, 1×1 convolution: (B, D, r, c) → (B, K, r, c)."""

    def __init__(self, width: int, n_classes: int, dropout: float, generator: torch.Generator):
        super().__init__()
        self.dropout = float(dropout)
        self.bn = nn.BatchNorm2d(width)  # SyncBatchNorm's defaults: eps 1e-5, momentum 0.1
        self.conv = nn.Conv2d(width, n_classes, kernel_size=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=generator) * INIT_STD)
            self.conv.bias.zero_()

    def forward(self, features: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.training and self.dropout > 0:  # nn.Dropout2d's rule, its draws from ``generator``
            keep = torch.rand(features.shape[:2], generator=generator) >= self.dropout
            features = features * (keep.to(features.dtype) / (1 - self.dropout))[:, :, None, None].to(features.device)
        return self.conv(self.bn(features))


def segmentation_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the upsampled logits, 255 ignored, averaged over every pixel."""
    up = F.interpolate(logits, size=target.shape[-2:], mode="bilinear", align_corners=False)
    return F.cross_entropy(up, target, ignore_index=IGNORE, reduction="none").mean()


def make_optimizer(head: LinearHead, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(head.parameters(), lr=LR, betas=BETAS, weight_decay=weight_decay)


def train_step(
    head: LinearHead, optimizer: torch.optim.Optimizer, features: torch.Tensor, target: torch.Tensor, rate: float, generator: torch.Generator | None = None
) -> float:
    """One iteration on a batch's frozen features: forward, loss, backward, AdamW at ``rate``."""
    for group in optimizer.param_groups:
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
    head.train()
    loss = segmentation_loss(head(features, generator), target)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def center_pad(images: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero padding to a multiple of the patch, split evenly (the left/top gets the smaller half):
    DINOv2's ``CenterPadding`` (notebooks/semantic_segmentation.ipynb); nothing at 512 px and /16."""
    h, w = images.shape[-2:]
    ph, pw = -h % multiple, -w % multiple
    if not (ph or pw):
        return images
    return F.pad(images, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))


def window_boxes(height: int, width: int, crop: int, stride: int) -> list[tuple[int, int, int, int]]:
    """(y1, y2, x1, x2) of each sliding window, row by row, as ``slide_inference`` places them
    (the last row and column flush with the image's edge; an image smaller than the crop on both
    sides is one window of its short side)."""
    hc = wc = crop
    if hc > height and wc > width:
        hc = wc = min(height, width)
    rows = max(height - hc + stride - 1, 0) // stride + 1
    cols = max(width - wc + stride - 1, 0) // stride + 1
    boxes = []
    for i in range(rows):
        for j in range(cols):
            y2, x2 = min(i * stride + hc, height), min(j * stride + wc, width)
            boxes.append((max(y2 - hc, 0), y2, max(x2 - wc, 0), x2))
    return boxes


def window_logits(head: LinearHead, features: Features, crops: torch.Tensor) -> torch.Tensor:
    """(n, K, h, w): the head's logits of same-size windows, upsampled to the window."""
    head.eval()
    with torch.no_grad():
        logits = head(features(crops))
        return F.interpolate(logits, size=crops.shape[-2:], mode="bilinear", align_corners=False)


def slide_logits(image: torch.Tensor, head: LinearHead, features: Features, n_classes: int, crop: int = CROP, stride: int = STRIDE, batch: int = 8) -> torch.Tensor:
    """(1, K, H, W) window-averaged logits of one (1, 3, H, W) image; windows of one size go
    through the network ``batch`` at a time (in eval mode each window's logits are its own)."""
    _, _, h, w = image.shape
    total = torch.zeros((1, n_classes, h, w))
    count = torch.zeros((1, 1, h, w))
    boxes = window_boxes(h, w, crop, stride)
    for a in range(0, len(boxes), batch):
        part = boxes[a : a + batch]
        crops = torch.cat([image[:, :, y1:y2, x1:x2] for y1, y2, x1, x2 in part])
        out = window_logits(head, features, crops).float().cpu()
        for (y1, y2, x1, x2), logits in zip(part, out):
            total[0, :, y1:y2, x1:x2] += logits
            count[0, :, y1:y2, x1:x2] += 1
    return total / count


def predict(
    image: torch.Tensor, shape: tuple[int, int], head: LinearHead, features: Features, n_classes: int, crop: int = CROP, stride: int = STRIDE, batch: int = 8
) -> np.ndarray:
    """(H, W) uint8 classes at the label map's ``shape``: slide, upsample, argmax (the
    reference's softmax before the argmax changes no class)."""
    logits = slide_logits(image, head, features, n_classes, crop, stride, batch)
    up = F.interpolate(logits, size=shape, mode="bilinear", align_corners=False)
    return up.argmax(1)[0].to(torch.uint8).numpy()


def intersect_union(predicted: np.ndarray, label: np.ndarray, n_classes: int) -> np.ndarray:
    """(4, K) int64 pixel counts of one image: intersection, union, predicted, labelled; pixels
    labelled 255 are left out (``calculate_intersect_and_union``)."""
    keep = label != IGNORE
    p, t = predicted[keep].astype(np.int64), label[keep].astype(np.int64)
    inter = np.bincount(p[p == t], minlength=n_classes)[:n_classes]
    area_p = np.bincount(p, minlength=n_classes)[:n_classes]
    area_t = np.bincount(t, minlength=n_classes)[:n_classes]
    return np.stack([inter, area_p + area_t - inter, area_p, area_t])


@dataclass
class Scores:
    iou: np.ndarray  # (K,) float64, NaN where the class is neither labelled nor predicted
    miou: float  # nanmean of iou
    accuracy: float  # aAcc: correct labelled pixels / labelled pixels
    areas: np.ndarray  # (4, K) summed counts


def scores(areas: np.ndarray) -> Scores:
    inter, union, _, labelled = (a.astype(np.float64) for a in areas)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = inter / union
    present = ~np.isnan(iou)
    miou = float(iou[present].mean()) if present.any() else float("nan")
    accuracy = float(inter.sum() / labelled.sum()) if labelled.sum() else float("nan")
    return Scores(iou, miou, accuracy, areas)
