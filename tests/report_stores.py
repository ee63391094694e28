"""Stores for the report's tests: copies of the session's tiny stores without their results, the
analyses run on them through their own command line, a labelled panel over the synthetic scenes
and a store whose checkpoint sits in a training run folder.

Plain helpers (not fixtures), so each test module builds only what it needs.
"""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.store import cache
from probe_toolkit.store.create import create_store
from probe_toolkit.store.extract import Settings, extract

runner = CliRunner()

# conftest.image_dir's synthetic scenes: (size, boxes x0, y0, x1, y1)
SCENES = {
    "one.png": ((640, 480), [(160, 120, 400, 360)]),
    "two.png": ((480, 480), [(32, 32, 176, 176), (304, 304, 448, 448)]),
}


def invoke(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, f"probe {' '.join(map(str, args))}: {result.output}\n{result.exception!r}"
    return result.output


def bare_copies(stores: dict[str, Path], root: Path) -> dict[str, Path]:
    """Each store copied to ``root/<checkpoint folder>/<network>.zarr`` without its results."""
    out = {}
    for name, path in stores.items():
        target = root / path.parent.name / path.name
        shutil.copytree(path, target, ignore=lambda folder, names, top=str(path): ["results"] if folder == top and "results" in names else [])
        out[name] = target
    return out


def box_coco(entries: dict[str, tuple[tuple[int, int], list[tuple[int, int, int, int]]]]) -> dict:
    """A COCO dict of one category, ``box``: per file name its (width, height) and exact boxes as polygons."""
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "box"}]}
    for i, (name, ((w, h), boxes)) in enumerate(entries.items(), 1):
        coco["images"].append({"id": i, "file_name": name, "width": w, "height": h})
        for x0, y0, x1, y1 in boxes:
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": i,
                    "category_id": 1,
                    "iscrowd": 0,
                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                }
            )
    return coco


def scenes_panels(image_dir: Path, root: Path, cache_dir: Path) -> Path:
    """A COCO file with the scenes' exact boxes, registered as panels ``scenes`` (val) and
    ``scenes-train`` (train) on the scenes folder."""
    path = root / "scenes.json"
    coco = box_coco(SCENES)
    path.write_text(json.dumps(coco))
    invoke("panel", "add", "scenes", "--annotations", path, "--images", image_dir / "scenes", "--role", "val", "--cache", cache_dir)
    # the train panel holds other images (panels of two roles may not share one): the photographs, a centred box each
    train = {"images": [], "annotations": [], "categories": coco["categories"]}
    for i, name in enumerate(sorted(p.name for p in image_dir.glob("*.jpg")), 1):
        with Image.open(image_dir / name) as picture:
            w, h = picture.size
        train["images"].append({"id": i, "file_name": name, "width": w, "height": h})
        x0, y0, x1, y1 = w // 4, h // 4, 3 * w // 4, 3 * h // 4
        train["annotations"].append(
            {
                "id": i,
                "image_id": i,
                "category_id": 1,
                "iscrowd": 0,
                "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "area": (x1 - x0) * (y1 - y0),
            }
        )
    (root / "photos-train.json").write_text(json.dumps(train))
    invoke("panel", "add", "scenes-train", "--annotations", root / "photos-train.json", "--images", image_dir, "--role", "train", "--cache", cache_dir)
    return path


def saliency_panel(image_dir: Path, root: Path, cache_dir: Path) -> Path:
    """The scenes' boxes as binary saliency masks (0 / 255 PNGs), registered as panel ``scenes-sal``."""
    from PIL import Image

    masks = root / "scenes-masks"
    masks.mkdir()
    for name, ((w, h), boxes) in SCENES.items():
        m = np.zeros((h, w), np.uint8)
        for x0, y0, x1, y1 in boxes:
            m[y0:y1, x0:x1] = 255
        Image.fromarray(m).save(masks / name)
    invoke("panel", "add", "scenes-sal", "--images", image_dir / "scenes", "--masks", masks, "--role", "val", "--cache", cache_dir)
    return masks


TRAIN_EPOCHS = 3


def training_store(image_dir: Path, root: Path) -> tuple[Path, Path]:
    """A real tiny run of training/ (seconds on a CPU), a line cut by a crash appended to its log,
    and the store of its checkpoint; returns (store, run folder)."""
    from training import train

    run = train("tiny", {"data.images": str(image_dir), "run.out": str(root / "runs" / "tiny-run"), "optim.epochs": TRAIN_EPOCHS}, quiet=True)
    with open(run.log, "a") as log:
        log.write('{"step": 99, "cut by a cra')
    store = extract(run.checkpoint, image_dir, settings=Settings(views=(224,), attention="last", chunk=4), cache_dir=root / "cache", quiet=True, batch_size=4).store
    return store, Path(run.dir)


# ----------------------------------------------------------------------------------------------
# plain re-implementations the tests compare the report with (different code paths)


def plain_window(grid: int, anchor: int) -> list[int]:
    """SelfPatch's 3×3 window with wrap-around, by hand: the 8 neighbours modulo the grid side."""
    r, c = divmod(anchor, grid)
    return sorted(((r + dr) % grid) * grid + (c + dc) % grid for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0))


def plain_follow(patch: int, ref: tuple[int, int], grid: tuple[int, int], size: int) -> int | None:
    """The patch of ``grid`` (``size``-pixel patches) holding the centre of ``patch`` of ``ref`` (rows, cols, size),
    by a loop over its rows and columns with exact fractions; a centre on a border belongs to the patch before it."""
    rows0, cols0, size0 = ref
    r0, c0 = divmod(patch, cols0)
    y, x = (r0 + Fraction(1, 2)) * size0, (c0 + Fraction(1, 2)) * size0
    row = next((r for r in range(grid[0]) if r * size < y <= (r + 1) * size), None)
    col = next((c for c in range(grid[1]) if c * size < x <= (c + 1) * size), None)
    return None if row is None or col is None else row * grid[1] + col


def plain_cosine(tokens: np.ndarray) -> np.ndarray:
    x = np.asarray(tokens, dtype=np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x @ x.T


def plain_rank(values: np.ndarray, candidates: list[int], n: int) -> list[int]:
    """The n candidates of largest value, largest first, ties to the lower index (a Python sort)."""
    return sorted(candidates, key=lambda j: (-float(values[j]), j))[:n]


def stored(store: Path, array: str, image_id: str) -> np.ndarray:
    ds = cache.open_store(store)
    return np.asarray(ds[array].sel(image=image_id).values)


def synthetic_store(
    path: Path, grid: int, heads: int = 2, channels: int = 8, seed: int = 0, *, class_token: bool = False, registers: int = 0, patch: int | None = None
) -> Path:
    """A store on any patch grid (e.g. 28 × 28, a ViT-S/8 at 224 px) with random tokens and softmax
    attention rows over ``class_token`` + ``registers`` prefix tokens and the patches, written with
    ``create.create_store``; its image file does not exist."""
    rng = np.random.default_rng(seed)
    n = grid * grid
    t = int(class_token) + registers + n
    manifest = {
        "checkpoint": {"path": str(path.parent / "synthetic.pth"), "sha256": "cd" * 32, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": channels, "depth": 1, "heads": heads, "patch": patch or 224 // grid, "class_token": class_token, "final_norm": False, "registers": registers},
        "views": [224],
        "interpolation": "dino",
        "attention": "last",
        "dtype": "float16",
        "chunk": 1,
        "n_images": 1,
        "image_list_sha256": "x",
        "image_source": str(path.parent / "no-such-folder"),
        "attention_prefix": t - n,
        "registers": registers,
    }
    writer = create_store(
        path, manifest, ["gone.jpg"], {"tokens_224": (("patch_224", "channel"), (n, channels)), "attention_224": (("head", "query", "key"), (heads, t, t))}
    )
    scores = rng.normal(0, 2, (1, heads, t, t))
    rows = np.exp(scores - scores.max(-1, keepdims=True))
    writer.write(
        0,
        {"tokens_224": rng.normal(0, 1, (1, n, channels)).astype(np.float16), "attention_224": (rows / rows.sum(-1, keepdims=True)).astype(np.float16)},
        np.array([[480, 640]]),
        np.zeros(1, dtype=bool),
    )
    return path
