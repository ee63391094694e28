"""``probe attention-masks STORE [--panel NAME]``: DINO's 60 % attention masks, scored by Jaccard.

Reads the store's 224 view: the last block's attention (``attention_224``) for the class-token
row and the mean of the patch rows, or the patch tokens (``tokens_224``) for SelfPatch's
aggregation head, whose weights come from the store's checkpoint (``store.parts``). Masks are
made for every finished image, without a label; with ``--panel`` the panel's labels are read
through the ledger (purpose ``attention-masks: score``) and each image's masks are compared with
its objects in the same 224 view: every COCO instance (crowd regions left out) carried into the
view by the view's own resize and crop (each view pixel takes the object under its centre);
objects with no pixel in the view, and images left with none, are not scored (counted).

Resolution: masks nearest-upsampled by the patch size onto the view (224 × 224 at /16 and /14).
DINO's script squashes the image to 480 × 480 instead; its paper's evaluation code is private.

Results ``results/attention_masks``:

    mask               (image, head, patch)   uint8, the kept patches (the class token's row over the patches)
    storage_mask       (image, storage, head, patch)  uint8, each storage (register) token's own row, the same rule
    prefix_mass        (image, head, token, key)      where the class and storage tokens look: their attention on
                                                      each of them and (key "patches") on the patches together
    jaccard            (image, head)          IoU with the union of the objects (NaN: not scored)
    best               (image)                best head per image (union)
    per_object         (image)                dino #54: best head per object, mean over objects
    jaccard_mean (head), best_mean, per_object_mean: means over the scored images
    attrs: row (cls | aggregation | mean), mass, resolution, panel, ledger, counts, looks (means by token), provenance
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analyses import attention_masks as am
from ..analyses.linear import view_labels
from ..infra.errors import ProbeError
from ..infra.runner import Where, map_images
from ..infra.settings import SettingError
from ..labels.panels import read_labels
from ..protocols.attention_masks import AttentionMasksSettings
from ..protocols.context import Inputs, RunContext, Saving
from ..results.masks_report import RESOLUTION, ROW_TEXT, MasksReport
from ..store import cache, images, parts
from .runs import result_provenance

if TYPE_CHECKING:
    from ..store.direct import StoreData

VIEW = 224


def choose_row(row: str, meta: dict[str, Any], store: Path) -> tuple[str, dict | None]:
    """The row ``auto`` stands for on this network (and SelfPatch's head where it is read), or a refusal naming what the network lacks."""
    token = bool(meta.get("arch", {}).get("class_token"))
    if row == "cls" and not token:
        raise SettingError(
            "row",
            requirement="aggregation (SelfPatch's ca_head) or mean on this store",
            value=row,
            example="mean",
            why=f"{store} has no class token, so no class-token attention",
        )
    head = None
    if row == "aggregation" or (row == "auto" and not token):  # asked for by name, whatever the class token
        head = parts.aggregation_head(meta, store)
        if row == "aggregation" and head is None:
            raise SettingError(
                "row",
                requirement=f"{'cls (its class token) or ' if token else ''}mean on this store",
                value=row,
                example="cls" if token else "mean",
                why=f"{store} comes from a checkpoint without SelfPatch's aggregation head (ca_head)",
            )
    if row == "auto":
        row = "cls" if token else ("aggregation" if head is not None else "mean")
    return row, head


def grid_of(ds: StoreData, n_patches: int) -> tuple[int, int]:
    """The 224 view's (rows, cols), from the store's grid arrays when it has them, else square."""
    if "grid_rows_224" in ds and ds.sizes.get("image", 0):
        return int(ds["grid_rows_224"].values[0]), int(ds["grid_cols_224"].values[0])
    side = int(round(n_patches**0.5))
    if side * side != n_patches:
        raise ProbeError(ds.attrs.get("store"), f"holds {n_patches} patches at 224, not a square grid", "re-extract with probe extract --views 224")
    return side, side


def masks_of_store(
    ds: StoreData,
    row: str,
    head: dict | None,
    mass: float,
    heads: int,
    progress: Callable[[int], None] | None = None,
    where: Where = Where(),
    image_range: tuple[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """``mask`` (image, head, patch) bool masks of every image, block by block through the runner: blocks of
    the store's chunk whatever the worker count, so the masks are the same bits on any placement;
    with storage tokens and the class row, ``storage_mask`` and ``prefix_mass`` too (``am.masks_block``)."""
    name = "tokens_224" if row == "aggregation" else "attention_224"
    array = cache.require(ds, name)
    arch = ds.attrs["manifest"].get("arch", {})
    prefix = int(bool(arch.get("class_token"))) + int(arch.get("registers", 0))  # the class token, then DINOv2's registers
    if ds.sizes["image"] == 0:
        return {"mask": np.zeros((0, heads, 0), bool)}
    fn = functools.partial(am.masks_block, row=row, head=head, heads=heads, prefix=prefix, mass=mass)
    block = int(ds.attrs["manifest"].get("chunk") or 16)
    out = map_images(fn, {"values": array}, where=where, block=block, fixed=True, progress=progress, image_range=image_range, torch_free=row != "aggregation")
    return {name: values.astype(bool) if name.endswith("mask") else values for name, values in out.items()}


DIMS = {"mask": ("image", "head", "patch"), "storage_mask": ("image", "storage", "head", "patch"), "prefix_mass": ("image", "head", "token", "key")}


def prefix_names(registers: int) -> list[str]:
    """The prefix tokens as the result names them: the class token, then each storage (register) token."""
    return ["class", *(f"storage {i + 1}" for i in range(registers))]


def shard_masks(
    ds: StoreData, store: Path, shard: tuple[int, int], row: str, head: dict | None, mass: float, heads: int, progress: Callable[[int], None] | None, where: Where
) -> tuple[dict[str, np.ndarray] | None, list[int]]:
    """This shard's masks saved as a part; (every image's masks, []) once all parts are in."""
    from . import shards

    ids = [str(i) for i in ds["image"].values]
    which, (a, b) = shards.share(shard, len(ids), int(ds.attrs["manifest"].get("chunk") or 16))
    arrays = masks_of_store(ds, row, head, mass, heads, progress, where, (a, b)) if b > a else {"mask": np.zeros((0, heads, 0), bool)}
    import xarray as xr

    part = xr.Dataset({name: (DIMS[name], values.astype(np.uint8) if name.endswith("mask") else values) for name, values in arrays.items()}, coords={"image": ids[a:b]})
    identity = {"row": row, "mass": float(mass), "images_sha256": shards.images_sha256(ids)}
    whole, missing = shards.gather(store, "attention_masks", which, part, identity)
    if whole is None:
        return None, missing
    return {name: whole[name].values.astype(bool) if name.endswith("mask") else whole[name].values for name in whole.data_vars}, missing


def view_objects(coco: Any, image_id: int, width: int, height: int) -> np.ndarray:
    """(object, 224, 224) bool: every non-crowd instance carried into the 224 view."""
    geometry = images.geometry(width, height, VIEW)
    masks = []
    for ann in coco.imgToAnns.get(image_id, []):
        if ann.get("iscrowd", 0):
            continue
        carried = view_labels(coco.annToMask(ann).astype(np.int16), geometry).astype(bool)
        if carried.any():
            masks.append(carried)
    return np.stack(masks) if masks else np.zeros((0, VIEW, VIEW), bool)


def run(inputs: Inputs, settings: AttentionMasksSettings, context: RunContext) -> MasksReport:
    """Masks of every finished image (where the context places the blocks; a shard computes its
    share, ``commands.shards``), saved; scored by Jaccard on the panel when one is given (by the
    shard that completes the set)."""
    store, mass = inputs.store, float(settings.mass)
    ds = cache.open_store(store, allow_partial=settings.partial, plain=True)  # zarr alone: xarray is imported once the masks are made
    meta = cache.manifest(ds)
    row, head = choose_row(settings.row, meta, store)
    cache.require(ds, "tokens_224" if row == "aggregation" else "attention_224")
    heads = int(meta.get("arch", {}).get("heads", 1))
    patch = int(meta.get("arch", {}).get("patch", 16))
    with context.placed() as where:
        progress = context.task("masks", ds.sizes["image"])
        if not context.sharded:
            arrays = masks_of_store(ds, row, head, mass, heads, progress, where)
        else:
            arrays, missing = shard_masks(ds, store, context.shard(), row, head, mass, heads, progress, where)
            if arrays is None:  # a shard that finished before the others
                return context.finish(MasksReport(store, row, mass, ds.sizes["image"], 0, waiting=missing))
    masks = arrays["mask"]
    n, h, p = masks.shape
    rows, cols = grid_of(ds, p)
    ids = [str(i) for i in ds["image"].values]
    data = {"mask": (("image", "head", "patch"), masks.astype(np.uint8))}
    report = MasksReport(store, row, mass, n, 0)
    tokens = prefix_names(int(meta.get("arch", {}).get("registers", 0)))
    if "prefix_mass" in arrays and n:  # storage (register) tokens: their own masks, and where every prefix token looks
        data["storage_mask"] = (DIMS["storage_mask"], arrays["storage_mask"].astype(np.uint8))
        data["prefix_mass"] = (DIMS["prefix_mass"], arrays["prefix_mass"].astype(np.float32))
        every = np.concatenate([masks[:, None], arrays["storage_mask"]], axis=1)  # (image, prefix, head, patch)
        report.looks = {name: [float(v) for v in values] for name, values in am.looks(arrays["prefix_mass"], every).items()}
        report.looks["token"] = tokens
    attrs: dict[str, Any] = {
        "row": row,
        "row_text": ROW_TEXT[row],
        "mass": mass,
        "resolution": RESOLUTION,
        "grid": [rows, cols],
        "patch": patch,
        "source": "facebookresearch/dino visualize_attention.py; Jaccard rules: dino issue #54",
    }
    if inputs.panel is not None:
        read = context.read("panel", read_labels, purpose="attention-masks: score", checkpoint=(meta.get("checkpoint") or {}).get("sha256"), images=ids)
        union = np.full((n, h), np.nan)
        best = np.full(n, np.nan)
        per_object = np.full(n, np.nan)
        widths, heights = ds["image_width"].values.astype(int), ds["image_height"].values.astype(int)
        objects_seen = 0
        for i, sid in enumerate(ids):
            if sid not in read.image_map:
                continue
            cid = read.image_map[sid]
            record = read.coco.imgs[cid]
            if (int(record.get("width", -1)), int(record.get("height", -1))) != (widths[i], heights[i]):
                raise ProbeError(
                    read.panel.annotations,
                    f"says {sid} is {record.get('width')}×{record.get('height')}, the image is {widths[i]}×{heights[i]}",
                    "fix the annotation file's width and height",
                )
            objects = view_objects(read.coco, cid, widths[i], heights[i])
            if not len(objects):
                continue
            objects_seen += len(objects)
            score = am.jaccard(am.upsample(masks[i], rows, cols, patch), objects)
            union[i], best[i], per_object[i] = score.union, score.best_union, score.per_object
        scored = int(np.isfinite(best).sum())
        if scored == 0:
            raise ProbeError(
                read.panel.annotations, f"has no object inside the 224 view of any of the store's {n} images", "score on a panel whose images the store holds"
            )
        data.update(
            {
                "jaccard": (("image", "head"), union),
                "best": ("image", best),
                "per_object": ("image", per_object),
                "jaccard_mean": ("head", np.nanmean(union, 0)),
                "best_mean": np.nanmean(best),
                "per_object_mean": np.nanmean(per_object),
            }
        )
        report.scored, report.ledger = scored, read.entry_id
        report.jaccard_mean, report.best_mean, report.per_object_mean = np.nanmean(union, 0), float(np.nanmean(best)), float(np.nanmean(per_object))
        report.counts = {"images": n, "in_panel": len(read.image_map), "scored": scored, "objects": objects_seen}
        attrs.update({"panel": {"name": read.panel.name, "role": read.panel.role}, "ledger_entry": read.entry_id, "counts": report.counts})
    coords = {"image": ids, "head": np.arange(h), **({"storage": tokens[1:], "token": tokens, "key": [*tokens, "patches"]} if "prefix_mass" in data else {})}
    import xarray as xr

    result = xr.Dataset(data, coords=coords)
    if report.looks is not None:
        attrs["looks"] = report.looks
    attrs["provenance"] = result_provenance(ds, context.command)
    return context.finish(report, Saving(store, "attention_masks", result, attrs))
