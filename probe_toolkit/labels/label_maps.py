"""Segmentation label maps, read once for every layout (VOC 2012, ADE20K): the mask files opened
inside the label guard, decoded, hashed, and the ledger entry written before any map is handed out.

A layout module (``voc_segmentation``, ``ade_segmentation``) says which files a split holds and
how a mask decodes; ``read_masks`` does the rest, the one way segmentation labels leave a panel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..infra import provenance
from ..infra.errors import ProbeError
from ..store.cache import cache_root
from . import hygiene


@dataclass
class SegmentationLabels:
    """What a segmentation panel's reader hands out, after its ledger entry."""

    ids: list[str]  # image file names relative to the panel's image folder, in the split's order
    maps: list[np.ndarray]  # (H, W) uint8 class indices as stored (the layout's module says which value is ignored)
    classes: tuple[str, ...]
    entry_id: str
    panel: object  # panels.Panel
    image_map: dict[str, str]  # store id → file name (when store ids were given)


def open_mask(raw: bytes, where: Path, wrong_mode: str, fix: str, release: str) -> np.ndarray:
    """The pixels of one mask PNG, refused naming ``where`` unless it is a palette or grey image
    (``wrong_mode``: what it should be; ``fix``: where the right masks are; ``release``: what to
    restore an unreadable file from)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as image:
            if image.mode not in ("P", "L"):
                raise ProbeError(where, f"is a {image.mode} image, not {wrong_mode}", fix)
            return np.asarray(image).copy()
    except OSError as error:
        raise ProbeError(where, f"is not a readable PNG ({error})", f"restore the file from {release}") from None


def restrict(names: list[str], images: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """(the split's names that the store ids ``images`` match, in split order; store id → name);
    every name and an empty map when ``images`` is None (``matching.match_images``)."""
    from .matching import match_images

    if images is None:
        return names, {}
    matched = match_images(images, dict(enumerate(names)))
    image_map = {sid: names[n] for sid, n in matched.items()}
    keep = set(image_map.values())
    return [n for n in names if n in keep], image_map


def read_masks(panel, names: list[str], files: list[Path], *, listing: tuple[str, bytes], decode: Callable[[bytes, Path], np.ndarray],
               classes: tuple[str, ...], masks: Path, image_map: dict[str, str], purpose: str, checkpoint: str | None, unseal: str | None,
               cache: str | Path | None, command: str | None) -> SegmentationLabels:
    """Open ``files`` (the masks of ``names``) inside the guard, decode them, write the ledger entry
    (the annotation hash covers ``listing``, the split's name and bytes, and every mask's bytes),
    then return the maps."""
    from .guard import inside

    inside.active = True
    try:
        raw = [f.read_bytes() for f in files]
    except OSError as error:
        raise ProbeError(getattr(error, "filename", None) or masks, f"cannot be read ({error.strerror})", "restore the data set's files") from None
    finally:
        inside.active = False
    maps = [decode(data, f) for f, data in zip(files, raw)]
    digest = hashlib.sha256(listing[0].encode() + b"\0" + hashlib.sha256(listing[1]).digest())
    for f, data in zip(files, raw):
        digest.update(f.name.encode() + b"\0" + hashlib.sha256(data).digest())
    annotation_sha256 = digest.hexdigest()
    store = cache_root(cache)
    hashes, fresh = hygiene.content_hashes(store, panel.images, names)
    hygiene.check_overlap(store, panel.name, panel.role, annotation_sha256, hashes, fresh)
    from .panels import log_read  # the one place a read's ledger entry is assembled

    entry = log_read(store, panel=panel.name, role=panel.role, annotations=str(masks), annotation_sha256=annotation_sha256, names=names,
                     purpose=purpose, command=command, checkpoint=checkpoint, unseal=unseal,
                     images_content_sha256=provenance.list_hash(sorted(hashes)))
    return SegmentationLabels(names, maps, classes, entry.id, panel, image_map)
