"""Synthetic scenes for the decoder's tests: keys with planted objects, the matching photos
(written with PIL) and a COCO panel whose objects are exact rectangles on the patch grid."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from probe_toolkit.store.create import create_store


@dataclass
class Scene:
    """One image: ``objects`` are patch rectangles (r0, r1, c0, c1), end-exclusive, on a G × G grid."""

    name: str
    height: int
    width: int
    objects: list[tuple[int, int, int, int]] = field(default_factory=list)


def region(grid: int, objects) -> np.ndarray:
    """(len(objects), G²) bool patch masks."""
    out = np.zeros((len(objects), grid, grid), dtype=bool)
    for k, (r0, r1, c0, c1) in enumerate(objects):
        out[k, r0:r1, c0:c1] = True
    return out.reshape(len(objects), grid * grid)


def planted_keys(grid: int, objects, channels: int = 16, noise: float = 0.05, seed: int = 0) -> np.ndarray:
    """Keys whose background and each object have their own mean (orthogonal, length 1), plus noise."""
    rng = np.random.default_rng(seed)
    masks = region(grid, objects)
    means = np.linalg.qr(rng.standard_normal((channels, len(objects) + 1)))[0].T
    label = np.zeros(grid * grid, dtype=int)
    for k, m in enumerate(masks):
        label[m] = k + 1
    return (means[label] + noise * rng.standard_normal((grid * grid, channels))).astype(np.float32)


def pixel_mask(scene: Scene, grid: int, obj) -> np.ndarray:
    """The object's exact pixels: patch rows r cover [r·H/G, (r+1)·H/G) (H, W multiples of G)."""
    r0, r1, c0, c1 = obj
    ph, pw = scene.height // grid, scene.width // grid
    m = np.zeros((scene.height, scene.width), dtype=bool)
    m[r0 * ph : r1 * ph, c0 * pw : c1 * pw] = True
    return m


def write_panel(folder: Path, scenes: list[Scene], grid: int, extra_annotations: list[dict] | None = None) -> tuple[Path, Path]:
    """Photos in ``folder/images`` and ``folder/panel.json`` with RLE outlines of every object."""
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}, {"id": 2, "name": "other"}]}
    ann_id = 1
    for i, scene in enumerate(scenes, start=1):
        pixels = np.full((scene.height, scene.width, 3), 90, dtype=np.uint8)
        for obj in scene.objects:
            pixels[pixel_mask(scene, grid, obj)] = (220, 80, 40)
        (images / scene.name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(images / scene.name)
        coco["images"].append({"id": 100 + i, "file_name": scene.name, "height": scene.height, "width": scene.width})
        for k, obj in enumerate(scene.objects):
            m = pixel_mask(scene, grid, obj)
            rle = mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            x, y, w, h = mask_utils.toBbox(rle).tolist()
            coco["annotations"].append(
                {"id": ann_id, "image_id": 100 + i, "category_id": 1 + k % 2, "segmentation": rle, "bbox": [x, y, w, h], "area": float(m.sum()), "iscrowd": 0}
            )
            ann_id += 1
    coco["annotations"] += extra_annotations or []
    path = folder / "panel.json"
    path.write_text(json.dumps(coco))
    return path, images


def make_store(path: Path, scenes: list[Scene], keys: np.ndarray, chunk: int = 2, **extra) -> Path:
    """A store with ``keys_480`` (image, patch, channel) for ``scenes`` (ids = file names); ``extra``
    manifest entries (e.g. ``image_source``)."""
    n, patches, channels = keys.shape
    manifest = {
        "kind": "probe-store",
        "checkpoint": {"path": "synthetic.pth", "sha256": "ab" * 32, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": channels, "patch": 16, "class_token": False},
        "views": [480],
        "interpolation": "dino",
        "attention": "none",
        "dtype": "float32",
        "chunk": chunk,
        "image_list_sha256": "0" * 64,
        "n_images": n,
        **extra,
    }
    writer = create_store(path, manifest, [s.name for s in scenes], {"keys_480": (("patch_480", "channel"), (patches, channels))})
    sizes = np.array([[s.height, s.width] for s in scenes])
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        writer.write(start, {"keys_480": keys[start:stop]}, sizes[start:stop], np.zeros(stop - start, dtype=bool))
    return path


def run_main(args: list[str], capsys) -> tuple[int, str]:
    """``probe ARGS`` through ``cli.main`` (one-line errors, exit codes): (status, stderr)."""
    from cli_runs import probe_main

    code, captured = probe_main(args, capsys)
    return code, captured.err


def photo_store(folder: Path, scenes: list[Scene], grid: int, seed: int = 5) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """(store, photographs by name, keys): random photographs written under ``folder/img`` and a
    store of random keys on a grid × grid view whose ``image_source`` is that folder (DSM's colour term)."""
    rng = np.random.default_rng(seed)
    (folder / "img").mkdir()
    photos = {}
    for s in scenes:
        photos[s.name] = rng.integers(0, 255, (s.height, s.width, 3)).astype(np.uint8)
        Image.fromarray(photos[s.name]).save(folder / "img" / s.name)
    keys = rng.standard_normal((len(scenes), grid * grid, 8)).astype(np.float32) + 0.3
    return make_store(folder / "store.zarr", scenes, keys, image_source=str(folder / "img")), photos, keys
