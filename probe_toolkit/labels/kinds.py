"""Panels that are not one COCO file: Pascal VOC devkits, COCO20k and saliency mask folders.

Each kind becomes the same in-memory COCO dataset ``panels.read_labels`` hands out, so scoring,
image matching and the ledger do not change:

- ``voc``: ``<DIR>/Annotations/<id>.xml`` for every id of ``<DIR>/ImageSets/Main/<split>.txt``,
  images in ``<DIR>/JPEGImages`` (``labels/voc.py``: LOST's box convention, ``no_hard``).
- ``coco20k``: a COCO-2014 train annotation file (read and parsed as any COCO panel) restricted to the 19,817 images of LOST and
  TokenCut (``data/coco20k_filenames.txt``, byte-identical to their ``coco_20k_filenames.txt``;
  selected by the image id in each file name, as their ``select_coco_20k``), crowd boxes removed
  (their ``extract_gt_COCO(remove_iscrowd=True)``). Images of the list missing from the file are
  counted, not invented: ``coco20k_found`` says how many of 19,817 a panel holds.
- ``saliency``: an image folder and a folder of masks named like the images (``x.jpg`` →
  ``x.png``), one annotation per image whose segmentation is the mask (RLE), foreground every grey
  above 0 as TokenCut scores it; ``saliency_grey`` counts the masks and pixels strictly between 0
  and 255 that this rule decided.
- ``voc-segmentation``, ``ade20k``: a VOC2012 or ADEChallengeData2016 folder's class masks
  (layouts in ``labels/voc_layout.py``, ``labels/ade_layout.py``); their labels are label maps, not
  a COCO dataset, so they are read by ``voc_segmentation`` / ``ade_segmentation.read_label_maps``
  (``labels/label_maps.py``: same ledger entry and seal), never by ``read_labels``.
- ``spair``: a SPair-71k folder's keypoint pairs of one split (``labels/spair.py``), checked field
  by field when added and read by ``spair_read.read_pairs`` (same ledger entry and seal).
- ``nyu``: an NYU Depth v2 folder's depth maps of one split (``labels/nyu.py``), checked field by
  field when added and read by ``nyu.read_depth_maps`` (same ledger entry and seal).
- ``navi``: a NAVI folder's wild-set images, poses and depth maps (``labels/navi.py``), checked field
  by field when added and read by ``navi_read.read_navi`` (same ledger entry and seal).

Label files are opened only through the reader ``read_labels`` passes to ``load_dataset`` (under its guard).
The annotation hash of a multi-file kind is the sha256 of ``name NUL sha256(bytes)`` per file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from . import ade_layout, navi, nyu, saliency, spair, voc, voc_layout

COCO20K_SIZE = 19817
Reader = Callable[[Path], bytes]


def _voc_paths(root: Path, split: str) -> tuple[Path, Path, Path]:
    return root / "Annotations", root / "JPEGImages", root / "ImageSets" / "Main" / f"{split}.txt"


def check_layout(kind: str, annotations: Path, images: Path | None, split: str) -> tuple[Path, Path]:
    """(annotations, images) of a new panel of ``kind``, resolved; its folders checked, no label opened."""
    if kind == "voc":
        root = annotations.resolve()
        notes, jpegs, split_file = _voc_paths(root, split or "trainval")
        if not notes.is_dir():
            raise ProbeError(
                root,
                "has no Annotations/ folder, so it is not a VOC devkit year folder",
                "pass --voc VOCdevkit/VOC2007 (the folder holding Annotations/ and JPEGImages/)",
            )
        if not split_file.is_file():
            raise ProbeError(split_file, "does not exist", "pass --split trainval, train, val or test (a file of ImageSets/Main/)")
        return root, (images.resolve() if images else jpegs)
    if kind == "saliency":
        if images is None:
            raise ProbeError(None, "a saliency panel needs --images (the photographs) besides --masks", "pass --images DIR --masks DIR")
        if not annotations.is_dir():
            raise ProbeError(annotations, "is not a folder of masks", "pass --masks with the ground-truth mask folder")
        return annotations.resolve(), images.resolve()
    if kind == "coco20k":
        if not annotations.is_file():
            raise ProbeError(annotations, "is not a file", "pass --annotations instances_train2014.json")
        if images is None:
            raise ProbeError(None, "a COCO20k panel needs --images (the train2014 folder)", "pass --images train2014/")
        return annotations.resolve(), images.resolve()
    if kind == voc_layout.KIND:
        return voc_layout.check_layout(annotations, images, split)
    if kind == ade_layout.KIND:
        return ade_layout.check_layout(annotations, images, split)
    if kind == spair.KIND:
        return spair.check_layout(annotations, images, split)
    if kind == nyu.KIND:
        return nyu.check_layout(annotations, images, split)
    if kind == navi.KIND:
        return navi.check_layout(annotations, images, split)
    raise ProbeError(
        None,
        f"panel kind {kind!r} is not one of coco, voc, coco20k, saliency, {voc_layout.KIND}, {ade_layout.KIND}, {spair.KIND}, {nyu.KIND}, {navi.KIND}",
        "use --voc, --coco20k, --masks, --voc-segmentation, --ade20k, --spair, --nyu or --navi",
    )


def coco20k_ids() -> list[int]:
    """The image ids of LOST's and TokenCut's COCO20k list, in its order."""
    text = resources.files(__package__).joinpath("data/coco20k_filenames.txt").read_text()
    return [int(line.strip().rsplit("_", 1)[-1].split(".")[0]) for line in text.splitlines() if line.strip()]


def _digest(parts: list[tuple[str, bytes]]) -> bytes:
    return b"".join(name.encode() + b"\0" + hashlib.sha256(data).digest() for name, data in parts)


def _voc(panel, read: Reader) -> tuple[bytes, dict[str, Any]]:
    notes, _, split_file = _voc_paths(panel.annotations, panel.split or "trainval")
    if not notes.is_dir():
        raise ProbeError(panel.annotations, "has no Annotations/ folder", "point the panel at a VOC devkit year folder (`probe panel add --replace`)")
    split_raw = read(split_file)
    parts, records = [(split_file.name, split_raw)], []
    for image_id in voc.split_ids(split_raw):
        path = notes / f"{image_id}.xml"
        if not path.is_file():
            raise ProbeError(path, f"is missing (listed in {split_file.name})", "use the devkit's own ImageSets/Main split")
        raw = read(path)
        parts.append((path.name, raw))
        size, objects = voc.parse(raw, path)
        records.append((f"{image_id}.jpg", size, objects))
    return _digest(parts), voc.coco_dataset(records, no_hard=panel.no_hard)


def coco20k_subset(dataset: dict[str, Any], where: Path) -> dict[str, Any]:
    """A COCO-2014 train dataset restricted to the COCO20k images, crowd annotations removed."""
    keep = set(coco20k_ids())
    images = [im for im in dataset["images"] if int(im["id"]) in keep]
    if not images:
        raise ProbeError(where, "holds none of the 19,817 COCO20k images", "pass COCO-2014 train annotations (instances_train2014.json)")
    found = {int(im["id"]) for im in images}
    anns = [a for a in dataset["annotations"] if int(a["image_id"]) in found and a.get("iscrowd", 0) != 1]
    return {"images": images, "annotations": anns, "categories": dataset.get("categories", []), "coco20k_found": len(found)}


def _saliency(panel, read: Reader) -> tuple[bytes, dict[str, Any]]:
    from PIL import Image
    from pycocotools import mask as mask_utils

    from ..store.images import list_images
    from .masks import encode

    images, annotations, parts, grey = [], [], [], [0, 0]
    for n, ref in enumerate(list_images(panel.images), start=1):
        path = saliency.mask_for(Path(ref.id), panel.annotations)
        if path is None:
            raise ProbeError(
                panel.annotations,
                f"has no mask for image {ref.id!r} (looked for {Path(ref.id).with_suffix('.png')})",
                "give every image a mask of the same name (x.jpg → x.png)",
            )
        with Image.open(ref.path) as im:
            size = im.size
        raw = read(path)
        parts.append((str(path.relative_to(panel.annotations)), raw))
        mask, in_between = saliency.read_mask(raw, path, size)
        grey = [grey[0] + bool(in_between), grey[1] + in_between]
        rle = encode(mask)
        images.append({"id": n, "file_name": ref.id, "height": size[1], "width": size[0]})
        annotations.append(
            {"id": n, "image_id": n, "category_id": 1, "segmentation": rle, "area": float(mask.sum()), "bbox": [float(v) for v in mask_utils.toBbox(rle)], "iscrowd": 0}
        )
    return _digest(parts), {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 1, "name": "salient"}],
        "saliency_grey": {"masks": grey[0], "pixels": grey[1]},
    }


def load_dataset(panel, read: Reader) -> tuple[bytes, dict[str, Any]]:
    """(bytes to hash, COCO dataset) of a panel whose kind is not plain COCO; ``read`` (path → bytes)
    is ``read_labels``' reader, the one way label files are opened."""
    loaders = {"voc": _voc, "saliency": _saliency}
    if panel.kind in (voc_layout.KIND, ade_layout.KIND):
        raise ProbeError(
            panel.name,
            "is a segmentation panel: its labels are label maps, not boxes or instance masks",
            f"read it with labels.{'voc' if panel.kind == voc_layout.KIND else 'ade'}_segmentation.read_label_maps (probe hummingbird)",
        )
    if panel.kind == spair.KIND:
        raise ProbeError(
            panel.name,
            "is a SPair-71k panel: its labels are keypoint pairs, not boxes or instance masks",
            "score it with probe correspond (labels.spair_read.read_pairs)",
        )
    if panel.kind == nyu.KIND:
        raise ProbeError(panel.name, "is an NYU panel: its labels are depth maps, not boxes or instance masks", "score it with probe depth (labels.nyu.read_depth_maps)")
    if panel.kind == navi.KIND:
        raise ProbeError(
            panel.name,
            "is a NAVI panel: its labels are camera poses and depth maps, not boxes or instance masks",
            "score it with probe correspond (labels.navi_read.read_navi)",
        )
    if panel.kind not in loaders:
        raise ProbeError(panel.name, f"has an unknown kind {panel.kind!r}", "re-add it with `probe panel add --replace`")
    return loaders[panel.kind](panel, read)


def benchmark(panel) -> str:
    """The published benchmark a panel is, read from its kind and folder names ("" when unknown)."""
    text = f"{panel.annotations} {panel.images}".upper().replace("_", "-")
    if panel.kind == "voc":
        return "VOC07" if "2007" in text else "VOC12" if "2012" in text else ""
    if panel.kind == voc_layout.KIND:
        return "VOC12-seg" if "2012" in text else ""
    if panel.kind == ade_layout.KIND:
        return "ADE20K"
    if panel.kind == "coco20k":
        return "COCO20k"
    if panel.kind == spair.KIND:
        return f"SPair-71k {panel.split or 'test'}"
    if panel.kind == nyu.KIND:
        return f"NYUv2 {panel.split or 'test'}"
    if panel.kind == navi.KIND:
        return "NAVI wild set"
    if panel.kind == "saliency":
        return next((name for name in ("ECSSD", "DUTS-TE", "DUT-OMRON") if name in text), "")
    return ""
