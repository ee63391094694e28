"""A synthetic SPair-71k folder: textured scenes with one coloured object each, its keypoints and
box annotated, and pairs of images of one category in PairAnnotation/test (the release's layout
and json fields). For ``probe correspond`` offline (the demo, the tests, the benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from ..infra.origin import mark_synthetic

SIZES = ((96, 64), (64, 80), (72, 72))


def write_spair(root: Path, categories: dict[str, int] | None = None, keypoints: int = 5, seed: int = 0, split: str = "test") -> Path:
    """``categories``: name → images; every ordered pair of a category's images (source ≠ target) is a pair."""
    categories = categories or {"cat": 3, "dog": 3}
    rng = np.random.default_rng(seed)
    n = 0
    (root / "PairAnnotation" / split).mkdir(parents=True, exist_ok=True)
    for c, (category, count) in enumerate(categories.items()):
        (root / "JPEGImages" / category).mkdir(parents=True, exist_ok=True)
        (root / "ImageAnnotation" / category).mkdir(parents=True, exist_ok=True)
        notes = []
        for i in range(count):
            name = f"2008_{c:02d}{i:04d}"
            width, height = SIZES[(i + c) % len(SIZES)]
            pixels = rng.normal(110, 30, (height, width, 3))
            x1, y1 = int(rng.integers(2, width // 3)), int(rng.integers(2, height // 3))
            x2, y2 = int(rng.integers(2 * width // 3, width - 1)), int(rng.integers(2 * height // 3, height - 1))
            pixels[y1:y2, x1:x2] = (200, 60 + 40 * c, 50)
            kps = {}
            for k in range(keypoints):
                if rng.random() < 0.2:
                    kps[str(k)] = None
                else:
                    x, y = int(rng.integers(x1, x2)), int(rng.integers(y1, y2))
                    pixels[max(0, y - 1) : y + 2, max(0, x - 1) : x + 2] = (30 * k, 255 - 40 * k, 120)
                    kps[str(k)] = [x, y]
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(root / "JPEGImages" / category / f"{name}.jpg", quality=95)
            note = {"filename": f"{name}.jpg", "category": category, "image_width": width, "image_height": height, "bndbox": [x1, y1, x2, y2], "kps": kps}
            (root / "ImageAnnotation" / category / f"{name}.json").write_text(json.dumps(note))
            notes.append((name, (width, height), [x1, y1, x2, y2]))
        for s, (src, src_size, src_box) in enumerate(notes):
            for t, (trg, trg_size, trg_box) in enumerate(notes):
                if s == t:
                    continue
                n += 1
                stem = f"{n:06d}-{src}-{trg}:{category}"
                pair = {
                    "filename": stem,
                    "src_imname": f"{src}.jpg",
                    "trg_imname": f"{trg}.jpg",
                    "category": category,
                    "src_imsize": [*src_size, 3],
                    "trg_imsize": [*trg_size, 3],
                    "src_bndbox": src_box,
                    "trg_bndbox": trg_box,
                    "viewpoint_variation": int((s + 2 * t) % 3),
                    "src_kps": [],
                    "trg_kps": [],
                    "kps_ids": [],
                }
                (root / "PairAnnotation" / split / f"{stem}.json").write_text(json.dumps(pair))
    mark_synthetic(root / "JPEGImages", f"synthetic SPair-71k scenes drawn by probe (seed {seed})")  # the report's caveat
    return root
