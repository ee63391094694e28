"""Gather what exists into sections: each present only when its results (or arrays) exist, and
saying in one line, when they do not, which command would produce them.

Every section shows the stores side by side (one column or panel per store). A published number
sits beside a score only when protocol and data match; the rest are in their own table
(``published``, ``references``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from ..commands.summaries import ENTROPY_LABELS, NEIGHBOUR_LABELS, cell, summary
from ..infra.errors import ProbeError
from ..labels import masks as mask_geometry
from . import figures_attention, figures_maps, figures_training, followed, protocols, registers
from .discovery import discovery
from .pictures import decoder_cuts, token_pca
from .published import comparable, reference_values
from .content import Explorer, Note, Report, Section, Table
from .context import Context
from .explorer import explorer_data, store_data
from .patches import follow_patches
from .freshness import freshness
from .sources import (
    Picture,
    StoreView,
    choose_follow,
    followed_picture,
    open_stores,
    original_image,
    read_ledgers,
    training_run,
)

# the command that produces each missing piece
HOW = {
    "tokens": "run `probe extract CKPT --views 224`",
    "attention": "run `probe extract CKPT --views 224 --attention last`",
    "blocks": "run `probe extract CKPT --views 224 --attention all`",
    "entropy": "run `probe entropy STORE... --patch {patch}`",
    "neighbours_g14": "run `probe neighbours STORE...` (the 224 view, at the grid the store holds)",
    "neighbours_g6": "run `probe neighbours STORE... --view 96` (needs `--views 96`)",
    "decoder": "run `probe decode STORE` (needs `--views 480`)",
    "scores": "run `probe decode STORE --panel NAME` or `probe score MASKS.json --panel NAME`",
    "sweep": "run `probe decode-sweep STORE --panel NAME`",
    "linear_patch": "run `probe linear STORE... --train PANEL --val PANEL`",
    "linear_image": "run `probe linear STORE... --train PANEL --val PANEL --level image`",
    "training": "only checkpoints trained with `probe train` (training/) have `log.jsonl` beside them",
}
MAX_MASK_IMAGES = 4
MASK_WIDTH = 320  # display width of the decoder overlays, pixels


def _pct(x: float, digits: int = 1) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{100 * float(x):.{digits}f} %"


def _names(stores: list[StoreView]) -> str:
    return ", ".join(s.label for s in stores)


def _lacking(section: Section, stores: list[StoreView], what: str, how: str) -> None:
    """One line naming the stores that lack something and the command that makes it."""
    if stores:
        section.missing(f"No {what} for {_names(stores)}: {how}.")


# ----------------------------------------------------------------------------------------------
# manifests


def manifests(ctx: Context) -> Section:
    section = Section("manifests", "Stores and their manifests")
    rows: dict[str, list[str]] = {}

    def put(field_name: str, values: list[str]) -> None:
        rows[field_name] = values

    m = [s.manifest for s in ctx.stores]
    ck = [x.get("checkpoint") or {} for x in m]
    arch = [x.get("arch") or {} for x in m]
    put("store", [str(s.path) for s in ctx.stores])
    put("checkpoint", [str(c.get("path", "?")) for c in ck])
    put("checkpoint sha256", [str(c.get("sha256", "?"))[:16] for c in ck])
    put("format", [f"{c.get('format', '?')}{' (converted)' if c.get('converted') else ''}" for c in ck])
    put("network", [str(x.get("network", "?")) for x in m])
    put("architecture", [f"width {a.get('width')}, depth {a.get('depth')}, heads {a.get('heads')}, patch {a.get('patch')}" for a in arch])
    put("class token / final norm", [f"{'yes' if a.get('class_token') else 'no'} / {'yes' if a.get('final_norm') else 'no'}" for a in arch])
    put("views (px)", [", ".join(str(v) for v in x.get("views", [])) for x in m])
    put("interpolation", [str(x.get("interpolation", "?")) for x in m])
    put("attention", [str(x.get("attention", "?")) for x in m])
    put("dtype", [str(x.get("dtype", "?")) for x in m])
    put("images finished", [f"{len(s.image_ids)} of {s.manifest.get('n_images', '?')}" for s in ctx.stores])
    put("image source", [str(x.get("image_source", "?")) for x in m])
    put("toolkit", [f"{x.get('toolkit_version', '?')} ({str(x.get('git_revision', '?'))[:12]})" for x in m])
    put("extracted", [str(x.get("date", "?")) for x in m])
    put("results", [", ".join(s.results) or "none yet" for s in ctx.stores])
    section.blocks.append(Table(["", *ctx.labels], [[k, *v] for k, v in rows.items()], "What each store was extracted from and with."))
    return section


# ----------------------------------------------------------------------------------------------
# the followed image and the explorer


def _grid_of(ctx: Context) -> int:
    """The side of the first store's 224 grid: the one the followed image is drawn with and ``--patch`` reads."""
    for found in ctx.followed.values():
        return found.rows
    return 14


def _other_grids(ctx: Context) -> list[str]:
    """One line per store on another grid than the first: which patch it follows (patches.py)."""
    grids = {f.grid for f in ctx.followed.values()}
    return [f.line for f in list(ctx.followed.values())[1:]] if len(grids) > 1 else []


def followed_image(ctx: Context) -> Section:
    section = Section("followed", "The followed image and its patch grid")
    if ctx.follow is None or ctx.picture is None or ctx.picture.rgb is None:
        section.missing(ctx.picture.note if ctx.picture and ctx.picture.note else "No finished image to follow in these stores.")
        return section
    grid = _grid_of(ctx)
    r, c = divmod(ctx.patch, grid)
    section.blocks.append(Note(
        f"Image `{ctx.follow}`, its 224-pixel view (short side to 224 px with PIL bicubic, centre crop), cut into {grid} × {grid} "
        f"patches numbered row by row from 0 at the top left: patch = {grid}·row + column. The followed patch {ctx.patch} sits in "
        f"row {r}, column {c} (outlined)."))
    mapped = _other_grids(ctx)
    if mapped:
        section.blocks.append(Note("Stores on other grids follow the patch under its centre (a centre on a border goes to the upper / left "
                                   "patch): " + "; ".join(mapped) + "."))
    if ctx.picture.note:
        section.blocks.append(Note(ctx.picture.note))
    png = figures_maps.followed_image(ctx.picture.rgb, grid, ctx.patch, f"{ctx.follow}: {grid}×{grid} patches, followed patch {ctx.patch}")
    section.blocks.append(ctx.figure("followed-image", png, f"The 224-pixel view of {ctx.follow} with every patch's number; patch {ctx.patch} outlined."))
    return section


def explorer(ctx: Context) -> Section:
    section = Section("explorer", "Patch explorer")
    usable = [s for s in ctx.stores if ctx.attention.get(s.label) is not None or ctx.neighbours.get(s.label) is not None]
    if ctx.follow is None or not usable:
        section.missing(f"Nothing to explore: the explorer needs the followed image's 224 attention or tokens; {HOW['attention']}.")
        return section
    data = []
    for store in ctx.stores:
        att, near, where = ctx.attention.get(store.label), ctx.neighbours.get(store.label), ctx.followed.get(store.label)
        note = "" if store in usable else f"no 224 attention or tokens of {ctx.follow}"
        if store in usable and where is not None and where.patch is None:
            att, near, note = None, None, where.line
        data.append(store_data(store, att, near, note, where if store in usable else None))
    reference = next(iter(ctx.followed.values()))
    picture = ctx.picture or Picture(None, "", "")
    grids = dict.fromkeys(f"{f.rows} × {f.cols}" for f in ctx.followed.values())
    section.blocks.append(Note(
        "Click a patch of the image (or open the page at `#patch=N`): every store shows that patch's row of the last block's "
        "attention, the mean over heads large and each head small, scaled to its largest weight, the five largest weights "
        "outlined in blue; and the cosine of its token to every patch, with its 3×3 window (SelfPatch's wrap-around, dashed), "
        "the window's top k (thick) and the crop's 8 most similar (dots). Networks with a class token can show the class "
        "token's row instead, DINOv2's register tokens each register's row (Darcet et al. 2024, Fig. 9). "
        "Weights and cosines are stored with 8 bits."
        + (f" Each store is drawn on its own grid ({', '.join(grids)}); the picture's grid is the first store's, and the others follow "
           "the patch under the chosen patch's centre (a centre on a border goes to the upper / left patch)." if len(grids) > 1 else "")))
    section.blocks.append(Explorer(explorer_data(data, reference, ctx.follow, picture)))
    return section


# ----------------------------------------------------------------------------------------------
# attention of the followed patch


def _weights_cell(att: followed.Attention, head: int, query: int) -> str:
    """The row's five largest weights, ranked as ``att.ranked`` (stable: ties to the lower token), each key named:
    a patch index, [CLS], or [REG r] for DINOv2's register r."""
    row = att.weights[head, query]
    cls = att.start - att.registers
    prefix = ["[CLS]"] * cls + [f"[REG {r}]" for r in range(att.registers)]
    order = np.argsort(-np.asarray(row, dtype=np.float32), kind="stable")[: att.ranked.shape[-1]]
    return ", ".join(f"{prefix[t] if t < att.start else t - att.start}: {row[t]:.3f}" for t in order)


def _row_table(label: str, att: followed.Attention, query: int, what: str) -> Table:
    rows = []
    for h in range(att.weights.shape[0]):
        cls = f"{att.weights[h, query, 0]:.3f}" if att.start > att.registers else "–"
        rows.append([str(h), f"{att.effective[h, query]:.1f}", f"{100 * att.effective[h, query] / att.weights.shape[-1]:.1f} %",
                     _weights_cell(att, h, query), cls])
    return Table(["head", "e^H", "e^H / T", "five largest weights (patch: weight)", "weight on [CLS]"], rows, f"{label}: {what}, last block")


def attention(ctx: Context) -> Section:
    section = Section("attention", f"Where patch {ctx.patch} looks: attention per head")
    if ctx.follow is None:
        section.missing("No image to follow.")
        return section
    without, no_blocks = [], []
    # one weight scale for every store's maps of the followed patch (and one for the class token's)
    held = [(s, a) for s in ctx.stores if (a := ctx.attention.get(s.label)) is not None]
    scale = figures_attention.weight_scale(*[a.patch_rows(a.start + ctx.patch_of(s)) for s, a in held if ctx.patch_of(s) is not None])
    cls_scale = figures_attention.weight_scale(*[a.patch_rows(0) for _, a in held if a.start > a.registers])
    for line in _other_grids(ctx):
        section.blocks.append(Note(line + "."))
    for store in ctx.stores:
        att, patch = ctx.attention.get(store.label), ctx.patch_of(store)
        if att is None:
            without.append(store)
            continue
        if patch is None:  # its grid leaves the followed pixel unused: the line above says so
            continue
        grid = int(round(att.n_patches**0.5))
        q = att.start + patch
        png = figures_attention.attention_rows(att.patch_rows(q), att.ranked[:, q], att.effective[:, q], grid, patch,
                                     f"{store.label}: row of patch {patch}, last block", att.cls_weight(q), vmax=scale)
        section.blocks.append(ctx.figure("attention-patch", png, f"{store.label}: patch {patch}'s row of the last block's attention in every head; "
                                                                 "five largest weights outlined, the patch itself dashed."))
        section.blocks.append(_row_table(store.label, att, q, f"row of patch {patch}"))
        if att.start > att.registers:  # the network has a class token (token 0)
            png = figures_attention.attention_rows(att.patch_rows(0), att.ranked[:, 0], att.effective[:, 0], grid, None,
                                         f"{store.label}: the class token's row, last block", vmax=cls_scale)
            section.blocks.append(ctx.figure("attention-cls", png, f"{store.label}: where the class token looks, head by head."))
            section.blocks.append(_row_table(store.label, att, 0, "the class token's row"))
        if att.registers:  # DINOv2's register tokens, drawn as the registers paper draws them (report/registers.py)
            png = registers.register_maps(att, grid, f"{store.label}: class token and registers, last block, mean over heads")
            section.blocks.append(ctx.figure("attention-registers", png, f"{store.label}: where the class token and each of the {att.registers} "
                                                                         "register tokens look (Darcet et al. 2024, Vision Transformers Need Registers, Fig. 9)."))
        through = followed.blocks(store, ctx.follow, patch)
        if through is None:
            no_blocks.append(store)
            continue
        png = figures_attention.block_rows(through.rows, through.effective, through.blocks, grid, patch, f"{store.label}: patch {patch} through the blocks")
        section.blocks.append(ctx.figure("attention-blocks", png, f"{store.label}: patch {patch}'s row in every block (rows) and head (columns)."))
        section.blocks.append(Table(["block", *[f"head {h}" for h in range(through.effective.shape[1])]],
                                    [[str(b), *[f"{v:.1f}" for v in through.effective[i]]] for i, b in enumerate(through.blocks)],
                                    f"{store.label}: e^H of patch {patch}'s row in every block and head"))
    _lacking(section, without, f"last-block attention of {ctx.follow}", HOW["attention"])
    _lacking(section, no_blocks, "attention of every block", HOW["blocks"])
    return section


# ----------------------------------------------------------------------------------------------
# attention entropy (results/entropy)


def entropy(ctx: Context) -> Section:
    section = Section("entropy", "Attention spread: entropy and e^H")
    found = {s.label: s.result("entropy") for s in ctx.stores if s.result("entropy") is not None}
    how = HOW["entropy"].format(patch=ctx.patch)
    if not found:
        section.missing(f"No attention entropy yet: {how}.")
        return section
    labels = list(found)
    level = int(round(100 * float(next(iter(found.values())).attrs.get("level", 0.95))))
    sums = {label: summary(ds) for label, ds in found.items()}
    rows = []
    for name, (text, share) in ENTROPY_LABELS.items():
        if not any(name in s for s in sums.values()):
            continue
        cells = [cell(s[name]["mean"], s[name]["low"], s[name]["high"], share) if name in s else "–" for s in sums.values()]
        rows.append([text, *cells])
    rows.append(["keys per row T", *[str(ds.attrs.get("n_keys")) for ds in found.values()]])
    rows.append(["images", *[str(ds.attrs.get("n_images")) for ds in found.values()]])
    section.blocks.append(Table(["statistic", *labels], rows,
                                f"Last block, patch rows over all keys; mean over images [{level} % bootstrap interval]."))
    heads = max(ds.sizes["head"] for ds in found.values())
    per_head = []
    for h in range(heads):
        row = [str(h)]
        for ds in found.values():
            if h >= ds.sizes["head"]:
                row.append("–")
                continue
            cls = f", [CLS] row {float(ds.set_cls_effective.values[h]):.1f}" if "set_cls_effective" in ds else ""
            row.append(f"{float(ds.set_patch_effective.values[h]):.1f} ({_pct(ds.set_patch_share.values[h])}), distance {float(ds.set_distance.values[h]):.2f}{cls}")
        per_head.append(row)
    section.blocks.append(Table(["head", *labels], per_head, "Per head: mean e^H of a patch row (share of T), mean attention distance (patches)."))
    png = figures_attention.effective_histograms({label: ds.patch_effective.values for label, ds in found.items()},
                                       {label: int(ds.attrs.get("n_keys", 196)) for label, ds in found.items()})
    section.blocks.append(ctx.figure("entropy-histograms", png, "Per head, how the images' mean e^H of a patch row is distributed: "
                                                               "one outline per store on shared bins fitted to the data; dotted: T, a uniform row."))
    blocks = {label: ds for label, ds in found.items() if "set_block_patch_effective" in ds}
    if blocks:
        png = figures_attention.block_spread({label: ds.set_block_patch_effective.values for label, ds in blocks.items()},
                                   {label: [int(b) for b in ds.block.values] for label, ds in blocks.items()})
        section.blocks.append(ctx.figure("entropy-blocks", png, "Mean e^H of a patch row in every block, per head."))
        png = figures_attention.per_block({label: ds.set_block_distance.values for label, ds in blocks.items() if "set_block_distance" in ds},
                                {label: [int(b) for b in ds.block.values] for label, ds in blocks.items()},
                                "mean attention distance (patches)")
        section.blocks.append(ctx.figure("attention-distance-blocks", png, "Mean attention distance of the patch rows (Dosovitskiy et al., ICLR 2021, "
                                                                         "Fig. 7: the attention-weighted distance to every patch) per head against block."))
    _lacking(section, [s for s in ctx.stores if s.label not in found], "attention entropy", how)
    return section


# ----------------------------------------------------------------------------------------------
# neighbours: the followed patch's cosine map, and the premise statistics


def neighbour_map(ctx: Context) -> Section:
    section = Section("neighbour-map", f"Patch {ctx.patch}'s neighbours: cosine to every patch")
    have = [(s, ctx.neighbours[s.label]) for s in ctx.stores if ctx.neighbours.get(s.label) is not None]
    if ctx.follow is None or not have:
        section.missing(f"No 224 tokens of the followed image: {HOW['tokens']}.")
        return section
    rows, by_grid = [], {}
    for store, n in have:  # one figure per grid: stores on another grid follow the patch under the centre (patches.py)
        if ctx.patch_of(store) is not None:
            by_grid.setdefault(n.grid, []).append((store, n))
    for grid, group in by_grid.items():
        anchor = ctx.patch_of(group[0][0])
        window = group[0][1].window[anchor]
        maps = []
        for store, n in group:
            topk, crop = n.topk[anchor], n.top_crop[anchor]
            maps.append((store.label, n.cosine[anchor], topk, crop))
            inside = [int(p) for p in crop if p in set(window.tolist())]
            rows.append([store.label, ", ".join(str(int(p)) for p in window),
                         ", ".join(f"{int(p)}: {n.cosine[anchor, p]:.3f}" for p in topk),
                         ", ".join(f"{int(p)}{'*' if int(p) in inside else ''}: {n.cosine[anchor, p]:.3f}" for p in crop),
                         f"{len(inside)} of {len(crop)}", f"{anchor} of {grid} × {grid}"])
        png = figures_maps.cosine_maps(maps, grid, anchor, window)
        where = "" if len(by_grid) == 1 else f" ({grid} × {grid} grid)"
        section.blocks.append(ctx.figure("neighbour-map", png, f"Cosine of patch {anchor}'s token to every patch of {ctx.follow}{where}; dashed: its 3×3 "
                                                               "window (SelfPatch wraps around the border); thick: the window's top k; dots: the crop's 8 most similar."))
    k = ", ".join(f"{s.label}: k = {n.k}" for s, n in have)
    section.blocks.append(Table(["store", "window (wrap)", "window's top k (cosine)", "crop's top 8 (* in the window)", "top 8 in the window", "anchor (its grid)"], rows,
                                f"Anchor {ctx.patch} of {ctx.follow}, on each store's own grid ({k})."))
    _lacking(section, [s for s in ctx.stores if ctx.neighbours.get(s.label) is None], f"224 tokens of {ctx.follow}", HOW["tokens"])
    for line in _other_grids(ctx):
        section.blocks.append(Note(line + "."))
    return section


PREMISE_RESULTS = ("neighbours_g14", "neighbours_g14_nowrap", "neighbours_g6", "neighbours_g6_nowrap")


def premise_results(ctx: Context) -> list[str]:
    """ViT-S/16's names first, then every other grid's (ViT-S/8: g28, g12; DINOv2 /14: g16, g6), larger grids first."""
    held = {name for s in ctx.stores for name in s.results if re.fullmatch(r"neighbours_g\d+(_nowrap)?", name)}
    others = sorted(held - set(PREMISE_RESULTS), key=lambda n: (-int(re.search(r"\d+", n).group()), n))
    return [*PREMISE_RESULTS, *others]


def _other_grid(store: StoreView, name: str, array: str | None) -> bool:
    """Whether ``store`` holds the same view's premise statistics at another grid (another patch size)."""
    wrap = name.endswith("_nowrap")
    return any(other != name and other.endswith("_nowrap") == wrap and found.attrs.get("array") == array
               for other, found in store.results.items() if re.fullmatch(r"neighbours_g\d+(_nowrap)?", other))


def premise(ctx: Context) -> Section:
    section = Section("premise", "Premise statistics: do the most similar patches lie in the window?")
    any_found = False
    for name in premise_results(ctx):
        found = {s.label: s.result(name) for s in ctx.stores if s.result(name) is not None}
        if not found:
            continue
        any_found = True
        first = next(iter(found.values()))
        level = int(round(100 * float(first.attrs.get("level", 0.95))))
        sums = {label: summary(ds) for label, ds in found.items()}
        rows = []
        for stat, (text, share) in NEIGHBOUR_LABELS.items():
            if not any(stat in s for s in sums.values()):
                continue
            cells = [cell(s[stat]["mean"], s[stat]["low"], s[stat]["high"], share) if stat in s else "–" for s in sums.values()]
            rows.append([text.format(**first.attrs), *cells])
        rows.append(["wrapped candidate links", *[f"{int(ds.wrapped_links)} of {int(ds.links)}" for ds in found.values()]])
        rows.append(["images", *[str(ds.attrs.get("n_images")) for ds in found.values()]])
        wrap = "SelfPatch's wrap-around" if first.attrs.get("wrap") else "no wrap"
        section.blocks.append(Table(["statistic", *found], rows,
                                    f"{name}: grid {first.attrs.get('grid')}, {wrap}, {first.attrs.get('distance', '')}; "
                                    f"mean over images [{level} % bootstrap interval]."))
        if first.attrs.get("array") == "tokens_224" and not name.endswith("_nowrap"):
            png = figures_maps.share_maps({label: ds.anchor_top_in_window.values for label, ds in found.items()}, int(first.attrs.get("grid", 14)),
                                     f"Share of each anchor's top {first.attrs.get('top', 8)} inside its window, mean over images",
                                     "share of the top 8 inside the window")
            section.blocks.append(ctx.figure("premise-anchors" + ("" if name == "neighbours_g14" else f"-g{first.attrs.get('grid')}"), png, "Per anchor position: how often its most similar patches lie in its 3×3 window."))
        lacking = [s for s in ctx.stores if s.label not in found and not _other_grid(s, name, first.attrs.get("array"))]
        _lacking(section, lacking, f"premise statistics ({name})", HOW.get(name.removesuffix("_nowrap"), HOW["neighbours_g14"]))
    if not any_found:
        section.missing(f"No premise statistics yet: {HOW['neighbours_g14']} (and, for the 96 view, {HOW['neighbours_g6'].removeprefix('run ')}).")
    return section


# ----------------------------------------------------------------------------------------------
# decoder masks and scores


def _display(rgb: np.ndarray | None, height: int, width: int) -> np.ndarray:
    w = MASK_WIDTH
    h = max(1, int(round(height * w / max(width, 1))))
    if rgb is None:
        return np.full((h, w, 3), 128, dtype=np.uint8)
    return np.asarray(Image.fromarray(rgb).resize((w, h), Image.Resampling.BILINEAR))


def _cut_on(ds) -> str:
    """The view a decoder run cut its masks on, in words."""
    view = str(ds.attrs.get("view") or ds.attrs.get("size") or "480")
    if "grid_rows" in ds:
        return f"the {view} view, a grid per image"
    return f"the {view} view" if not view.isdigit() else f"the {view} view ({view} × {view} px)"


def decoder(ctx: Context) -> Section:
    section = Section("decoder", "Decoder masks (label-free)")
    found = {s.label: s.result("decoder") for s in ctx.stores if s.result("decoder") is not None}
    if not found:
        section.missing(f"No decoder masks yet: {HOW['decoder']}.")
        return section
    rows = []
    for label, ds in found.items():
        st = ds.attrs.get("settings", {})
        n = ds["n_masks"].values
        rows.append([label, str(st.get("preset", "?")), f"{st.get('tau', '?')}", f"{st.get('eps', '?')}", str(st.get("center", "?")),
                     str(st.get("masks", "?")), str(ds.sizes["image"]), f"{int(n.sum())} ({n.mean():.2f} per image)",
                     str(int(ds["degenerate"].values.sum())), f"{float(ds.attrs.get('seconds', float('nan'))):.1f}"])
    section.blocks.append(Table(["store", "preset", "τ", "ε", "centred", "masks ≤", "images", "masks found", "degenerate eigengap", "seconds"], rows,
                                "Settings and counts of each store's saved decoder run (results/decoder)."))
    ids = {label: [str(v) for v in ds.image.values] for label, ds in found.items()}
    order = ([ctx.follow] if ctx.follow else []) + [i for label in ids for i in ids[label]]
    chosen = [i for i in dict.fromkeys(order) if any(i in held for held in ids.values())][:MAX_MASK_IMAGES]
    pictures, overlays = [], {label: [] for label in found}
    for image_id in chosen:
        holder = next((s for s in ctx.stores if image_id in s.image_ids), None)
        k = holder.image_ids.index(image_id) if holder else 0
        height, width = (int(holder.ds["image_height"].values[k]), int(holder.ds["image_width"].values[k])) if holder else (480, 480)
        rgb = _display(original_image(ctx.stores, image_id), height, width)
        pictures.append((image_id, rgb))
        for label, ds in found.items():
            if image_id not in ids[label]:
                overlays[label].append(None)
                continue
            i = ids[label].index(image_id)
            overlays[label].append(mask_geometry.saved_masks(ds, i, *rgb.shape[:2], original=(height, width)))
    png = figures_maps.mask_overlays(pictures, overlays)
    views = "; ".join(f"{label}: {_cut_on(ds)}" for label, ds in found.items())
    section.blocks.append(ctx.figure("decoder-masks", png, "Decoder masks over sample images (first cut first), one column per store; "
                                                           f"masks are cut on the patch grid of each store's view ({views}) and mapped back to the whole image."))
    _lacking(section, [s for s in ctx.stores if s.label not in found], "decoder masks", HOW["decoder"])
    return section


SCORE_ROWS = [(f"{kind}_{m}", f"{kind} {m}") for kind in ("segm", "bbox") for m in ("AP", "AP50", "AP75", "AR1", "AR10", "AR100")]


def _score_value(ds, key: str) -> float:
    if key in ("corloc", "mean_best_iou"):
        return float(ds[key].values)
    kind, metric = key.split("_", 1)
    return float(ds[kind].sel(metric=metric).values)


def scores(ctx: Context) -> Section:
    section = Section("scores", "Decoder scores against panels (labels read through the ledger)")
    panels = sorted({name.removeprefix("scores_") for s in ctx.stores for name in s.results if name.startswith("scores_")})
    for panel in panels:
        found = {s.label: s.result(f"scores_{panel}") for s in ctx.stores if s.result(f"scores_{panel}") is not None}
        rows = []
        for key, text in [*SCORE_ROWS, ("corloc", "CorLoc"), ("mean_best_iou", "mean best IoU")]:
            rows.append([text, *[_pct(_score_value(ds, key), 2) for ds in found.values()]])
        matched = comparable(ctx, found, rows)
        role = next(iter(found.values())).attrs.get("role", "?")
        section.blocks.append(Table(["metric", *found, *(["published, same protocol and data"] if matched else [])], rows,
                                    f"Panel {panel} ({role}): class-agnostic COCO AP/AR (pycocotools), CorLoc (LOST's rule), mean best IoU; in %."
                                    + ("" if matched else " No published number shares this panel's protocol and data (see the last section).")))
        prov = []
        for label, ds in found.items():
            st = ds.attrs.get("settings", {})
            counts = ds.attrs.get("counts", {})
            prov.append([label, ctx.book.describe(ds.attrs.get("ledger_entry")),
                         f"{st.get('preset', '?')}, τ {st.get('tau', '?')}, ε {st.get('eps', '?')}, centred {st.get('center', '?')}, at most {st.get('masks', '?')} mask(s)",
                         ", ".join(f"{k} {v}" for k, v in counts.items())])
        section.blocks.append(Table(["store", "ledger entry of the label read", "decoder settings", "counts"], prov, f"Where the scores on {panel} came from."))
        _lacking(section, [s for s in ctx.stores if s.label not in found], f"scores on {panel}", HOW["scores"].replace("NAME", panel))
    sweeps = sorted({name.removeprefix("sweep_") for s in ctx.stores for name in s.results if name.startswith("sweep_")})
    for panel in sweeps:
        for store in ctx.stores:
            ds = store.result(f"sweep_{panel}")
            if ds is None:
                continue
            metric = str(ds.attrs.get("metric", "segm_AP"))
            values = np.asarray(ds[metric].values, dtype=np.float64)
            order = np.argsort(-np.nan_to_num(values, nan=-1.0), kind="stable")[:5]
            best = int(ds.attrs.get("best", order[0]))
            cols = ["preset", "center", "tau", "eps", "masks"]
            rows = [[("★ " if int(i) == best else "") + str(ds["preset"].values[i]), *[str(ds[c].values[i]) for c in cols[1:]],
                     *[_pct(float(ds[m].values[i]), 2) for m in ("segm_AP", "segm_AP50", "bbox_AP50", "corloc")]] for i in order]
            section.blocks.append(Table([*cols, "segm AP", "segm AP50", "bbox AP50", "CorLoc"], rows,
                                        f"{store.label}: the 5 best of {ds.sizes['setting']} decoder settings on {panel} by {metric} (★ chosen); "
                                        f"{ctx.book.describe(ds.attrs.get('ledger_entry'))}."))
    if not panels and not sweeps:
        section.missing(f"No scores yet: {HOW['scores']}; to choose the settings, {HOW['sweep']}.")
    if ctx.book.chains:
        section.blocks.append(Note("; ".join(f"ledger {path}: {'chain intact' if not problems else 'BROKEN: ' + ' / '.join(problems[:3])}"
                                             for path, problems in ctx.book.chains.items()) + "."))
    return section


def linear(ctx: Context) -> Section:
    section = Section("linear", "Linear probes on the frozen tokens (labels read through the ledger)")
    any_found = False
    for level, metrics in (("patch", (("miou", "patch mIoU"), ("accuracy", "patch accuracy"), ("miou_dense", "dense mIoU (original pixels)"))),
                           ("image", (("map", "mAP (categories present)"),))):
        found = {s.label: s.result(f"linear_{level}") for s in ctx.stores if s.result(f"linear_{level}") is not None}
        if not found:
            continue
        any_found = True
        rows = [[text, *[_pct(float(ds[key].values), 2) for ds in found.values()]] for key, text in metrics]
        rows.append(["chosen regularisation", *[str(ds.attrs.get("settings", {}).get("weight_decay" if level == "patch" else "c", "?")) for ds in found.values()]])
        section.blocks.append(Table(["", *found], rows, f"Linear probe, {level} level, in %."))
        prov = []
        for label, ds in found.items():
            led = ds.attrs.get("ledger", {})
            pan = ds.attrs.get("panels", {})
            prov.append([label, f"{pan.get('train', {}).get('name', '?')}: {ctx.book.describe(led.get('train'))}",
                         f"{pan.get('val', {}).get('name', '?')}: {ctx.book.describe(led.get('val'))}"])
        section.blocks.append(Table(["store", "train labels (fit)", "val labels (score)"], prov, f"Where the {level}-level probe's labels came from."))
        per = "class" if level == "patch" else "category"
        score = "iou" if level == "patch" else "ap"
        names = list(dict.fromkeys(str(c) for ds in found.values() for c in ds[per].values))
        table = []
        for name in names:
            table.append([name, *[_pct(float(ds[score].sel({per: name}).values), 1) if name in [str(c) for c in ds[per].values] else "–" for ds in found.values()]])
        section.blocks.append(Table([per, *found], table, f"Per {per}: {'IoU' if level == 'patch' else 'AP'} on the val panel, in %."))
        _lacking(section, [s for s in ctx.stores if s.label not in found], f"{level}-level probe", HOW[f"linear_{level}"])
    if not any_found:
        section.missing(f"No linear probes yet: {HOW['linear_patch']} (and with `--level image`).")
    return section


# ----------------------------------------------------------------------------------------------
# training curves and the reference table


def training(ctx: Context) -> Section:
    section = Section("training", "Training curves")
    runs = {s.label: run for s in ctx.stores if (run := training_run(s)) is not None}
    if not runs:
        section.missing(f"No training log beside any checkpoint: {HOW['training']}.")
        return section
    rows = []
    for label, run in runs.items():
        last = run.log[-1] if run.log else {}
        meta = run.manifest
        init = meta.get("init") or {}
        start = init.get("sha256", "")[:12] if isinstance(init, dict) and init.get("sha256") else ("random" if isinstance(init, dict) and "random" in init else "?")
        rows.append([label, str(run.folder), str(meta.get("run", "?")), str(meta.get("rule", "?")), start, str(len(run.log)),
                     str(last.get("epoch", "?")), f"{last.get('loss', float('nan')):.4f}" if "loss" in last else "–", str(meta.get("status", "?"))])
    section.blocks.append(Table(["store", "run folder", "run", "rule", "started from", "steps logged", "last epoch", "last loss", "status"], rows,
                                "Runs of training/ that wrote the stores' checkpoints."))
    png = figures_training.training_curves({label: run.log for label, run in runs.items()})
    section.blocks.append(ctx.figure("training-curves", png, "Logged quantities against the optimiser step (training/'s log.jsonl)."))
    _lacking(section, [s for s in ctx.stores if s.label not in runs], "training log beside the checkpoint", HOW["training"])
    return section


BUILDERS: tuple[Callable[[Context], Section], ...] = (
    manifests, freshness, explorer, followed_image, attention, entropy, neighbour_map, token_pca, premise, decoder, decoder_cuts, scores, linear,
    *protocols.SECTIONS, training, reference_values,
    discovery,  # report/discovery.py: the field's benchmarks beside the published numbers
)


def gather(stores: list[Path], follow: str | None = None, patch: int = 34, cache_dir: str | Path | None = None, run: str | None = None) -> Report:
    """Open the stores, read their results (the latest records, or run ``run``'s) and the followed
    image, and build every section."""
    if not stores:
        raise ProbeError("probe report", "no store given", "pass one or more stores written by `probe extract`")
    views = open_stores(stores, run)
    image_id = choose_follow(views, follow)
    ctx = Context(views, image_id, int(patch), None, read_ledgers(views, cache_dir), cache_dir=cache_dir)
    if image_id is not None:
        ctx.picture = followed_picture(views, image_id)
        for store in views:
            ctx.attention[store.label] = followed.attention(store, image_id)
            ctx.neighbours[store.label] = followed.neighbours(store, image_id, followed.store_k(store))
        ctx.followed = follow_patches([s for s in views if ctx.attention[s.label] is not None or ctx.neighbours[s.label] is not None], ctx.patch)
    title = "probe report: " + " vs ".join(ctx.labels)
    return Report(title, ctx.labels, image_id, ctx.patch, [build(ctx) for build in BUILDERS])
