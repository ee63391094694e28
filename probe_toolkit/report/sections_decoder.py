"""The decoder sections: the masks of ``probe decode`` over their images (with the cut they came
from) and the scores on a panel (COCO AP, CorLoc, saliency), with where their labels came from."""

from __future__ import annotations

import numpy as np
from PIL import Image

from ..labels import masks as mask_geometry
from . import figures_maps
from .content import Note, Section, Table
from .context import Context
from .published import comparable
from .sections_kit import HOW, MASK_WIDTH, MAX_MASK_IMAGES, _lacking, _pct
from .sources import original_image, shown_path

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
        rows.append(
            [
                label,
                str(st.get("preset", "?")),
                f"{st.get('tau', '?')}",
                f"{st.get('eps', '?')}",
                str(st.get("center", "?")),
                str(st.get("masks", "?")),
                str(ds.sizes["image"]),
                f"{int(n.sum())} ({n.mean():.2f} per image)",
                str(int(ds["degenerate"].values.sum())),
                f"{float(ds.attrs.get('seconds', float('nan'))):.1f}",
            ]
        )
    section.blocks.append(
        Table(
            ["store", "preset", "τ", "ε", "centred", "masks ≤", "images", "masks found", "degenerate eigengap", "seconds"],
            rows,
            "Settings and counts of each store's saved decoder run (results/decoder).",
        )
    )
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
    section.blocks.append(
        ctx.figure(
            "decoder-masks",
            png,
            "Decoder masks over sample images (first cut first), one column per store; "
            f"masks are cut on the patch grid of each store's view ({views}) and mapped back to the whole image.",
        )
    )
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
        section.blocks.append(
            Table(
                ["metric", *found, *(["published, same protocol and data"] if matched else [])],
                rows,
                f"Panel {panel} ({role}): class-agnostic COCO AP/AR (pycocotools), CorLoc (LOST's rule), mean best IoU; in %."
                + ("" if matched else " No published number shares this panel's protocol and data (see the last section)."),
            )
        )
        prov = []
        for label, ds in found.items():
            st = ds.attrs.get("settings", {})
            counts = ds.attrs.get("counts", {})
            prov.append(
                [
                    label,
                    ctx.book.describe(ds.attrs.get("ledger_entry")),
                    f"{st.get('preset', '?')}, τ {st.get('tau', '?')}, ε {st.get('eps', '?')}, centred {st.get('center', '?')}, at most {st.get('masks', '?')} mask(s)",
                    ", ".join(f"{k} {v}" for k, v in counts.items()),
                ]
            )
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
            rows = [
                [
                    ("★ " if int(i) == best else "") + str(ds["preset"].values[i]),
                    *[str(ds[c].values[i]) for c in cols[1:]],
                    *[_pct(float(ds[m].values[i]), 2) for m in ("segm_AP", "segm_AP50", "bbox_AP50", "corloc")],
                ]
                for i in order
            ]
            section.blocks.append(
                Table(
                    [*cols, "segm AP", "segm AP50", "bbox AP50", "CorLoc"],
                    rows,
                    f"{store.label}: the 5 best of {ds.sizes['setting']} decoder settings on {panel} by {metric} (★ chosen); "
                    f"{ctx.book.describe(ds.attrs.get('ledger_entry'))}.",
                )
            )
    if not panels and not sweeps:
        section.missing(f"No scores yet: {HOW['scores']}; to choose the settings, {HOW['sweep']}.")
    if ctx.book.chains:
        section.blocks.append(
            Note(
                "; ".join(
                    f"ledger {shown_path(path)}: {'chain intact' if not problems else 'BROKEN: ' + ' / '.join(problems[:3])}"
                    for path, problems in ctx.book.chains.items()
                )
                + "."
            )
        )
    return section
