"""SPair-71k panels: keypoint pairs, checked field by field when added, read only through the ledger.

Layout of the release (``SPair-71k/``)::

    PairAnnotation/{trn,val,test}/<n>-<source>-<target>:<category>.json
        category, src_imname, trg_imname, src_imsize / trg_imsize ([width, height, depth]),
        src_bndbox / trg_bndbox ([x1, y1, x2, y2]), viewpoint_variation (0, 1 or 2), ...
    ImageAnnotation/<category>/<image>.json    kps: {"0": [x, y] or null, "1": ..., ...}
    JPEGImages/<category>/<image>.jpg

The keypoints are those of the two images' ``ImageAnnotation`` files, indexed as they are, as
mbanani/probe3d reads them (``evals/datasets/spair.py``: ``process_keypoints`` of each image's
``kps``; the pair file's own ``src_kps``/``trg_kps`` are not used); a pair scores the keypoints
annotated in both images. Pair files are taken in sorted order (the reference takes ``glob``'s
order, which the file system decides).

``check_layout`` (when the panel is added) opens every pair file of the split and the image
annotations they name, and refuses the panel in one line: the first problem (file, entry, field, fix) and how many more.
It hands out no label, only where a file is malformed, so it writes no ledger entry (the files are
opened inside the readers' guard, ``guard.inside``); ``spair_read.read_pairs`` opens them again,
writes the ledger entry, and only then hands the pairs out. This module knows the layout only, so
the panel registry (``kinds``) can check a folder without importing the readers that use it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError

KIND = "spair"
SPLITS = ("trn", "val", "test")
BINS = (0, 1, 2)  # viewpoint_variation
FIX = "restore the file from the SPair-71k release"


@dataclass(frozen=True)
class Pair:
    """One pair: its file name, category, the two images (paths under JPEGImages/), their sizes
    (width, height) and boxes, the viewpoint bin, and both images' keypoints (index → (x, y) or None)."""

    name: str
    category: str
    source: str
    target: str
    source_size: tuple[int, int]
    target_size: tuple[int, int]
    source_box: tuple[int, int, int, int]
    target_box: tuple[int, int, int, int]
    viewpoint: int
    source_kps: tuple[tuple[float, float] | None, ...]
    target_kps: tuple[tuple[float, float] | None, ...]


def pair_folder(root: Path, split: str) -> Path:
    return root / "PairAnnotation" / split


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _box(data: dict, field: str, size: tuple[int, int] | None, problems: list[str], where: str) -> tuple[int, int, int, int] | None:
    box = data.get(field)
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in box)):
        problems.append(f"{where}: field {field} is {box!r}, not four whole numbers [x1, y1, x2, y2]; {FIX}")
        return None
    x1, y1, x2, y2 = box
    if not (0 <= x1 < x2 and 0 <= y1 < y2) or (size is not None and (x2 > size[0] or y2 > size[1])):
        problems.append(f"{where}: field {field} is not a box [x1, y1, x2, y2] with x1 < x2, y1 < y2 inside the image; {FIX}")
        return None
    return x1, y1, x2, y2


def _size(data: dict, field: str, problems: list[str], where: str) -> tuple[int, int] | None:
    size = data.get(field)
    if not (isinstance(size, list) and len(size) >= 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size[:2])):
        problems.append(f"{where}: field {field} is {size!r}, not [width, height, depth]; {FIX}")
        return None
    return size[0], size[1]


def _keypoints(raw: bytes, path: Path, problems: list[str], size: tuple[int, int] | None = None) -> tuple[tuple[float, float] | None, ...] | None:
    try:
        data = json.loads(raw)
    except ValueError as error:
        problems.append(f"{path}: is not JSON ({error}); {FIX}")
        return None
    kps = data.get("kps") if isinstance(data, dict) else None
    if not isinstance(kps, dict) or not kps:
        problems.append(f'{path}: field kps is {kps!r}, not an object of keypoints {{"0": [x, y] or null, ...}}; {FIX}')
        return None
    out: list[tuple[float, float] | None] = []
    for i in range(len(kps)):
        point = kps.get(str(i), "absent")
        if point is None:
            out.append(None)
        elif isinstance(point, list) and len(point) == 2 and all(_number(v) and math.isfinite(v) for v in point):
            if size is not None and not (0 <= point[0] <= size[0] and 0 <= point[1] <= size[1]):
                problems.append(f"{path}: kps entry {i!s} {point!r} lies outside its {size[0]}×{size[1]} image (it would be scored as if inside); {FIX}")
                return None
            out.append((float(point[0]), float(point[1])))
        else:
            problems.append(f"{path}: kps entry {i!s} is {point!r}, not [x, y] or null (keys must run 0..{len(kps) - 1}); {FIX}")
            return None
    return tuple(out)


def parse(root: Path, split: str, read, image_size=None) -> tuple[list[Pair], list[str], list[tuple[str, bytes]]]:
    """(pairs, problems, (name, bytes) of every file read) of a split; ``read`` (path → bytes)
    opens the annotation files, ``image_size`` (path → (width, height)) reads an image's header."""
    from ..store.images import header_size

    sizes_seen: dict[Path, tuple[int, int]] = {}

    def size_of(path: Path) -> tuple[int, int]:
        if path not in sizes_seen:
            sizes_seen[path] = (image_size or header_size)(path)
        return sizes_seen[path]

    problems: list[str] = []
    parts: list[tuple[str, bytes]] = []
    pairs: list[Pair] = []
    kps_cache: dict[Path, Any] = {}
    for path in sorted(pair_folder(root, split).glob("*.json")):
        raw = read(path)
        parts.append((f"{split}/{path.name}", raw))
        before = len(problems)
        try:
            data = json.loads(raw)
        except ValueError as error:
            problems.append(f"{path}: is not JSON ({error}); {FIX}")
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}: is not a JSON object; {FIX}")
            continue
        entry = str(data.get("filename", path.stem))
        where = f"{path}: pair {entry}"
        category = data.get("category")
        names = [data.get(f) for f in ("src_imname", "trg_imname")]
        if not isinstance(category, str) or not category or "/" in category:
            problems.append(f"{where}: field category is {category!r}, not a category name; {FIX}")
            continue
        if not all(isinstance(n, str) and n.endswith(".jpg") and "/" not in n for n in names):
            problems.append(f"{where}: fields src_imname, trg_imname are {names!r}, not two .jpg file names; {FIX}")
            continue
        stems = entry.split(":")[0].split("-")
        if len(stems) != 3 or stems[1:] != [Path(n).stem for n in names]:
            problems.append(f"{where}: field filename does not name src_imname and trg_imname as <n>-<source>-<target>:<category>; {FIX}")
        viewpoint = data.get("viewpoint_variation")
        if viewpoint not in BINS or isinstance(viewpoint, bool):
            problems.append(f"{where}: field viewpoint_variation is {viewpoint!r}, not 0, 1 or 2; {FIX}")
        sizes = [_size(data, f, problems, where) for f in ("src_imsize", "trg_imsize")]
        images = [root / "JPEGImages" / category / n for n in names]
        for image, size, field in zip(images, sizes, ("src_imsize", "trg_imsize")):
            if not image.is_file():
                problems.append(f"{where}: its image {image} is missing; put the release's JPEGImages/ beside PairAnnotation/")
            elif size is not None and size_of(image) != size:
                problems.append(f"{where}: field {field} {list(size)} is not the size of {image} {list(size_of(image))}; {FIX}")
        boxes = [_box(data, f, s, problems, where) for f, s in (("src_bndbox", sizes[0]), ("trg_bndbox", sizes[1]))]
        kps = []
        for name, image in zip(names, images):
            note = root / "ImageAnnotation" / category / f"{Path(name).stem}.json"
            if note not in kps_cache:
                if not note.is_file():
                    problems.append(f"{where}: its image annotation {note} is missing; {FIX}")
                    kps_cache[note] = None
                else:
                    raw_note = read(note)
                    parts.append((f"{category}/{note.name}", raw_note))
                    kps_cache[note] = _keypoints(raw_note, note, problems, size_of(image) if image.is_file() else None)
            kps.append(kps_cache[note])
        if kps[0] is not None and kps[1] is not None and len(kps[0]) != len(kps[1]):
            problems.append(f"{where}: its images' annotations list {len(kps[0])} and {len(kps[1])} keypoints (one category, one count); {FIX}")
        if len(problems) == before:
            pairs.append(
                Pair(entry, category, f"{category}/{names[0]}", f"{category}/{names[1]}", sizes[0], sizes[1], boxes[0], boxes[1], int(viewpoint), kps[0], kps[1])
            )
    return pairs, problems, parts


def refuse(problems: list[str], where: Path) -> None:
    """Refuse in one line: the first problem found, and how many more ``where`` holds (as ``schema`` does)."""
    if problems:
        n = len(problems) - 1
        more = f" ({n} more problem{'s' if n > 1 else ''} in {where})" if n else ""
        raise ProbeError(None, problems[0] + more)


def check_layout(annotations: Path, images: Path | None, split: str) -> tuple[Path, Path]:
    """(the SPair-71k folder, its JPEGImages/) of a new panel: the folders, then every pair file
    of the split and every image annotation it names, field by field (refused in one line: the first problem and how many more)."""
    from .guard import inside

    root = annotations.resolve()
    split = split or "test"
    if split not in SPLITS:
        raise ProbeError(None, f"--split {split!r} is not one of {', '.join(SPLITS)}", "pass --split test (or trn, val), as PairAnnotation/ names them")
    for folder in (pair_folder(root, split), root / "ImageAnnotation", root / "JPEGImages"):
        if not folder.is_dir():
            raise ProbeError(folder, "is not a folder", "pass --spair with the SPair-71k folder (PairAnnotation/, ImageAnnotation/, JPEGImages/)")
    if images is not None and images.resolve() != (root / "JPEGImages").resolve():
        raise ProbeError(images, "is not the folder's JPEGImages/", "leave --images out: a SPair panel's images are <DIR>/JPEGImages")
    if not any(pair_folder(root, split).glob("*.json")):
        raise ProbeError(pair_folder(root, split), "holds no pair file (*.json)", FIX)
    inside.active = True
    try:
        _, problems, _ = parse(root, split, lambda p: Path(p).read_bytes())
    finally:
        inside.active = False
    refuse(problems, root)
    return root, root / "JPEGImages"
