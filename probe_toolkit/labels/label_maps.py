"""Segmentation label maps, read for every layout (VOC 2012, ADE20K): the mask files opened
inside the label guard, decoded, hashed, and the ledger entry written before any map is handed out.

A layout module (``voc_segmentation``, ``ade_segmentation``) says which files a split holds and
how a mask decodes; ``read_masks`` does the rest, the one way segmentation labels leave a panel.

In portions, so memory does not grow with the data set (ADE20K's 20,210 training maps are about
7 GB decoded): a first pass opens every mask, checks it decodes, and keeps only its sha256 and
shape; the ledger entry (one, naming the portion size) is written over those hashes; the maps
are then handed out by ``LabelMaps``, which reads and decodes them again, ``PORTION`` at a time
or one by one, each checked against the hash the entry covers (a file changed since is refused).
Every mask is opened twice; memory holds one portion. What the read keeps per mask is compact
(``FolderFiles``: one folder and a fixed-width unicode array of names; the digests and shapes in
integer arrays): a Python object per mask would be held for the whole run (~0.5 KiB a mask).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError
from ..store.cache import cache_root

PORTION = 256  # maps read and decoded at a time


class FolderFiles(Sequence):
    """Files of one folder: the folder and each file's name (a fixed-width unicode array), each
    ``Path`` made when it is asked (a list of a data set's Path objects costs ~0.3 KiB a file)."""

    def __init__(self, folder: Path, names: Iterable[str]) -> None:
        self.folder, self.names = Path(folder), np.array(list(names), dtype=str)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.folder / str(self.names[i])


class LabelMaps(Sequence):
    """The (H, W) uint8 maps of a read, in the read's order, decoded from their files when asked:
    ``maps[i]`` one map, iteration (``portions``) ``PORTION`` maps at a time. Each file's bytes are
    checked against the sha256 the ledger entry covers; nothing is kept after it is handed out."""

    def __init__(self, files: Sequence[Path], digests: np.ndarray, shapes: np.ndarray, decode: Callable[[bytes, Path], np.ndarray]) -> None:
        self.files, self.digests, self.shapes, self._decode = files, digests, shapes, decode  # (n, 32) uint8 sha256s, (n, 2) (H, W)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._decoded(i, _read([self.files[i]])[0])

    def __iter__(self) -> Iterator[np.ndarray]:
        for portion in self.portions():
            yield from portion

    def portions(self, order: Iterable[int] | None = None, size: int | None = None) -> Iterator[list[np.ndarray]]:
        """The maps at ``order`` (indices; default every map in the read's order), ``size`` (default
        ``PORTION``) at a time."""
        order = list(range(len(self))) if order is None else list(order)
        size = size or PORTION
        for a in range(0, len(order), size):
            chosen = order[a : a + size]
            yield [self._decoded(i, raw) for i, raw in zip(chosen, _read([self.files[i] for i in chosen]))]

    def _decoded(self, i: int, raw: bytes) -> np.ndarray:
        if hashlib.sha256(raw).digest() != self.digests[i].tobytes():
            raise ProbeError(
                self.files[i],
                "changed while its panel was read (its bytes are not those the ledger entry hashed)",
                "rerun the command (and leave the data set's files alone meanwhile)",
            )
        return self._decode(raw, self.files[i])


def _read(files: list[Path]) -> list[bytes]:
    """The bytes of mask files, opened inside the label guard (``guard.inside``)."""
    from .guard import inside

    inside.active = True
    try:
        return [f.read_bytes() for f in files]
    except OSError as error:
        raise ProbeError(getattr(error, "filename", None) or files[0], f"cannot be read ({error.strerror})", "restore the data set's files") from None
    finally:
        inside.active = False


@dataclass
class SegmentationLabels:
    """What a segmentation panel's reader hands out, after its ledger entry."""

    ids: list[str]  # image file names relative to the panel's image folder, in the split's order
    maps: LabelMaps  # (H, W) uint8 class indices as stored (the layout's module says which value is ignored), decoded when asked
    classes: tuple[str, ...]
    entry_id: str
    panel: object  # panels.Panel
    image_map: dict[str, str]  # store id → file name (when store ids were given)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(H, W) of every map, known from the first pass (no map decoded again)."""
        return [(int(h), int(w)) for h, w in self.maps.shapes]


def open_mask(raw: bytes, where: Path, wrong_mode: str, fix: str, release: str) -> np.ndarray:
    """The pixels of one mask PNG, refused naming ``where`` unless it is a palette or grey image
    (``wrong_mode``: what it should be; ``fix``: where the right masks are; ``release``: what to
    restore an unreadable file from)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as image:
            if image.mode not in ("P", "L"):
                raise ProbeError(where, f"is an image of mode {image.mode}, not {wrong_mode}", fix)
            return np.asarray(image).copy()
    except OSError as error:
        raise ProbeError(where, f"is not a readable PNG ({error})", f"restore the file from {release}") from None


def sized_as_images(panel, names: Sequence[str], files: Sequence[Path], shapes: np.ndarray) -> None:
    """Every mask is its image's size (the image's header; the masks' shapes from the read's first
    pass). Every protocol resizes a mask onto its image's view: a mask of another size would be
    stretched there and scored as if it were the image's, so it is refused, for every protocol
    that reads label maps, in this one place."""
    from .schema import header_size

    size = header_size(Path(panel.images))
    wrong = []
    for file, name, shape in zip(files, names, shapes):
        found = size(name)
        if found is not None and (found[1], found[0]) != (int(shape[0]), int(shape[1])):
            wrong.append((file, name, (int(shape[0]), int(shape[1])), found))
    if wrong:
        file, name, (height, width), (image_width, image_height) = wrong[0]
        more = f" (and {len(wrong) - 1} more masks)" if len(wrong) > 1 else ""
        raise ProbeError(file, f"is {width}x{height} px, its image {Path(panel.images) / name} {image_width}x{image_height}{more}", "restore the data set's masks")


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


def read_masks(
    panel,
    names: list[str],
    files: Sequence[Path],
    *,
    listing: tuple[str, bytes],
    decode: Callable[[bytes, Path], np.ndarray],
    classes: tuple[str, ...],
    masks: Path,
    image_map: dict[str, str],
    purpose: str,
    checkpoint: str | None,
    unseal: str | None,
    cache: str | Path | None,
    command: str | None,
) -> SegmentationLabels:
    """Open ``files`` (the masks of ``names``) inside the guard a portion at a time, check each
    decodes (a bad mask is refused before the ledger entry), write the ledger entry (the annotation
    hash covers ``listing``, the split's name and bytes, and every mask's bytes), then hand out the
    maps (``LabelMaps``: decoded again when asked, each checked against the hash)."""
    digest = hashlib.sha256(listing[0].encode() + b"\0" + hashlib.sha256(listing[1]).digest())
    digests, shapes = np.zeros((len(files), 32), np.uint8), np.zeros((len(files), 2), np.int64)
    for a in range(0, len(files), PORTION):
        part = files[a : a + PORTION]
        for i, (f, data) in enumerate(zip(part, _read(part)), start=a):
            shapes[i] = decode(data, f).shape[:2]
            sha = hashlib.sha256(data).digest()
            digests[i] = np.frombuffer(sha, np.uint8)
            digest.update(f.name.encode() + b"\0" + sha)
    sized_as_images(panel, names, files, shapes)  # before the ledger entry: a refused read hands nothing out
    annotation_sha256 = digest.hexdigest()
    store = cache_root(cache)
    from .panels import log_checked_read  # the one place a read's entry is assembled

    entry = log_checked_read(
        store,
        panel,
        panel.images,
        names,
        annotations=str(masks),
        annotation_sha256=annotation_sha256,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
        portions=PORTION,
    )
    return SegmentationLabels(names, LabelMaps(files, digests, shapes, decode), classes, entry.id, panel, image_map)
