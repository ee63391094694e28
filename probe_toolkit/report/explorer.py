"""The explorer's data: every row of the followed image's attention and every anchor's cosine map,
quantised to 8 bits and base64-encoded so the HTML carries them compactly and works offline.

Quantisation (what a reader of the page sees is exact up to half a step):

- attention: each row is divided by its own largest weight (kept, in ``rowMax``) and stored as
  round(255 · w / max); a map is drawn scaled to its largest weight anyway (brightest = largest);
- cosine: round(127.5 · (c + 1)) on [-1, 1], so the value 128 is a cosine of about 0;
- rankings (five largest keys of each row; the window, its top k and the crop's top 8 of each
  anchor) are computed exactly in Python (``followed``) and stored as patch indices, one byte
  each while a grid has fewer than 254 patches (two bytes, little-endian, beyond: ViT-S/8 at
  224 has 784), with the largest value of the width standing for the class token and the one
  below it for a DINOv2 register token, so the page never ranks quantised values.

Every store is drawn on its own 224 grid (``rows``, ``cols``, patch ``size`` in pixels, its own
index width and window table); the picture carries the first store's grid, which ``--patch``
and ``#patch=N`` index, and each store follows the patch under that patch's centre
(``patches.py``). DINOv2's register tokens get their own rows (``registers``), drawn as the
report's register figure draws them (Darcet et al. 2024, Fig. 9).

The page (``assets/explorer.js``) reads the JSON in ``<script id="probe-explorer-data">``.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ..analyses import selection
from . import figures
from .followed import Attention, Neighbours
from .patches import Followed
from .sources import VIEW, Picture, StoreView


def b64(array: np.ndarray | bytes) -> str:
    """uint8 data (or raw bytes) as base64 text."""
    raw = array if isinstance(array, bytes) else np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    return base64.b64encode(raw).decode("ascii")


def index_width(n_patches: int) -> int:
    """Bytes per stored patch index: 1 below 254 patches, else 2 (the top two values mark the class and register tokens)."""
    return 1 if n_patches < 254 else 2


def indices(values: np.ndarray, n_patches: int) -> str:
    """Patch indices as base64 (uint8 or little-endian uint16); negative (the class token) → the top value."""
    dtype = np.uint8 if index_width(n_patches) == 1 else np.dtype("<u2")
    top = np.iinfo(dtype).max
    values = np.asarray(values)
    return b64(np.ascontiguousarray(np.where(values == -2, top - 1, np.where(values < 0, top, values)), dtype=dtype).tobytes())


def quantise_rows(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(…, T) non-negative rows → (uint8 rows scaled to each row's maximum, the maxima)."""
    top = weights.max(-1)
    scale = np.where(top > 0, top, 1.0)
    q = np.clip(np.rint(weights / scale[..., None] * 255.0), 0, 255).astype(np.uint8)
    return q, top.astype(np.float32)


def quantise_cosine(cosine: np.ndarray) -> np.ndarray:
    return np.clip(np.rint((np.asarray(cosine, dtype=np.float32) + 1.0) * 127.5), 0, 255).astype(np.uint8)


def store_data(store: StoreView, attention: Attention | None, neighbours: Neighbours | None, note: str = "", followed: Followed | None = None) -> dict[str, Any]:
    """One store's panel: its own 224 grid (rows, cols, patch size), followed patch and window table, and its maps."""
    out: dict[str, Any] = {
        "label": store.label,
        "classToken": store.class_token,
        "registers": store.registers,
        "note": note,
        "attention": None,
        "cosine": None,
        "rows": None,
        "cols": None,
        "size": None,
        "patch": None,
        "follows": "",
    }
    if followed is not None:
        n = followed.rows * followed.cols
        out.update(
            rows=followed.rows,
            cols=followed.cols,
            size=followed.size,
            patch=followed.patch,
            follows=followed.line,
            indexBytes=index_width(n),
            window=indices(selection.window(followed.grid, wrap=True).index, n),
        )
    if attention is not None:
        heads, tokens, _ = attention.weights.shape
        q, top = quantise_rows(attention.weights)
        out.update(
            heads=heads,
            tokens=tokens,
            start=attention.start,
            attention=b64(q),
            rowMax=[float(f"{v:.4g}") for v in top.ravel()],
            top=indices(attention.ranked, attention.n_patches),
            effective=[round(float(v), 2) for v in attention.effective.ravel()],
        )
    if neighbours is not None:
        n = neighbours.cosine.shape[0]
        out.update(cosine=b64(quantise_cosine(neighbours.cosine)), k=neighbours.k, topk=indices(neighbours.topk, n), topCrop=indices(neighbours.top_crop, n))
    return out


def explorer_data(stores: list[dict[str, Any]], reference: Followed, image_id: str, picture: Picture) -> dict[str, Any]:
    """The page's data: the picture and its grid (the first store's, which ``--patch`` and ``#patch=N`` index), every store's panel."""
    return {
        "version": 2,
        "grid": [reference.rows, reference.cols],
        "size": reference.size,
        "view": VIEW,
        "patch": reference.patch,
        "image": image_id,
        "picture": ("data:image/png;base64," + b64(figures.image_png(picture.rgb))) if picture.rgb is not None else None,
        "pictureNote": picture.note,
        "lut": {"weight": b64(figures.colour_table(figures.WEIGHT_CMAP)), "cosine": b64(figures.colour_table(figures.COSINE_CMAP))},
        "stores": stores,
    }
