"""ADE20K (SceneParsing, ``ADEChallengeData2016``) semantic segmentation panels: label maps read
only through the ledger.

Layout of the release folder::

    images/training/ADE_train_<8 digits>.jpg        images/validation/ADE_val_<8 digits>.jpg
    annotations/training/ADE_train_<8 digits>.png   annotations/validation/ADE_val_<8 digits>.png

A mask is an 8-bit grey PNG at the image's size: 0 "other" (no class of the 150), 1..150 the
classes of ``objectInfo150`` (names as open-mmlab/mmsegmentation ``mmseg/utils/class_names.py``
``ade_classes`` lists them). A split is every image of its folder, sorted (DINOv3's
``dinov3/data/datasets/ade20k.py`` reads the same names from ``ADE20K_object150_<split>.txt``).
Label maps are handed out as stored (0..150); a protocol says how it treats 0: DINOv3's
segmentation evaluation ignores it (``reduce_zero_label``: 0 → 255, c → c − 1), and
open-hummingbird-eval keeps it as a 151st class (``hbird/data/ade20k/ade20k_data.py``).
``check_layout`` (when the panel is added) names the first image without a mask, opening none;
``read_label_maps`` opens the masks, writes the ledger entry, and only then returns them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import numpy as np

from ..infra.errors import ProbeError
from .label_maps import SegmentationLabels, read_masks, restrict

KIND = "ade20k"
SPLITS = ("training", "validation")
OTHER = 0  # the "other" label: no class of the 150
CLASSES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet", "sidewalk", "person", "earth",
    "door", "table", "mountain", "plant", "curtain", "chair", "car", "water", "painting", "sofa", "shelf", "house", "sea", "mirror", "rug",
    "field", "armchair", "seat", "fence", "desk", "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column",
    "signboard", "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path", "stairs",
    "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase", "blind", "coffee table", "toilet",
    "flower", "book", "hill", "bench", "countertop", "stove", "palm", "kitchen island", "computer", "swivel chair", "boat", "bar",
    "arcade machine", "hovel", "bus", "towel", "light", "truck", "tower", "chandelier", "awning", "streetlight", "booth",
    "television receiver", "airplane", "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet",
    "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool", "barrel",
    "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank", "trade name", "microwave", "pot",
    "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce", "vase", "traffic light", "tray",
    "ashcan", "fan", "pier", "crt screen", "plate", "monitor", "bulletin board", "shower", "radiator", "glass", "clock", "flag",
)  # label c (1..150) is CLASSES[c - 1]
FIX_LAYOUT = "pass the ADEChallengeData2016 folder holding images/ and annotations/ (training/ and validation/ in each)"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def image_folder(root: Path, split: str) -> Path:
    return root / "images" / split


def mask_folder(root: Path, split: str) -> Path:
    return root / "annotations" / split


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))


def check_layout(annotations: Path, images: Path | None, split: str) -> tuple[Path, Path]:
    """(the release folder, the split's image folder) of a new panel, resolved; every image checked
    to have a mask file (the first missing one named), no mask opened."""
    root = annotations.resolve()
    split = split or "validation"
    if split not in SPLITS:
        raise ProbeError(None, f"--split {split!r} is not one of {', '.join(SPLITS)}", "pass --split training or validation")
    if images is not None:
        raise ProbeError("--images", "is read from the release folder for an ADE20K panel (images/<split>/)", f"drop --images; {FIX_LAYOUT}")
    pictures, masks = image_folder(root, split), mask_folder(root, split)
    for folder in (pictures, masks):
        if not folder.is_dir():
            raise ProbeError(folder, "is not a folder", FIX_LAYOUT)
    names = _names(pictures)
    if not names:
        raise ProbeError(pictures, "holds no image", FIX_LAYOUT)
    absent = [n for n in names if not (masks / f"{Path(n).stem}.png").is_file()]
    if absent:
        more = f" (and {len(absent) - 1} more of the {len(names)} images)" if len(absent) > 1 else ""
        raise ProbeError(masks / f"{Path(absent[0]).stem}.png", f"is missing, the mask of {pictures / absent[0]}{more}", "restore the release's annotations")
    return root, pictures


def split_images(panel) -> list[str]:
    """The image file names of the panel's split folder, sorted: a list of images, not labels."""
    return _names(image_folder(Path(panel.annotations), panel.split or "validation"))


def decode(raw: bytes, where: Path) -> np.ndarray:
    """(H, W) uint8 labels 0..150 of one mask PNG (grey or palette); other values, or a colour PNG
    (the full ADE20K release's RGB-coded masks), are refused naming ``where``."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as image:
            if image.mode not in ("P", "L"):
                raise ProbeError(where, f"is a {image.mode} image, not a grey mask of labels 0..150",
                                 "use ADEChallengeData2016/annotations (SceneParsing), not the full ADE20K release's colour masks")
            array = np.asarray(image).copy()
    except OSError as error:
        raise ProbeError(where, f"is not a readable PNG ({error})", "restore the file from the release") from None
    if array.size and int(array.max()) > len(CLASSES):
        raise ProbeError(where, f"holds label {int(array.max())}, above the {len(CLASSES)} classes", "use the release's 150-class annotations")
    return array.astype(np.uint8)


def read_label_maps(panel, *, purpose: str, checkpoint: str | None = None, images: Sequence[str] | None = None,
                    unseal: str | None = None, cache: str | Path | None = None, command: str | None = None) -> SegmentationLabels:
    """Open an ADE20K panel's masks, write the ledger entry, then return the label maps (0..150, as stored).

    ``images`` (store ids) restricts what is read and handed out to the split's images they match;
    a sealed (``test``) panel needs ``unseal``, recorded.
    """
    from . import panels

    panel = panels.check_readable(panel, unseal, cache)
    if panel.kind != KIND:
        raise ProbeError(panel.name, f"is a {panel.kind} panel, not an {KIND} one", f"register the ADEChallengeData2016 folder with kind {KIND}")
    if not purpose:
        raise ProbeError(None, "a read of labels needs a purpose", "pass purpose='score' (or sweep, probe...)")
    root, split = Path(panel.annotations), panel.split or "validation"
    every = _names(image_folder(root, split))
    names, image_map = restrict(every, images)
    masks = mask_folder(root, split)
    files = [masks / f"{Path(n).stem}.png" for n in names]
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise ProbeError(absent[0], f"is missing ({len(absent)} of the {len(files)} masks)", "restore the release's annotations")
    return read_masks(panel, names, files, listing=(f"images/{split}", "\n".join(every).encode()), decode=decode, classes=CLASSES, masks=masks,
                      image_map=image_map, purpose=purpose, checkpoint=checkpoint, unseal=unseal, cache=cache, command=command)
