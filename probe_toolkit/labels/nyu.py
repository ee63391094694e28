"""NYU Depth v2 panels in the layout facebookresearch/dinov3 reads (``dinov3/data/datasets/nyu.py``;
the same folder the Monocular-Depth-Estimation-Toolbox's ``NYUDataset`` reads for DINOv2's
configs): depth maps checked field by field when added, read only through the ledger.

Layout of the folder (the BTS split, its files renamed as the Toolbox's ``data/nyu``)::

    nyu_train.txt   24,231 lines  /kitchen_0028b/rgb_00045.jpg /kitchen_0028b/sync_depth_00045.png 518.8579
    nyu_test.txt       654 lines  bathroom/rgb_00045.jpg bathroom/sync_depth_00045.png 518.8579
    <scene>/rgb_<n>.jpg           640 × 480 photographs
    <scene>/sync_depth_<n>.png    16-bit grey PNGs of the same size, millimetres; 0 = no measurement

A line is ``image depth focal``, the paths relative to the folder (leading and trailing ``/``
stripped, as the reference does); the focal length is not used. A split is its file's lines,
sorted as the reference sorts them (``NYU`` sorts the lines themselves). DINOv3's ``split=TRAIN``
reads ``nyu_train.txt``; ``VAL`` and ``TEST`` both read ``nyu_test.txt``: panels here name the
file, ``--split train`` or ``--split test``.

``check_layout`` (when the panel is added) reads the split file and every image's and depth
map's header (format, size, mode: no depth value), refusing the panel in one line (the first problem and how many more)
(file, line, field, fix); it hands out no label and writes no ledger entry. ``read_depth_maps``
opens every depth map of the split once, hashes it, writes the ledger entry and only then hands
out a ``DepthMaps``: it keeps each file's sha256, not its pixels (24,231 maps of 600 kB would not
fit in memory), and ``DepthMaps.map(i)`` reads the file again, inside the guard, refusing it
unless its bytes are those the ledger entry covers.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError

KIND = "nyu"
SPLITS = ("train", "test")
FIX = "restore the file from the BTS NYU Depth v2 split (the Monocular-Depth-Estimation-Toolbox's data/nyu layout)"
FIX_LAYOUT = "pass --nyu the folder holding nyu_train.txt, nyu_test.txt and the scene folders they list"
DEPTH_MODES = ("I;16", "I;16B", "I;16L")  # PIL's 16-bit grey
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass(frozen=True)
class Entry:
    """One line of a split file: the photograph and its depth map, relative to the folder."""

    image: str
    depth: str
    focal: float


def split_file(root: Path, split: str) -> Path:
    return root / f"nyu_{split}.txt"


def parse_split(raw: bytes, where: Path, root: Path) -> tuple[list[Entry], list[str]]:
    """(entries in the reference's order, problems) of a split file's bytes; no file opened."""
    problems: list[str] = []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return [], [f"{where}: is not UTF-8 text ({error}); {FIX}"]
    entries, seen = [], {}
    for n, line in sorted(enumerate(text.splitlines(keepends=True), start=1), key=lambda t: t[1]):  # NYU: lines = sorted(lines)
        fields = line.split()
        at = f"{where}: line {n}"
        if len(fields) != 3:
            problems.append(f"{at}: has {len(fields)} fields, not 3 (image depth focal); {FIX}")
            continue
        image, depth = fields[0].strip("/"), fields[1].strip("/")
        try:
            focal = float(fields[2])
        except ValueError:
            focal = float("nan")
        if not (np.isfinite(focal) and focal > 0):
            problems.append(f"{at}: field focal is {fields[2]!r}, not a positive number; {FIX}")
        if not image.lower().endswith(IMAGE_SUFFIXES):
            problems.append(f"{at}: field image {fields[0]!r} is not a .jpg or .png file; {FIX}")
        if not depth.lower().endswith(".png"):
            problems.append(f"{at}: field depth {fields[1]!r} is not a .png file; {FIX}")
        for field, path in (("image", image), ("depth", depth)):
            if not (root / path).resolve().is_relative_to(root):
                problems.append(f"{at}: field {field} {path!r} leads outside {root}; {FIX}")
        if image in seen:
            problems.append(f"{at}: image {image} is listed again (first at line {seen[image]}); {FIX}")
        seen.setdefault(image, n)
        entries.append(Entry(image, depth, focal))
    if not entries and not problems:
        problems.append(f"{where}: lists no image; {FIX}")
    return entries, problems


def depth_header(raw_or_path, where: Path) -> tuple[tuple[int, int] | None, str | None]:
    """((width, height), None) of a depth map from its header alone, or (None, the problem)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw_or_path) if isinstance(raw_or_path, bytes) else raw_or_path) as opened:
            if opened.format != "PNG" or opened.mode not in DEPTH_MODES:
                return None, f"{where}: is {opened.format} of mode {opened.mode}, not a 16-bit grey PNG of millimetres; {FIX}"
            return opened.size, None
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as error:
        return None, f"{where}: is not a readable PNG ({error}); {FIX}"


def check_entries(root: Path, entries: list[Entry]) -> list[str]:
    """Problems of the files the entries name: missing, unreadable, a depth map that is not a 16-bit
    grey PNG or not the size of its photograph (headers only, inside the guard)."""
    from PIL import Image, UnidentifiedImageError

    from .guard import inside

    problems = []
    for e in entries:
        picture, depth = root / e.image, root / e.depth
        if not picture.is_file():
            problems.append(f"{picture}: is missing (listed with {e.depth}); {FIX}")
            continue
        if not depth.is_file():
            problems.append(f"{depth}: is missing, the depth map of {picture}; {FIX}")
            continue
        try:
            with Image.open(picture) as opened:
                size = opened.size
        except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as error:
            problems.append(f"{picture}: is not an image PIL can read ({error}); {FIX}")
            continue
        inside.active = True
        try:
            found, problem = depth_header(depth, depth)
        finally:
            inside.active = False
        if problem:
            problems.append(problem)
        elif found != size:
            problems.append(f"{depth}: is {found[0]}x{found[1]} px, its photograph {picture} {size[0]}x{size[1]}; {FIX}")
    return problems


def check_layout(annotations: Path, images: Path | None, split: str) -> tuple[Path, Path]:
    """(the NYU folder, the folder the split's image paths are relative to: the same) of a new
    panel: its split file line by line and field by field, then every file it names."""
    from .spair import refuse

    root = annotations.resolve()
    split = split or "test"
    if split not in SPLITS:
        raise ProbeError(None, f"--split {split!r} is not one of {', '.join(SPLITS)}", "pass --split train or --split test (nyu_train.txt, nyu_test.txt)")
    if images is not None and images.resolve() != root:
        raise ProbeError("--images", "is the --nyu folder itself for an NYU panel (its split file's paths are relative to it)", "drop --images")
    if not root.is_dir():
        raise ProbeError(root, "is not a folder", FIX_LAYOUT)
    listing = split_file(root, split)
    if not listing.is_file():
        raise ProbeError(listing, "does not exist", FIX_LAYOUT)
    entries, problems = parse_split(listing.read_bytes(), listing, root)
    refuse(problems + check_entries(root, entries), root)
    return root, root


def split_images(panel) -> list[str]:
    """The image paths of the panel's split file, in its order: a list of images, not labels."""
    root = Path(panel.annotations)
    listing = split_file(root, panel.split or "test")
    entries, problems = parse_split(listing.read_bytes(), listing, root)
    if problems:
        raise ProbeError(listing, problems[0].split(": ", 1)[-1], "re-add the panel with `probe panel add --replace` once the file is restored")
    return [e.image for e in entries]


@dataclass
class DepthMaps:
    """What ``read_depth_maps`` hands out after its ledger entry: the split's images and, per
    image, its depth map's file and the sha256 of the bytes the entry covers."""

    ids: list[str]  # image paths relative to the panel's folder, in the split's order
    files: list[Path]
    digests: list[bytes]
    entry_id: str
    panel: object  # panels.Panel
    image_map: dict[str, str]  # store id → image path (when store ids were given)

    def map(self, i: int) -> np.ndarray:
        """(H, W) uint16 millimetres of image ``i``, read again inside the guard and refused unless
        its bytes are those the ledger entry covers."""
        from PIL import Image

        from .guard import inside

        inside.active = True
        try:
            raw = self.files[i].read_bytes()
        except OSError as error:
            raise ProbeError(self.files[i], f"cannot be read ({error.strerror})", FIX) from None
        finally:
            inside.active = False
        if hashlib.sha256(raw).digest() != self.digests[i]:
            raise ProbeError(
                self.files[i],
                f"changed since its read was written to the ledger (entry {self.entry_id[:12]})",
                "restore the file, or run the command again to read the panel afresh",
            )
        with Image.open(io.BytesIO(raw)) as opened:
            return np.asarray(opened, dtype=np.uint16).copy()


def read_depth_maps(
    panel,
    *,
    purpose: str,
    checkpoint: str | None = None,
    images: Sequence[str] | None = None,
    unseal: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
) -> DepthMaps:
    """Open an NYU panel's depth maps, write the ledger entry, then hand them out (``DepthMaps``).

    ``images`` (store ids) restricts what is read to the split's images they match; a sealed
    (``test``) panel needs ``unseal``, recorded. The annotation hash covers the split file and
    every depth map read.
    """
    from ..store.cache import cache_root
    from . import panels
    from .guard import inside
    from .label_maps import restrict

    panel = panels.open_for_reading(panel, KIND, purpose=purpose, unseal=unseal, cache=cache, register="register the NYU folder with probe panel add --nyu DIR")
    root = Path(panel.annotations)
    listing = split_file(root, panel.split or "test")
    inside.active = True
    try:
        split_raw = listing.read_bytes()
    except OSError as error:
        raise ProbeError(listing, f"cannot be read ({error.strerror})", FIX_LAYOUT) from None
    finally:
        inside.active = False
    entries, problems = parse_split(split_raw, listing, root)
    if problems:
        raise ProbeError(None, problems[0], "")
    names, image_map = restrict([e.image for e in entries], images)
    keep = set(names)
    chosen = [e for e in entries if e.image in keep]
    files = [root / e.depth for e in chosen]
    digest = hashlib.sha256(listing.name.encode() + b"\0" + hashlib.sha256(split_raw).digest())
    digests = []
    inside.active = True
    try:
        for f in files:
            try:
                raw = f.read_bytes()
            except OSError as error:
                raise ProbeError(f, f"cannot be read ({error.strerror})", FIX) from None
            _, problem = depth_header(raw, f)
            if problem:
                raise ProbeError(None, problem, "")
            digests.append(hashlib.sha256(raw).digest())
            digest.update(f.name.encode() + b"\0" + digests[-1])
    finally:
        inside.active = False
    annotation_sha256 = digest.hexdigest()
    store = cache_root(cache)
    entry = panels.log_checked_read(
        store,
        panel,
        panel.images,
        names,
        annotations=str(listing),
        annotation_sha256=annotation_sha256,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
    )
    return DepthMaps(names, files, digests, entry.id, panel, image_map)
