"""Pascal VOC 2012 semantic segmentation panels: class label maps, read only through the ledger.

Layout of a VOC2012 devkit year folder (the ``VOCdevkit/VOC2012`` of the release)::

    JPEGImages/<id>.jpg
    SegmentationClass/<id>.png                  palette PNG: 0 background, 1..20 the classes,
                                                255 the boundary / "void" band (ignored in scores)
    SegmentationClassAug/<id>.png               trainaug only: the SBD-augmented masks
                                                (8-bit grey PNGs, same values)
    ImageSets/Segmentation/{train,val,trainaug}.txt   one id a line

``trainaug`` (10,582 images) is the list open-hummingbird-eval builds its VOC memory from
(``file_sets/voc/full/trainaug.txt``); it reads those masks from ``SegmentationClassAug``
(``hbird/data/voc/voc_data.py``: trainaug and train from SegmentationClassAug, val from
SegmentationClass). Here ``train`` and ``val`` read ``SegmentationClass`` (the release's own
masks, where every train id has one) and ``trainaug`` reads ``SegmentationClassAug``.

A label map is handed out as the PNG's indices (mode P or L), uint8, at the image's size; any
value outside 0..20 and 255 is refused naming the file. ``check_layout`` (when the panel is
added) names the first missing image or mask and how many are missing, without opening a mask;
``read_label_maps`` opens the masks, writes the ledger entry, and only then returns them.
The devkit's layout and ``check_layout`` are ``labels/voc_layout.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError
from .label_maps import FolderFiles, SegmentationLabels, open_mask, read_masks, restrict  # noqa: F401  (SegmentationLabels: this reader's answer)
from .voc_layout import CLASSES, IGNORE, KIND, mask_folder, missing_files, split_file, split_ids  # noqa: F401


def decode(raw: bytes, where: Path, n_classes: int = len(CLASSES)) -> np.ndarray:
    """(H, W) uint8 class indices of one mask PNG (palette or grey); other values than 0..20
    and 255, or a colour PNG, are refused naming ``where``."""
    array = open_mask(
        raw, where, "a palette or grey mask of class indices", "use SegmentationClass/ (palette PNGs), not SegmentationObject or a colour rendering", "the devkit"
    )
    bad = np.setdiff1d(np.unique(array), np.r_[np.arange(n_classes), IGNORE])
    if bad.size:
        raise ProbeError(where, f"holds values {bad[:5].tolist()} outside 0..{n_classes - 1} and {IGNORE}", "use the devkit's class masks")
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
    """Open a segmentation panel's masks, write the ledger entry, then return the label maps.

    ``images`` (store ids) restricts what is read and handed out to the split's images they
    match (``matching.match_images``); a sealed (``test``) panel needs ``unseal``, recorded.
    """
    from . import panels

    panel = panels.open_for_reading(panel, KIND, purpose=purpose, unseal=unseal, cache=cache, register=f"register the VOC2012 folder with kind {KIND}")
    root, split = panel.annotations, panel.split or "val"
    listing, masks = split_file(root, split), mask_folder(root, split)
    try:
        listing_raw = listing.read_bytes()
    except OSError as error:
        raise ProbeError(listing, f"cannot be read ({error.strerror})", "restore the devkit's files") from None
    names, image_map = restrict([f"{i}.jpg" for i in split_ids(listing_raw)], images)
    files = FolderFiles(masks, (f"{Path(n).stem}.png" for n in names))
    missing_files(files, listing)
    return read_masks(
        panel,
        names,
        files,
        listing=(listing.name, listing_raw),
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
