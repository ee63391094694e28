"""NAVI panels (Jampani et al., NeurIPS 2023, google/navi ``navi_v1``) as mbanani/probe3d reads them for
multiview correspondence, checked field by field when added, read only through the ledger.

Layout (``evals/datasets/navi.py`` ``parse_dataset``; the downsampled files made by its
``data_processing/resize_navi.py``: short side 1024, images bicubic, depth nearest)::

    <DIR>/<object>/<collection>/annotations.json    [{filename, camera: {q: [w, x, y, z], t: [x, y, z] (mm),
                                                       focal_length}, image_size: [height, width], ...}, ...]
    <DIR>/<object>/<collection>/images/<id>.jpg, images/downsampled_<id>.jpg
    <DIR>/<object>/<collection>/depth/downsampled_<id>.png    (16-bit; 0 where no object)

Collections are ``multiview_*`` and ``wild_set``. The test split (``NAVI(split="test")``: collection
"wild", subpart "all") is every ``wild_set`` image of each object that also has another
collection; an image's id is the stem of a ``.jpg`` without ``_`` in it (the originals: the reference
drops the ``downsampled_`` names from its list), and it reads ``downsampled_<id>`` files.

Pairs (``generate_instance_pairs``, ``max_angle=120``): ``torch.manual_seed(8)``, then for each
object and collection, for each of its images in order, the relative rotation angle to every image
of the collection (``acos(clamp(0.5 · trace(R_i R_jᵀ) − 0.5, −1, 1))`` in degrees, float32), every
angle above 120° and every angle of 0 (the image itself) weighted 0, the others 1, and one partner
drawn by ``torch.multinomial``. The pairs scored are every fourth image's (``instances[::4]``, taken
after the pairs are drawn). The reference lists objects, collections and images in the order glob and
``os.listdir`` return them (the file system's); here they are sorted, so the pairs are reproducible.

``check_layout`` opens every annotation file and every image's and depth map's header when the panel
is added, and refuses it in one line (the first problem, and how many more); it hands out no label (the files are opened inside
the readers' guard, ``guard.inside``), so it writes no ledger entry; ``navi_read.read_navi`` opens them
again, writes the entry, and only then hands out poses and depth paths. An image without a partner
within 120° is refused here: the reference's ``torch.multinomial`` fails on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from .spair import refuse

KIND = "navi"
SPLITS = ("test",)  # probe3d's correspondence split: the wild_set collections
WILD = "wild_set"
PREFIX = "downsampled_"  # data_processing/resize_navi.py
MAX_ANGLE = 120.0  # NAVI(max_angle=120)
PAIR_SEED = 8  # generate_instance_pairs: torch.manual_seed(8)
STRIDE = 4  # NAVI.__init__: self.instances = self.instances[::4]
FIX = "restore the file from the navi_v1 release"
DOWNSAMPLE = (
    "make the downsampled files as mbanani/probe3d data_processing/resize_navi.py does (short side 1024: images bicubic, depth nearest, saved as downsampled_<name>)"
)


@dataclass(frozen=True)
class NaviImage:
    """One image of the panel: where it is (paths relative to the NAVI folder), its camera (rotation
    quaternion w, x, y, z and translation in mm, as the annotation gives them), focal length and
    original size (height, width)."""

    object: str
    collection: str
    id: str
    image: str  # <object>/<collection>/images/downsampled_<id>.jpg
    depth: str  # <object>/<collection>/depth/downsampled_<id>.png
    q: tuple[float, float, float, float]
    t: tuple[float, float, float]
    focal: float
    size: tuple[int, int]  # (height, width) of the original image (annotation image_size)

    @property
    def key(self) -> str:
        return f"{self.object}/{self.collection}/{self.id}"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _entry(raw: Any, where: str, problems: list[str]) -> tuple[tuple[float, ...], tuple[float, ...], float, tuple[int, int]] | None:
    """(q, t, focal, (height, width)) of one annotation entry, or None with its problems added."""
    camera = raw.get("camera") if isinstance(raw, dict) else None
    if not isinstance(camera, dict):
        problems.append(f"{where}: field camera is {camera!r}, not an object {{q, t, focal_length}}; {FIX}")
        return None
    q, t, focal, size = camera.get("q"), camera.get("t"), camera.get("focal_length"), raw.get("image_size")
    ok = True
    if not (isinstance(q, list) and len(q) == 4 and all(_number(v) for v in q) and any(v != 0 for v in q)):
        problems.append(f"{where}: field camera.q is {q!r}, not a rotation quaternion [w, x, y, z]; {FIX}")
        ok = False
    if not (isinstance(t, list) and len(t) == 3 and all(_number(v) for v in t)):
        problems.append(f"{where}: field camera.t is {t!r}, not a translation [x, y, z] in millimetres; {FIX}")
        ok = False
    if not (_number(focal) and focal > 0):
        problems.append(f"{where}: field camera.focal_length is {focal!r}, not a positive number of pixels; {FIX}")
        ok = False
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        problems.append(f"{where}: field image_size is {size!r}, not [height, width] in whole pixels; {FIX}")
        ok = False
    return (tuple(map(float, q)), tuple(map(float, t)), float(focal), (size[0], size[1])) if ok else None


def image_ids(folder: Path) -> list[str]:
    """The ids of a collection's images (``parse_dataset``: stems of ``.jpg`` names without ``_``), sorted."""
    return sorted({p.name.split(".")[0] for p in folder.iterdir() if "jpg" in p.name and "_" not in p.name.split(".")[0]})


def parse(root: Path, read, header=None) -> tuple[list[NaviImage], list[str], list[tuple[str, bytes]]]:
    """(the test split's images in the reference's order, problems, (name, bytes) of every annotation
    file read); ``read`` (path → bytes) opens the annotation files, ``header`` (path → (width, height,
    mode)) reads an image's or depth map's header."""
    from PIL import Image

    def size_mode(path: Path) -> tuple[int, int, str]:
        with Image.open(path) as im:
            return im.size[0], im.size[1], im.mode

    header = header or size_mode
    problems: list[str] = []
    parts: list[tuple[str, bytes]] = []
    out: list[NaviImage] = []
    for obj in sorted(p for p in root.iterdir() if p.is_dir()):
        collections = sorted(p for p in obj.iterdir() if p.is_dir() and (p.name.startswith("multiview") or p.name == WILD))
        if not any(c.name == WILD for c in collections) or len(collections) == 1:
            continue  # define_instances_split: "Skipping object"
        folder = obj / WILD
        note = folder / "annotations.json"
        if not note.is_file() or not (folder / "images").is_dir():
            problems.append(f"{folder}: has no annotations.json or images/ folder; {FIX}")
            continue
        raw = read(note)
        parts.append((f"{obj.name}/{WILD}/annotations.json", raw))
        try:
            entries = json.loads(raw)
        except ValueError as error:
            problems.append(f"{note}: is not JSON ({error}); {FIX}")
            continue
        if not isinstance(entries, list):
            problems.append(f"{note}: is not a JSON list of annotations; {FIX}")
            continue
        by_id = {str(e.get("filename", "")).split(".")[0]: e for e in entries if isinstance(e, dict)}
        ids = image_ids(folder / "images")
        if not ids:
            problems.append(f"{folder / 'images'}: holds no image (<id>.jpg); {FIX}")
        for image_id in ids:
            where = f"{note}: image {image_id}"
            if image_id not in by_id:
                problems.append(f"{where}: has no annotation (no entry with filename {image_id}.jpg); {FIX}")
                continue
            fields = _entry(by_id[image_id], where, problems)
            image, depth = folder / "images" / f"{PREFIX}{image_id}.jpg", folder / "depth" / f"{PREFIX}{image_id}.png"
            if not image.is_file() or not depth.is_file():
                problems.append(f"{where}: {image if not image.is_file() else depth} is missing; {DOWNSAMPLE}")
                continue
            (iw, ih, _), (dw, dh, mode) = header(image), header(depth)
            if (iw, ih) != (dw, dh):
                problems.append(f"{where}: its depth map is {dw}x{dh}, its image {iw}x{ih}; {DOWNSAMPLE}")
            elif mode not in ("I;16", "I;16B", "I"):
                problems.append(f"{where}: its depth map {depth.name} is an image of mode {mode}, not 16-bit; {FIX}")
            elif fields is not None:
                q, t, focal, size = fields
                out.append(NaviImage(obj.name, WILD, image_id, str(image.relative_to(root)), str(depth.relative_to(root)), q, t, focal, size))
    return out, problems, parts


def check_layout(annotations: Path, images: Path | None, split: str) -> tuple[Path, Path]:
    """(the NAVI folder, the same folder as the images' root) of a new panel: every wild_set
    annotation field by field, every image's and depth map's header, and every image's partner."""
    from . import navi_pairs
    from .guard import inside

    root = annotations.resolve()
    split = split or "test"
    if split not in SPLITS:
        raise ProbeError(
            None,
            f"--split {split!r} is not one of {', '.join(SPLITS)}",
            "pass --split test: probe3d's NAVI correspondence reads the wild_set collections (NAVI(split='test'))",
        )
    if not root.is_dir():
        raise ProbeError(root, "is not a folder", "pass --navi with the navi_v1 folder (<object>/<collection>/annotations.json)")
    if images is not None and images.resolve() != root:
        raise ProbeError(images, "is not the NAVI folder", "leave --images out: a NAVI panel's images are under <DIR>/<object>/wild_set/images")
    inside.active = True
    try:
        found, problems, _ = parse(root, lambda p: Path(p).read_bytes())
    finally:
        inside.active = False
    if not found and not problems:
        raise ProbeError(root, "holds no object with a wild_set and a multiview collection", "pass the navi_v1 folder")
    if not problems:
        problems = navi_pairs.unpaired(found)
    refuse(problems, root)
    return root, root
