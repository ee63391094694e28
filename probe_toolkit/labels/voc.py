"""Pascal VOC detection annotations as an in-memory COCO dataset, the way LOST and TokenCut read them.

VOC ships ``Annotations/<id>.xml`` (one ``<annotation>`` per image: ``<size>``, and per object
``<name>``, ``<difficult>``, ``<truncated>``, ``<bndbox>`` with 1-based inclusive pixel corners),
``JPEGImages/<id>.jpg`` and ``ImageSets/Main/<split>.txt``. LOST's ``extract_gt_VOC`` (copied by
TokenCut) turns a box into [xmin − 1, ymin − 1, xmax, ymax], continuous 0-based coordinates in
which (xmin = 1, xmax = W) spans the whole image; the COCO box here is that box as
[x, y, w, h], so ``scoring.gt_boxes`` gives back exactly LOST's integers.

Hard objects (``difficult`` or ``truncated`` = 1) are kept by default, as LOST and TokenCut do.
``no_hard`` (their ``--no_hard``) drops those boxes and every image left without a box. Pure:
the caller (``panels.read_labels``) reads the bytes and writes the ledger.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError


@dataclass(frozen=True)
class VocObject:
    name: str
    box: tuple[int, int, int, int]  # xmin − 1, ymin − 1, xmax, ymax (LOST's convention)
    difficult: bool
    truncated: bool

    @property
    def hard(self) -> bool:
        return self.difficult or self.truncated


def _int(node: ET.Element, tag: str, where: Path) -> int:
    text = node.findtext(tag)
    try:
        return int(float(text))  # a few VOC12 files write 273.5-style corners; LOST's int() would fail on them
    except (TypeError, ValueError):
        raise ProbeError(where, f"is not a VOC annotation: <{tag}> is {text!r}, not a number", "pass the Annotations/ folder of a VOC devkit") from None


def _flag(node: ET.Element, tag: str) -> bool:
    return (node.findtext(tag) or "0").strip() == "1"


def parse(raw: bytes, where: Path) -> tuple[tuple[int, int], list[VocObject]]:
    """((height, width), objects) of one VOC XML file; anything else is refused naming ``where``."""
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as error:
        raise ProbeError(where, f"is not XML ({error})", "pass the Annotations/ folder of a VOC devkit") from None
    if root.tag != "annotation":
        raise ProbeError(where, f"is not a VOC annotation (root <{root.tag}>, not <annotation>)", "pass the Annotations/ folder of a VOC devkit")
    size = root.find("size")
    if size is None:
        raise ProbeError(where, "is not a VOC annotation (no <size>)", "pass the Annotations/ folder of a VOC devkit")
    height, width = _int(size, "height", where), _int(size, "width", where)
    objects = []
    for obj in root.findall("object"):
        box = obj.find("bndbox")
        if box is None or not obj.findtext("name"):
            raise ProbeError(where, "is not a VOC annotation (an <object> without <name> or <bndbox>)", "pass the Annotations/ folder of a VOC devkit")
        x1, y1, x2, y2 = (_int(box, t, where) for t in ("xmin", "ymin", "xmax", "ymax"))
        if not (1 <= x1 <= x2 and 1 <= y1 <= y2):
            raise ProbeError(where, f"has a box with corners ({x1}, {y1}, {x2}, {y2}) that are not 1-based and ordered", "fix the file")
        if x2 > width or y2 > height:
            raise ProbeError(where, f"has a box with corners ({x1}, {y1}, {x2}, {y2}) outside its {width}×{height} <size>", "fix the file")
        objects.append(VocObject(str(obj.findtext("name")).strip(), (x1 - 1, y1 - 1, x2, y2), _flag(obj, "difficult"), _flag(obj, "truncated")))
    return (height, width), objects


def split_ids(raw: bytes) -> list[str]:
    """Image ids of an ``ImageSets/Main/<split>.txt`` file, in its order."""
    return [line.split()[0] for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]


def coco_dataset(records: list[tuple[str, tuple[int, int], list[VocObject]]], *, no_hard: bool) -> dict[str, Any]:
    """COCO dataset of (file name, (height, width), objects) records; ids follow the split's order."""
    categories: dict[str, int] = {}
    images, annotations = [], []
    for image_id, (file_name, (height, width), objects) in enumerate(records, start=1):
        kept = [o for o in objects if not (no_hard and o.hard)]
        if not kept and no_hard:
            continue  # LOST/TokenCut --no_hard: an image whose objects are all hard is not evaluated
        images.append({"id": image_id, "file_name": file_name, "height": height, "width": width})
        for o in kept:
            x1, y1, x2, y2 = o.box
            category = categories.setdefault(o.name, len(categories) + 1)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": float((x2 - x1) * (y2 - y1)),
                    "iscrowd": 0,
                    "difficult": int(o.difficult),
                    "truncated": int(o.truncated),
                }
            )
    return {"images": images, "annotations": annotations, "categories": [{"id": i, "name": n} for n, i in categories.items()]}
