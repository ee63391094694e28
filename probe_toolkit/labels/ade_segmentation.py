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
``check_layout`` (``labels/ade_layout.py``, when the panel is added) names the first image without
a mask, opening none; ``read_label_maps`` opens the masks, writes the ledger entry, and only then
returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError
from .ade_layout import CLASSES, KIND, OTHER, SPLITS, check_layout, image_folder, mask_folder, names_in, split_images  # noqa: F401
from .label_maps import FolderFiles, SegmentationLabels, open_mask, read_masks, restrict


def decode(raw: bytes, where: Path) -> np.ndarray:
    """(H, W) uint8 labels 0..150 of one mask PNG (grey or palette); other values, or a colour PNG
    (the full ADE20K release's RGB-coded masks), are refused naming ``where``."""
    array = open_mask(
        raw, where, "a grey mask of labels 0..150", "use ADEChallengeData2016/annotations (SceneParsing), not the full ADE20K release's colour masks", "the release"
    )
    if array.size and int(array.max()) > len(CLASSES):
        raise ProbeError(where, f"holds label {int(array.max())}, above the {len(CLASSES)} classes", "use the release's 150-class annotations")
    return array.astype(np.uint8)


def read_label_maps(
    panel,
    *,
    purpose: str,
    checkpoint: str | None = None,
    images: Sequence[str] | None = None,
    unseal: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
) -> SegmentationLabels:
    """Open an ADE20K panel's masks, write the ledger entry, then return the label maps (0..150, as stored).

    ``images`` (store ids) restricts what is read and handed out to the split's images they match;
    a sealed (``test``) panel needs ``unseal``, recorded.
    """
    from . import panels

    panel = panels.open_for_reading(panel, KIND, purpose=purpose, unseal=unseal, cache=cache, register=f"register the ADEChallengeData2016 folder with kind {KIND}")
    root, split = Path(panel.annotations), panel.split or "validation"
    every = names_in(image_folder(root, split))
    names, image_map = restrict(every, images)
    masks = mask_folder(root, split)
    files = FolderFiles(masks, (f"{Path(n).stem}.png" for n in names))
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise ProbeError(absent[0], f"is missing ({len(absent)} of the {len(files)} masks)", "restore the release's annotations")
    return read_masks(
        panel,
        names,
        files,
        listing=(f"images/{split}", "\n".join(every).encode()),
        decode=decode,
        classes=CLASSES,
        masks=masks,
        image_map=image_map,
        purpose=purpose,
        checkpoint=checkpoint,
        unseal=unseal,
        cache=cache,
        command=command,
    )
