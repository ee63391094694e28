"""The own-size views: each image at about its own size, brought to whole patches by one edge rule.

One table (``EDGE``) names each view's rule, and two functions carry it: ``cells`` (an image
side in pixels → that side of the view's grid) and ``pixel_cells`` (which grid row or column
each original pixel row or column takes when a mask is drawn back at the original size).

- pad (``native``): zero-padded at the right and bottom to ⌈s/p⌉ patches, as TokenCut's
  ``main_tokencut.py`` and LOST's ``main_lost.py`` pad it; pixel s takes patch ⌊s/p⌋.
- crop (``native_crop``): cut at the right and bottom to ⌊s/p⌋ patches, as
  lukemelas/deep-spectral-segmentation ``extract/extract.py`` cuts it; pixel s takes patch
  ⌊s/p⌋, and the last s − ⌊s/p⌋·p pixels lie under none.
- resize (``native_resized``): the whole image resized (PIL LANCZOS) to round(s/p)·p, at least
  one patch, as TokenCut's saliency code resizes it (``unsupervised_saliency_detection/utils.py``
  ``resize_pil``, Python's ``round``: halves to even, 264/16 → 16); its masks come back by
  ``F.interpolate(mode='nearest')`` (``object_discovery.py``), pixel s taking patch
  ⌊s · (cells / size)⌋ computed in float32 as torch computes it.

Torch-free (numpy only), so the commands that only read stores can name the views.
"""

from __future__ import annotations

import numpy as np

PAD, CROP, RESIZE = "pad", "crop", "resize"
NATIVE, NATIVE_CROP, NATIVE_RESIZED = "native", "native_crop", "native_resized"
EDGE = {NATIVE: PAD, NATIVE_CROP: CROP, NATIVE_RESIZED: RESIZE}
VIEWS = tuple(EDGE)
# how a message names each view's edge: "... at its own size, <this>"
DESCRIBED = {
    NATIVE: "zero-padded to whole patches (native view)",
    NATIVE_CROP: "cut to whole patches (native_crop view)",
    NATIVE_RESIZED: "resized with LANCZOS to round(side/p) patches (native_resized view)",
}
# the verb of an integrity message: "image X's grid is not its pixels <verb> to /p"
VERB = {PAD: "padded", CROP: "cut", RESIZE: "resized"}


def rule(view: str) -> str:
    """The edge rule (pad, crop, resize) of an own-size view."""
    return EDGE[str(view)]


def cells(size, patch: int, view: str):
    """Patches along a side of ``size`` pixels (an int or an integer array) in ``view``:
    ⌈s/p⌉ padded, ⌊s/p⌋ cut, Python's round(s/p) (halves to even), at least 1, resized.

    The rounding is integer arithmetic, equal to ``round(s / p)`` on every int: a half is
    exact in float64, so Python's round sees the same tie."""
    edge = rule(view)
    if edge == PAD:
        return -(-size // patch)
    if edge == CROP:
        return size // patch
    quotient, remainder = np.divmod(size, patch)
    up = (2 * remainder > patch) | ((2 * remainder == patch) & (quotient % 2 == 1))
    out = np.maximum(quotient + up, 1)
    return int(out) if np.ndim(out) == 0 else out.astype(np.asarray(size).dtype)


def needs_whole_patch(view: str) -> bool:
    """Whether an image smaller than one patch on a side has no grid in ``view``: padded or cut,
    the store has always refused it; resized, it becomes one patch, as TokenCut's resize would
    (which leaves a side under half a patch at 0 pixels; here it is one patch)."""
    return rule(view) != RESIZE


def pixel_cells(size: int, n_cells: int, patch: int, view: str) -> np.ndarray:
    """The grid row (or column) each of ``size`` original pixel rows (or columns) takes, int64.

    Padded or cut: ⌊s/p⌋ (past the grid where the cut dropped the strip: ``masks.on_grid``
    leaves it 0). Resized: torch's nearest source index (``upsample_nearest``:
    ``min(floor(float(s) * (float(cells) / size)), cells - 1)`` in float32, as
    ``F.interpolate(size=(h, w), mode='nearest')`` maps TokenCut's patch mask back)."""
    size = int(size)
    if rule(view) != RESIZE:
        return np.arange(size, dtype=np.int64) // patch
    scale = np.float32(n_cells) / np.float32(size)
    return np.minimum(np.floor(np.arange(size, dtype=np.float32) * scale).astype(np.int64), n_cells - 1)
