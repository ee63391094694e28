"""Linear monocular depth on a frozen network's patch tokens, as facebookresearch/dinov3
``dinov3/eval/depth`` (``config-nyu.yaml``) and DINOv2's linear depth heads train and score it:
the head, the bins that turn its logits into metres, the loss, the schedule, one training step,
the prediction with its test-time flip, and the metrics. Tensors in, tensors out; the network is a
callable handed in (``Features``), the crops are ``depth_augment``, the published values
``depth_published``.

The head (dinov3 ``models/linear_head.py`` + ``models/__init__.py`` ``FeaturesToDepth``): the
chosen blocks' patch maps (with DINOv2 the class token concatenated to every patch, the maps
upsampled bilinearly ×4), BatchNorm (DINOv3 only), a 1×1 convolution to 256 logits, which become
a depth as the mean of 256 bins spaced linearly over [1e-3, 10] m weighted by ``relu(logit) + 0.1``
normalised to sum 1 ('linear' normalisation, after AdaBins). The depth map, at the patch grid (or
4× it), is upsampled bilinearly (align_corners False) to the ground truth for the loss and the
metrics.

The loss (dinov3 ``loss.py`` ``SigLoss``; DINOv2 ``losses/sigloss.py``): over the valid pixels
(truth ≠ 0), g = log(pred + 1e-3) − log(truth + 1e-3); during the first 100 iterations
sqrt(0.15·mean(g)²), then sqrt(var(g) + 0.15·mean(g)²) (unbiased variance). The reference trains
on 8 GPUs of 2 crops under DDP: each GPU's loss covers its own 2 crops and the gradients are
averaged, while the BatchNorm (SyncBatchNorm) sees all 16; ``train_step`` computes exactly that in
one process (the loss of each group of ``batch`` crops, averaged; BatchNorm over the whole batch).

Metrics (dinov3 ``eval.py`` + ``metrics.py`` + ``datasets_utils.make_valid_mask``), per image,
then averaged over images (``nanmean``): the truth outside (1e-3, 10) m set to 0; valid pixels are
those inside the Eigen crop whose truth is not 0; the prediction upsampled to the truth's size and
clamped to [1e-3, 10]; δ1..δ3, AbsRel, SqRel, RMSE, RMSE-log, log10, SILog (0 where it is NaN, as
the reference sets it: an image without a valid pixel counts SILog 0 and NaN elsewhere) and MAE,
in float32 as the reference computes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import depth_published as pub

# the frozen network as the head reads it: (B, 3, H, W) normalised → one (patch map (B, D, h, w), class token (B, D) or None) per block
Features = Callable[[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor | None]]]
EPS = 1e-3  # SigLoss.eps


# ----------------------------------------------------------------------------------------------
# the head


class DepthHead(nn.Module):
    """Features of the chosen blocks → 256 logits per position: (B, K, h·u, w·u)."""

    def __init__(self, channels: int, preset: pub.Preset, generator: torch.Generator, bins: int = pub.BINS):
        super().__init__()
        self.preset = preset
        self.bn = nn.BatchNorm2d(channels) if preset.batchnorm else None  # SyncBatchNorm's defaults: eps 1e-5, momentum 0.1
        self.conv = nn.Conv2d(channels, bins, kernel_size=1)
        with torch.no_grad():
            if preset.init == "normal":  # nn.init.normal_(std=0.01), constant_(bias, 0)
                self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=generator) * pub.INIT_STD)
                self.conv.bias.zero_()
            else:  # nn.Conv2d.reset_parameters: kaiming_uniform_(a=√5) and a uniform bias, both ±1/√fan_in
                bound = 1 / math.sqrt(channels)
                self.conv.weight.copy_((torch.rand(self.conv.weight.shape, generator=generator) * 2 - 1) * bound)
                self.conv.bias.copy_((torch.rand(self.conv.bias.shape, generator=generator) * 2 - 1) * bound)

    def forward(self, blocks: Sequence[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor:
        maps = []
        for patch, cls in blocks:
            if self.preset.class_token:  # BNHead._forward_feature: the class token beside every patch
                patch = torch.cat((patch, cls[:, :, None, None].expand_as(patch)), 1)
            maps.append(patch)
        h, w = maps[0].shape[-2:]
        size = [h * self.preset.upsample, w * self.preset.upsample]
        x = torch.cat([F.interpolate(m, size=size, mode="bilinear", align_corners=False) for m in maps], 1)
        if self.bn is not None:
            x = self.bn(x)
        return self.conv(x)


def channels_of(width: int, preset: pub.Preset, depth: int) -> int:
    return width * len(pub.blocks_of(preset, depth)) * (2 if preset.class_token else 1)


def to_depth(logits: torch.Tensor, low: float = pub.MIN_DEPTH, high: float = pub.MAX_DEPTH) -> torch.Tensor:
    """(B, K, h, w) logits → (B, 1, h, w) metres: the bins' mean under relu(logit) + 0.1, normalised."""
    bins = torch.linspace(low, high, logits.shape[1], device=logits.device, dtype=logits.dtype)
    weights = torch.relu(logits) + 0.1
    weights = weights / weights.sum(dim=1, keepdim=True)
    return torch.einsum("ikmn,k->imn", [weights, bins]).unsqueeze(dim=1)


def predict(head: DepthHead, features: Features, images: torch.Tensor) -> torch.Tensor:
    """(B, 1, h', w') depth at the head's grid of normalised (B, 3, H, W) images, head in eval mode."""
    head.eval()
    with torch.no_grad():
        return to_depth(head(features(images)))


def predict_flipped(head: DepthHead, features: Features, image: torch.Tensor) -> torch.Tensor:
    """(1, 1, h', w') the test-time augmentation of ``LeftRightFlipAug``: the image and its mirror
    in one batch, the mirror's depth flipped back and the two averaged, at the head's grid."""
    both = predict(head, features, torch.cat([image, image.flip(-1)]))
    return (both[:1] + both[1:].flip(-1)) / 2


# ----------------------------------------------------------------------------------------------
# the loss and one training step


def sigloss(pred: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor, warm: bool) -> torch.Tensor:
    """The scale-invariant log loss over ``valid`` pixels; ``warm``: only the mean term."""
    g = torch.log(pred[valid] + EPS) - torch.log(truth[valid] + EPS)
    dg = 0.15 * torch.pow(torch.mean(g), 2)
    if not warm:
        dg = dg + torch.var(g)
    return torch.abs(dg) if dg <= 0 else torch.sqrt(dg)


def depth_loss(head: DepthHead, blocks, truth: torch.Tensor, group: int, warm: bool) -> torch.Tensor:
    """The batch's loss: the head over all its crops (BatchNorm sees them all), the depth upsampled
    to the truth, SigLoss of each ``group`` of crops (one GPU's) averaged (DDP's mean gradient)."""
    pred = to_depth(head(blocks))
    pred = F.interpolate(pred, size=truth.shape[-2:], mode="bilinear", align_corners=False)
    valid = truth != 0  # make_valid_mask(FULL, ignored_value 0)
    parts = [sigloss(pred[a : a + group], truth[a : a + group], valid[a : a + group], warm) for a in range(0, len(truth), group)]
    return torch.stack(parts).mean()


def make_optimizer(head: DepthHead) -> torch.optim.AdamW:
    p = head.preset
    return torch.optim.AdamW(head.parameters(), lr=p.lr, betas=p.betas, weight_decay=p.weight_decay)


def train_step(head: DepthHead, optimizer: torch.optim.Optimizer, blocks, truth: torch.Tensor, rate: float, beta1: float, group: int, warm: bool) -> float:
    """One iteration: forward, loss, backward, gradient norm clipped at 35, AdamW at (``rate``, ``beta1``)."""
    for g in optimizer.param_groups:
        g["lr"] = rate
        g["betas"] = (beta1, g["betas"][1])
    optimizer.zero_grad(set_to_none=True)
    head.train()
    loss = depth_loss(head, blocks, truth, group, warm)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([q for q in head.parameters() if q.requires_grad], pub.CLIP)
    optimizer.step()
    return float(loss.detach())


# ----------------------------------------------------------------------------------------------
# the schedule


def _anneal_cos(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def schedule(step: int, *, lr: float, iterations: int, warmup: int, kind: str) -> tuple[float, float]:
    """(learning rate, AdamW β1) of iteration ``step`` (0-based).

    onecycle (dinov3 ``schedulers.WarmupOneCycleLR``, stepped after every iteration, ``use_beta1``):
    during the warm-up lr/1000 + lr·(1 + cos(π s/T))/2 · s/W and β1 = 0 (the scheduler leaves its
    momentum at 0 there and writes it into β1); then lr anneals by cosine from lr to lr/25/1000 at
    (s + 1)/T and β1 from 0.85 to 0.95 over the rest. cosine (DINOv2's mmcv config): lr anneals by
    cosine to lr·1e-8 at s/T, times 1 − (1 − s/W)(1 − 1e-3) during the warm-up; β1 follows mmcv's
    OneCycle momentum: 0.95 → 0.85 until 0.3·T − 1, then back to 0.95 at T − 1.
    """
    s, total = step, iterations
    if kind == "onecycle":
        if s < warmup:
            return lr / pub.FINAL_DIV_FACTOR + lr * (1 + math.cos(math.pi * s / total)) / 2 * s / warmup, 0.0
        low = lr / pub.DIV_FACTOR / pub.FINAL_DIV_FACTOR
        momentum = _anneal_cos(pub.BASE_MOMENTUM, pub.MAX_MOMENTUM, (s - warmup) / (total - warmup))
        return _anneal_cos(lr, low, (s + 1) / total), momentum
    rate = _anneal_cos(lr, lr * pub.MIN_LR_RATIO, s / total)
    if s < warmup:
        rate *= 1 - (1 - s / warmup) * (1 - pub.WARMUP_RATIO)
    first = pub.PCT_START * total - 1
    if s <= first:
        momentum = _anneal_cos(pub.MAX_MOMENTUM, pub.BASE_MOMENTUM, s / first)
    else:
        momentum = _anneal_cos(pub.BASE_MOMENTUM, pub.MAX_MOMENTUM, (s - first) / (total - 1 - first))
    return rate, momentum


# ----------------------------------------------------------------------------------------------
# the metrics


def valid_mask(truth: torch.Tensor, eigen: bool = True) -> torch.Tensor:
    """(B, 1, H, W) bool: inside the Eigen crop (its box scaled to H × W, as ``make_valid_mask``)
    and truth not 0."""
    _b, _, h, w = truth.shape
    mask = torch.zeros(truth.shape, dtype=torch.bool, device=truth.device)
    if eigen:
        y1, y2, x1, x2 = pub.EIGEN_CROP
        oh, ow = pub.NYU_SIZE
        mask[:, :, int(y1 / oh * h) : int(y2 / oh * h), int(x1 / ow * w) : int(x2 / ow * w)] = True
    else:
        mask[:] = True
    return mask & ~(truth == 0).all(dim=1, keepdim=True)


def in_range(truth: torch.Tensor, low: float = pub.MIN_DEPTH, high: float = pub.MAX_DEPTH) -> torch.Tensor:
    """The truth with depths at or beyond the range's ends set to 0 (ignored)."""
    return torch.where((truth >= high) | (truth <= low), torch.zeros((), dtype=truth.dtype), truth)


def image_metrics(truth: torch.Tensor, pred: torch.Tensor, low: float = pub.MIN_DEPTH, high: float = pub.MAX_DEPTH, eigen: bool = True) -> dict[str, float]:
    """The metrics of one image: ``truth`` (1, 1, H, W) metres, ``pred`` (1, 1, h, w) at any size."""
    truth = in_range(truth.float(), low, high)
    valid = valid_mask(truth, eigen) & (truth > 0)
    if pred.shape[-2:] != truth.shape[-2:]:
        pred = F.interpolate(pred, size=truth.shape[-2:], mode="bilinear", align_corners=False)
    pred = pred.float().clamp(min=low, max=high)
    gt, p = truth[valid], pred[valid]
    thresh = torch.maximum(gt / p, p / gt)
    error = gt - p
    sq = error**2
    log_error = torch.log(gt) - torch.log(p)
    silog = torch.sqrt(torch.mean(log_error**2) - torch.mean(log_error) ** 2) * 100
    out = {
        "a1": (thresh < 1.25).float().mean(),
        "a2": (thresh < 1.25**2).float().mean(),
        "a3": (thresh < 1.25**3).float().mean(),
        "mae": torch.mean(torch.abs(error)),
        "abs_rel": torch.mean(torch.abs(error) / gt),
        "sq_rel": torch.mean(sq / gt),
        "rmse": torch.sqrt(sq.mean()),
        "rmse_log": torch.sqrt((log_error**2).mean()),
        "silog": torch.zeros(()) if torch.isnan(silog) else silog,
        "log_10": torch.abs(torch.log10(gt) - torch.log10(p)).mean(),
    }
    return {k: float(v) for k, v in out.items()}


def mean_metrics(per_image: dict[str, np.ndarray]) -> dict[str, float]:
    """The mean over images of each metric, NaN (no valid pixel) left out, in float32 as the reference."""
    return {k: float(torch.tensor(np.asarray(v, np.float32)).nanmean()) for k, v in per_image.items()}


def error_map(truth: np.ndarray, pred: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(H, W) float32 |truth − prediction| in metres at the valid pixels, NaN elsewhere (the report's figure)."""
    out = np.full(truth.shape, np.nan, np.float32)
    out[valid] = np.abs(truth[valid] - pred[valid])
    return out
