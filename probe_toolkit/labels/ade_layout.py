"""The ADE20K SceneParsing release's layout (``ADEChallengeData2016``; ``labels/ade_segmentation.py``
reads its label maps through the ledger): where a split's images and masks are, its classes, and
the check made when a panel is added, which names the first image without a mask, opening none.

    images/training/ADE_train_<8 digits>.jpg        images/validation/ADE_val_<8 digits>.jpg
    annotations/training/ADE_train_<8 digits>.png   annotations/validation/ADE_val_<8 digits>.png

Class names as open-mmlab/mmsegmentation ``mmseg/utils/class_names.py`` ``ade_classes`` lists them.
"""

from __future__ import annotations

from pathlib import Path

from ..infra.errors import ProbeError

KIND = "ade20k"
SPLITS = ("training", "validation")
OTHER = 0  # the "other" label: no class of the 150
CLASSES = (
    "wall",
    "building",
    "sky",
    "floor",
    "tree",
    "ceiling",
    "road",
    "bed",
    "windowpane",
    "grass",
    "cabinet",
    "sidewalk",
    "person",
    "earth",
    "door",
    "table",
    "mountain",
    "plant",
    "curtain",
    "chair",
    "car",
    "water",
    "painting",
    "sofa",
    "shelf",
    "house",
    "sea",
    "mirror",
    "rug",
    "field",
    "armchair",
    "seat",
    "fence",
    "desk",
    "rock",
    "wardrobe",
    "lamp",
    "bathtub",
    "railing",
    "cushion",
    "base",
    "box",
    "column",
    "signboard",
    "chest of drawers",
    "counter",
    "sand",
    "sink",
    "skyscraper",
    "fireplace",
    "refrigerator",
    "grandstand",
    "path",
    "stairs",
    "runway",
    "case",
    "pool table",
    "pillow",
    "screen door",
    "stairway",
    "river",
    "bridge",
    "bookcase",
    "blind",
    "coffee table",
    "toilet",
    "flower",
    "book",
    "hill",
    "bench",
    "countertop",
    "stove",
    "palm",
    "kitchen island",
    "computer",
    "swivel chair",
    "boat",
    "bar",
    "arcade machine",
    "hovel",
    "bus",
    "towel",
    "light",
    "truck",
    "tower",
    "chandelier",
    "awning",
    "streetlight",
    "booth",
    "television receiver",
    "airplane",
    "dirt track",
    "apparel",
    "pole",
    "land",
    "bannister",
    "escalator",
    "ottoman",
    "bottle",
    "buffet",
    "poster",
    "stage",
    "van",
    "ship",
    "fountain",
    "conveyer belt",
    "canopy",
    "washer",
    "plaything",
    "swimming pool",
    "stool",
    "barrel",
    "basket",
    "waterfall",
    "tent",
    "bag",
    "minibike",
    "cradle",
    "oven",
    "ball",
    "food",
    "step",
    "tank",
    "trade name",
    "microwave",
    "pot",
    "animal",
    "bicycle",
    "lake",
    "dishwasher",
    "screen",
    "blanket",
    "sculpture",
    "hood",
    "sconce",
    "vase",
    "traffic light",
    "tray",
    "ashcan",
    "fan",
    "pier",
    "crt screen",
    "plate",
    "monitor",
    "bulletin board",
    "shower",
    "radiator",
    "glass",
    "clock",
    "flag",
)  # label c (1..150) is CLASSES[c - 1]
FIX_LAYOUT = "pass the ADEChallengeData2016 folder holding images/ and annotations/ (training/ and validation/ in each)"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def image_folder(root: Path, split: str) -> Path:
    return root / "images" / split


def mask_folder(root: Path, split: str) -> Path:
    return root / "annotations" / split


def names_in(folder: Path) -> list[str]:
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
    names = names_in(pictures)
    if not names:
        raise ProbeError(pictures, "holds no image", FIX_LAYOUT)
    absent = [n for n in names if not (masks / f"{Path(n).stem}.png").is_file()]
    if absent:
        more = f" (and {len(absent) - 1} more of the {len(names)} images)" if len(absent) > 1 else ""
        raise ProbeError(masks / f"{Path(absent[0]).stem}.png", f"is missing, the mask of {pictures / absent[0]}{more}", "restore the release's annotations")
    return root, pictures


def split_images(panel) -> list[str]:
    """The image file names of the panel's split folder, sorted: a list of images, not labels."""
    return names_in(image_folder(Path(panel.annotations), panel.split or "validation"))
