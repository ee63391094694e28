"""The published values of linear depth on NYUv2, without torch: the presets (DINOv3's
``config-nyu.yaml`` and DINOv2's ``lin.1`` / ``lin.4`` heads), the values every preset shares, and
the published RMSE of released weights. The settings (``protocols/depth.py``), the terminal table
and the report read them here, so that loading the registry imports no torch.

Sources (facebookresearch/dinov3 at commit 6876159, facebookresearch/dinov2 at commit b8931f7):
``dinov3/eval/depth/configs/config-nyu.yaml`` and ``config.py`` (schedule, optimizer, crops, eval),
``models/__init__.py`` (``FeaturesToDepth``: 256 linear bins, 'linear' normalisation),
``models/linear_head.py`` (BatchNorm + 1×1 convolution, weights N(0, 0.01²)), ``models/encoder.py``
(``BackboneLayersSet.LAST`` through the backbone's norm), ``loss.py`` (``SigLoss``, warm-up 100),
``transforms.py`` (``NYUCrop``, rotation, flip, random crop, ``ColorAug``), ``datasets_utils.py``
(Eigen crop), ``metrics.py``; DINOv2's heads: ``dinov2/hub/depthers.py``
(``_make_dinov2_linear_depth_head``: the class token concatenated to every patch token, features
upsampled 4×, no backbone norm, blocks [2, 5, 8, 11] for ``lin.4`` at 12 blocks) and
``dinov2/eval/depth/models/decode_heads/linear_head.py`` (``BNHead``: its BatchNorm commented out);
DINOv2's training values are in ``dinov2_vits14_nyu_linear_config.py`` on dl.fbaipublicfiles.com,
outside the repository: the values here are those of the copy in ywyue/FiT3D
``evaluation/baseline_configs/vits_nyu_depth_linear_config.py`` (commit 1d7c532).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """What one reference head configures; the rest (256 bins over [1e-3, 10] m, SigLoss with
    100 warm-up iterations, gradient clipping at 35, 38,400 iterations of 2 crops × 8 GPUs,
    12,800 warm-up iterations, the crops and the evaluation) is common to every preset."""

    name: str
    blocks: str  # "last" (DINOv3 LAST, DINOv2 lin.1) or "four" (DINOv2 lin.4: four evenly spaced blocks)
    class_token: bool  # the class token concatenated to every patch token (DINOv2 BNHead)
    backbone_norm: bool  # features through the backbone's final norm (DINOv3 use_backbone_norm; DINOv2 hub norm=False)
    batchnorm: bool  # BatchNorm before the 1×1 convolution (DINOv3 use_batchnorm; DINOv2's is commented out)
    upsample: int  # bilinear factor on the features before the convolution (DINOv2 upsample=4)
    init: str  # "normal": N(0, 0.01²), bias 0 (DINOv3); "torch": nn.Conv2d's own (DINOv2, mmcv leaves it)
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    schedule: str  # "onecycle" (DINOv3 WarmupOneCycleLR, β1 its momentum) or "cosine" (mmcv CosineAnnealing, linear warm-up, OneCycle momentum)
    source: str


PRESETS = {
    "dinov3": Preset(
        "dinov3", "last", False, True, True, 1, "normal", 3e-4, (0.9, 0.99), 1e-4, "onecycle", "facebookresearch/dinov3 dinov3/eval/depth/configs/config-nyu.yaml"
    ),
    "dinov2-lin1": Preset(
        "dinov2-lin1",
        "last",
        True,
        False,
        False,
        4,
        "torch",
        1e-4,
        (0.9, 0.999),
        1e-2,
        "cosine",
        "facebookresearch/dinov2 dinov2/hub/depthers.py (layers=1); config as copied in ywyue/FiT3D evaluation/baseline_configs/vits_nyu_depth_linear_config.py",
    ),
    "dinov2-lin4": Preset(
        "dinov2-lin4",
        "four",
        True,
        False,
        False,
        4,
        "torch",
        1e-4,
        (0.9, 0.999),
        1e-2,
        "cosine",
        "facebookresearch/dinov2 dinov2/hub/depthers.py (layers=4); config as copied in ywyue/FiT3D evaluation/baseline_configs/vits_nyu_depth_linear_config.py",
    ),
}
BINS = 256  # n_output_channels / n_bins
MIN_DEPTH, MAX_DEPTH = 1e-3, 10.0  # decoder_head and eval min_depth / max_depth (m)
DEPTH_SCALE = 1000.0  # transforms.normalization_constant: the PNGs hold millimetres
ITERATIONS = 38_400  # scheduler.total_iter / runner.max_iters
WARMUP = 12_800  # constructor_kwargs.warmup_iters / lr_config.warmup_iters
BATCH, REPLICAS = 2, 8  # bs 2 per GPU × n_gpus 8 (DINOv2: samples_per_gpu 2)
CLIP = 35.0  # optimizer.gradient_clip / grad_clip max_norm
SIGLOSS_WARMUP = 100  # LossType.SIGLOSS: SigLoss(warm_up=True, warm_iter=100)
CROP = (416, 544)  # transforms.train.random_crop (height, width)
BRIGHTNESS = (0.75, 1.25)  # transforms.train.brightness_range
ROTATION = 2.5  # TrainTransformConfig.rotation_angle (degrees)
NYU_CROP = (43, 45, 608, 472)  # NYUCrop crop_box (x1, y1, x2, y2) at 640 × 480
EIGEN_CROP = (45, 471, 41, 601)  # make_valid_mask NYU_EIGEN (y1, y2, x1, x2) at 640 × 480
NYU_SIZE = (480, 640)  # (height, width) both boxes are given at
INIT_STD = 0.01
# WarmupOneCycleLR's constructor values (config-nyu.yaml constructor_kwargs and the class's defaults)
DIV_FACTOR, FINAL_DIV_FACTOR = 25.0, 1000.0
BASE_MOMENTUM, MAX_MOMENTUM = 0.85, 0.95
# mmcv's cosine schedule of DINOv2's config: warmup_ratio 1e-3, min_lr_ratio 1e-8; OneCycle momentum pct_start 0.3
WARMUP_RATIO, MIN_LR_RATIO, PCT_START = 1e-3, 1e-8, 0.3
SEED = 321  # config-nyu.yaml seed
METRICS = ("rmse", "abs_rel", "a1", "a2", "a3", "log_10", "rmse_log", "silog", "sq_rel", "mae")  # metrics.py DEPTH_METRICS
LOWER_IS_BETTER = {"rmse", "abs_rel", "log_10", "rmse_log", "silog", "sq_rel", "mae"}
# published NYUv2 RMSE (m) of released weights (other weights than any run's): (source, preset, RMSE)
PUBLISHED = (
    ("DINOv3 ViT-S/16 (facebookresearch/dinov3 MODEL_CARD.md, NYU linear)", "dinov3", 0.403),
    ("DINOv3 ViT-S+/16 (facebookresearch/dinov3 MODEL_CARD.md)", "dinov3", 0.399),
    ("DINOv3 ViT-B/16 (facebookresearch/dinov3 MODEL_CARD.md)", "dinov3", 0.373),
    ("DINOv3 ViT-L/16 (facebookresearch/dinov3 MODEL_CARD.md)", "dinov3", 0.352),
    ("DINOv2 ViT-S/14 linear 4 layers (facebookresearch/dinov2 MODEL_CARD.md)", "dinov2-lin4", 0.417),
    ("DINOv2 ViT-B/14 linear 4 layers (facebookresearch/dinov2 MODEL_CARD.md)", "dinov2-lin4", 0.362),
    ("DINOv2 ViT-L/14 linear 4 layers (facebookresearch/dinov2 MODEL_CARD.md)", "dinov2-lin4", 0.333),
)


def four_blocks(depth: int) -> tuple[int, ...]:
    """The four 0-based blocks DINOv2's ``lin.4`` reads: [2, 5, 8, 11] at 12 blocks, [4, 11, 17, 23]
    at 24, [9, 19, 29, 39] at 40 (``dinov2/hub/depthers.py``; DINOv3's FOUR_EVEN_INTERVALS rule,
    ``encoder.py``, gives the same, ViT-L's 4 included)."""
    if depth == 24:
        return (4, 11, 17, 23)
    return tuple(i * (depth // 4) - 1 for i in range(1, 5))


def blocks_of(preset: Preset, depth: int) -> tuple[int, ...]:
    return (depth - 1,) if preset.blocks == "last" else four_blocks(depth)


def published_warmup(iterations: int) -> int:
    """The warm-up of a schedule of ``iterations``: 12,800 at the published 38,400, the same share
    (a third) of another."""
    return WARMUP if iterations == ITERATIONS else round(iterations * WARMUP / ITERATIONS)
