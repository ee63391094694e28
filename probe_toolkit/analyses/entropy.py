"""How spread is each attention row? Entropy, its exponent, and mean attention distance.

For a softmax row a over the keys, H = −Σ a ln a in nats (0 · ln 0 = 0),
computed from the stored rows as they are (float16 rows sum to 1 within ~1e-3; no
renormalisation; each float16 weight's term −a ln a comes from a table made in float64), and e^H, the number of equally weighted tokens that would be as spread:
ln T and T for a uniform row over T keys, 0 and 1 for a one-hot row.

Rows and keys. The stored rows are full softmax rows over every token of the network
(``attention_224``: query and key cover T = P + N tokens, the P prefix tokens first: the class
token when the network has one, then DINOv2's R register tokens; T = N without either, e.g.
196 at ViT-S/16, 784 at ViT-S/8). A patch row's entropy is taken over all T keys, the class
token's and the registers' columns included, because that is the distribution the network used;
the share e^H / T divides by the same T (the row's length). The class token's own row (query 0)
is summarised separately and never mixed into the patch rows; register rows are not patch rows.

Mean attention distance (Dosovitskiy et al. 2021; the textbook's Eq. 11.5.3): for a patch
query i, Σ_j a_ij ‖u_i − u_j‖ / Σ_j a_ij over patch keys j only (the prefix is excluded as
query and as key and the row renormalised over the patches), u the patch centres, Euclidean, in
patch units (× 16 for pixels at ViT-S/16); averaged over the queries of a head and image. The
patches lie on the view's grid, square (G × G) or rectangular (rows × cols, patch i at row
i // cols, column i % cols), so a row-major rectangle is measured on its own rows and columns.

Results (``probe entropy`` saves them as ``results/entropy`` in the store):

  per image:  patch_entropy, patch_effective, distance                 (image, head)
              cls_entropy, cls_effective                               (image, head)  with a class token
              block_patch_entropy, block_patch_effective, block_distance,
              block_cls_effective                                      (image, block, head)  with all blocks
              detail_effective (image, head), detail_weight and detail_key (image, head, rank)
              and detail_block_* with ``block``: the followed patch (``--patch``), its row's
              e^H and five largest weights; a key is a patch index, -1 for the class token,
              -2 for a register token
  over set:   set_<name> (head) or (block, head): the mean over images of each per-image array;
              set_patch_share, set_cls_share (head): set mean e^H / T
              summary_mean, summary_low, summary_high (statistic): the head-averaged statistics
              (patch_entropy, patch_effective, patch_share, distance, cls_*) with a seeded
              percentile-bootstrap interval over images
  attrs:      n_keys (T), n_patches (N), grid (G, or [rows, cols]), grid_rows, grid_cols, class_token, registers, patch, n_boot, seed, level

The arithmetic is numpy's (so ``probe entropy`` never imports torch, whose start-up ``benchmarks/startup.py`` measures); the
functions take numpy arrays or CPU torch tensors and return numpy arrays. Float32 means and sums
are numpy's pairwise sums, which may round in the last bit where torch's reductions (used before)
rounded otherwise: results agree with them to float32 precision (``tests/test_entropy.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..infra import runner
from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from ..store.plain import Results
from .grid import grid_distance, grid_shape, grid_side
from .stats import Bootstrap

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreArray

TOP_WEIGHTS = 5  # each head's five largest weights are listed and outlined


@functools.lru_cache(maxsize=1)
def _float16_terms() -> np.ndarray:
    """−x ln x for every float16 bit pattern, computed in float64, stored as float32."""
    x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    with np.errstate(all="ignore"):
        terms = np.where(x > 0, -x * np.log(x), np.where(x == 0, 0.0, np.nan))
    return terms.astype(np.float32)


def row_entropy(rows) -> np.ndarray:
    """H = −Σ a ln a over the last axis, in nats, float32; zeros contribute 0.

    Stored rows are float16, which has only 65,536 values: their terms −a ln a are looked up
    in a table computed once in float64 (exact to float32, and faster than a logarithm per
    weight); other inputs are computed in float32 (0 · ln 0 = 0, as ``xlogy``).
    """
    rows = np.asarray(rows)
    if rows.dtype == np.float16:
        terms, bits = _float16_terms(), rows.view(np.uint16)
        if bits.ndim < 3:
            return np.asarray(np.take(terms, bits).sum(-1, dtype=np.float32))
        # one leading slice at a time: the float32 terms of a whole chunk are never held at once
        out = np.empty(bits.shape[:-1], dtype=np.float32)
        for i in range(bits.shape[0]):
            out[i] = np.take(terms, bits[i]).sum(-1, dtype=np.float32)
        return out
    a = rows.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(a == 0, np.float32(0), a * np.log(a))
    return np.asarray(-terms.sum(-1))


def effective_number(rows) -> np.ndarray:
    """e^H: how many equally weighted keys would be as spread as the row."""
    return np.exp(row_entropy(rows))


def attention_distance(attention, class_token: bool, registers: int = 0, grid: int | tuple[int, int] | None = None) -> np.ndarray:
    """Mean attention distance (…, head) of attention (…, head, T, T), patch units; see module doc.

    ``grid``: the patches' grid, its side G or (rows, cols) for a rectangular one (patch i at row
    i // cols, column i % cols); by default the square grid of the patch count.
    """
    a = np.asarray(attention).astype(np.float32)
    start = int(class_token) + registers
    patches = a[..., start:, start:]
    if grid is None:
        grid = grid_side(patches.shape[-1], "attention")
    rows, cols = grid_shape(grid)
    if rows * cols != patches.shape[-1]:
        raise ProbeError("attention", f"has {patches.shape[-1]} patch keys, not the {rows} × {cols} grid's {rows * cols}", "pass the grid the rows were computed on")
    distance = grid_distance((rows, cols), "euclidean", torus=False)
    weighted = np.einsum("...qk,qk->...q", patches, distance)  # one fused pass
    return (weighted / patches.sum(-1)).mean(-1)


def row_statistics(attention, class_token: bool, registers: int = 0, grid: int | tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Per head means of one block's attention (…, head, T, T): entropy, e^H, distance (on ``grid``), CLS row."""
    start = int(class_token) + registers
    entropy = row_entropy(attention)  # (…, head, T)
    out = {
        "patch_entropy": entropy[..., start:].mean(-1),
        "patch_effective": np.exp(entropy[..., start:]).mean(-1),
        "distance": attention_distance(attention, class_token, registers, grid),
    }
    if class_token:
        out["cls_entropy"] = entropy[..., 0]
        out["cls_effective"] = np.exp(entropy[..., 0])
    return out


def patch_detail(attention, patch: int, class_token: bool, top: int = TOP_WEIGHTS, registers: int = 0) -> dict[str, np.ndarray]:
    """One patch's row in every head (…, head, T, T): its e^H and ``top`` largest weights.

    Keys come back as patch indices (-1 for the class token, -2 for a register); ties go to the lower key.
    """
    a = np.asarray(attention).astype(np.float32)
    start = int(class_token) + registers
    n_patches = a.shape[-1] - start
    if not 0 <= patch < n_patches:
        raise SettingError("patch", f"patch {patch} is outside 0..{n_patches - 1}", "pick one of the grid's patches")
    row = a[..., start + patch, :]
    order = np.argsort(-row, axis=-1, kind="stable")[..., :top]  # descending, the lower key first on ties
    return {
        "detail_effective": effective_number(row),
        "detail_weight": np.take_along_axis(row, order, axis=-1),
        "detail_key": _key_names(order, int(class_token), start),
    }


def _key_names(index: np.ndarray, cls: int, start: int) -> np.ndarray:
    """Token index → patch index; the class token → -1, a register → -2."""
    out = index - start
    out = np.where((index >= cls) & (index < start), -2, out)
    return np.where(index < cls, -1, out)


def _chunk(
    attention: np.ndarray, blocks: np.ndarray | None = None, *, class_token: bool, patch: int | None, registers: int = 0, grid: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    a = np.asarray(attention)
    out = row_statistics(a, class_token, registers, grid)
    if patch is not None:
        out.update(patch_detail(a, patch, class_token, registers=registers))
    if blocks is not None:
        per_block: dict[str, list[np.ndarray]] = {}
        for b in range(blocks.shape[1]):
            block = np.ascontiguousarray(blocks[:, b])
            found = row_statistics(block, class_token, registers, grid)
            if patch is not None:
                found.update(patch_detail(block, patch, class_token, registers=registers))
            for name, value in found.items():
                per_block.setdefault(name, []).append(value)
        for name, values in per_block.items():
            prefix, rest = ("detail_block_", name[len("detail_") :]) if name.startswith("detail_") else ("block_", name)
            out[prefix + rest] = np.stack(values, axis=1)
    return {name: np.asarray(value) for name, value in out.items()}


def _dims(name: str) -> tuple[str, ...]:
    dims = ["image"]
    if name.startswith(("block_", "detail_block_")):
        dims.append("block")
    dims.append("head")
    if name.endswith(("_weight", "_key")):
        dims.append("rank")
    return tuple(dims)


def entropy(
    attention: xr.DataArray | StoreArray,
    *,
    class_token: bool,
    registers: int = 0,
    blocks: xr.DataArray | StoreArray | None = None,
    patch: int | None = None,
    grid: int | tuple[int, int] | None = None,
    boot: Bootstrap = Bootstrap(),
    run_blocks: Callable[..., dict[str, np.ndarray]] | None = None,
) -> Results:
    """Entropy and distance summaries of a store's attention (image, head, query, key), by chunks;
    a ``store.plain.Results`` (``.to_xarray()`` for a Dataset), saved in xarray's layout.

    ``grid``: the view's patch grid, G or (rows, cols) (``store.grids.fixed_grid``); by default the
    square grid of the patch count. ``boot``: the summary's bootstrap over images. ``run_blocks``: where the per-image block function runs
    (``infra.runner.per_image``); by default in this process, a store chunk at a time.
    """
    if attention.ndim != 4 or attention.shape[-1] != attention.shape[-2]:
        raise ProbeError(attention.name, f"has shape {attention.shape}", "pass (image, head, query, key) attention")
    n_keys = attention.shape[-1]
    n_patches = n_keys - int(class_token) - registers
    rows, cols = grid_shape(grid if grid is not None else grid_side(n_patches, str(attention.name)))
    if rows * cols != n_patches:
        raise ProbeError(attention.name, f"has {n_patches} patch keys, not the {rows} × {cols} grid's {rows * cols}", "pass the grid the store holds")
    arrays = {"attention": attention}
    if blocks is not None:
        arrays["blocks"] = blocks
    fn = functools.partial(_chunk, class_token=class_token, patch=patch, registers=registers, grid=(rows, cols))
    per_image = (run_blocks or runner.per_image())(fn, arrays)  # in this process unless told

    coords = {"block": blocks.coords["block"].values if "block" in blocks.coords else np.arange(1, blocks.shape[1] + 1)} if blocks is not None else {}
    attrs = dict(
        n_keys=n_keys,
        n_patches=n_patches,
        grid=rows if rows == cols else [rows, cols],
        grid_rows=rows,
        grid_cols=cols,
        class_token=bool(class_token),
        registers=int(registers),
        patch=-1 if patch is None else int(patch),
        blocks=blocks is not None,
    )
    return summarise(per_image, attention, n_keys, class_token, boot, coords, attrs, detail=patch is not None)


def summarise(per_image: dict[str, np.ndarray], source, n_keys, class_token: bool, boot: Bootstrap, coords: dict, attrs: dict, detail: bool = False) -> Results:
    """The set's means, shares and bootstrap summary of per-image statistics (``entropy``'s and
    ``entropy_stats``'s): ``n_keys`` the rows' length T, one number or one per image (an own-size view)."""
    keys = np.asarray(n_keys, dtype=np.float64)
    data: dict[str, tuple] = {}
    for name, values in per_image.items():
        data[name] = (_dims(name), values)
    for name, values in per_image.items():
        if not name.startswith("detail_"):
            data[f"set_{name}"] = (_dims(name)[1:], values.mean(0))

    def shares(values: np.ndarray, axis: int) -> np.ndarray:
        """The mean of e^H / T along ``axis``: T one number (divided after the mean, as ever), or each image's own."""
        if not keys.ndim:
            return values.mean(axis) / n_keys
        per = values / keys.reshape((-1,) + (1,) * (values.ndim - 1)).astype(values.dtype)
        return per.mean(axis)

    for prefix in ("", "block_"):
        for kind in ("patch", "cls"):
            if f"{prefix}{kind}_effective" in per_image:
                data[f"set_{prefix}{kind}_share"] = (_dims(f"{prefix}{kind}_effective")[1:], shares(per_image[f"{prefix}{kind}_effective"], 0))
    summary = {
        "patch_entropy": per_image["patch_entropy"].mean(1),
        "patch_effective": per_image["patch_effective"].mean(1),
        "patch_share": shares(per_image["patch_effective"], 1),
        "distance": per_image["distance"].mean(1),
    }
    if class_token:
        summary.update(
            cls_entropy=per_image["cls_entropy"].mean(1),
            cls_effective=per_image["cls_effective"].mean(1),
            cls_share=shares(per_image["cls_effective"], 1),
        )
    summarised, images, described = boot.summary(source, np.stack(list(summary.values()), axis=1))
    data.update(summarised)
    coords = {"image": images, "head": np.arange(per_image["patch_entropy"].shape[1]), "statistic": list(summary), **coords}
    if detail:
        coords["rank"] = np.arange(1, TOP_WEIGHTS + 1)
    attrs = dict(attrs, entropy_unit="nats", distance_unit="patches (Euclidean between patch centres; times the patch size for pixels)", **described)
    return Results(data, coords=coords, attrs=attrs)
