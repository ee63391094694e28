"""DSM's colour term as a runner block (``probe decode --preset dsm --color-lambda L``).

Each image's photograph (the store's ``image_source``) is resized bilinearly to its patch grid,
/255, as DSM's ``_extract_eig`` does, and gives the KNN colour affinity beside its keys. DSM resizes
the whole file (lukemelas/deep-spectral-segmentation ``extract/extract.py``: ``Image.open(image_file)
.resize((W_pad_lr, H_pad_lr), Image.BILINEAR)``, the grid ⌊H/P⌋ × ⌊W/P⌋ of its cropped keys), so the
square views, native_crop and native_resized resize the photograph as stored (native_resized's
keys saw the whole image resized, as the square views' did); the native view's keys saw the
zero-padded image, so its photograph is padded the same way first. The block
reads its images' photographs itself, so local processes and dask workers (which mount the image
folder as they mount the store) decode their images alone, the same bits as one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

# imported with the module, not in the block: a worker unpickling colour_block loads scipy's
# BLAS here, before the task's thread limit (infra.runner.task_threads) is entered, which binds
# only the libraries already loaded; loaded inside it, eigh would run on every core and round otherwise
from ..analyses.decoder import collate, decode_image, grid_of
from ..analyses.decoder_settings import Settings

if TYPE_CHECKING:
    from ..infra.shared import Shared


def colour_block(
    keys: np.ndarray,
    names: np.ndarray,
    *,
    settings: Settings,
    source: str,
    patch: int,
    padded: bool = False,
    rows: np.ndarray | None = None,
    cols: np.ndarray | None = None,
    photos: Shared | None = None,
) -> dict[str, np.ndarray]:
    """A block of images → the decoder's arrays, each image decoded with its colour affinity;
    ``padded``: the keys are the native view's (the photograph padded as they saw it); ``photos``:
    the sha256 of every photograph as the command read it (``photographs``), checked before each is read."""
    from PIL import Image

    from ..analyses.decoder_blocks import ARRAYS
    from ..analyses.dsm import knn_color_affinity
    from ..store.images import load_image

    keys = np.asarray(keys)
    results = []
    for i, image_keys in enumerate(keys):
        if photos is not None:
            _check(photos, Path(source), str(names[i]))
        photo = load_image(Path(source) / str(names[i])).convert("RGB")
        if rows is None:
            side = grid_of(keys.shape[1])
            r, c = side, side
        else:  # an own-size view: the image's own grid, its first rows·cols patches
            r, c = int(rows[i]), int(cols[i])
            image_keys = image_keys[: r * c]
            if padded:  # zeros at the right and bottom, as the native view's keys saw it
                canvas = Image.new("RGB", (c * patch, r * patch))
                canvas.paste(photo, (0, 0))
                photo = canvas
        photo = photo.resize((c, r), Image.BILINEAR)
        color = knn_color_affinity(np.asarray(photo, dtype=np.float64) / 255.0)
        results.append(decode_image(image_keys, settings, color=color, grid=(r, c)))
    decoded = collate(results, settings, keys.shape[1])
    return {name: getattr(decoded, name) for name in ARRAYS}


def _check(photos: Shared, source: Path, name: str) -> None:
    from ..infra.errors import IntegrityError, worker_name
    from ..store.sources import read_checked

    table = photos.value()
    at = int(np.searchsorted(table["name"], name))
    if at >= table.shape[0] or table["name"][at] != name:
        raise IntegrityError(worker_name(), f"was handed {name!r}, which the command did not hash", "rerun the command")
    read_checked(source / name, table["sha256"][at].decode())


@contextmanager
def photographs(src) -> Iterator[tuple[str, Shared]]:
    """The store's photographs for the colour term: their folder, absolute (``store.sources``: a
    store's relative ``image_source`` is resolved against the store's location, never the current
    directory), each photograph's size checked against the size the store recorded at extraction,
    and their sha256 as a ``runner.Shared`` table, so that every worker proves it reads these bytes."""
    from ..infra.errors import ProbeError
    from ..infra.shared import shared
    from ..results import records
    from ..store.images import header_size
    from ..store.sources import check_current, file_digest, image_folder

    folder = image_folder(src.store, src.manifest)
    order = sorted(range(len(src.image_ids)), key=lambda i: src.image_ids[i])
    width = max((len(n) for n in src.image_ids), default=1)
    table = np.zeros(len(order), dtype=[("name", f"U{width}"), ("sha256", "S64")])
    for i in order:
        name, path = src.image_ids[i], folder / src.image_ids[i]
        if not path.is_file():
            raise ProbeError(src.store, f"was extracted from {folder}, which no longer holds {name}", f"restore the photographs at {folder}")
        if header_size(path) != (int(src.widths[i]), int(src.heights[i])):
            w, h = header_size(path)
            raise ProbeError(
                path,
                f"is {w}×{h}, but the store recorded {src.widths[i]}×{src.heights[i]} when it was extracted from it",
                "restore the photographs the store was extracted from (or extract a new store from these)",
            )
    check_current(src.store, [(name, folder / name) for name in src.image_ids])  # the bytes extracted, where the store recorded them
    for row, i in enumerate(order):
        table[row] = (src.image_ids[i], file_digest(folder / src.image_ids[i]).encode())
    with shared(table, records.results_path(src.store, ""), "colour-photos") as handle:
        yield str(folder), handle
