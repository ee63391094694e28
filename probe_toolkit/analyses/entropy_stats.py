"""``probe entropy`` from the attention statistics (``probe extract --attention stats``), without any
T × T map: at any view, own sizes and 1024-2048 px included.

The statistics are per block, head and query (``store.attention_stats``: each row's entropy over
every key in nats, and each patch query's mean attention distance over the patch keys); this module
takes each image's valid queries (an own-size view's arrays are padded past its grid) and gives the
summaries ``analyses.entropy`` gives from explicit maps, under the same names: the chosen block's
(the last by default) ``patch_entropy``, ``patch_effective`` (mean e^H), ``distance``,
``cls_entropy``, ``cls_effective``, and every block's as ``block_*``; e^H / T divides by each
image's own T. The statistics are float32 of a float64 softmax where the maps are float16 in a
store, so the two paths agree to the maps' rounding (``tests/test_entropy_stats.py``). No --patch
detail: a patch's five largest weights need its row, which statistics do not keep.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..infra import runner
from .entropy import summarise
from .stats import Bootstrap

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreArray
    from ..store.plain import Results


def _chunk(entropy: np.ndarray, distance: np.ndarray, rows: np.ndarray, cols: np.ndarray, *, class_token: bool, registers: int, block: int) -> dict[str, np.ndarray]:
    """Per image of a block of images: every block's summaries over its valid queries, and the chosen block's."""
    prefix = int(class_token) + registers
    n, blocks, heads = entropy.shape[:3]
    out = {name: np.empty((n, blocks, heads), dtype=np.float32) for name in ("block_patch_entropy", "block_patch_effective", "block_distance")}
    for i in range(n):
        patches = int(rows[i]) * int(cols[i])
        h = entropy[i, :, :, prefix : prefix + patches].astype(np.float32)
        out["block_patch_entropy"][i] = h.mean(-1)
        out["block_patch_effective"][i] = np.exp(h).mean(-1)
        out["block_distance"][i] = distance[i, :, :, :patches].astype(np.float32).mean(-1)
    if class_token:
        out["block_cls_entropy"] = entropy[:, :, :, 0].astype(np.float32)
        out["block_cls_effective"] = np.exp(out["block_cls_entropy"])
    for name in list(out):
        out[name[len("block_") :]] = np.ascontiguousarray(out[name][:, block])
    return out


def entropy_from_statistics(
    entropy: xr.DataArray | StoreArray,
    distance: xr.DataArray | StoreArray,
    rows: xr.DataArray | StoreArray,
    cols: xr.DataArray | StoreArray,
    *,
    class_token: bool,
    registers: int = 0,
    block: int = -1,
    boot: Bootstrap = Bootstrap(),
    run_blocks: Callable[..., dict[str, np.ndarray]] | None = None,
) -> Results:
    """Entropy and distance summaries from a store's statistics: ``entropy`` (image, block, head,
    query), ``distance`` (image, block, head, patch), each image's grid ``rows`` and ``cols``;
    ``block`` the block the plain names summarise (0-based; -1 the last)."""
    depth = int(entropy.shape[1])
    chosen = block % depth
    fn = functools.partial(_chunk, class_token=class_token, registers=registers, block=chosen)
    per_image = (run_blocks or runner.per_image())(fn, {"entropy": entropy, "distance": distance, "rows": rows, "cols": cols})
    grid_rows, grid_cols = np.asarray(rows.values, dtype=np.int64), np.asarray(cols.values, dtype=np.int64)
    keys = grid_rows * grid_cols + int(class_token) + registers
    fixed = bool(keys.size) and bool((keys == keys[0]).all())
    n_keys = int(keys[0]) if fixed else keys
    same = fixed and bool((grid_rows == grid_rows[0]).all() and (grid_cols == grid_cols[0]).all())
    attrs = dict(
        n_keys=n_keys if fixed else -1,
        n_patches=int(keys[0]) - int(class_token) - registers if fixed else -1,
        grid=(int(grid_rows[0]) if grid_rows[0] == grid_cols[0] else [int(grid_rows[0]), int(grid_cols[0])]) if same else "per image",
        grid_rows=int(grid_rows[0]) if same else -1,
        grid_cols=int(grid_cols[0]) if same else -1,
        class_token=bool(class_token),
        registers=int(registers),
        patch=-1,
        blocks=True,
        source="attention statistics (probe extract --attention stats): float32 of a float64 softmax, no T x T map",
        summarised_block=int(chosen),
    )
    coords = {"block": np.arange(1, depth + 1)}  # counted from 1, as the explicit maps' block summaries are
    return summarise(per_image, entropy, n_keys, class_token, boot, coords, attrs)
