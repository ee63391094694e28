"""The Pascal VOC 2012 segmentation devkit's layout (``labels/voc_segmentation.py`` reads its
label maps through the ledger): which folder holds a split's masks, its split file, its classes,
and the check made when a panel is added, which names the first missing image or mask without
opening a mask."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..infra.errors import ProbeError

KIND = "voc-segmentation"
SPLITS = ("train", "val", "trainaug")
CLASSES = (
    "background",
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
IGNORE = 255  # VOC's boundary band
FIX_LAYOUT = "pass the VOC2012 folder holding JPEGImages/, SegmentationClass/ and ImageSets/Segmentation/"


def mask_folder(root: Path, split: str) -> Path:
    """Where a split's masks are: SegmentationClassAug for trainaug, SegmentationClass otherwise."""
    return root / ("SegmentationClassAug" if split == "trainaug" else "SegmentationClass")


def split_file(root: Path, split: str) -> Path:
    return root / "ImageSets" / "Segmentation" / f"{split}.txt"


def split_ids(raw: bytes) -> list[str]:
    """Image ids of an ``ImageSets/Segmentation/<split>.txt`` file, in its order."""
    return [line.split()[0] for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]


def split_images(panel) -> list[str]:
    """The image file names (``<id>.jpg``) a panel's split file lists, in its order: a list of
    images, not labels (read without a ledger entry, as when the panel was added)."""
    listing = split_file(Path(panel.annotations), panel.split or "val")
    try:
        return [f"{i}.jpg" for i in split_ids(listing.read_bytes())]
    except OSError as error:
        raise ProbeError(listing, f"cannot be read ({error.strerror})", "restore the devkit's ImageSets/Segmentation") from None


def missing_files(paths: Sequence[Path], listing: Path) -> None:
    """The first of ``paths`` that is not a file, named (one Path at a time: ``paths`` may make them when asked)."""
    absent = [p for p in paths if not p.is_file()]
    if absent:
        more = f" (and {len(absent) - 1} more of the {len(paths)} files it lists)" if len(absent) > 1 else ""
        raise ProbeError(absent[0], f"is missing, listed in {listing}{more}", "restore the devkit's files, or use the split file that matches them")


def check_layout(annotations: Path, images: Path | None, split: str) -> tuple[Path, Path]:
    """(the year folder, the image folder) of a new panel, resolved; the split file, its images
    and its masks checked to exist (the first missing one named), no mask opened."""
    root = annotations.resolve()
    split = split or "val"
    if split not in SPLITS:
        raise ProbeError(None, f"--split {split!r} is not one of {', '.join(SPLITS)}", "pass --split train, val or trainaug")
    if not root.is_dir():
        raise ProbeError(root, "is not a folder", FIX_LAYOUT)
    listing = split_file(root, split)
    if not listing.is_file():
        raise ProbeError(listing, "does not exist", f"{FIX_LAYOUT} (trainaug.txt comes with the SBD-augmented masks)")
    masks = mask_folder(root, split)
    if not masks.is_dir():
        raise ProbeError(masks, "is not a folder", FIX_LAYOUT if split != "trainaug" else "put the SBD-augmented masks in SegmentationClassAug/")
    jpegs = images.resolve() if images else root / "JPEGImages"
    ids = split_ids(listing.read_bytes())  # a list of image ids, not labels
    if not ids:
        raise ProbeError(listing, "lists no image", "list one image id a line")
    missing_files([jpegs / f"{i}.jpg" for i in ids], listing)
    missing_files([masks / f"{i}.png" for i in ids], listing)
    return root, jpegs
