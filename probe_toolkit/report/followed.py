"""The followed image in one store, prepared once for the figures, the tables and the explorer.

Drawing a map needs a little arithmetic on one image's stored arrays; it is done here, once,
with the analyses' own functions so a picture can never disagree with a result:

- attention: each row's e^H (``entropy.effective_number``) and its five largest keys, ranked
  like ``entropy.patch_detail`` (stable sort of the float32 weights: ties to the lower key);
- neighbours: the cosine of the tokens (``selection.cosine``), SelfPatch's window with its
  wrap-around (``selection.window``), the window's top k (``selection.window_topk``) and the
  crop's most similar patches (``selection.most_similar``), the very code ``probe neighbours``
  and ``training/`` use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analyses import selection
from ..analyses.entropy import TOP_WEIGHTS, effective_number
from ..store import grids
from .sources import StoreView

TOP_CROP = 8  # the crop's 8 most similar patches, as the premise statistics count them
DEFAULT_K = 4  # SelfPatch's positives per anchor


@dataclass
class Attention:
    """Last-block attention of one image: ``weights`` (head, T, T) over every token."""

    weights: np.ndarray
    start: int  # tokens before the patches: 1 for the class token, plus DINOv2's registers
    effective: np.ndarray  # (head, T) e^H of every row
    ranked: np.ndarray  # (head, T, 5) the five largest keys of every row, as patch indices (-1: class token, -2: register)
    registers: int = 0

    @property
    def n_patches(self) -> int:
        return self.weights.shape[-1] - self.start

    def patch_rows(self, query: int) -> np.ndarray:
        """(head, N) weights of row ``query`` (a token index) on the patch keys."""
        return self.weights[:, query, self.start :]

    def cls_weight(self, query: int) -> np.ndarray | None:
        return self.weights[:, query, 0] if self.start > self.registers else None


def ranked_keys(weights: np.ndarray, start: int, top: int = TOP_WEIGHTS, registers: int = 0) -> np.ndarray:
    """The ``top`` largest keys of every row (…, T), largest first, ties to the lower key; patch indices
    (-1 the class token, -2 a register, as ``entropy.patch_detail`` names them)."""
    order = np.argsort(-np.asarray(weights, dtype=np.float32), axis=-1, kind="stable")[..., :top]
    cls = start - registers
    return np.where(order < cls, -1, np.where(order < start, -2, order - start))


def attention(store: StoreView, image_id: str, array: str = "attention_224") -> Attention | None:
    if not store.has(array, image_id):
        return None
    weights = store.image_values(array, image_id)
    start = store.prefix
    return Attention(weights, start, effective_number(weights), ranked_keys(weights, start, registers=store.registers), store.registers)


@dataclass
class Blocks:
    """The followed patch's row in every block: ``rows`` (block, head, N), ``effective`` (block, head)."""

    rows: np.ndarray
    effective: np.ndarray
    blocks: list[int]


def blocks(store: StoreView, image_id: str, patch: int) -> Blocks | None:
    if not store.has("attention_blocks_224", image_id):
        return None
    start = store.prefix
    array = store.array("attention_blocks_224").sel(image=image_id).isel(query=start + patch)
    rows = np.asarray(array.values, dtype=np.float32)  # (block, head, T)
    labels = [int(b) for b in array["block"].values] if "block" in array.coords else list(range(1, rows.shape[0] + 1))
    return Blocks(rows[..., start:], effective_number(rows), labels)


@dataclass
class Neighbours:
    """Token cosines of one image and SelfPatch's window selections for every anchor."""

    cosine: np.ndarray  # (N, N)
    window: np.ndarray  # (N, 8) the 3×3 window's patches, with the wrap
    topk: np.ndarray  # (N, k) the window's k most similar, most similar first
    top_crop: np.ndarray  # (N, 8) the crop's 8 most similar other patches
    k: int
    grid: int | tuple[int, int]  # the store's 224 grid (store/grids.py): its side, (rows, cols) were it not square


def neighbours(store: StoreView, image_id: str, k: int = DEFAULT_K) -> Neighbours | None:
    if not store.has("tokens_224", image_id):
        return None
    rows, cols = grids.fixed_grid(store.ds, "224")
    tokens = store.image_values("tokens_224", image_id)[: rows * cols][None]
    grid = int(rows) if rows == cols else (int(rows), int(cols))
    sim = selection.cosine(tokens)
    table = selection.window(grid, wrap=True)
    chosen = selection.window_topk(None, grid, k, wrap=True, similarity=sim)
    crop = selection.most_similar(sim, TOP_CROP)
    return Neighbours(sim[0], table.index, chosen.index[0], crop[0], k, grid)


def k_record(store: StoreView):
    """The store's own neighbours result of the 224 tokens that holds a k (None: none); only that one is read."""
    for name in sorted(store.results):
        found = dict.get(store.results, name)  # looked at, not read: the record the caller uses is read below
        if name.startswith("neighbours_g") and found.attrs.get("array") == "tokens_224" and "k" in found.attrs:
            return store.result(name)
    return None


def store_k(store: StoreView) -> int:
    """The k of the store's own neighbours result (``--k``), else SelfPatch's 4."""
    found = k_record(store)
    return int(found.attrs["k"]) if found is not None else DEFAULT_K
