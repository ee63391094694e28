"""Label propagation's presets: DINO's ``eval_video_segmentation.py`` and DINOv3's tracking notebook.

Both propagate the first frame's labels through L2-normalised last-block patch features (after the
final norm), from the first frame and a queue of the 7 previous frames' soft segmentations, the
top 5 sources per target patch chosen jointly over every context frame (ties at the cut-off kept),
weighted by exp(cos / T) normalised over the kept sources (``analyses.propagation``). They differ in
how a frame becomes the network's input, the window, the temperature and how a soft grid becomes
labels again.

``dino`` (facebookresearch/dino ``eval_video_segmentation.py``): short side 480, long side floored
to a multiple of 64, bilinear, std (0.228, 0.224, 0.225); a square window of radius 12 patches;
T 0.1; the first mask resized to the grid with nearest; the prediction upsampled bilinearly by the
patch size, min-max normalised per label, argmaxed, resized to the frame with nearest.

``dinov3-tracking`` (facebookresearch/dinov3 ``notebooks/segmentation_tracking.ipynb``, read value
by value at commit 6876159): ``ResizeToMultiple(short_side=960, multiple=patch_size)`` (each side
scaled by short/short side and rounded *up* to a multiple of the patch, PIL bicubic through
torchvision), ``Normalize`` with ImageNet's std (0.229, 0.224, 0.225); features
``get_intermediate_layers(n=1, reshape=True)`` (the last block through the final norm),
``F.normalize``; the first mask to the grid by ``F.interpolate(mode="nearest-exact")``;
``MAX_CONTEXT_LENGTH = 7``, ``NEIGHBORHOOD_SIZE = 12`` with ``NEIGHBORHOOD_SHAPE = "circle"``
(Euclidean distance ≤ 12 patches), ``TOPK = 5`` (``dot >= k-th``, ties kept), ``TEMPERATURE = 0.2``
as softmax(dot / T) over the kept sources; the probabilities upsampled with ``mode="nearest"``
straight to the mask's size, each map min-max normalised (NaN → 0), argmaxed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch, PIL and analyses.propagation are imported where frames are computed: the protocol's settings read this table
    import numpy as np
    import torch

PRESETS = ("dino", "dinov3-tracking")
SHORT_SIDE = {"dino": 480, "dinov3-tracking": 960}  # DINO: short side 480 (propagation.SHORT_SIDE); the notebook: SHORT_SIDE = 960
TEMPERATURE = {"dino": 0.1, "dinov3-tracking": 0.2}  # DINO: exp(cos / 0.1) (propagation.TEMPERATURE); the notebook: TEMPERATURE = 0.2
SHAPE = {"dino": "square", "dinov3-tracking": "circle"}
IMAGENET_STD = (0.229, 0.224, 0.225)  # the notebook's Normalize (DINO's video script uses 0.228)
SOURCES = {"dino": "facebookresearch/dino eval_video_segmentation.py", "dinov3-tracking": "facebookresearch/dinov3 notebooks/segmentation_tracking.ipynb"}


def v3_frame_size(width: int, height: int, short: int, multiple: int) -> tuple[int, int]:
    """(width, height) as the notebook's ``ResizeToMultiple``: the short side ``short`` rounded up to
    ``multiple``, the long side scaled by the same factor and rounded up."""
    up = lambda side: math.ceil(side / multiple) * multiple  # noqa: E731
    if width > height:
        new_height = up(short)
        return up(width * new_height / height), new_height
    new_width = up(short)
    return new_width, up(height * new_width / width)


def v3_frame_tensor(rgb: np.ndarray, short: int, multiple: int) -> torch.Tensor:
    """(H, W, 3) uint8 → (3, h, w): PIL bicubic to ``v3_frame_size`` (torchvision's resize of a PIL
    image is PIL's), scaled to [0, 1], ImageNet mean and std."""
    import numpy as np
    import torch
    from PIL import Image

    from .propagation import MEAN

    height, width = rgb.shape[:2]
    w, h = v3_frame_size(width, height, short, multiple)
    resized = np.asarray(Image.fromarray(np.asarray(rgb, np.uint8)).resize((w, h), Image.Resampling.BICUBIC), np.float32) / 255.0
    x = torch.from_numpy(resized).permute(2, 0, 1)
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (x - mean) / std


def circle_window(rows: int, cols: int, radius: int) -> torch.Tensor:
    """(rows·cols, rows·cols) 0/1: source within Euclidean distance ``radius`` patches of the target."""
    import torch

    r = torch.arange(rows, dtype=torch.float32).repeat_interleave(cols)
    c = torch.arange(cols, dtype=torch.float32).repeat(rows)
    return (((r[:, None] - r[None, :]) ** 2 + (c[:, None] - c[None, :]) ** 2) <= radius * radius).float()


def v3_first_labels(annotation: np.ndarray, rows: int, cols: int) -> torch.Tensor:
    """The first mask to the patch grid by ``F.interpolate(mode="nearest-exact")``, one-hot (labels, rows, cols)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    mask = torch.as_tensor(np.asarray(annotation, np.int64))
    small = F.interpolate(mask[None, None].float(), (rows, cols), mode="nearest-exact")[0, 0].long()
    return F.one_hot(small, int(mask.max()) + 1).permute(2, 0, 1).float()


def v3_labels(soft: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(labels, rows, cols) → (height, width) uint8: nearest upsampling to ``size`` (width, height),
    each map min-max normalised (a flat map gives NaN, then 0), argmax."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    up = F.interpolate(soft.unsqueeze(0), size=(size[1], size[0]), mode="nearest")[0]
    lo, hi = up.amin((1, 2), keepdim=True), up.amax((1, 2), keepdim=True)
    normed = torch.nan_to_num((up - lo) / (hi - lo), nan=0.0)
    return normed.argmax(0).numpy().astype(np.uint8)


@dataclass(frozen=True)
class Frames:
    """One preset's frame input, first labels, window shape and labels: what differs between presets."""

    preset: str
    short_side: int
    patch: int

    @property
    def shape(self) -> str:
        return SHAPE[self.preset]

    def size(self, width: int, height: int) -> tuple[int, int]:
        if self.preset == "dino":
            from . import propagation

            return propagation.frame_size(width, height, self.short_side)
        return v3_frame_size(width, height, self.short_side, self.patch)

    def tensor(self, frame: np.ndarray) -> torch.Tensor:
        """The network input from a frame as each reference decodes it: DINO's script with
        ``cv2.imread`` (BGR, 8 bits), DINOv3's notebook with PIL (RGB)."""
        if self.preset == "dino":
            from . import propagation

            return propagation.frame_tensor(frame, self.short_side)
        return v3_frame_tensor(frame, self.short_side, self.patch)

    def first(self, annotation: np.ndarray, rows: int, cols: int) -> torch.Tensor:
        if self.preset == "dino":
            from . import propagation

            return propagation.first_labels(annotation, rows, cols)
        return v3_first_labels(annotation, rows, cols)

    def window(self, rows: int, cols: int, radius: int) -> torch.Tensor | None:
        """The notebook's circle; None for DINO's square, which ``propagation.propagate`` builds itself."""
        return circle_window(rows, cols, radius) if self.shape == "circle" and radius > 0 else None

    def labels(self, soft: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
        if self.preset == "dino":
            from . import propagation

            return propagation.to_labels(soft, self.patch, size)
        return v3_labels(soft, size)

    def describe(self) -> str:
        """The record's ``frame_size``."""
        if self.preset == "dino":
            return (
                f"read with cv2.imread, cv2.resize INTER_LINEAR on the 8-bit frame to short side {self.short_side}, long side floored "
                "to a multiple of 64; BGR → RGB; mean (0.485, 0.456, 0.406), std (0.228, 0.224, 0.225)"
            )
        return (
            f"short side {self.short_side}, each side rounded up to a multiple of {self.patch} (ResizeToMultiple), PIL bicubic; "
            "mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)"
        )
