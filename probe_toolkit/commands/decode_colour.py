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

from pathlib import Path

import numpy as np

# imported with the module, not in the block: a worker unpickling colour_block loads scipy's
# BLAS here, before the task's thread limit (infra.runner.task_threads) is entered, which binds
# only the libraries already loaded; loaded inside it, eigh would run on every core and round otherwise
from ..analyses.decoder import collate, decode_image, grid_of
from ..analyses.decoder_settings import Settings


def colour_block(keys: np.ndarray, names: np.ndarray, *, settings: Settings, source: str, patch: int, padded: bool = False,
                 rows: np.ndarray | None = None, cols: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A block of images → the decoder's arrays, each image decoded with its colour affinity;
    ``padded``: the keys are the native view's (the photograph padded as they saw it)."""
    from PIL import Image

    from ..analyses.decoder_blocks import ARRAYS
    from ..analyses.dsm import knn_color_affinity
    from ..store.images import load_image

    keys = np.asarray(keys)
    results = []
    for i, image_keys in enumerate(keys):
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
