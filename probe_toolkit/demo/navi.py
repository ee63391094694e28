"""A synthetic NAVI folder (google/navi ``navi_v1`` with mbanani/probe3d's downsampled files): objects
with a ``wild_set`` and a ``multiview_00`` collection, each wild image a textured band of a slab seen
from a camera turned about the vertical axis, its 16-bit depth map 0 off the band. For ``probe
correspond`` on NAVI offline (the demo, the tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image


def quaternion(angle_deg: float, axis=(0.0, 1.0, 0.0)) -> list[float]:
    half = math.radians(angle_deg) / 2
    return [math.cos(half), *(math.sin(half) * a for a in axis)]


def write_navi(root: Path, objects: dict[str, list[float]], *, size=(96, 128), seed: int = 0, original=(1200, 1600)) -> Path:
    """``objects``: name → the wild images' rotation angles in degrees (one image each). Returns ``root``."""
    rng = np.random.default_rng(seed)
    h, w = size
    for o, (name, angles) in enumerate(objects.items()):
        (root / name / "multiview_00").mkdir(parents=True)
        (root / name / "multiview_00" / "annotations.json").write_text("[]")
        wild = root / name / "wild_set"
        (wild / "images").mkdir(parents=True)
        (wild / "depth").mkdir()
        entries = []
        for i, angle in enumerate(angles):
            image_id = f"{i:03d}"
            pixels = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
            disparity = np.zeros((h, w), np.uint16)
            top, left = int(rng.integers(4, h // 4)), int(rng.integers(4, w // 4))
            bottom, right = top + int(rng.integers(h // 2, h - top - 2)), left + int(rng.integers(w // 3, w // 2))
            ys, xs = np.mgrid[top:bottom, left:right]
            band = np.abs((ys - top) / (bottom - top) - (xs - left) / (right - left)) < 0.08  # a diagonal band: about a tenth of the matching grid
            slab = (700 + 3 * ys + 2 * xs + 40 * o).astype(np.uint16)  # about 0.9 m away, tilted
            disparity[top:bottom, left:right] = np.where(band, slab, 0)
            texture = (np.stack([ys * 7 + 50 * o, xs * 5, (ys + xs) * 3], -1) % 256).astype(np.uint8)
            pixels[top:bottom, left:right] = np.where(band[..., None], texture, pixels[top:bottom, left:right])
            Image.fromarray(pixels).save(wild / "images" / f"{image_id}.jpg", quality=95)
            Image.fromarray(pixels).save(wild / "images" / f"downsampled_{image_id}.jpg", quality=95)
            Image.fromarray(disparity).save(wild / "depth" / f"downsampled_{image_id}.png")
            entries.append(
                {
                    "object_id": name,
                    "filename": f"{image_id}.jpg",
                    "image_size": list(original),
                    "camera": {"q": quaternion(angle), "t": [10.0 * i, -5.0, 600.0 + 20 * i], "focal_length": 1400.0 + 10 * i},
                    "split": "val",
                }
            )
        (wild / "annotations.json").write_text(json.dumps(entries))
    return root
