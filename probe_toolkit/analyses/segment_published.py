"""The published values of linear segmentation, without torch: the two presets (DINOv3's
``config-ade20k-linear-training.yaml``, DINOv2's mmseg linear config), the values both share, and
the published ADE20K numbers of released weights. The settings (``protocols/segment.py``), the
terminal table and the report read them here, so that loading the registry imports no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """What one reference configures; the rest (crop 512, scale 0.5–2, lr 1e-3, 1500 warm-up
    iterations from 1e-6 of the rate, batch 2 × 8 GPUs, 40,000 iterations, slide 512 / 341) is
    common to both."""

    name: str
    weight_decay: float
    dropout: float
    decay: str  # after the warm-up: cosine (WarmupOneCycleLR, anneal 'cos', to 0) or poly (mmcv, power 1, to 0)
    pipeline: str  # segment_augment: the library that resizes and distorts
    source: str


PRESETS = {
    "dinov3": Preset(
        "dinov3",
        1e-3,
        0.1,
        "cosine",
        "dinov3",
        "facebookresearch/dinov3 dinov3/eval/segmentation/configs/config-ade20k-linear-training.yaml (+ config.py DecoderConfig.dropout 0.1)",
    ),
    "dinov2": Preset(
        "dinov2", 1e-4, 0.0, "poly", "dinov2", "facebookresearch/dinov2 dinov2_vits14_ade20k_linear_config.py (dl.fbaipublicfiles.com/dinov2; BNHead, mmsegmentation 0.x)"
    ),
}
LR = 1e-3
BETAS = (0.9, 0.999)
WARMUP = 1500
WARMUP_RATIO = 1e-6
ITERATIONS = 40_000
BATCH = 16  # bs 2 × n_gpus 8 (DINOv3); samples_per_gpu 2 × gpu_ids range(0, 8) (DINOv2)
CROP, STRIDE, SIZE = 512, 341, 512
INIT_STD = 0.01
# published ADE20K mIoU of released weights (other weights than any run's): (source, panel kind, mIoU %)
PUBLISHED = (
    ("DINOv3 ViT-S/16 (facebookresearch/dinov3 MODEL_CARD.md, ADE20k linear)", "ade20k", 47.0),
    ("DINOv2 ViT-S/14 linear, multi-scale (facebookresearch/dinov2 MODEL_CARD.md)", "ade20k", 47.2),
    ("DINOv2 ViT-S/14 linear, single scale (Oquab et al. 2023, Table 10)", "ade20k", 44.3),
)


def published_warmup(iterations: int) -> int:
    """The warm-up of a schedule of ``iterations``: 1500 at the published 40,000, the same share
    (3.75 %) of a shorter or longer one."""
    return WARMUP if iterations == ITERATIONS else int(round(iterations * WARMUP / ITERATIONS))
