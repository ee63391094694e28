"""A COCO dataset checked field by field: every panel kind that becomes one (COCO, COCO20k, VOC,
saliency) is checked here when it is added and again when it is read, before any label leaves.

pycocotools trusts its input: an ``image_id`` written as the string ``"1"`` indexes no image and
its objects silently count for nothing (CorLoc 0.00 % with exit 0); a box left of the image is
scored as if it were one. Here each field has a type, a range and, for ids, a referent:

- ``images``: ``id`` a whole number, unique; ``file_name`` a relative path; ``width`` and
  ``height``, when given, whole numbers above 0;
- ``categories``: ``id`` a whole number, unique;
- ``annotations``: ``id`` a whole number, unique; ``image_id`` and ``category_id`` whole numbers
  naming a listed image and category; ``bbox`` four finite numbers, width and height ≥ 0, and
  overlapping its image (a box partly outside is clipped later, ``hygiene.clip_geometry``; one
  wholly outside describes nothing in it); ``segmentation`` polygons of ≥ 3 finite points or an
  RLE of its image's size; ``iscrowd`` 0 or 1; ``area`` a finite number ≥ 0.

Problems are collected, and the first is the one line shown, with how many more there are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError

FIX = "fix the annotation file (each field as the COCO format defines it)"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problems(dataset: Any, image_size: Callable[[str], tuple[int, int] | None] | None = None) -> list[str]:
    """Every problem of a COCO dataset, as ``<entry>: <what>`` (empty when it is sound).
    ``image_size`` (file name → (width, height) or None) sizes an image that records none."""
    if not isinstance(dataset, dict):
        return [f"is a JSON {type(dataset).__name__}, not an object with images, annotations and categories"]
    found: list[str] = []
    for key in ("images", "annotations"):
        if not isinstance(dataset.get(key), list):
            found.append(f"field {key} is {type(dataset.get(key)).__name__ if key in dataset else 'absent'}, not a list")
    if found:
        return found
    if not dataset["images"]:
        return ["field images is empty: the panel lists no image"]
    if not dataset["annotations"]:
        return ["field annotations is empty: the panel holds no object, and every score of it would describe nothing"]
    categories = dataset.get("categories", [])
    if not isinstance(categories, list):
        return [f"field categories is of type {type(categories).__name__}, not a list"]
    sizes: dict[int, tuple[int, int] | None] = {}
    for n, image in enumerate(dataset["images"]):
        found += image_problems(n, image, sizes, image_size)
    category_ids: set[int] = set()
    for n, category in enumerate(categories):
        found += category_problems(n, category, category_ids)
    seen: set[int] = set()
    for n, ann in enumerate(dataset["annotations"]):
        found += annotation_problems(n, ann, sizes, category_ids if categories else None, seen)
    return found


def image_problems(n: int, image: Any, sizes: dict, image_size: Callable[[str], tuple[int, int] | None] | None = None) -> list[str]:
    """The problems of ``images[n]``; its size (None when unknown) joins ``sizes`` under its id.
    One entry at a time, so a reader may check a file entry by entry (``coco_classes``)."""
    where = f"images[{n}]"
    if not isinstance(image, dict):
        return [f"{where} is of type {type(image).__name__}, not an object"]
    found = []
    image_id, name = image.get("id"), image.get("file_name")
    if not _whole(image_id):
        return [f"{where}: id {image_id!r} is not a whole number"]
    if image_id in sizes:
        found.append(f"{where}: id {image_id} is listed twice")
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        found.append(f"{where} (id {image_id}): file_name {name!r} is not a path relative to the image folder")
    width, height = image.get("width"), image.get("height")
    size = None
    if width is not None or height is not None:
        if not (_whole(width) and _whole(height) and width > 0 and height > 0):
            found.append(f"{where} (id {image_id}): width/height {width!r}/{height!r} are not whole numbers above 0")
        else:
            size = (width, height)
    if size is None and image_size is not None and isinstance(name, str):
        size = image_size(name)
    sizes[image_id] = size
    return found


def category_problems(n: int, category: Any, category_ids: set) -> list[str]:
    """The problems of ``categories[n]``; its id joins ``category_ids``."""
    cid = category.get("id") if isinstance(category, dict) else None
    if not _whole(cid):
        return [f"categories[{n}]: id {cid!r} is not a whole number"]
    if cid in category_ids:
        return [f"categories[{n}]: id {cid} is listed twice"]
    category_ids.add(cid)
    return []


def annotation_problems(n: int, ann: Any, sizes: dict, category_ids: set | None, seen: set) -> list[str]:
    """The problems of ``annotations[n]`` against the images' ``sizes`` and the listed
    ``category_ids`` (None: the file lists no category); its id joins ``seen``."""
    where = f"annotations[{n}]"
    if not isinstance(ann, dict):
        return [f"{where} is of type {type(ann).__name__}, not an object"]
    found = []
    if "id" in ann:
        if not _whole(ann["id"]):
            return [f"{where}: id {ann['id']!r} is not a whole number"]
        if ann["id"] in seen:
            found.append(f"{where}: id {ann['id']} is listed twice")
        seen.add(ann["id"])
        where = f"annotation {ann['id']!r}"
    image_id = ann.get("image_id")
    if not _whole(image_id):
        return found + [f"{where}: image_id {image_id!r} is not a whole number (a string names no image, and its objects would count for nothing)"]
    if image_id not in sizes:
        return found + [f"{where} names image id {image_id!r}, which the file's images list lacks"]
    cid = ann.get("category_id")
    if cid is not None and not _whole(cid):
        found.append(f"{where}: category_id {cid!r} is not a whole number")
    elif cid is not None and category_ids is not None and cid not in category_ids:
        found.append(f"{where}: category_id {cid} names no listed category")
    if ann.get("iscrowd", 0) not in (0, 1) or isinstance(ann.get("iscrowd"), bool):
        found.append(f"{where}: iscrowd {ann.get('iscrowd')!r} is not 0 or 1")
    if "area" in ann and not (_finite(ann["area"]) and ann["area"] >= 0):
        found.append(f"{where}: area {ann['area']!r} is not a finite number ≥ 0")
    size = sizes[image_id]
    found += _bbox(where, ann.get("bbox"), size)
    found += _segmentation(where, ann.get("segmentation"), size)
    return found


def _bbox(where: str, box: Any, size: tuple[int, int] | None) -> list[str]:
    if box is None:
        return []
    if not (isinstance(box, list) and len(box) == 4 and all(_finite(v) for v in box)):
        return [f"{where}: bbox {box!r} is not four finite numbers [x, y, width, height]"]
    x, y, w, h = box
    if w < 0 or h < 0:
        return [f"{where}: bbox {box!r} has a negative width or height"]
    if size is not None and (x >= size[0] or y >= size[1] or x + w <= 0 or y + h <= 0) and (w > 0 and h > 0):
        return [f"{where}: bbox {box!r} lies wholly outside its {size[0]}×{size[1]} image"]
    return []


def _segmentation(where: str, segmentation: Any, size: tuple[int, int] | None) -> list[str]:
    if segmentation is None:
        return []
    if isinstance(segmentation, list):
        if not segmentation:
            return [f"{where}: segmentation is an empty list, no polygon (pycocotools cannot rasterise it)"]
        for polygon in segmentation:
            if not (isinstance(polygon, list) and len(polygon) >= 6 and len(polygon) % 2 == 0 and all(_finite(v) for v in polygon)):
                return [f"{where}: segmentation holds {str(polygon)[:40]!r}, not a polygon of 3 or more finite (x, y) points"]
            if size is not None and (max(polygon[0::2]) <= 0 or min(polygon[0::2]) >= size[0] or max(polygon[1::2]) <= 0 or min(polygon[1::2]) >= size[1]):
                return [f"{where}: a polygon of its segmentation lies wholly outside its {size[0]}×{size[1]} image"]
        return []
    if isinstance(segmentation, dict):
        rle_size, counts = segmentation.get("size"), segmentation.get("counts")
        if not (isinstance(rle_size, list) and len(rle_size) == 2 and all(_whole(v) and v >= 0 for v in rle_size)):
            return [f"{where}: segmentation's RLE size {rle_size!r} is not [height, width]"]
        if not (isinstance(counts, str) or (isinstance(counts, list) and all(_whole(v) and v >= 0 for v in counts))):
            return [f"{where}: segmentation's RLE counts are neither a string nor a list of whole numbers"]
        if size is not None and rle_size != [size[1], size[0]]:
            return [f"{where}: its RLE mask is {rle_size} (height, width), its image {size[1]}×{size[0]}"]
        return []
    return [f"{where}: segmentation is of type {type(segmentation).__name__}, not polygons or an RLE"]


def check(dataset: Any, where: str | Path, image_size: Callable[[str], tuple[int, int] | None] | None = None, fix: str = FIX) -> None:
    """Refuse a dataset with any problem (``problems``), in one line: the first, and how many more."""
    found = problems(dataset, image_size)
    if found:
        more = f" ({len(found) - 1} more problems)" if len(found) > 1 else ""
        raise ProbeError(where, f"{found[0]}{more}", fix)


def header_size(folder: Path) -> Callable[[str], tuple[int, int] | None]:
    """``image_size`` for ``check``: an image's (width, height) from its file's header, None when unreadable."""

    def size(name: str) -> tuple[int, int] | None:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(folder / name) as picture:
                return picture.size
        except (OSError, UnidentifiedImageError, ValueError):
            return None

    return size


def result_problems(results: Any, image_size: Callable[[str], tuple[int, int] | None] | None = None) -> list[str]:
    """Every problem of a COCO results file (``probe decode``'s masks: a list of predictions, each
    with a ``file_name``, a ``score``, a ``bbox`` and a ``segmentation``, as the evaluator reads them).
    ``image_size`` (``header_size`` of the panel's images) gives a named image's (width, height): a
    mask of another size would be scored against the image's objects as if it were its own."""
    if not isinstance(results, list):
        return [f"is a JSON {type(results).__name__}, not a list of results"]
    found: list[str] = []
    for n, entry in enumerate(results):
        where = f"result [{n}]"
        if not isinstance(entry, dict):
            found.append(f"{where} is of type {type(entry).__name__}, not an object")
            continue
        if not isinstance(entry.get("file_name"), str) or not entry["file_name"]:
            found.append(f"{where}: file_name {entry.get('file_name')!r} is not an image's name, so it matches no panel image")
        if "score" in entry and not _finite(entry["score"]):
            found.append(f"{where}: score {entry['score']!r} is not a finite number")
        if not _whole(entry.get("category_id")):  # the evaluator indexes every result by it (pycocotools' loadRes)
            found.append(f"{where}: category_id {entry.get('category_id')!r} is {'not a whole number' if 'category_id' in entry else 'absent'}")
        if "mask" in entry and not _whole(entry["mask"]):  # CorLoc and saliency score each image's first mask
            found.append(f"{where}: mask {entry['mask']!r} is not a whole number (the mask's index in its image)")
        if "patch_box" in entry and not (isinstance(entry["patch_box"], list) and len(entry["patch_box"]) == 4 and all(_finite(v) for v in entry["patch_box"])):
            found.append(f"{where}: patch_box {entry['patch_box']!r} is not four finite numbers [x1, y1, x2, y2]")
        if entry.get("bbox") is None:  # the evaluator reads both (segm and bbox AP), masks as RLEs
            found.append(f"{where}: bbox is {'null' if 'bbox' in entry else 'absent'}")
        if not isinstance(entry.get("segmentation"), dict):
            found.append(f"{where}: segmentation is {type(entry.get('segmentation')).__name__}, not an RLE (`probe decode` writes masks as RLEs)")
            continue
        size = image_size(entry["file_name"]) if image_size is not None and isinstance(entry.get("file_name"), str) and entry["file_name"] else None
        found += _bbox(where, entry.get("bbox"), size)
        wrong = _segmentation(where, entry.get("segmentation"), size)
        found += wrong or ([] if size is None else _compressed_rle(where, entry["segmentation"]))
    return found


def _compressed_rle(where: str, segmentation: dict) -> list[str]:
    """The mask is a compressed RLE (pycocotools' ``mask.encode``, as ``probe decode`` writes it) whose
    runs fill its size exactly: decoding it and encoding it again gives the same counts. An
    uncompressed list, or a string whose runs do not add up, would be scored as some other mask.
    Called once the size is known to be the image's (decoding allocates height × width bytes)."""
    counts = segmentation["counts"]
    if not isinstance(counts, str):
        return [f"{where}: segmentation's RLE counts are a list (an uncompressed RLE), not the compressed string pycocotools' mask.encode writes"]
    import numpy as np
    from pycocotools import mask as mask_utils

    try:
        again = mask_utils.encode(np.asfortranarray(mask_utils.decode({"size": segmentation["size"], "counts": counts.encode()})))["counts"].decode()
    except (ValueError, TypeError, UnicodeError):
        again = None
    if again != counts:
        height, width = segmentation["size"]
        return [f"{where}: segmentation's RLE counts {counts[:20]!r} do not describe a {height}×{width} mask (encoding the decoded mask again gives other counts)"]
    return []


def result_mask_problems(where: str, segmentation: dict, height: int, width: int) -> list[str]:
    """A scored mask against its image's size as the panel records it: the size, then the runs."""
    return _segmentation(where, segmentation, (width, height)) or _compressed_rle(where, segmentation)


# ----------------------------------------------------------------------------------------------
# when a panel is added, and when a scorer reads it


def coco_json(raw: bytes, where: Path) -> Any:
    """A COCO file's JSON, or one line (not JSON, not UTF-8, not an object with images and annotations)."""
    try:
        dataset = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProbeError(where, f"is not a COCO annotation file (not JSON: {str(error)[:80]})", "give a file with images, annotations and categories") from None
    if not isinstance(dataset, dict) or not isinstance(dataset.get("images"), list) or not isinstance(dataset.get("annotations"), list):
        raise ProbeError(where, "is not a COCO annotation file (no images/annotations lists)", "give a file with images, annotations and categories")
    return dataset


def checked(panel):
    """A panel's labels checked field by field when it is added (``schema``; SPair's and the
    segmentation kinds' own checks ran in ``kinds.check_layout``): opened inside the readers'
    guard, nothing handed out, so no ledger entry (as SPair's check). The reader checks again."""
    if panel.kind not in ("coco", "coco20k", "voc", "saliency"):
        return panel
    from .guard import inside

    inside.active = True
    try:
        if panel.kind in ("coco", "coco20k"):
            dataset = coco_json(panel.annotations.read_bytes(), panel.annotations)
        else:
            from .kinds import load_dataset

            _, dataset = load_dataset(panel, lambda path: Path(path).read_bytes())
    except OSError as error:
        raise ProbeError(getattr(error, "filename", None) or panel.annotations, f"cannot be read ({error.strerror})", "check the path") from None
    finally:
        inside.active = False
    check(dataset, panel.annotations, header_size(panel.images))
    if panel.kind == "coco20k":
        from .kinds import coco20k_subset

        dataset = coco20k_subset(dataset, panel.annotations)
    files_present(dataset, panel, replace=False)
    return panel


def files_present(dataset: dict, panel, *, replace: bool = True) -> None:
    """Every image the dataset names is a file of the panel's image folder (when it is added and
    when it is read): an image named but absent would be scored as one with no prediction, or a
    store of that folder would hold other photographs than the labels describe."""
    names_present([str(im.get("file_name", "")) for im in dataset["images"]], panel, replace=replace)


def names_present(names: list[str], panel, *, replace: bool = True) -> None:
    """``files_present`` of the images' file names alone."""
    absent = sorted(name for name in names if not (panel.images / name).is_file())
    if absent:
        from ..infra.spelling import fix_command

        again = fix_command("panel add", panel.name, annotations=panel.annotations, images="DIR", role=panel.role, replace=replace)
        raise ProbeError(
            panel.annotations,
            f"names {len(absent)} images that are not in {panel.images} (e.g. {absent[0]!r})",
            f"add the panel again with DIR the folder its file_name entries are relative to: `{again}`",
        )


def covered(panel, matched: int, listed: int, given_count: int, cover: str, given: str) -> None:
    """The one rule of every scorer: predictions (masks, a store's images) that describe none of a
    panel's images are refused, never scored as 0.00; with ``cover="all"`` (no ``--allow-partial``)
    so are those that miss some, whose scores would describe a subset nobody chose."""
    if cover not in ("some", "all"):
        return
    if not matched:
        raise ProbeError(
            panel.name,
            f"has none of its {listed} images among the {given_count} of {given}: the scores would describe no image",
            "score predictions of this panel's images: `probe decode` a store extracted with `probe extract CKPT --panel " + panel.name + "`",
        )
    if cover == "all" and matched < listed:
        raise ProbeError(
            panel.name,
            f"has {matched} of its {listed} images among {given}: the scores would describe only those",
            "decode the panel's every image first, or pass --allow-partial to score the " + str(matched),
        )
