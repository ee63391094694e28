"""SelfPatch's multi-crop augmentation (``DataAugmentationDINO`` of ``main_selfpatch.py``), with torchvision.

Two 224-px global crops (scale 0.25–1) and eight 96-px local crops (0.05–0.25), bicubic. Every
crop: horizontal flip p 0.5, ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8, greyscale p 0.2. PIL
Gaussian blur with radius uniform in [0.1, 2]: p 1.0 on global 1, 0.1 on global 2, 0.5 on the
locals. Solarisation at 128 with p 0.2 on global 2 only. ImageNet normalisation.

DINO's blur draws from Python's ``random``; here every draw comes from torch's generator, so a
crop depends only on the seed the data set gives it (``training.data``).
"""

from __future__ import annotations

import torch
from PIL import Image, ImageFilter
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

MEAN = (0.485, 0.456, 0.406)  # ImageNet
STD = (0.229, 0.224, 0.225)


class GaussianBlur:
    """PIL's GaussianBlur with probability ``p`` and radius uniform in [low, high] (DINO's ``utils.GaussianBlur``)."""

    def __init__(self, p: float, low: float = 0.1, high: float = 2.0):
        self.p, self.low, self.high = p, low, high

    def __call__(self, image: Image.Image) -> Image.Image:
        if torch.rand(()).item() > self.p:  # DINO: apply when random() <= p
            return image
        radius = self.low + (self.high - self.low) * torch.rand(()).item()
        return image.filter(ImageFilter.GaussianBlur(radius=radius))

    def __repr__(self) -> str:
        return f"GaussianBlur(p={self.p}, radius=({self.low}, {self.high}))"


class MultiCrop:
    """image → [global 1, global 2, local 1 … local n] normalised tensors."""

    def __init__(
        self,
        global_scale: tuple[float, float] = (0.25, 1.0),
        local_scale: tuple[float, float] = (0.05, 0.25),
        local_crops: int = 8,
        global_size: int = 224,
        local_size: int = 96,
    ):
        flip_and_colour = T.Compose(
            [
                T.RandomHorizontalFlip(p=0.5),
                T.RandomApply([T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)], p=0.8),
                T.RandomGrayscale(p=0.2),
            ]
        )
        normalise = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
        bicubic = InterpolationMode.BICUBIC
        self.global_1 = T.Compose(
            [
                T.RandomResizedCrop(global_size, scale=tuple(global_scale), interpolation=bicubic),
                flip_and_colour,
                GaussianBlur(1.0),
                normalise,
            ]
        )
        self.global_2 = T.Compose(
            [
                T.RandomResizedCrop(global_size, scale=tuple(global_scale), interpolation=bicubic),
                flip_and_colour,
                GaussianBlur(0.1),
                T.RandomSolarize(threshold=128, p=0.2),
                normalise,
            ]
        )
        self.local = T.Compose(
            [
                T.RandomResizedCrop(local_size, scale=tuple(local_scale), interpolation=bicubic),
                flip_and_colour,
                GaussianBlur(0.5),
                normalise,
            ]
        )
        self.local_crops = local_crops

    def __call__(self, image: Image.Image) -> list[torch.Tensor]:
        return [self.global_1(image), self.global_2(image)] + [self.local(image) for _ in range(self.local_crops)]
