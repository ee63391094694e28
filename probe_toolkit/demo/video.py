"""A synthetic DAVIS-2017 folder: moving textured shapes on a textured background, exact masks.

For ``probe propagate`` offline (the demo, the tests): ``JPEGImages/480p/<seq>/00000.jpg``…,
``Annotations/480p/<seq>/00000.png``… (indexed PNGs with DAVIS's palette; 1 = a disc, 2 = a
rectangle, 0 background) and ``ImageSets/2017/val.txt``. The objects move a few pixels per
frame and the disc passes in front of the rectangle, so propagation has occlusion to handle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..infra.origin import mark_synthetic
from ..labels.davis import davis_palette


def _texture(rng: np.random.Generator, height: int, width: int, base: tuple[int, int, int], stripes: float) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    wave = 40 * np.sin((x + 0.6 * y) / stripes)[..., None]
    return np.clip(np.array(base)[None, None] + wave + rng.normal(0, 12, (height, width, 3)), 0, 255)


def write_davis(root: str | Path, sequences: dict[str, int] | None = None, size: tuple[int, int] = (160, 120), seed: int = 0) -> Path:
    """Write the folder; ``sequences`` maps a name to its frame count; ``size`` is (width, height)."""
    root = Path(root)
    sequences = sequences or {"shapes": 6}
    width, height = size
    for k, (name, n_frames) in enumerate(sequences.items()):
        rng = np.random.default_rng(seed + k)
        background = _texture(rng, height, width, (90, 110, 80), 5.0)
        disc = _texture(rng, height, width, (220, 70, 60), 2.0)
        box = _texture(rng, height, width, (60, 80, 210), 3.5)
        frames = root / "JPEGImages" / "480p" / name
        masks = root / "Annotations" / "480p" / name
        frames.mkdir(parents=True, exist_ok=True)
        masks.mkdir(parents=True, exist_ok=True)
        y, x = np.mgrid[0:height, 0:width]
        for t in range(n_frames):
            labels = np.zeros((height, width), np.uint8)
            bx, by = int(0.55 * width) - 2 * t, int(0.30 * height) + t
            labels[by : by + height // 3, bx : bx + width // 4] = 2
            cx, cy, r = 0.25 * width + 4 * t, 0.5 * height, 0.16 * min(width, height)
            labels[(x - cx) ** 2 + (y - cy) ** 2 <= r * r] = 1
            pixels = np.where((labels == 1)[..., None], disc, np.where((labels == 2)[..., None], box, background))
            Image.fromarray(pixels.astype(np.uint8)).save(frames / f"{t:05d}.jpg", quality=95)
            mask = Image.fromarray(labels, mode="P")
            mask.putpalette(davis_palette().ravel().tolist())
            mask.save(masks / f"{t:05d}.png")
    sets = root / "ImageSets" / "2017"
    sets.mkdir(parents=True, exist_ok=True)
    (sets / "val.txt").write_text("".join(f"{name}\n" for name in sequences))
    mark_synthetic(root, f"a synthetic DAVIS folder drawn by probe ({len(sequences)} sequence(s), seed {seed})")
    return root
