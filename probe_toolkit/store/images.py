"""Image sources and the views every store is built from.

- 224: short side to 224 (PIL bicubic, long side truncated as torchvision's Resize does), centre
  crop 224. A 640×480 photo becomes 298×224 and the crop starts 37 px from the left.
- eval224: short side to 256, centre crop 224, the evaluation transform of facebookresearch/dino
  ``eval_knn.py`` and ``eval_linear.py`` (``Resize(256, interpolation=3)``, ``CenterCrop(224)``):
  the crop covers the central 87.5 % of the short side. A 640×480 photo becomes 341×256.
- 480: the whole image squashed to 480×480 (the decoder's view), PIL bicubic by default or PIL
  LANCZOS (``resample="lanczos"``, as CutLER's ``maskcut/maskcut.py`` resizes).
- 96: short side to 96, centre crop 96.
- square800: the image padded with white (255) at the right and bottom to a square, resized to
  800 × 800 (PIL bicubic, as torchvision's ``Resize((800, 800), BICUBIC)`` on a PIL image),
  normalised, then zero-padded about the centre to whole patches (none at /16 or /8; at /14, 6
  rows and columns each side: 58 × 58), as mbanani/probe3d reads SPair-71k
  (``evals/datasets/spair.py`` with ``use_bbox=False`` and ``image_size: 800`` of
  ``configs/spair_correspondence.yaml``; ``center_padding`` of ``evals/models/utils.py``).
- native: the image at its own size, normalised, then zero-padded at the right and bottom to a
  multiple of the patch size, as TokenCut's ``main_tokencut.py`` and LOST's ``main_lost.py`` pad
  it (``ceil(h / p) * p`` rows, ``ceil(w / p) * p`` columns). Its grid differs per image.
- native_crop: the image at its own size, normalised, then cut at the right and bottom to whole
  patches (``floor(h / p) * p`` rows, ``floor(w / p) * p`` columns, the top left kept), as
  lukemelas/deep-spectral-segmentation crops it (``extract/extract.py``: ``images[:, :, :H_patch * P,
  :W_patch * P]``; ``object-localization/main.py --eigenseg``). The last < p rows and columns are
  read by no patch. Its grid differs per image.
- native_resized: the whole image resized with PIL LANCZOS to ``round(w / p) * p`` × ``round(h / p)
  * p`` (Python's round, halves to even; at least one patch a side), then normalised, as TokenCut's
  saliency code reads it (``unsupervised_saliency_detection/utils.py`` ``resize_pil``, called by
  ``get_saliency.py``). Its grid differs per image, and from native's for about half of the sides.

The three own-size views (``OWN_SIZE``) are one machinery with an edge rule, pad, crop or resize
(``store.own_size``: the grid and the way masks come back to the original pixels).

Every view is normalised with ImageNet's mean and standard deviation. Files are decoded as
stored, their EXIF orientation tag left unapplied, as the peers' loaders read them (PIL's
``open(...).convert("RGB")`` in torchvision's ImageFolder, COCO and VOC datasets, which DINO,
LOST and TokenCut use), so features match theirs and boxes annotated on the stored pixels line
up; greyscale, palette, RGBA, CMYK and 16-bit images become RGB.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..infra.errors import ProbeError
from . import hbird_views, own_size
from . import views as view_table  # (``views`` is also this module's function of several views)

if TYPE_CHECKING:  # torch is imported where pixels become tensors: listing images and their geometry need none
    import torch

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
VIEWS = (96, 224, 480)
EVAL = "eval224"
NATIVE, NATIVE_CROP, NATIVE_RESIZED = own_size.NATIVE, own_size.NATIVE_CROP, own_size.NATIVE_RESIZED
OWN_SIZE = own_size.VIEWS  # each image at its own size: padded up, cut down, or resized to whole patches
VIEW_NAMES = view_table.NAMES  # store/views.py defines every view once
SQUARE = "square800"  # white-padded to a square, resized to SQUARE_SIDE, centre-padded to whole patches
SQUARE_SIDE = 800
RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS}


def view_name(view: int | str) -> str:
    """The canonical name of a view (``store.views``: an alias, ``family@size``, or an own-size view); anything else is bad input."""
    from ..infra.settings import SettingError

    try:
        return view_table.canonical(view)
    except SettingError as error:
        raise ProbeError(None, f"--views {view}: {error.problem}", "use e.g. --views 224,480, square@1024 or native,native_resized") from None


def manifest_view(name: str) -> int | str:
    """How the manifest lists a view: a view named by its size as that size in pixels, the others by name."""
    return int(name) if name.isdigit() else name


def view_side(view: int | str) -> int:
    """The side in pixels of a fixed square view (``eval224``: 224; ``hbird512``: 512; ``square@1024``: 1024)."""
    return int(view_table.view(view).size)


def fixed_grid(view: str, patch: int) -> tuple[int, int]:
    """(rows, cols) of a fixed square view at this patch size (224 at /16: 14 x 14; at /8: 28 x 28;
    at /14: 16 x 16, and 96 or 480 give 6 x 6 or 34 x 34: the backbone reads the whole patches from
    the top left and leaves the last pixels unused, as DINO's visualize_attention.py crops; the
    padded family is centre-padded up to whole patches)."""
    spec = view_table.view(view)
    size = int(spec.size)
    if spec.family == "padded":
        return -(-size // patch), -(-size // patch)
    return size // patch, size // patch


def native_grid(width: int, height: int, patch: int, view: str = NATIVE) -> tuple[int, int]:
    """(rows, cols) of an own-size view (``own_size.cells``): zero-padded up to whole patches
    (native), cut down to them (native_crop: 0 on a side shorter than one patch), or resized to
    round(side / p) of them (native_resized)."""
    return own_size.cells(height, patch, view), own_size.cells(width, patch, view)


def header_size(path: str | Path) -> tuple[int, int]:
    """(width, height) as stored (no EXIF orientation, as ``load_image``), read from the file's
    header without decoding it."""
    path = Path(path)
    try:
        with Image.open(path) as opened:
            width, height = opened.size
    except UnidentifiedImageError:
        raise ProbeError(path, "is not an image PIL can read", "remove it from the folder") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ProbeError(path, f"has an unreadable header ({error})", "replace it") from None
    return width, height


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a source: its id (path relative to the source folder) and its file.

    The file is kept as text and made a ``Path`` when asked: a listing holds one of these per
    image of the data set for the whole extraction, and a ``Path`` (its parts cached) with a
    dataclass's ``__dict__`` made a 100,000-image listing about 45 MiB; ImageNet's 1.28 M
    images, about 580 MiB."""

    id: str
    file: str

    @property
    def path(self) -> Path:
        return Path(self.file)


def _image_files(folder: Path) -> Iterator[tuple[str, str]]:
    """(id, file) of every image under ``folder``, one at a time, unsorted: recursively, as
    ``Path.rglob`` walks (links to folders not followed, an unreadable folder skipped), hidden files
    and folders skipped. Names, not Path objects: rglob keeps a Path of every file it yields (a
    set, against repeats), about 0.5 KiB an image, a 100,000-image folder's listing ~50 MiB."""
    stack = [("", os.fspath(folder))]
    while stack:
        prefix, directory = stack.pop()
        try:
            found = os.scandir(directory)
        except PermissionError:
            continue
        with found:  # entry by entry: a list of a 100 k folder's entries is ~20 MiB, and the names kept stay scattered among them
            for entry in found:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append((f"{prefix}{entry.name}/", entry.path))
                elif PurePosixPath(entry.name).suffix.lower() in EXTENSIONS and entry.is_file():
                    yield prefix + entry.name, entry.path


def _listed(folder: Path, fix: str | None = None) -> Iterator[tuple[str, str]]:
    """``fix``: how the caller's user names another folder (probe train's is a config key, not --images)."""
    if not folder.is_dir():
        raise ProbeError(folder, "is not a folder", fix or "pass --images DIR with your photographs")
    found = iter(_image_files(folder))
    first = next(found, None)
    if first is None:
        raise ProbeError(folder, f"holds no images ({', '.join(sorted(EXTENSIONS))})", fix or "point --images at a folder of photographs")
    yield first
    yield from found


def list_images(folder: str | Path, fix: str | None = None) -> list[ImageRef]:
    """Every image file under ``folder``, recursively, sorted by id; hidden files are skipped
    (``fix``: the refusal's fix where the folder is none or holds no image, as the caller's user names one)."""
    return sorted((ImageRef(i, path) for i, path in _listed(Path(folder), fix)), key=lambda r: r.id)


def require_images(folder: str | Path, fix: str | None = None) -> None:
    """Refuse a folder that is not one or holds no image, as ``list_images`` does, reading the
    listing only up to its first image (registering a panel of ImageNet's 1.28 M files checks
    this; it need not list them all)."""
    next(_listed(Path(folder), fix))


def image_ids(folder: str | Path) -> list[str]:
    """The ids of ``list_images(folder)`` (sorted), without a Path per image."""
    return sorted(i for i, _ in _listed(Path(folder)))


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if values.max(initial=0) > 255 else 255.0
        image = Image.fromarray(np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image if image.mode == "RGB" else image.convert("RGB")  # (convert would copy an RGB image)


# ``warnings.catch_warnings`` changes the process's filters: threads decoding at once would undo
# each other's (a bomb then decoded, or the filter left on for good). One thread at a time
# changes them, for PIL's size checks: JPEG, PNG, BMP and PPM check only when the file is
# opened, so they decode outside the lock; formats that check frames again while decoding
# (GIF, TIFF, WebP, MPO, ...) decode inside it.
_FILTERS = threading.Lock()
_CHECKED_AT_OPEN = frozenset({"JPEG", "PNG", "BMP", "PPM"})


def load_image(path: str | Path) -> Image.Image:
    """Decode one file to RGB; an unreadable file is a ProbeError naming it. Safe on several
    threads at once (extraction's decoding threads)."""
    return _load(Path(path), Path(path))


@dataclass(frozen=True)
class Photo:
    """A file decoded from one read of it, with the sha256 of the bytes decoded and the file's
    (size, mtime ns) as it was opened (``store.sources``: what later commands check a file against)."""

    image: Image.Image
    sha256: bytes
    stat: tuple[int, int]


def load_photo(path: str | Path) -> Photo:
    """``load_image``, and what the bytes decoded were: extraction records the very bytes its
    features came from (a file replaced while the run lasts cannot lend its sha256 to the old
    file's features), and no second pass reads the data set again to hash it. The stat is taken
    before the read, so a later change in place moves the mtime away from the one recorded."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            found = os.fstat(handle.fileno())
            data = handle.read()
    except OSError as error:  # not the bytes' fault: gone since the folder was listed, unreadable, a folder
        raise ProbeError(path, f"cannot be read ({error.strerror or error})", "make it a readable file (or remove it from the folder), then rerun") from None
    image = _load(path, io.BytesIO(data))
    return Photo(image, hashlib.sha256(data).digest(), (int(found.st_size), int(found.st_mtime_ns)))


def _load(path: Path, source: Path | io.BytesIO) -> Image.Image:
    """Decode ``source`` (the file at ``path``, or its bytes) to RGB; errors name ``path``."""
    try:
        with _FILTERS, warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(source)
            if opened.format not in _CHECKED_AT_OPEN:
                _decoded(opened)
        with opened:
            _decoded(opened)
            return _to_rgb(opened)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ProbeError(path, f"is larger than PIL's decompression-bomb limit ({error})", "downscale it") from None
    except UnidentifiedImageError:
        raise ProbeError(path, "is not an image PIL can read", "remove it from the folder") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ProbeError(path, f"cannot be decoded ({error})", "the file may be truncated; replace it") from None


def _decoded(opened: Image.Image) -> None:
    """Decode the pixels (once: ``load`` returns at once when they are there); a file that fails
    is closed before the error goes on."""
    try:
        opened.load()
    except BaseException:
        opened.close()
        raise


@dataclass(frozen=True)
class ViewGeometry:
    """Where a view's pixels come from: the original is resized to ``resized`` (width, height),
    then ``box`` (left, top, right, bottom, in resized pixels) is cut out.

    One home for the arithmetic: ``view`` uses it to make the pixels, and label code uses it
    to carry masks through the same resize and crop.
    """

    size: int
    original: tuple[int, int]
    resized: tuple[int, int]
    box: tuple[int, int, int, int]

    def source_centres(self) -> tuple[np.ndarray, np.ndarray]:
        """The original-image (x, y) coordinates of the centres of the view's columns and rows."""
        (w, h), (nw, nh) = self.original, self.resized
        left, top = self.box[:2]
        offsets = np.arange(self.size, dtype=np.float64) + 0.5
        return (offsets + left) * w / nw, (offsets + top) * h / nh

    def source_region(self) -> tuple[int, int, int, int]:
        """The original pixels (x0, y0, x1, y1; end exclusive) whose centres fall inside the view.

        Pixel x is inside when ``left <= (x + 0.5) * nw / w < right``; exact integer arithmetic.
        """
        (w, h), (nw, nh) = self.original, self.resized
        left, top, right, bottom = self.box

        def first(edge: int, n_orig: int, n_new: int) -> int:  # ceil(edge * n_orig / n_new - 0.5)
            return -((n_new - 2 * edge * n_orig) // (2 * n_new))

        return first(left, w, nw), first(top, h, nh), min(first(right, w, nw), w), min(first(bottom, h, nh), h)


def geometry(width: int, height: int, size: int | str) -> ViewGeometry:
    """The geometry of a square or cropped view (``480``, ``square@1024``; ``224``, ``96``, ``eval224``,
    ``short@S``, ``eval@S``) of a ``width`` × ``height`` image (see the module docstring)."""
    spec = view_table.view(size)
    if spec.family == "square":
        side = int(spec.size)
        return ViewGeometry(side, (width, height), (side, side), (0, 0, side, side))
    if spec.family not in ("short", "eval"):
        raise ValueError(f"view {size} is neither squashed nor cropped: its geometry is its own (store.views)")
    short, side = int(spec.resize), int(spec.size)
    # torchvision's Resize(short): the long side truncated; its CenterCrop(side): offsets rounded
    resized = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    left, top = int(round((resized[0] - side) / 2.0)), int(round((resized[1] - side) / 2.0))
    return ViewGeometry(side, (width, height), resized, (left, top, left + side, top + side))


def view(image: Image.Image, size: int | str, resample: str = "bicubic") -> Image.Image:
    """View ``size`` of an RGB image (short@S, eval@S: short side + centre crop; square@S: squash).

    ``resample`` (bicubic or lanczos) is the square views' filter; the others are always bicubic.
    """
    g = geometry(*image.size, size)
    squashed = view_table.view(size).family == "square"
    resized = image.resize(g.resized, RESAMPLE[resample] if squashed else Image.Resampling.BICUBIC)
    return resized if g.box == (0, 0, *g.resized) else resized.crop(g.box)


# every uint8 value of each channel normalised by the very float32 operations a whole image takes
# ((v / 255 - mean) / std, elementwise): a look-up gives the same values in a third of the time
NORMALISED = ((np.arange(256, dtype=np.float32)[:, None] / 255.0 - MEAN) / STD).T.copy()


def normalise(image: Image.Image) -> torch.Tensor:
    """(3, H, W) float32, ImageNet mean and std."""
    import torch

    pixels = np.asarray(image)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        array = (pixels.astype(np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
    out = np.empty((3, *pixels.shape[:2]), dtype=np.float32)
    for channel in range(3):
        np.take(NORMALISED[channel], pixels[..., channel], out=out[channel])
    return torch.from_numpy(out)


def native(image: Image.Image, patch: int, view: str = NATIVE) -> torch.Tensor:
    """An own-size view: (3, rows * patch, cols * patch). Padded or cut (native, native_crop):
    normalised first, then the image's top-left pixels that fit the grid on a zero canvas of the
    grid's size. Resized (native_resized): the whole image resized with LANCZOS to the grid's
    pixels, then normalised, as TokenCut's ``resize_pil`` then ``ToTensor`` + ``Normalize``."""
    import torch

    rows, cols = native_grid(image.width, image.height, patch, view)
    if own_size.rule(view) == own_size.RESIZE:
        return normalise(image.resize((cols * patch, rows * patch), Image.Resampling.LANCZOS))
    pixels = normalise(image).numpy()
    height, width = min(rows * patch, image.height), min(cols * patch, image.width)
    canvas = np.zeros((3, rows * patch, cols * patch), dtype=pixels.dtype)  # numpy: see ``stack``
    canvas[:, :height, :width] = pixels[:, :height, :width]
    return torch.from_numpy(canvas)


def stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack`` of CPU tensors, copied by numpy: a torch copy this large runs in parallel,
    and on a thread other than the main one each such call starts its own OpenMP team, whose
    threads then spin on the cores the forward pass runs on. The same values."""
    import torch

    return torch.from_numpy(np.stack([t.numpy() for t in tensors]))


def square(image: Image.Image, patch: int, side: int = SQUARE_SIDE) -> torch.Tensor:
    """The square800 view: (3, s, s) with s = ⌈side / p⌉ · p (see the module docstring)."""
    import torch

    width, height = image.size
    big = max(width, height)
    canvas = Image.new("RGB", (big, big), (255, 255, 255))
    canvas.paste(image, (0, 0))
    pixels = normalise(canvas.resize((side, side), Image.Resampling.BICUBIC)).numpy()
    whole = -(-side // patch) * patch
    before = (whole - side) // 2
    out = np.zeros((3, whole, whole), dtype=np.float32)
    out[:, before : before + side, before : before + side] = pixels
    return torch.from_numpy(out)


def fixed_pixels(image: Image.Image, name: str, resample: str, image_id: str, patch: int) -> torch.Tensor:
    """The network's input of one fixed view of an RGB image: ``normalise(view(...))``, ``square``
    for the padded family (square800), or Hummingbird's views (``image_id``: its id in the store,
    which keys the random crops of the memory views, ``store.hbird_views``)."""
    spec = view_table.view(name)
    if spec.family == "hbird":
        return hbird_views.pixels(image, name, image_id)
    return square(image, patch, int(spec.size)) if spec.family == "padded" else normalise(view(image, name, resample))


def views(image: Image.Image, sizes: tuple[int | str, ...], resample: str = "bicubic") -> dict[int | str, torch.Tensor]:
    return {size: normalise(view(image, size, resample)) for size in sizes}
