"""Each image's patch grid in a store: the one place readers learn rows and columns.

A view's patch arrays (``tokens_<view>``, ``keys_<view>``) hold up to the view's largest patch
count along ``patch_<view>``. Image i's patches are the first ``rows_i * cols_i`` entries,
row-major on its rows_i x cols_i grid; the rest is padding (NaN) that nothing may read. The
per-image grids live in ``grid_rows_<view>`` / ``grid_cols_<view>`` (constant for the fixed
views, one per image for the own-size views ``native``, ``native_crop``, ``native_resized``). Stores written before these arrays existed hold square
fixed views only, so their grid follows from the patch count.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..infra.errors import ProbeError
from . import layout, views

if TYPE_CHECKING:
    import xarray as xr


# views whose name holds an underscore (``store.views.JOINED``)
JOINED_VIEWS = views.JOINED


def view_of(array: str) -> str:
    """The view (with its part, ``store.layout``) an array belongs to: ``tokens_224`` -> ``224``,
    ``keys_native`` -> ``native``, ``grid_rows_native_crop`` -> ``native_crop``, ``tokens_square@1024``
    -> ``square@1024``, ``tokens_b3_224.p1`` -> ``224.p1`` (a part's flags and grids are its own)."""
    return layout.unit_of(array)


def views_in(ds: xr.Dataset) -> list[str]:
    """The views a store holds, from its manifest."""
    return [str(v) for v in ds.attrs.get("manifest", {}).get("views", [])]


def view_grid(ds: xr.Dataset, view: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-image (rows, cols) of ``view`` for the images of ``ds``, as int64 arrays."""
    view = str(view)
    rows, cols = f"grid_rows_{view}", f"grid_cols_{view}"
    if rows in ds and cols in ds:
        return ds[rows].values.astype(np.int64), ds[cols].values.astype(np.int64)
    dim = f"patch_{view}"
    if dim not in ds.dims:
        from .cache import extract_into

        raise ProbeError(ds.attrs.get("store"), f"holds no {view} view", f"add it: `{extract_into(ds, view)}`")
    n = int(ds.sizes[dim])
    side = math.isqrt(n)
    if side * side != n:
        raise ProbeError(ds.attrs.get("store"), f"has {n} patches in the {view} view and no grid arrays", "extract the store again with this version")
    count = ds.sizes.get("image", 0)
    return np.full(count, side, dtype=np.int64), np.full(count, side, dtype=np.int64)


def fixed_grid(ds: xr.Dataset, view: str) -> tuple[int, int]:
    """The one (rows, cols) every image of ``view`` shares; an error for a view whose grid varies."""
    rows, cols = view_grid(ds, view)
    pairs = set(zip(rows.tolist(), cols.tolist()))
    if len(pairs) > 1:
        raise ProbeError(ds.attrs.get("store"), f"has {len(pairs)} different grids in the {view} view", "read it image by image with grids.image_patches")
    if not pairs:
        n = int(ds.sizes.get(f"patch_{view}", 0))
        side = math.isqrt(n)
        return side, side
    return pairs.pop()


def image_patches(values: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Image i's valid patches from its row of a patch array: (rows, cols, ...), padding dropped."""
    n = int(rows) * int(cols)
    if n > values.shape[0]:
        raise ValueError(f"a {rows} x {cols} grid does not fit {values.shape[0]} patches")
    return values[:n].reshape(int(rows), int(cols), *values.shape[1:])


def valid_mask(rows: np.ndarray, cols: np.ndarray, n_patches: int) -> np.ndarray:
    """(image, patch) bool: which entries along the patch dimension are real patches."""
    return np.arange(n_patches)[None, :] < (np.asarray(rows) * np.asarray(cols))[:, None]
