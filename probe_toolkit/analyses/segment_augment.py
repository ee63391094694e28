"""The training crops and evaluation inputs of linear segmentation, as the two reference pipelines
make them: numpy arrays in, arrays out, every random draw from the ``numpy.random.Generator``
handed in (never a global generator), so a crop is a function of (seed, iteration, slot).

Two pipelines, one per preset (``analyses.segment.PRESETS``):

* ``dinov3``: facebookresearch/dinov3 ``dinov3/eval/segmentation/transforms.py``
  ``make_segmentation_train_transforms``: the short side resized to ``int(512 · r)``, r uniform in
  [0.5, 2) (``FixedSideResize``: the long side ``int(short · long / short₀ + 0.5)``; the image by
  PIL's bilinear filter, the label map by torch's nearest), ``ReduceZeroLabel`` on ADE20K, a random
  512 crop (``RandomCropWithLabel``: up to 10 redraws while one class holds ≥ 75 % of the crop's
  labelled pixels), a horizontal flip with probability 0.5, ``PhotoMetricDistortion`` (brightness
  ±32, contrast and saturation 0.5–1.5, hue ±0.5 through torchvision's ``adjust_hue``, each with
  probability 0.5), ImageNet normalisation, padding to 512 (image 0, labels 255).
* ``dinov2``: the mmsegmentation 0.x pipeline of DINOv2's ``dinov2_vits14_ade20k_linear_config.py``
  (dl.fbaipublicfiles.com/dinov2): ``Resize(img_scale=(99999999, 512), ratio_range=(0.5, 2.0))``
  (mmcv ``imrescale``: scale factor ``int(512 · r) / short₀``, sides ``int(side · f + 0.5)``, OpenCV
  bilinear for the image and nearest for the labels), ``RandomCrop(512, cat_max_ratio=0.75)``,
  ``RandomFlip(0.5)``, mmseg's ``PhotoMetricDistortion`` (saturation and hue in OpenCV's HSV, hue
  ±18 of 180), ``Normalize``, ``Pad(512, 0, 255)``.

Evaluation: the short side resized to 512 by the same library as training, labels untouched
(scored at the original size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

IGNORE = 255
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)  # ImageNet's, on 0..255 pixels (both references)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
PIPELINES = ("dinov3", "dinov2")


@dataclass(frozen=True)
class Augment:
    """The values of one training pipeline (the preset's library, the published numbers)."""

    pipeline: str = "dinov3"
    size: int = 512  # the short side before the random ratio (img_size 512; img_scale (…, 512))
    scale: tuple[float, float] = (0.5, 2.0)  # random_img_size_ratio_range / ratio_range
    crop: int = 512  # crop_size
    cat_max_ratio: float = 0.75  # RandomCrop's default in both
    flip: float = 0.5  # flip_prob / RandomFlip prob
    photometric: bool = True  # PhotoMetricDistortion in both pipelines


def reduce_zero_label(label: np.ndarray) -> np.ndarray:
    """ADE20K's label 0 ("other") becomes the ignored 255 and c becomes c − 1 (255 stays 255):
    dinov3 ``metrics.preprocess_nonzero_labels``, mmseg ``LoadAnnotations(reduce_zero_label=True)``."""
    out = label.astype(np.int16) - 1
    out[label == IGNORE] = IGNORE
    out[out < 0] = IGNORE
    return out.astype(np.uint8)


def resized_shape(height: int, width: int, short: int, pipeline: str) -> tuple[int, int]:
    """(H, W) after resizing the short side to ``short`` keeping the aspect ratio."""
    if pipeline == "dinov3":  # FixedSideResize._resize
        if height > width:
            return int(short * height / width + 0.5), short
        return short, int(short * width / height + 0.5)
    factor = short / min(height, width)  # mmcv.rescale_size: min(99999999·r / long, short / short₀)
    return int(height * factor + 0.5), int(width * factor + 0.5)


def resize_image(image: np.ndarray, shape: tuple[int, int], pipeline: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB → ``shape``: PIL's bilinear filter (dinov3, torchvision on a PIL image)
    or OpenCV's INTER_LINEAR (dinov2, mmcv's default backend)."""
    if pipeline == "dinov3":
        from PIL import Image

        return np.asarray(Image.fromarray(image).resize((shape[1], shape[0]), Image.BILINEAR))
    import cv2

    return cv2.resize(image, (shape[1], shape[0]), interpolation=cv2.INTER_LINEAR)


def resize_label(label: np.ndarray, shape: tuple[int, int], pipeline: str) -> np.ndarray:
    """Nearest neighbour: torch's rule on the label tensor (dinov3) or OpenCV's (dinov2)."""
    if pipeline == "dinov3":
        t = torch.from_numpy(np.array(label, np.float32))[None, None]
        return F.interpolate(t, size=shape, mode="nearest")[0, 0].to(torch.uint8).numpy()
    import cv2

    return cv2.resize(label, (shape[1], shape[0]), interpolation=cv2.INTER_NEAREST)


def crop_box(rng: np.random.Generator, label: np.ndarray, crop: int, cat_max_ratio: float) -> tuple[int, int]:
    """(top, left) of the random crop: drawn, and redrawn up to 10 times while one class holds
    ``cat_max_ratio`` or more of the crop's non-ignored pixels (or it holds one class only)."""
    h, w = label.shape

    def draw() -> tuple[int, int]:
        return int(rng.integers(0, max(h - crop, 0) + 1)), int(rng.integers(0, max(w - crop, 0) + 1))

    box = draw()
    if cat_max_ratio < 1.0:
        for _ in range(10):
            part = label[box[0] : box[0] + crop, box[1] : box[1] + crop]
            values, counts = np.unique(part, return_counts=True)
            counts = counts[values != IGNORE]
            if len(counts) > 1 and counts.max() / counts.sum() < cat_max_ratio:
                break
            box = draw()
    return box


def _convert(image: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    return np.clip(image.astype(np.float32) * alpha + beta, 0, 255).astype(np.uint8)


def photometric(rng: np.random.Generator, image: np.ndarray, pipeline: str) -> np.ndarray:
    """PhotoMetricDistortion: brightness, then contrast before or after (a coin) saturation and
    hue, each applied with probability 0.5, in the references' order of draws."""
    image = np.ascontiguousarray(image)
    if rng.integers(2):
        image = _convert(image, beta=rng.uniform(-32, 32))
    mode = int(rng.integers(2))
    if mode == 1 and rng.integers(2):
        image = _convert(image, alpha=rng.uniform(0.5, 1.5))
    if pipeline == "dinov3":
        import torchvision.transforms.functional as TF

        if rng.integers(2):
            t = torch.from_numpy(np.array(image)).permute(2, 0, 1)
            image = TF.adjust_saturation(t, float(rng.uniform(0.5, 1.5))).permute(1, 2, 0).numpy()
        if rng.integers(2):
            t = torch.from_numpy(np.array(image)).permute(2, 0, 1)
            image = TF.adjust_hue(t, float(rng.uniform(-0.5, 0.5))).permute(1, 2, 0).numpy()
    else:
        import cv2

        if rng.integers(2):
            hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)  # mmcv.bgr2hsv of the BGR image: the same HSV
            hsv[..., 1] = _convert(hsv[..., 1], alpha=rng.uniform(0.5, 1.5))
            image = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
        if rng.integers(2):
            hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
            hsv[..., 0] = (hsv[..., 0].astype(int) + int(rng.integers(-18, 18))) % 180
            image = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    if mode == 0 and rng.integers(2):
        image = _convert(image, alpha=rng.uniform(0.5, 1.5))
    return np.ascontiguousarray(image)


def normalise(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 → (3, H, W) float32, ImageNet mean and std on 0..255 pixels."""
    t = torch.from_numpy(np.array(image, np.float32)).permute(2, 0, 1)
    return (t - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


@dataclass
class Crop:
    """One training sample and the draws that made it (the record keeps none; tests read them)."""

    image: torch.Tensor  # (3, crop, crop) normalised, padded with 0
    label: torch.Tensor  # (crop, crop) int64, padded with 255
    short: int
    box: tuple[int, int]
    flipped: bool


def training_crop(rng: np.random.Generator, image: np.ndarray, label: np.ndarray, augment: Augment, reduce_zero: bool) -> Crop:
    """One augmented sample of (image, label map at the image's size), as the preset's pipeline."""
    lo, hi = augment.scale
    ratio = rng.random() * (hi - lo) + lo
    short = int(augment.size * ratio)
    shape = resized_shape(*label.shape, short, augment.pipeline)
    image = resize_image(image, shape, augment.pipeline)
    label = resize_label(label, shape, augment.pipeline)
    if reduce_zero:
        label = reduce_zero_label(label)
    top, left = crop_box(rng, label, augment.crop, augment.cat_max_ratio)
    image = image[top : top + augment.crop, left : left + augment.crop]
    label = label[top : top + augment.crop, left : left + augment.crop]
    flipped = bool(rng.random() < augment.flip)
    if flipped:
        image, label = image[:, ::-1], label[:, ::-1]
    if augment.photometric:
        image = photometric(rng, image, augment.pipeline)
    pixels = normalise(image)
    h, w = label.shape
    pixels = F.pad(pixels, (0, augment.crop - w, 0, augment.crop - h), value=0.0)
    target = F.pad(torch.from_numpy(np.array(label, np.int64)), (0, augment.crop - w, 0, augment.crop - h), value=IGNORE)
    return Crop(pixels, target, short, (top, left), flipped)


def eval_input(image: np.ndarray, size: int, pipeline: str) -> torch.Tensor:
    """(1, 3, H', W') the val image with its short side resized to ``size``, normalised."""
    shape = resized_shape(image.shape[0], image.shape[1], size, pipeline)
    return normalise(resize_image(image, shape, pipeline))[None]
