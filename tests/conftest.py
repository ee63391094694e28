"""Cached fixtures: tiny checkpoints in every released layout and small stores built from them once.

Later analyses' tests read ``tiny_stores``; nothing here downloads anything.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from probe_toolkit.demo.samples import LAYOUTS, TINY, sample_photos, write_checkpoint
from probe_toolkit.store.extract import Settings, extract

torch.set_num_threads(2)


def synthetic_scene(path: Path, size: tuple[int, int], boxes: list[tuple[int, int, int, int]], seed: int = 0) -> Path:
    """A textured background with flat-coloured boxes (x0, y0, x1, y1): objects with exact outlines."""
    rng = np.random.default_rng(seed)
    width, height = size
    pixels = (rng.normal(110, 25, (height, width, 3))).clip(0, 255)
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        pixels[y0:y1, x0:x1] = (220, 60 + 60 * i, 40)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def davis_video(root: Path, sequences: dict[str, int], seed: int, layout: str, arch, arch_seed: int) -> tuple[Path, Path]:
    """A synthetic DAVIS folder of 120×96 frames (``root/DAVIS``) and a tiny checkpoint of
    ``layout`` beside it: (root, checkpoint)."""
    from probe_toolkit.demo.samples import write_checkpoint
    from probe_toolkit.demo.video import write_davis

    write_davis(root / "DAVIS", sequences, size=(120, 96), seed=seed)
    return root, write_checkpoint(root / f"{layout}.pth", layout, arch, seed=arch_seed)


def scenes_folder(root: Path, scenes: dict[str, tuple[tuple[int, int], list]]) -> Path:
    """``root/scenes`` holding one synthetic scene per entry (name: (size, boxes)), seeded by order."""
    images = root / "scenes"
    images.mkdir()
    for seed, (name, (size, boxes)) in enumerate(scenes.items()):
        synthetic_scene(images / name, size, boxes, seed=seed)
    return images


@pytest.fixture(scope="session")
def photos() -> Path:
    return sample_photos()


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """Five real photographs plus two synthetic scenes with known boxes, in a nested folder."""
    folder = tmp_path_factory.mktemp("images")
    for name in ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg", "camera.jpg"):
        (folder / name).write_bytes((sample_photos() / name).read_bytes())
    (folder / "scenes").mkdir()
    synthetic_scene(folder / "scenes" / "one.png", (640, 480), [(160, 120, 400, 360)], seed=1)
    synthetic_scene(folder / "scenes" / "two.png", (480, 480), [(32, 32, 176, 176), (304, 304, 448, 448)], seed=2)
    return folder


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("checkpoints")
    return {layout: write_checkpoint(folder / f"{layout}.pth", layout, TINY, seed=i) for i, layout in enumerate(LAYOUTS)}


@pytest.fixture(scope="session")
def tiny_stores(tmp_path_factory, tiny_checkpoints, image_dir) -> dict[str, Path]:
    """``dino``: class token, views 96/224/480, every block's attention; ``selfpatch``: no class token, last block."""
    root = tmp_path_factory.mktemp("cache")
    stores = {}
    stores["dino"] = extract(
        tiny_checkpoints["dino-full"],
        image_dir,
        settings=Settings(views=(96, 224, 480), attention="all", chunk=4),
        cache_dir=root,
        quiet=True,
        batch_size=4,
    ).store
    stores["selfpatch"] = extract(
        tiny_checkpoints["selfpatch-full"],
        image_dir,
        settings=Settings(views=(96, 224, 480), attention="last", chunk=4),
        cache_dir=root,
        quiet=True,
        batch_size=4,
    ).store
    return stores
