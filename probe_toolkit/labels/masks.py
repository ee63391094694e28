"""Patch masks → masks at each image's original size, COCO results JSON, the saved decoder results.

Geometry. The 480 view is the whole image squashed to 480 × 480 (``images.view``), so patch
(r, c) of the G × G grid (G = 30 at patch 16) covers the original rows [r·H/G, (r+1)·H/G) and
columns [c·W/G, (c+1)·W/G), whatever the aspect ratio. Upsampling is nearest: original pixel
(i, j), centred at (i + ½, j + ½), takes patch (⌊(i + ½)·G/H⌋, ⌊(j + ½)·G/W⌋). The box of a
mask for CorLoc is LOST's patch-aligned box [xmin, ymin, xmax + 1, ymax + 1] in patches, mapped
to the original image as [xmin·W/G, ymin·H/G, (xmax+1)·W/G, (ymax+1)·H/G] (continuous pixels).

The native view is the image at its own size, zero-padded at the right and bottom to a multiple
of the patch size p (TokenCut's and LOST's ``main_*.py``), so its rows × cols grid (rows = ⌈H/p⌉,
cols = ⌈W/p⌉) is the image's own: patch (r, c) covers the original pixels [r·p, (r+1)·p) ×
[c·p, (c+1)·p), clipped at the image edge, and pixel (i, j) takes patch (⌊i/p⌋, ⌊j/p⌋). Its box
is [xmin·p, ymin·p, (xmax+1)·p, (ymax+1)·p] clipped to [0, W] × [0, H], as LOST's ``detect_box``
clips it to the initial image size.

The native_crop view is the image cut at the right and bottom to whole patches (DSM's
``extract/extract.py``), rows = ⌊H/p⌋, cols = ⌊W/p⌋: patch (r, c) covers the same pixels
[r·p, (r+1)·p) × [c·p, (c+1)·p), and the last H − rows·p rows and W − cols·p columns of the image
lie under no patch, so they are 0 in every mask; its boxes lie inside the cut area.

The native_resized view is the whole image resized with LANCZOS to rows = round(H/p), cols =
round(W/p) patches (TokenCut's saliency code, ``unsupervised_saliency_detection/utils.py``), and
its masks come back as TokenCut's ``object_discovery.py`` brings them, ``F.interpolate(size=(H,
W), mode='nearest')``: pixel (i, j) takes patch (⌊i·rows/H⌋, ⌊j·cols/W⌋), the quotient taken in
float32 as torch takes it (``store.own_size.pixel_cells``; exact rationals differ on a few
borders). Its box is the pixels whose patches lie in the patch box, so box and mask agree.

One rule for the three own-size views: ``pixel_cells`` maps pixels to patches, and the box of
patches [c0, c1) is the pixels that map into it, [first pixel of c0, first pixel of c1).

Results JSON: a list of COCO results, one per mask: ``image_id`` (the panel's COCO id when a
panel was given, and then only that panel's images are listed; else the image's position in
the store), ``file_name`` (the store's image id,
which ``probe score`` uses to match a panel), ``category_id`` 1, ``segmentation`` (RLE from
pycocotools, ``counts`` a str, ``size`` [height, width]), ``bbox`` (``toBbox``, [x, y, w, h]),
``score``, ``area``, ``mask`` (its index in the image, 0 = the first cut) and ``patch_box``
(the patch-aligned box above, [x1, y1, x2, y2], which CorLoc uses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pycocotools import mask as mask_utils

from ..analyses.decoder import STOPS, Decoded, grid_of
from ..store import own_size
from ..store.plain import Results

if TYPE_CHECKING:
    import xarray as xr


def pixel_patches(size: int, grid: int) -> np.ndarray:
    """Patch index of each pixel row (or column) of an original side of ``size`` pixels."""
    return np.minimum(((np.arange(size) + 0.5) * grid / size).astype(np.int64), grid - 1)


def upsample(patch_mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """(G, G) or flat (G²,) bool → (height, width) bool, nearest (see module doc)."""
    m = np.asarray(patch_mask, dtype=bool)
    if m.ndim == 1:
        g = grid_of(m.shape[0])
        m = m.reshape(g, g)
    g = m.shape[0]
    return m.T[np.ix_(pixel_patches(int(width), g), pixel_patches(int(height), g))].T  # column-major, as RLE reads it


def on_grid(patch_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``patch_mask[rows][:, cols]`` of a (rows, cols) mask, False where an index lies past the grid
    (native_crop's strip under no patch); column-major, as RLE reads it."""
    m = np.asarray(patch_mask, dtype=bool)
    framed = np.zeros((m.shape[1] + 1, m.shape[0] + 1), dtype=bool)  # transposed, one empty row and column beyond
    framed[: m.shape[1], : m.shape[0]] = m.T
    return framed[np.ix_(np.minimum(cols, m.shape[1]), np.minimum(rows, m.shape[0]))].T


def upsample_native(patch_mask: np.ndarray, height: int, width: int, patch: int, view: str = "native") -> np.ndarray:
    """(rows, cols) bool on an own-size grid → (height, width) bool: pixel (i, j) takes the patch
    ``own_size.pixel_cells`` gives it (⌊i/p⌋ padded or cut, torch's nearest resized), and is 0
    past the grid (native_crop's uncovered right and bottom)."""
    m = np.asarray(patch_mask, dtype=bool)
    return on_grid(m, own_size.pixel_cells(height, m.shape[0], patch, view), own_size.pixel_cells(width, m.shape[1], patch, view))


def pixel_span(first: int, end: int, pixel_cells: np.ndarray) -> tuple[float, float]:
    """The original pixels [x0, x1) whose patch lies in [first, end): the side of a box drawn
    from the same mapping as the mask, so the two agree in every own-size view."""
    return float(np.searchsorted(pixel_cells, first)), float(np.searchsorted(pixel_cells, end))


def patch_box_native(patch_mask: np.ndarray, height: int, width: int, patch: int, view: str = "native") -> list[float]:
    """LOST's box of a (rows, cols) own-size mask in original pixels, [x1, y1, x2, y2]: the pixels
    mapped into its patch box. Padded, [xmin·p, (xmax+1)·p] clipped to the image as LOST's
    ``detect_box`` clips it; cut, inside the cut area; resized, where the nearest mapping puts it."""
    m = np.asarray(patch_mask, dtype=bool)
    rows, cols = np.nonzero(m)
    if rows.size == 0:
        return [0.0, 0.0, 0.0, 0.0]
    x1, x2 = pixel_span(int(cols.min()), int(cols.max()) + 1, own_size.pixel_cells(width, m.shape[1], patch, view))
    y1, y2 = pixel_span(int(rows.min()), int(rows.max()) + 1, own_size.pixel_cells(height, m.shape[0], patch, view))
    return [x1, y1, x2, y2]


def encode(mask: np.ndarray) -> dict[str, Any]:
    """COCO RLE of an (H, W) bool mask, ``counts`` as str (JSON-ready); a column-major bool mask
    (as ``upsample`` draws it) is encoded without a copy."""
    mask = np.asarray(mask)
    rle = mask_utils.encode(np.asfortranarray(mask.view(np.uint8) if mask.dtype == bool else mask.astype(np.uint8)))
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


def decode_rle(rle: dict[str, Any]) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode("ascii") if isinstance(rle["counts"], str) else rle["counts"]}).astype(bool)


def patch_box(patch_mask: np.ndarray, height: int, width: int) -> list[float]:
    """LOST's patch-aligned box of a mask, in original pixels, [x1, y1, x2, y2]."""
    m = np.asarray(patch_mask, dtype=bool)
    g = grid_of(m.size)
    rows, cols = np.nonzero(m.reshape(g, g))
    if rows.size == 0:
        return [0.0, 0.0, 0.0, 0.0]
    return [float(cols.min() * width / g), float(rows.min() * height / g), float((cols.max() + 1) * width / g), float((rows.max() + 1) * height / g)]


def coco_results(
    decoded: Decoded,
    image_ids: list[str],
    heights: np.ndarray,
    widths: np.ndarray,
    coco_ids: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """COCO results for every mask; with ``coco_ids`` only images of that map are included."""
    out = []
    for i, sid in enumerate(image_ids):
        if coco_ids is not None and sid not in coco_ids:
            continue
        h, w = int(heights[i]), int(widths[i])
        for k in range(int(decoded.n_masks[i])):
            if decoded.grids is not None:  # an own-size view: the image's own grid, its first rows·cols patches
                r, c = (int(v) for v in decoded.grids[i])
                grid_mask = decoded.masks[i, k, : r * c].reshape(r, c)
                full = upsample_native(grid_mask, h, w, decoded.patch, decoded.view)
                box_patches = patch_box_native(grid_mask, h, w, decoded.patch, decoded.view)
            else:
                full, box_patches = upsample(decoded.masks[i, k], h, w), patch_box(decoded.masks[i, k], h, w)
            rle = encode(full)
            box = mask_utils.toBbox(rle).tolist()
            out.append(
                {
                    "image_id": int(coco_ids[sid]) if coco_ids is not None else i,
                    "file_name": sid,
                    "category_id": 1,
                    "segmentation": rle,
                    "bbox": [float(v) for v in box],
                    "score": float(decoded.score[i, k]),
                    "area": float(mask_utils.area(rle)),
                    "mask": k,
                    "patch_box": box_patches,
                }
            )
    return out


def saved_masks(ds: xr.Dataset, i: int, height: int, width: int, original: tuple[int, int]) -> np.ndarray:
    """(masks, height, width) bool: image i's masks of saved ``results/decoder`` drawn at height ×
    width, through the view's geometry (``original``: the image's own (H, W), which the own-size views need)."""
    n = int(ds["n_masks"].values[i])
    patch_masks = ds["masks"].values[i, :n].astype(bool)
    if not n:
        return np.zeros((0, height, width), bool)
    if "grid_rows" not in ds:
        return np.stack([upsample(m, height, width) for m in patch_masks])
    r, c, p = int(ds["grid_rows"].values[i]), int(ds["grid_cols"].values[i]), int(ds.attrs["patch_size"])
    view = str(ds.attrs.get("view") or "native")
    h, w = original
    rows = own_size.pixel_cells(h, r, p, view)[np.minimum(((np.arange(height) + 0.5) * h / height).astype(np.int64), h - 1)]
    cols = own_size.pixel_cells(w, c, p, view)[np.minimum(((np.arange(width) + 0.5) * w / width).astype(np.int64), w - 1)]
    return np.stack([on_grid(m[: r * c].reshape(r, c), rows, cols) for m in patch_masks])


def decoder_dataset(decoded: Decoded, image_ids: list[str]) -> Results:
    """The patch-level results saved as ``results/decoder`` (dims image, mask, patch); written
    without xarray (``store.plain``), read back as an xarray Dataset."""
    variables = decoder_variables(decoded)
    if "degree" in variables and not np.isfinite(decoded.degree).any():
        del variables["degree"], variables["expansion"]
    return Results(variables, coords=decoder_coords(decoded, image_ids), attrs=decoder_attrs(decoded))


def decoder_variables(decoded: Decoded) -> dict[str, tuple[tuple[str, ...] | str, np.ndarray]]:
    """The arrays of ``results/decoder`` for these images (all or a block of them), each with its
    dimensions. LOST's degree and seed expansion per patch are among them wherever computed; the
    whole set's are saved only where some are finite (``decoder_dataset``, ``decode_keys.SavedRows``)."""
    dims2 = ("image", "mask")
    vectors = {} if decoded.fiedler is None else {"fiedler": (("image", "patch"), decoded.fiedler), "seed": ("image", decoded.seed)}
    if decoded.degree is not None:  # LOST: its degree and seed expansion per patch
        vectors.update(degree=(("image", "patch"), decoded.degree), expansion=(("image", "patch"), decoded.expansion))
    if decoded.grids is not None:  # an own-size view: masks padded to the view's most patches, each image's grid beside them
        vectors.update(grid_rows=("image", np.asarray(decoded.grids[:, 0], dtype=np.int64)), grid_cols=("image", np.asarray(decoded.grids[:, 1], dtype=np.int64)))
    return {
        **vectors,
        "masks": (("image", "mask", "patch"), decoded.masks),
        "score": (dims2, decoded.score),
        "lambda2": (dims2, decoded.lambda2),
        "lambda3": (dims2, decoded.lambda3),
        "gap": (dims2, decoded.gap),
        "ncut": (dims2, decoded.ncut),
        "n_masks": ("image", decoded.n_masks),
        "degenerate": ("image", decoded.degenerate),
        "stop": ("image", decoded.stop),
        "cuts": ("image", decoded.cuts),
        "dense_solves": ("image", decoded.dense_solves),
    }


def decoder_coords(decoded: Decoded, image_ids: list[str]) -> dict[str, np.ndarray]:
    return {"image": np.asarray(image_ids, dtype=object), "mask": np.arange(decoded.masks.shape[1])}


def decoder_attrs(decoded: Decoded) -> dict[str, Any]:
    """The masks' geometry (one grid, or each image's on an own-size view) and the stop reasons."""
    if decoded.grids is not None:
        grid_attrs = {"grid": "per image (grid_rows, grid_cols)", "view": decoded.view, "patch_size": int(decoded.patch)}
    else:
        grid_attrs = {"grid": grid_of(decoded.masks.shape[2])}
    return {**grid_attrs, "stops": list(STOPS)}


def decoded_from_dataset(ds: xr.Dataset | Results) -> Decoded:
    """The inverse of ``decoder_dataset`` (settings come from its attrs)."""
    from ..analyses.decoder_settings import Settings

    settings = Settings(**{k: v for k, v in ds.attrs.get("settings", {}).items() if k in Settings.__dataclass_fields__})
    return Decoded(
        masks=ds["masks"].values.astype(bool),
        score=ds["score"].values,
        lambda2=ds["lambda2"].values,
        lambda3=ds["lambda3"].values,
        gap=ds["gap"].values,
        ncut=ds["ncut"].values,
        n_masks=ds["n_masks"].values,
        degenerate=ds["degenerate"].values.astype(bool),
        stop=ds["stop"].values,
        dense_solves=ds["dense_solves"].values,
        cuts=ds["cuts"].values,
        settings=settings,
        fiedler=ds["fiedler"].values if "fiedler" in ds else None,
        seed=ds["seed"].values if "seed" in ds else None,
        degree=ds["degree"].values if "degree" in ds else None,
        expansion=ds["expansion"].values if "expansion" in ds else None,
        grids=np.stack([ds["grid_rows"].values, ds["grid_cols"].values], axis=1) if "grid_rows" in ds else None,
        patch=int(ds.attrs.get("patch_size", 0)),
        view=str(ds.attrs.get("view") or "native"),
    )
