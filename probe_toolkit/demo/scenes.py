"""A small labelled panel made on the spot: real textures, objects with exact outlines.

Each scene is a crop of one of scikit-image's real texture photographs (brick, grass, gravel),
tinted, with one to three objects pasted in: discs filled with the cat's fur (``chelsea``) and
squares filled with coffee beans (``coffee``). The objects' masks are exact by construction, so
the COCO annotation file written beside the images is the ground truth of the panel, and the
same seed always gives the same bytes. ``probe demo`` registers two such panels (train, val).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils
from skimage import data

from ..infra.origin import mark_synthetic

CATEGORIES = [{"id": 1, "name": "disc", "supercategory": "shape"}, {"id": 2, "name": "square", "supercategory": "shape"}]
SIZE = (320, 240)  # width, height


def _textures() -> dict[str, np.ndarray]:
    return {
        "background": [data.brick(), data.grass(), data.gravel()],
        "disc": data.chelsea()[60:260, 120:340],
        "square": data.coffee()[40:360, 300:600],
    }


def _fill(texture: np.ndarray, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    y = rng.integers(0, texture.shape[0] - height + 1)
    x = rng.integers(0, texture.shape[1] - width + 1)
    return texture[y : y + height, x : x + width]


def scene(seed: int) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One image (H, W, 3) uint8 and its objects as (category id, boolean mask) pairs."""
    rng = np.random.default_rng(seed)
    width, height = SIZE
    tex = _textures()
    grey = _fill(tex["background"][seed % 3], height, width, rng).astype(np.float32)
    tint = rng.uniform(0.6, 1.0, size=3)
    pixels = (grey[..., None] * tint).clip(0, 255)
    occupied = np.zeros((height, width), dtype=bool)
    objects: list[tuple[int, np.ndarray]] = []
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(int(rng.integers(1, 4))):
        category = int(rng.integers(1, 3))
        side = int(rng.integers(56, 104))
        for _attempt in range(20):
            x0, y0 = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
            if category == 1:
                r = side / 2
                mask = (yy - (y0 + r - 0.5)) ** 2 + (xx - (x0 + r - 0.5)) ** 2 <= r * r
            else:
                mask = np.zeros_like(occupied)
                mask[y0 : y0 + side, x0 : x0 + side] = True
            if not (mask & occupied).any():
                break
        else:
            continue
        texture = tex["disc" if category == 1 else "square"]
        patch = _fill(texture, side, side, rng).astype(np.float32)
        region = pixels[y0 : y0 + side, x0 : x0 + side]
        inside = mask[y0 : y0 + side, x0 : x0 + side]
        region[inside] = patch[inside]
        occupied |= mask
        objects.append((category, mask))
    return pixels.astype(np.uint8), objects


def write_panel(folder: str | Path, count: int, seed: int) -> Path:
    """Write ``count`` scenes as PNG (lossless, so the masks stay exact) and ``annotations.json``."""
    folder = Path(folder)
    images_dir = folder / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    coco: dict = {"info": {"description": f"probe synthetic scenes, seed {seed}"}, "images": [], "annotations": [], "categories": CATEGORIES}
    for i in range(count):
        pixels, objects = scene(seed * 1000 + i)
        name = f"scene_{seed:03d}_{i:03d}.png"
        Image.fromarray(pixels).save(images_dir / name, optimize=False)
        coco["images"].append({"id": i + 1, "file_name": name, "width": SIZE[0], "height": SIZE[1]})
        for category, mask in objects:
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": i + 1,
                    "category_id": category,
                    "segmentation": {"size": rle["size"], "counts": rle["counts"].decode("ascii")},
                    "area": float(mask_utils.area(rle)),
                    "bbox": [float(v) for v in mask_utils.toBbox(rle)],
                    "iscrowd": 0,
                }
            )
    annotations = folder / "annotations.json"
    annotations.write_text(json.dumps(coco, indent=1))
    mark_synthetic(folder, f"synthetic scenes drawn by probe (seed {seed})")
    return annotations


def write_masks(folder: str | Path, count: int, seed: int) -> Path:
    """The same scenes as ``write_panel(_, count, seed)`` as binary saliency masks (0 and 255, as
    ECSSD ships), one PNG per image under the image's name; a folder apart from the image root."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        pixels, objects = scene(seed * 1000 + i)
        salient = np.zeros(pixels.shape[:2], dtype=bool)
        for _, mask in objects:
            salient |= mask
        Image.fromarray(salient.astype(np.uint8) * 255).save(folder / f"scene_{seed:03d}_{i:03d}.png", optimize=False)
    mark_synthetic(folder, f"masks of synthetic scenes drawn by probe (seed {seed})")
    return folder


def write_voc(year: str | Path, splits: dict[str, tuple[int, int]]) -> Path:
    """The scenes in Pascal VOC 2012's segmentation layout (``JPEGImages``, ``SegmentationClass``,
    ``ImageSets/Segmentation/<split>.txt``), for ``probe hummingbird``: ``splits`` maps a split to
    (count, seed). Discs are labelled 1 and squares 2 (VOC's first two class indices stand in for
    the two shapes), the background 0, and a one-pixel band around each object 255, as VOC's
    boundary. Images are JPEG, as the devkit's."""
    year = Path(year)
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (year / folder).mkdir(parents=True, exist_ok=True)
    for split, (count, seed) in splits.items():
        ids = [f"{2000 + seed}_{i:06d}" for i in range(count)]
        for i, name in enumerate(ids):
            pixels, objects = scene(seed * 1000 + i)
            label = np.zeros(pixels.shape[:2], np.uint8)
            for category, mask in objects:
                grown = mask.copy()
                grown[1:] |= mask[:-1]
                grown[:-1] |= mask[1:]
                grown[:, 1:] |= grown[:, :-1].copy()
                grown[:, :-1] |= grown[:, 1:].copy()
                label[grown & ~mask] = 255
                label[mask] = category
            Image.fromarray(pixels).save(year / "JPEGImages" / f"{name}.jpg", quality=95)
            Image.fromarray(label, mode="L").save(year / "SegmentationClass" / f"{name}.png")
        (year / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
    mark_synthetic(year / "JPEGImages", "synthetic scenes drawn by probe in VOC's layout")  # the report's caveat
    return year
