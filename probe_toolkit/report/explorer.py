"""The explorer's data: every row of the followed image's attention and every anchor's cosine map,
quantised to 8 bits and base64-encoded so the HTML carries them compactly and works offline.

Quantisation (what a reader of the page sees is exact up to half a step):

- attention: each row is divided by its own largest weight (kept, in ``rowMax``) and stored as
  round(255 · w / max); a map is drawn scaled to its largest weight anyway (brightest = largest);
- cosine: round(127.5 · (c + 1)) on [-1, 1], so the value 128 is a cosine of about 0;
- rankings (five largest keys of each row; the window, its top k and the crop's top 8 of each
  anchor) are computed exactly in Python (``followed``) and stored as patch indices, 255 for the
  class token, so the page never ranks quantised values.

The page (``assets/explorer.js``) reads the JSON in ``<script id="probe-explorer-data">``.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from . import figures
from .followed import Attention, Neighbours
from .sources import Picture, StoreView

CLASS_TOKEN_KEY = 255


def b64(array: np.ndarray | bytes) -> str:
    raw = array if isinstance(array, bytes) else np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    return base64.b64encode(raw).decode("ascii")


def quantise_rows(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(…, T) non-negative rows → (uint8 rows scaled to each row's maximum, the maxima)."""
    top = weights.max(-1)
    scale = np.where(top > 0, top, 1.0)
    q = np.clip(np.rint(weights / scale[..., None] * 255.0), 0, 255).astype(np.uint8)
    return q, top.astype(np.float32)


def quantise_cosine(cosine: np.ndarray) -> np.ndarray:
    return np.clip(np.rint((np.asarray(cosine, dtype=np.float32) + 1.0) * 127.5), 0, 255).astype(np.uint8)


def dequantise_cosine(q: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) / 127.5 - 1.0


def _keys(ranked: np.ndarray) -> np.ndarray:
    return np.where(ranked < 0, CLASS_TOKEN_KEY, ranked).astype(np.uint8)


def store_data(store: StoreView, attention: Attention | None, neighbours: Neighbours | None, note: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"label": store.label, "classToken": store.class_token, "note": note, "attention": None, "cosine": None}
    if attention is not None:
        heads, tokens, _ = attention.weights.shape
        if attention.n_patches >= CLASS_TOKEN_KEY:
            raise ValueError(f"{attention.n_patches} patches do not fit the explorer's 8-bit patch index")
        q, top = quantise_rows(attention.weights)
        out.update(
            heads=heads, tokens=tokens, start=attention.start, attention=b64(q),
            rowMax=[float(f"{v:.4g}") for v in top.ravel()], top=b64(_keys(attention.ranked)),
            effective=[round(float(v), 2) for v in attention.effective.ravel()],
        )
    if neighbours is not None:
        out.update(cosine=b64(quantise_cosine(neighbours.cosine)), k=neighbours.k, topk=b64(neighbours.topk), topCrop=b64(neighbours.top_crop))
    return out


def explorer_data(stores: list[dict[str, Any]], grid: int, patch: int, image_id: str, picture: Picture, window: np.ndarray) -> dict[str, Any]:
    return {
        "version": 1,
        "grid": grid,
        "patch": patch,
        "image": image_id,
        "picture": ("data:image/png;base64," + b64(figures.image_png(picture.rgb))) if picture.rgb is not None else None,
        "pictureNote": picture.note,
        "lut": {"weight": b64(figures.colour_table(figures.WEIGHT_CMAP)), "cosine": b64(figures.colour_table(figures.COSINE_CMAP))},
        "window": b64(window),
        "stores": stores,
    }
