"""The views Hummingbird's evaluation reads, as vpariza/open-hummingbird-eval 2.0 makes them
(``hbird/utils/transforms.py`` ``get_hbird_train_transforms`` / ``get_hbird_val_transforms``,
``hbird/utils/image_transformations.py`` ``CombTransforms``), read there and written anew here.
Every function takes the input size ``side`` (the reference's ``input_size``; 512 as published
for DINO, 504 for DINOv2).

- ``hbird512`` (the query images): image and label squashed to side × side, the image with PIL's
  bilinear filter (torchvision's ``F.resize`` of a PIL image with antialias: ``Image.resize``),
  the label nearest (``resize_nearest``).
- ``hbird512_aug0``, ``hbird512_aug1`` (the memory images, one view per augmentation epoch; the
  published VOC table uses two), in the reference's order (``CombTransforms`` runs the image-only
  transform before the shared one): first colour jitter on the **whole** 8-bit image, brightness,
  contrast, saturation (factors in [0.9, 1.1]) and hue (shift in [-0.1, 0.1]), each applied with
  probability 0.5, in that order (PIL's ``ImageEnhance`` and an HSV hue shift, torchvision's
  ``F.adjust_*`` of a PIL image); then ``ToTensor`` and ``Normalize``; then the shared
  ``RandomResizedCrop`` on the **float** tensor: torchvision's ``get_params`` with scale
  (0.5, 2.0) and ratio (3/4, 4/3) (an area above the image's is drawn again, up to ten tries,
  then the centre crop clipped to the ratio range), the box cut from the normalised tensor and
  resized to side × side by torch's bilinear interpolation with antialias (``F.resized_crop`` of
  a tensor; a box already side × side is kept as it is, as ``F.resize`` returns it), the label
  cut by the same box and resized nearest.
- Normalisation: mean (0.485, 0.456, 0.406) and the reference's std **(0.229, 0.224, 0.255)**:
  its blue std is 0.255 where ImageNet's is 0.225. probe follows it in these views, so that the
  features are those the published numbers were measured on (the other views keep ImageNet's).

The draws: the reference takes them from torch's and Python's global generators, so no two runs
(or data-loader worker counts) see the same crops. Here each view's draws come from a generator
seeded by (``SEED``, epoch, the image's file name), so extraction (the pixels) and the protocol
(the label map, cut by the same box) agree without either reading the other, and the store is the
same at any batch size, worker count or shard. The box depends on the image's size, which the
protocol checks against the label map's; it does not depend on ``side``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageEnhance

from . import views

if TYPE_CHECKING:
    import torch

SIDE = 512  # README.md: "image size of (512,512) for the dino"
VAL = "hbird512"
AUGMENTED = ("hbird512_aug0", "hbird512_aug1")  # one per augmentation epoch
VIEWS = (VAL, *AUGMENTED)
SEED = 123  # eval.py RunConfig.seed
SCALE = (0.5, 2.0)  # transforms.py min_scale_factor, max_scale_factor
RATIO = (3.0 / 4.0, 4.0 / 3.0)  # image_transformations.py RandomResizedCrop
JITTER = 0.1  # brightness, contrast, saturation and hue jitter ranges
JITTER_P = 0.5  # each applied with this probability
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.255], dtype=np.float32)  # transforms.py IMAGENET_STD, as published
# the memory views' order of operations, written into the manifest (``per_view``): a store whose memory views lack it was
# made before probe followed the reference's order (the 8-bit crop jittered after), and is refused rather than mixed or read
ORDER = "jitter the whole image, normalise, crop and resize the float tensor (bilinear, antialias)"
NORMALISED = ((np.arange(256, dtype=np.float32)[:, None] / 255.0 - MEAN) / STD).T.copy()


def epoch(view: str) -> int | None:
    """The augmentation epoch of a memory view (``hbird512_aug1``, ``hbird@448_aug1`` → 1); None for a query view."""
    return views.view(view).epoch


def side(view: str) -> int:
    """The side in pixels of a Hummingbird view (``hbird512`` → 512, ``hbird@448_aug0`` → 448)."""
    return int(views.view(view).size)


def geometry_text(size: int, epoch_index: int) -> str:
    """How a memory view is made, as the manifest records it."""
    return (
        f"colour jitter 0.1 each with p 0.5 on the whole image, normalised with std (0.229, 0.224, 0.255), then a random resized "
        f"crop, scale (0.5, 2), ratio (3/4, 4/3), of the float tensor to {size}x{size} (torch bilinear, antialias); draws seeded by "
        f"({SEED}, epoch {epoch_index}, file name) (vpariza/open-hummingbird-eval get_hbird_train_transforms, CombTransforms)"
    )


@dataclass(frozen=True)
class Draw:
    """One memory view's random choices: the crop box (top, left, height, width) in the image's
    pixels, and the jitter factors applied (None: that jitter skipped)."""

    box: tuple[int, int, int, int]
    brightness: float | None
    contrast: float | None
    saturation: float | None
    hue: float | None


def generator(name: str, epoch_index: int, seed: int = SEED) -> np.random.Generator:
    """The generator of one image's view in one epoch, keyed by its file name alone (a store's id
    may carry a sub-folder)."""
    key = f"{seed}/{epoch_index}/{PurePosixPath(name).name}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))


def crop_box(width: int, height: int, rng: np.random.Generator, scale=SCALE, ratio=RATIO) -> tuple[int, int, int, int]:
    """(top, left, height, width) as torchvision's ``RandomResizedCrop.get_params`` chooses them."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def draw(name: str, epoch_index: int, width: int, height: int, seed: int = SEED) -> Draw:
    """The crop and jitter of image ``name`` (``width`` × ``height``) in augmentation epoch ``epoch_index``."""
    rng = generator(name, epoch_index, seed)
    box = crop_box(width, height, rng)
    factors = []
    for low, high in ((1 - JITTER, 1 + JITTER),) * 3 + ((-JITTER, JITTER),):
        factors.append(float(rng.uniform(low, high)) if rng.random() < JITTER_P else None)
    return Draw(box, *factors)


def adjust_hue(image: Image.Image, shift: float) -> Image.Image:
    """torchvision's ``F.adjust_hue`` of a PIL image: the HSV hue byte moved by ``shift`` · 255
    (truncated toward zero), modulo 256."""
    h, s, v = image.convert("HSV").split()
    moved = (np.asarray(h, dtype=np.int64) + int(shift * 255)) % 256
    return Image.merge("HSV", (Image.fromarray(moved.astype(np.uint8), "L"), s, v)).convert(image.mode)


def jittered(image: Image.Image, chosen: Draw) -> Image.Image:
    """The whole 8-bit image with the drawn colour jitter applied (brightness, contrast,
    saturation, hue, each where drawn), as the reference's image-only transform applies it."""
    out = image
    if chosen.brightness is not None:
        out = ImageEnhance.Brightness(out).enhance(chosen.brightness)
    if chosen.contrast is not None:
        out = ImageEnhance.Contrast(out).enhance(chosen.contrast)
    if chosen.saturation is not None:
        out = ImageEnhance.Color(out).enhance(chosen.saturation)
    if chosen.hue is not None:
        out = adjust_hue(out, chosen.hue)
    return out


def augmented(image: Image.Image, chosen: Draw, side: int = SIDE) -> torch.Tensor:
    """A memory view's input (3, side, side): the whole image jittered, normalised, then the box
    cut from the float tensor and resized bilinearly with antialias to ``side`` × ``side``."""
    import torch.nn.functional as F

    top, left, h, w = chosen.box
    cut = normalise(jittered(image, chosen))[:, top : top + h, left : left + w]
    if (h, w) == (side, side):
        return cut.contiguous()
    return F.interpolate(cut[None], size=(side, side), mode="bilinear", align_corners=False, antialias=True)[0]


def squashed(image: Image.Image, side: int = SIDE) -> Image.Image:
    """The query view's pixels: the whole image resized bilinearly to ``side`` × ``side``."""
    return image.resize((side, side), Image.Resampling.BILINEAR)


def normalise(image: Image.Image) -> torch.Tensor:
    """(3, H, W) float32: (v / 255 - mean) / std with the reference's std, channel by channel
    (a look-up of the same float32 operations, as ``images.normalise``)."""
    import torch

    pixels = np.asarray(image.convert("RGB"))
    out = np.empty((3, *pixels.shape[:2]), dtype=np.float32)
    for channel in range(3):
        np.take(NORMALISED[channel], pixels[..., channel], out=out[channel])
    return torch.from_numpy(out)


def pixels(image: Image.Image, view: str, image_id: str, side: int | None = None) -> torch.Tensor:
    """The network's input of one Hummingbird view (any size: ``hbird@S``, ``hbird@S_aug<e>``) of an RGB image, at input
    size ``side`` (default: the view's own size)."""
    spec = views.view(view)
    side = int(spec.size) if side is None else side
    if spec.epoch is None:
        return normalise(squashed(image, side))
    return augmented(image, draw(image_id, spec.epoch, *image.size), side)


def resize_nearest(label_map: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A label map resized to ``size`` (rows, cols) by torch's legacy nearest rule (source =
    floor(dst · in / out), the scale in float32 as torch computes it)."""
    y = np.asarray(label_map)

    def index(n_out: int, n_in: int) -> np.ndarray:
        scale = np.float32(n_in) / np.float32(n_out)
        return np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64), n_in - 1)

    return np.take(np.take(y, index(size[0], y.shape[0]), axis=0), index(size[1], y.shape[1]), axis=1)  # rows, then columns: no 2-D fancy index


def label_view(label_map: np.ndarray, view: str, name: str, side: int | None = None) -> np.ndarray:
    """The label map of one view of image ``name`` (its label at the image's size): cut by the
    view's box and resized nearest (memory views), or squashed nearest (the query view), to the
    view's side (or ``side``)."""
    y = np.asarray(label_map)
    spec = views.view(view)
    side = spec.size if side is None else side
    if spec.epoch is None:
        return resize_nearest(y, (side, side))
    top, left, h, w = draw(name, spec.epoch, y.shape[1], y.shape[0]).box
    return resize_nearest(y[top : top + h, left : left + w], (side, side))
