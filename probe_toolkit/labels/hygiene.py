"""Label hygiene, checked by ``panels.read_labels`` before any label leaves it.

- Every field of the dataset is checked first (``schema``: types, ranges, ids that resolve).
- An image whose recorded ``width``/``height`` disagree with its file is refused (scores would
  be computed on the wrong geometry).
- Boxes and polygons reaching outside their image are clipped to it; how many is recorded in
  the ledger entry and shown.
- The same image (by content, so copies under other names count) in panels of two roles is
  refused, naming both panels and an image: a probe fitted on its train panel would be scored
  on its own training images. ``panel-images.json`` in the cache root remembers the content
  hashes of every panel's images read so far, by panel and role. Class-folder panels (k-NN,
  linear) are held to the same rule as COCO panels.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..infra.atomic import write_json
from ..infra.errors import ProbeError
from ..infra.provenance import file_sha256
from . import hash_files, hash_memo, index_write, json_members
from .hash_files import ContentHashes
from .hash_memo import Fresh

INDEX = "panel-images.json"
MEMO = "panel-hashes.json"


def _file_size(path: Path) -> tuple[tuple[int, int] | None, str | None]:
    """(width, height) as stored, which annotations must match (images are read as stored, as the
    peers' loaders read them), from the file's header alone; or a problem."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as picture:
            return picture.size, None
    except (OSError, UnidentifiedImageError) as error:
        return None, f"cannot be read ({error})"


def _rotated(path: Path) -> bool:
    """Whether the file's EXIF orientation shows it turned by 90°. Asked only of a file whose size
    disagrees with its annotation: a PNG's EXIF may follow its pixels, so Pillow decodes the whole
    image to find it (every PNG of a panel, on every label read, when this was asked of all)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as picture:
            return picture.getexif().get(0x0112, 1) in (5, 6, 7, 8)
    except (OSError, UnidentifiedImageError):
        return False


def check_sizes(annotations_path: Path, folder: Path, images: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Refuse an image whose recorded width/height disagree with its file; return id → (width, height)."""
    out = {}
    for im in images:
        path = folder / str(im.get("file_name", ""))
        actual, problem = _file_size(path)
        if problem:
            raise ProbeError(path, problem, "replace the file or drop it from the panel")
        recorded = (im.get("width"), im.get("height"))
        if None not in recorded and (int(recorded[0]), int(recorded[1])) != actual:
            if (int(recorded[1]), int(recorded[0])) == actual and _rotated(path):
                raise ProbeError(
                    annotations_path,
                    f"records {im.get('file_name')!r} as {recorded[0]}×{recorded[1]}, as its EXIF orientation shows it; "
                    f"the file stores {actual[0]}×{actual[1]} pixels, which probe reads as stored (as DINO's, LOST's and TokenCut's loaders do)",
                    "annotate the stored pixels, or rotate the files themselves first (e.g. exiftran -ai) and re-add the panel",
                )
            raise ProbeError(
                annotations_path,
                f"records {im.get('file_name')!r} as {recorded[0]}×{recorded[1]}, but the file is {actual[0]}×{actual[1]}",
                "fix width/height in the annotation file, or point the panel at the images it was made for",
            )
        out[int(im["id"])] = (int(recorded[0]), int(recorded[1])) if None not in recorded else actual
    return out


def _clip_box(box: list[float], width: int, height: int) -> list[float]:
    x, y, w, h = (float(v) for v in box)
    x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
    x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
    return [x0, y0, x1 - x0, y1 - y0]


def clip_geometry(annotations: list[dict[str, Any]], sizes: dict[int, tuple[int, int]]) -> tuple[list[dict[str, Any]], int]:
    """Boxes and polygons clipped to their image; returns the annotations and how many changed."""
    out, clipped = [], 0
    for ann in annotations:
        size = sizes.get(int(ann["image_id"]))
        changed = ann if size is None else clipped_to(ann, *size)
        clipped += changed is not ann and moved(ann, changed)
        out.append(changed)
    return out, clipped


def moved(ann: dict[str, Any], changed: dict[str, Any]) -> bool:
    """Whether clipping (``clipped_to``) changed the annotation's box or polygons."""
    return changed.get("bbox") != ann.get("bbox") or changed.get("segmentation") != ann.get("segmentation")


def clipped_to(ann: dict[str, Any], width: int, height: int) -> dict[str, Any]:
    """One annotation (a copy) with its box and polygons clipped to a ``width`` × ``height`` image."""
    changed = dict(ann)
    if isinstance(ann.get("bbox"), list) and len(ann["bbox"]) == 4:
        changed["bbox"] = _clip_box(ann["bbox"], width, height)
    if isinstance(ann.get("segmentation"), list):
        polygons = []
        for polygon in ann["segmentation"]:
            xs = [min(max(float(v), 0.0), width) for v in polygon[0::2]]
            ys = [min(max(float(v), 0.0), height) for v in polygon[1::2]]
            polygons.append([c for pair in zip(xs, ys) for c in pair])
        changed["segmentation"] = polygons
    elif isinstance(ann.get("segmentation"), dict) and ann["segmentation"].get("size"):
        if [int(v) for v in ann["segmentation"]["size"]] != [height, width]:
            raise ProbeError(
                None,
                f"annotation {ann.get('id')!r}: its RLE mask is {ann['segmentation']['size']} (h, w), its image {height}×{width}",
                "fix the annotation file: an RLE mask has its image's size",
            )
    return changed


class _Paths(Sequence[str]):
    """Each name's absolute path text (the memo's key: ``str(folder.absolute() / name)``), made
    when asked: a list of them would sit beside the memo's text while it is read (~110 B a name:
    100 k names, ~10 MiB). A name ``Path`` would not rewrite (no empty or ``.`` part, not
    absolute) is joined as text: making a ``Path`` of each took half of a 100 k-image class-folder
    panel's second read."""

    def __init__(self, folder: Path, names: Sequence[str]):
        self._folder, self._names = folder.absolute(), names
        self._prefix = str(self._folder).rstrip("/") + "/"

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        name = self._names[i]
        if not name or name[0] == "/" or "//" in name or "/./" in f"/{name}/" or name[-1] == "/":
            return str(self._folder / name)
        return self._prefix + name


def content_hashes(root: Path, folder: Path, names: list[str]) -> tuple[ContentHashes, Fresh]:
    """(sha256 of each image file's bytes → its file name, the memo entries hashed afresh).

    A file is hashed again only when its size or modification time changed since the last read:
    ``panel-hashes.json`` in the cache root keeps each absolute path's [size, mtime_ns, sha256]
    (written by ``check_overlap`` once the panel passes), so reading an ImageNet-sized panel a
    second time costs a stat per file, not 140 GB of reads. The memo is read a block at a time
    (``hash_memo``): only this panel's entries are kept, as arrays, and so are the fresh ones.
    """
    paths = _Paths(folder, names)
    size, mtime, found, digests = hash_memo.memo_entries(root / MEMO, paths)
    fresh = np.zeros(len(names), bool)
    for i, path in enumerate(paths):
        stat = os.stat(path)
        if not (found[i] and size[i] == stat.st_size and mtime[i] == stat.st_mtime_ns):
            fresh[i], size[i], mtime[i] = True, stat.st_size, stat.st_mtime_ns
            digests[i] = np.frombuffer(bytes.fromhex(file_sha256(Path(path))), np.uint8)
    at = np.flatnonzero(fresh)
    return ContentHashes(digests, names), Fresh(paths, at, size[at], mtime[at], digests[at])


def _shared_refusal(name: str, role: str, other: str, other_role: Any, count: int, mine: str, theirs: Any) -> ProbeError:
    return ProbeError(
        name,
        f"({role}) shares {count} images with panel {other!r} ({other_role}), e.g. {mine!r} = {theirs!r} (same content)",
        "remove the shared images from one panel: a panel of one role must not hold another's images",
    )


def check_overlap(root: Path, panel_name: str, role: str, annotation_sha256: str, hashes: ContentHashes, fresh: Fresh | None = None) -> None:
    """Refuse images that a panel of another role holds too; then remember this panel's, and the
    files ``content_hashes`` hashed afresh (a refused read leaves the cache as it found it). The
    index is read panel by panel (``hash_files.Index``): the other panels matched against this
    one's digests as they are read, this one's kept as arrays; when its entry changes, the index is
    written again member by member (``index_write``)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{INDEX}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = root / INDEX
        index = hash_files.Index(path, own=panel_name, against=hashes.sorted)  # an unreadable index is rebuilt from the reads that follow
        for other, seen in sorted(index.panels.items()):
            if other == panel_name or seen.fields.get("role") == role:
                continue
            count, first = index.overlap(seen, hashes.sorted)
            if first is not None:
                raise _shared_refusal(panel_name, role, other, seen.fields.get("role"), count, hashes.name(first[0]), first[1])
        own = index.panels.get(panel_name)
        unchanged = (
            own is not None
            and own.has_hashes
            and set(own.fields) == {"role", "annotation_sha256"}
            and own.fields["role"] == role
            and own.fields["annotation_sha256"] == annotation_sha256
            and index.same_names(own, hashes)
        )
        settled = unchanged or index_write.write_panel(path, index, panel_name, role, annotation_sha256, hashes)
        del index  # its text is not kept while the memo is written
        if not settled:  # an index of another form: decoded whole, and its bytes written as before
            whole_index = json_members.read_json(path)
            mine = whole_index.get(panel_name, {})
            kept = mine.get("hashes", {}) if mine.get("annotation_sha256") == annotation_sha256 and mine.get("role") == role else {}
            entry = {"role": role, "annotation_sha256": annotation_sha256, "hashes": {**kept, **hashes.as_dict()}}
            if whole_index.get(panel_name) != entry:  # an unchanged panel's read writes nothing
                write_json(path, {**whole_index, panel_name: entry})
        if fresh is not None:
            hash_memo.write_memo(root / MEMO, fresh)


def check_apart(first: tuple[str, str, Path, list[str]], second: tuple[str, str, Path, list[str]], root: Path) -> None:
    """Refuse two panels (name, role, folder, image names) of different roles that hold an image
    of the same content, before either's labels are read (no ledger line, nothing remembered)."""
    (name_a, role_a, folder_a, names_a), (name_b, role_b, folder_b, names_b) = first, second
    if role_a == role_b:
        return
    hashes_a, _ = content_hashes(root, folder_a, names_a)
    hashes_b, _ = content_hashes(root, folder_b, names_b)
    shared, in_a, in_b = np.intersect1d(hashes_a.sorted, hashes_b.sorted, assume_unique=True, return_indices=True)
    if len(shared):
        raise _shared_refusal(name_b, role_b, name_a, role_a, len(shared), hashes_b.name(in_b[0]), hashes_a.name(in_a[0]))


def forget(root: Path, panel_name: str) -> None:
    """Drop a panel's remembered images (it was replaced by ``probe panel add --replace``): the index
    read by blocks and written back without it (``index_write``), or, in another form, decoded whole."""
    path = root / INDEX
    if not path.is_file():
        return
    with open(root / f".{INDEX}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = hash_files.Index(path, against=np.zeros(0, "V32"))  # no panel's arrays: only its text is copied
        if panel_name not in index.panels and index.readable:
            return
        if not index_write.write_without(path, index, panel_name):
            del index
            whole = json_members.read_json(path)
            if whole.pop(panel_name, None) is not None:
                write_json(path, whole)
