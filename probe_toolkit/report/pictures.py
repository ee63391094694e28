"""Two figures the field expects, each from what the report already reads:

- ``token_pca``: the first three principal components of the 224 patch tokens as RGB, one PCA
  per store over a small set of images together (the followed image and the next few the
  stores share; as DINOv2's and dino-vit-features' figures show them). The report reads those
  images' tokens from the store as the explorer reads the followed image's; no result is saved.
- ``decoder_cuts``: per store, the decoder's first Fiedler vector on the patch grid with its
  seed, beside the masks (TokenCut's figure), from ``results/decoder`` (``fiedler``, ``seed``).
  Where the store was scored on a panel whose role is not ``test``, the panel's objects are
  outlined: their labels are read through ``read_labels``, which writes the ledger entry first
  (purpose ``report``); a sealed test panel is never opened by a report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ..infra.errors import ProbeError
from ..labels import masks as mask_geometry
from ..labels.panels import read_labels
from . import figures, figures_maps
from .content import Note, Section
from .sources import original_image, shown_path

if TYPE_CHECKING:
    from .context import Context

PCA_IMAGES = 4
CUT_IMAGES = 3
DISPLAY = 240  # width of a decoder picture, pixels


def _shared_images(ctx: Context, array: str, count: int) -> list[str]:
    """The followed image first, then the first images every store holding ``array`` has."""
    holders = [s for s in ctx.stores if array in s.ds]
    if not holders:
        return []
    common = [i for i in holders[0].image_ids if all(i in s.image_ids for s in holders[1:])]
    return list(dict.fromkeys(([ctx.follow] if ctx.follow in common else []) + common))[:count]


def token_pca(ctx: Context) -> Section:
    section = Section("token-pca", "Patch tokens: the first three principal components as RGB")
    chosen = _shared_images(ctx, "tokens_224", PCA_IMAGES)
    holders = [s for s in ctx.stores if "tokens_224" in s.ds]
    if not chosen:
        section.missing("No 224 tokens: run `probe extract CKPT --views 224`.")
        return section
    sizes = {s.label: s.ds.sizes.get("patch_224", 0) for s in holders}
    grid = int(round(next(iter(sizes.values())) ** 0.5))
    same = [s for s in holders if sizes[s.label] == grid * grid]
    per_store = {}
    for store in same:
        tokens = [store.image_values("tokens_224", i) for i in chosen]
        colours, share = figures_maps.principal_rgb(tokens)
        per_store[store.label] = (colours, share)
    pictures = []
    for image_id in chosen:
        rgb = original_image(ctx.stores, image_id)
        pictures.append((image_id, None if rgb is None else np.asarray(Image.fromarray(rgb).resize((224, 224), Image.Resampling.BILINEAR))))
    png = figures_maps.pca_grids(pictures, per_store, grid)
    section.blocks.append(
        ctx.figure(
            "token-pca",
            png,
            f"Each store's last-block patch tokens of {len(chosen)} images projected on their first three "
            "principal components (one PCA per store over these images together), as red, green and blue; "
            "the left column is the image, squashed to a square for the comparison.",
        )
    )
    section.blocks.append(Note("Similar colours are similar tokens within one store; colours are not comparable between stores, each has its own PCA."))
    if len(same) < len(holders):
        section.missing(f"Not drawn: {', '.join(s.label for s in holders if s not in same)}, whose 224 grid differs from {grid} × {grid}.")
    return section


def panel_cache(ctx: Context, store, ds, panel: str) -> str | Path | None:
    """The cache whose registry holds ``panel``: the report's own (``--cache``, ``$PROBE_CACHE``, ``./cache``), the
    one the scoring run read the panel from (its record's inputs), or the cache the store sits in
    (``<cache>/<checkpoint>/<network>.zarr``); the report's own where none holds it (its error names the registry)."""
    from ..labels.panels import load_registry
    from ..results import records
    from ..store.cache import cache_root

    found = records.find(store.path, f"scores_{panel}")
    recorded = ((found.meta.get("inputs") or {}).get("cache_dir") if found is not None else None) or None
    for candidate in (ctx.cache_dir, recorded, store.path.parent.parent):
        if candidate is None and ctx.cache_dir is not None:
            continue
        try:
            if panel in load_registry(candidate):
                return candidate if candidate is not None else cache_root(None)
        except ProbeError:
            continue
    return ctx.cache_dir


def _truth(ctx: Context, store, ds_scores, chosen: list[str], shape: dict[str, tuple[int, int]]) -> tuple[dict[str, np.ndarray] | None, str]:
    """The union of each chosen image's objects at display size, read through the ledger, or None
    and why not (the panel's true role: only a test panel is sealed)."""
    panel, role = str(ds_scores.attrs.get("panel", "")), str(ds_scores.attrs.get("role", ""))
    if not panel:
        return None, "the scores name no panel"
    if role == "test":
        return None, f"panel {panel} is a test panel, sealed: a report never opens it"
    checkpoint = (store.manifest.get("checkpoint") or {}).get("sha256")
    try:
        labels = read_labels(panel, purpose="report", checkpoint=checkpoint, images=chosen, cache=panel_cache(ctx, store, ds_scores, panel))
    except ProbeError as error:
        where = f"{shown_path(error.where)}: " if error.where else ""
        return None, f"{role or 'the'} panel {panel} could not be read: {where}{error.problem}"  # gone or moved
    out = {}
    for image_id, coco_id in labels.image_map.items():
        anns = labels.coco.loadAnns(labels.coco.getAnnIds(imgIds=[coco_id], iscrowd=None))
        if not anns:
            out[image_id] = np.zeros(shape[image_id], bool)
            continue
        union = np.any([labels.coco.annToMask(a).astype(bool) for a in anns], axis=0)
        out[image_id] = np.asarray(Image.fromarray(union.astype(np.uint8) * 255).resize(shape[image_id][::-1], Image.Resampling.NEAREST)) > 127
    return out, ""


def decoder_cuts(ctx: Context) -> Section:
    section = Section("decoder-cuts", "Decoder: the Fiedler vector beside its mask")
    found = {s.label: (s, s.result("decoder")) for s in ctx.stores if s.result("decoder") is not None}
    with_vector = {k: v for k, v in found.items() if "fiedler" in v[1] or "degree" in v[1]}
    if not with_vector:
        section.missing("No Fiedler vectors saved: run `probe decode STORE` (decoder results from this version keep each image's first vector).")
        return section
    for label, (store, ds) in with_vector.items():
        if "grid_rows" in ds:  # the figure draws one square grid; the own-size views have a grid per image
            section.missing(
                f"{label}: the Fiedler figure draws the square views; these masks were cut on the {ds.attrs.get('view') or 'native'} view (a grid per image)."
            )
            continue
        ids = [str(v) for v in ds.image.values]
        scored = next((store.result(n) for n in sorted(store.results) if n.startswith("scores_")), None)
        panel_ids = {str(v) for v in scored.image.values} if scored is not None and "image" in scored.coords else set()
        ordered = [i for i in ids if i in panel_ids] + [i for i in ids if i not in panel_ids]
        chosen = list(dict.fromkeys(([ctx.follow] if ctx.follow in ids and not panel_ids else []) + ordered))[:CUT_IMAGES]
        shape, pictures = {}, {}
        for image_id in chosen:
            k = store.image_ids.index(image_id) if image_id in store.image_ids else None
            h, w = (int(store.ds["image_height"].values[k]), int(store.ds["image_width"].values[k])) if k is not None else (DISPLAY, DISPLAY)
            size = (max(1, int(round(h * DISPLAY / max(w, 1)))), DISPLAY)
            rgb = original_image(ctx.stores, image_id)
            pictures[image_id] = np.full((*size, 3), 128, np.uint8) if rgb is None else np.asarray(Image.fromarray(rgb).resize(size[::-1], Image.Resampling.BILINEAR))
            shape[image_id] = size
        truth, why = _truth(ctx, store, scored, chosen, shape) if scored is not None else (None, "")
        grid = int(ds.attrs.get("grid", round(ds.sizes["patch"] ** 0.5)))
        lost = "degree" in ds  # LOST: no cut, its degree map and seed instead (analyses/lost.py)
        items = []
        for image_id in chosen:
            i = ids.index(image_id)
            patch_masks = ds["masks"].values[i, : int(ds["n_masks"].values[i])].astype(bool)
            up = np.stack([mask_geometry.upsample(m, *shape[image_id]) for m in patch_masks]) if len(patch_masks) else np.zeros((0, *shape[image_id]), bool)
            items.append(
                (
                    image_id,
                    ds["degree" if lost else "fiedler"].values[i],
                    int(ds["seed"].values[i]),
                    pictures[image_id],
                    up,
                    None if truth is None else truth.get(image_id),
                )
            )
        png = figures_maps.fiedler_panels(items, grid, figures.wrap(label, 40), lost=lost)
        caption = (
            f"{label}: LOST's degree (how many patches each patch's key has a positive dot product with) on the {grid} × {grid} grid "
            "of the decoder's view (×: the seed, the patch of least degree), beside the mask grown from it, mapped back to the image"
            if lost
            else f"{label}: the first cut's Fiedler vector x on the {grid} × {grid} grid of the decoder's view (white line: the cut at mean(x); "
            "×: the seed), beside the masks mapped back to the image"
        )
        if truth is not None:
            caption += f"; dashed: the objects of panel {scored.attrs.get('panel')} (labels read for this figure, ledgered)"
        elif scored is not None:
            caption += f"; no ground truth drawn ({why})"
        section.blocks.append(ctx.figure("decoder-cuts", png, caption + "."))
    old = [label for label in found if label not in with_vector]
    if old:
        section.missing(f"No Fiedler vectors in the decoder results of {', '.join(old)}: rerun `probe decode STORE` to save them.")
    return section
