"""Segmentation release folders as the tests write them: ADE20K's ADEChallengeData2016 layout and
VOC2012's, filled with textured scenes whose label maps the tests keep to score against."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

Scene = Callable[[str, int], tuple[np.ndarray, np.ndarray]]  # (split or image id, its index) -> (pixels, label map)
PALETTE = [v for c in range(256) for v in ((c * 37) % 256, (c * 91) % 256, (c * 53) % 256)]  # VOC's masks are palette PNGs


def box_scene(
    seed: int, size: tuple[int, int], classes: int = 151, other_band: bool = True, box: int = 20, room: int = 24, mean: float = 100, sd: float = 20
) -> tuple[np.ndarray, np.ndarray]:
    """A textured image, one "stuff" class everywhere and two coloured ``box``-pixel squares of other
    classes (corners drawn ``room`` pixels from the far edges), and its label map; ``other_band``:
    ADE's label 0 ("other") over the top sixth."""
    rng = np.random.default_rng(seed)
    w, h = size
    pixels = rng.normal(mean, sd, (h, w, 3)).clip(0, 255)
    label = np.full((h, w), int(rng.integers(1, classes)), np.uint8)
    if other_band:
        label[: h // 6] = 0
    for _ in range(2):
        cls = int(rng.integers(1, classes))
        x0, y0 = int(rng.integers(0, w - room)), int(rng.integers(0, h - room))
        label[y0 : y0 + box, x0 : x0 + box] = cls
        pixels[y0 : y0 + box, x0 : x0 + box] = ((cls * 47) % 256, (cls * 91) % 256, (cls * 23) % 256)
    return pixels.astype(np.uint8), label


def write_ade(root: Path, names: dict[str, list[str]], scene: Scene) -> dict[str, np.ndarray]:
    """``root`` (an ADEChallengeData2016 folder) with ``names`` per split, ``scene(split, n)`` the
    n-th image; the label maps by ``split/name.jpg``."""
    labels = {}
    for split, listed in names.items():
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for n, name in enumerate(listed):
            pixels, label = scene(split, n)
            Image.fromarray(pixels).save(root / "images" / split / f"{name}.jpg", quality=95)
            Image.fromarray(label, mode="L").save(root / "annotations" / split / f"{name}.png")
            labels[f"{split}/{name}.jpg"] = label
    return labels


def write_voc(year: Path, splits: dict[str, list[str]], scene: Scene, palette: bool = True) -> dict[str, np.ndarray]:
    """``year`` (a VOCdevkit/VOC2012 folder) with the ids of each split listed in
    ImageSets/Segmentation, ``scene(id, n)`` the n-th image of its split, masks as palette PNGs
    (``palette``) or plain grey ones; the label maps by id."""
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (year / folder).mkdir(parents=True)
    labels = {}
    for split, ids in splits.items():
        (year / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        for n, i in enumerate(ids):
            pixels, label = scene(i, n)
            Image.fromarray(pixels).save(year / "JPEGImages" / f"{i}.jpg", quality=95)
            mask = Image.fromarray(label, mode="P" if palette else "L")
            if palette:
                mask.putpalette(PALETTE)
            mask.save(year / "SegmentationClass" / f"{i}.png")
            labels[i] = label
    return labels
