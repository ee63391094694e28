"""The training crops and evaluation inputs of linear depth on NYUv2, as facebookresearch/dinov3
``dinov3/eval/depth/transforms.py`` makes them (``make_depth_train_transforms`` /
``make_depth_eval_transforms`` with ``config-nyu.yaml``), every preset alike; every random draw
from the ``numpy.random.Generator`` handed in, so a crop is a function of (seed, sample).

Training, in the reference's order: ``NYUCrop`` (the box (43, 45, 608, 472) at 640 × 480, scaled
to the image, of the PIL image and of the depth map), ``ToTensor`` (pixels / 255) and the depth
/ 1000 (millimetres → metres, float32); with probability 0.5 a rotation by an angle uniform in
[−2.5°, 2.5°] (the image by torchvision's v2 ``rotate``, bilinear, fill 0; the depth by the kernel
``transforms.py`` registers for it, torchvision's ``rotate``, nearest, outside pixels 0 = invalid);
a horizontal flip with probability 0.5; a random 416 × 544 crop; ``ColorAug`` with probability
0.5 (on 0..255 pixels: a gamma uniform in [0.9, 1.1], a brightness in [0.75, 1.25] and a colour
per channel in [0.9, 1.1], clipped to 0..255 — the colour product in float64, as NumPy 2 gives it
in the reference); ImageNet normalisation. Draws, in order: rotate?, angle, flip?, top, left,
colour?, gamma, brightness, three colours (the reference draws the same values from numpy's and
torch's global generators).

Evaluation: the whole 640 × 480 image (``FixedCrop`` 'FULL'), ``ToTensor``, normalised; the depth
/ 1000, not resized; the test-time flip is ``analyses.depth.predict_flipped``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import depth_published as pub

MEAN = (0.485, 0.456, 0.406)  # dinov3.data.transforms IMAGENET_DEFAULT_MEAN, on 0..1 pixels
STD = (0.229, 0.224, 0.225)
GAMMA = (0.9, 1.1)  # ColorAug's defaults, which ColorAugV2 keeps
COLOUR = (0.9, 1.1)


@dataclass(frozen=True)
class Augment:
    """The published values of the training pipeline (``config-nyu.yaml``, ``TrainTransformConfig``)."""

    crop: tuple[int, int] = pub.CROP
    rotation: float = pub.ROTATION
    brightness: tuple[float, float] = pub.BRIGHTNESS
    flip: float = 0.5  # v2.RandomHorizontalFlip()
    rotate: float = 0.5  # MaybeApply(threshold=0.5)
    colour: float = 0.5  # ColorAugV2(prob=0.5)


@dataclass
class Crop:
    """One training sample and the draws that made it (the record keeps none; tests read them)."""

    image: torch.Tensor  # (3, h, w) float32, normalised
    depth: torch.Tensor  # (1, h, w) float32 metres, 0 = invalid
    angle: float | None
    flipped: bool
    box: tuple[int, int]  # (top, left) of the random crop
    colour: tuple[float, float, tuple[float, float, float]] | None  # (gamma, brightness, colours)


def nyu_box(height: int, width: int) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) of ``NYUCrop`` on an image of this size (the box scaled from 640 × 480, truncated)."""
    x1, y1, x2, y2 = pub.NYU_CROP
    oh, ow = pub.NYU_SIZE
    return int(x1 / ow * width), int(y1 / oh * height), int(x2 / ow * width), int(y2 / oh * height)


def to_metres(depth: np.ndarray) -> torch.Tensor:
    """(H, W) uint16 millimetres → (1, H, W) float32 metres (``NormalizeDepth(1000)``)."""
    return torch.from_numpy(np.array(depth, np.float32))[None] / pub.DEPTH_SCALE


def to_tensor(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 → (3, H, W) float32 in [0, 1] (``ToTensor``)."""
    return torch.from_numpy(np.array(image, np.float32)).permute(2, 0, 1).div(255)


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """ImageNet's mean and std on 0..1 pixels (``v2.Normalize``), in the pixels' own precision."""
    mean = torch.tensor(MEAN, dtype=pixels.dtype)[:, None, None]
    std = torch.tensor(STD, dtype=pixels.dtype)[:, None, None]
    return (pixels - mean) / std


def colour_aug(pixels: torch.Tensor, gamma: float, brightness: float, colours: tuple[float, float, float]) -> torch.Tensor:
    """``ColorAug`` on (3, h, w) 0..1 pixels: gamma and brightness in float32 on 0..255, the colour
    product in float64, clipped, back to 0..1 (float64)."""
    image = pixels.permute(1, 2, 0) * 255
    image = (image**gamma) * brightness
    colour = np.stack([np.ones(image.shape[:2], np.float32) * np.float64(c) for c in colours], axis=2)
    out = np.clip(image.numpy().astype(np.float64) * colour, 0, 255) / 255
    return torch.from_numpy(out).permute(2, 0, 1)


def training_crop(rng: np.random.Generator, image: np.ndarray, depth: np.ndarray, augment: Augment = Augment()) -> Crop:
    """One augmented sample of (RGB image (H, W, 3) uint8, depth (H, W) uint16 mm at the image's size)."""
    import torchvision.transforms.functional as TF
    import torchvision.transforms.v2.functional as F2
    from torchvision.transforms import InterpolationMode

    x1, y1, x2, y2 = nyu_box(*image.shape[:2])
    pixels = to_tensor(image[y1:y2, x1:x2])
    metres = to_metres(depth[y1:y2, x1:x2])
    angle = None
    if rng.random() < augment.rotate:
        angle = float(rng.uniform(-augment.rotation, augment.rotation))
        pixels = F2.rotate(pixels, angle, interpolation=InterpolationMode.BILINEAR, expand=False, center=None, fill=0)
        metres = TF.rotate(metres, angle, interpolation=InterpolationMode.NEAREST)
    flipped = bool(rng.random() < augment.flip)
    if flipped:
        pixels, metres = pixels.flip(-1), metres.flip(-1)
    h, w = pixels.shape[-2:]
    ch, cw = augment.crop
    if h < ch or w < cw:
        raise ValueError(f"an image of {w}x{h} px after the NYU crop is smaller than the {cw}x{ch} training crop")
    top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    pixels, metres = pixels[:, top : top + ch, left : left + cw], metres[:, top : top + ch, left : left + cw]
    colour = None
    if rng.random() < augment.colour:
        gamma = float(rng.uniform(*GAMMA))
        brightness = float(rng.uniform(*augment.brightness))
        colours = tuple(float(c) for c in rng.uniform(*COLOUR, size=3))
        colour = (gamma, brightness, colours)
        pixels = colour_aug(pixels, gamma, brightness, colours)
    return Crop(normalise(pixels).float(), metres.contiguous(), angle, flipped, (top, left), colour)


def eval_input(image: np.ndarray) -> torch.Tensor:
    """(1, 3, H, W) the whole val image, normalised."""
    return normalise(to_tensor(image))[None]
