"""NYU Depth v2 folders made on the spot, in the layout facebookresearch/dinov3 reads
(``nyu_train.txt`` / ``nyu_test.txt``, ``<scene>/rgb_<n>.jpg`` and 16-bit ``<scene>/sync_depth_<n>.png``
in millimetres): rooms whose depth is known exactly, for ``probe demo`` and the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def room(seed: int, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(H, W, 3) uint8 photograph and (H, W) uint16 depth in mm of a room: a back wall whose depth
    grows to the right, a nearer box whose colour says its depth, a band of missing depth (0) at the
    bottom and one pixel beyond 10 m (the range's end)."""
    rng = np.random.default_rng(seed)
    w, h = size
    cols = np.linspace(0, 1, w)[None, :]
    depth = np.broadcast_to(1500 + 3000 * cols + 800 * rng.random(), (h, w)).copy()
    pixels = rng.normal(120, 20, (h, w, 3))
    pixels[..., 0] += 60 * cols[0]
    x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
    near = 700 + 600 * rng.random()
    depth[y0 : y0 + h // 3, x0 : x0 + w // 3] = near
    pixels[y0 : y0 + h // 3, x0 : x0 + w // 3] = (near / 10, 200 - near / 10, 90)
    depth[-max(2, h // 12) :] = 0
    depth[h // 2, w // 2] = 10_500
    return pixels.clip(0, 255).astype(np.uint8), depth.round().astype(np.uint16)


def write_nyu(root: str | Path, splits: dict[str, list[str]], size: tuple[int, int] = (96, 72), seed: int = 0) -> dict[str, np.ndarray]:
    """``root`` with one ``nyu_<split>.txt`` per split listing ``scene/n`` entries (train lines
    with a leading '/', as the BTS file), their photographs and depth maps; the depth maps (uint16 mm)
    by image path."""
    root = Path(root)
    depths = {}
    for split, entries in splits.items():
        lines = []
        for k, entry in enumerate(entries):
            scene, n = entry.split("/")
            (root / scene).mkdir(parents=True, exist_ok=True)
            pixels, depth = room(seed + 31 * k + len(split), size)
            image, label = f"{scene}/rgb_{n}.jpg", f"{scene}/sync_depth_{n}.png"
            Image.fromarray(pixels).save(root / image, quality=95)
            Image.fromarray(depth).save(root / label)
            lead = "/" if split == "train" else ""
            lines.append(f"{lead}{image} {lead}{label} 518.8579\n")
            depths[image] = depth
        (root / f"nyu_{split}.txt").write_text("".join(lines))
    return depths
