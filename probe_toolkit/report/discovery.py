"""Object discovery on the field's benchmarks: CorLoc on VOC07 / VOC12 / COCO20k and the saliency
scores, each beside the published DINO ViT-S/16 numbers of TokenCut and LOST (their READMEs),
labelled as measured on other weights until a store holds the released checkpoint's keys.

TokenCut's two tables come from two views of each image: its CorLoc from ``main_tokencut.py``,
which zero-pads the image to whole patches (view ``native``), its saliency from
``unsupervised_saliency_detection/get_saliency.py``, which resizes it with LANCZOS to
round(side/16)·16 (view ``native_resized``); each row names the view its masks were cut on.
"""

from __future__ import annotations

import numpy as np

from .content import Note, Section, Table
from .references import OTHER_WEIGHTS

# CorLoc (%), DINO ViT-S/16: TokenCut README and LOST README (decoders.md §1c, §3c, tag [R])
CORLOC = {
    "TokenCut": {"VOC07": 68.8, "VOC12": 72.1, "COCO20k": 58.8},
    "LOST": {"VOC07": 61.9, "VOC12": 64.0, "COCO20k": 50.7},
}
# saliency (%), DINO ViT-S/16, TokenCut README: maxFβ / IoU / accuracy, without and with the bilateral solver
SALIENCY = {
    ("ECSSD", ""): (80.3, 71.2, 91.8),
    ("ECSSD", "bilateral"): (87.4, 77.2, 93.4),
    ("DUTS-TE", ""): (67.2, 57.6, 90.3),
    ("DUTS-TE", "bilateral"): (75.5, 62.4, 91.4),
    ("DUT-OMRON", ""): (60.0, 53.3, 88.0),
    ("DUT-OMRON", "bilateral"): (69.7, 61.8, 89.7),
}
HOW = "run `probe decode STORE --preset tokencut|lost|dsm --panel NAME` on a VOC, COCO20k (`probe panel add --voc / --coco20k`) or saliency panel (`--masks`)"


def _pct(x) -> str:
    return "–" if x is None or not np.isfinite(float(x)) else f"{100 * float(x):.1f}"


def discovery(ctx) -> Section:
    section = Section("discovery", "Object discovery on the published benchmarks (CorLoc, saliency)")
    corloc_rows, saliency_rows = [], []
    for store in ctx.stores:
        for name in sorted(store.results):
            if dict.get(store.results, name).attrs.get("kind") not in ("voc", "coco20k", "saliency"):
                continue  # looked at, not shown: its settings are not this section's
            ds = store.results[name]
            attrs = ds.attrs
            bench = attrs.get("benchmark") or "?"
            preset = attrs.get("settings", {}).get("preset", "?")
            where = ctx.book.describe(attrs.get("ledger_entry"))
            if name.startswith("scores_"):
                note = attrs.get("coco20k_images", "") + (" no-hard" if attrs.get("no_hard") else "")
                published = "; ".join(f"{m} {v[bench]}" for m, v in CORLOC.items() if bench in v) or "–"
                corloc_rows.append(
                    [store.label, name.removeprefix("scores_"), f"{bench} {note}".strip(), preset, _pct(ds["corloc"].values), f"{published} ({OTHER_WEIGHTS})", where]
                )
            elif name.startswith("saliency_"):
                refine = attrs.get("refine", "")
                ref = SALIENCY.get((bench, refine))
                view = f", {attrs['view']} view" if attrs.get("view") else ""
                saliency_rows.append(
                    [
                        store.label,
                        name.removeprefix("saliency_"),
                        bench,
                        preset + (" + BS" if refine else "") + view,
                        *(_pct(ds[k].values) for k in ("max_f", "iou", "accuracy")),
                        f"{float(ds['mae'].values):.3f}",
                        f"{float(ds['s_measure'].values):.3f}",
                        (" / ".join(f"{v}" for v in ref) + f" ({OTHER_WEIGHTS})") if ref else "–",
                        where,
                    ]
                )
    if corloc_rows:
        section.blocks.append(
            Table(
                ["store", "panel", "benchmark", "preset", "CorLoc %", "published, DINO ViT-S/16 (TokenCut; LOST READMEs)", "ledger entry"],
                corloc_rows,
                "CorLoc as LOST's main_lost.py counts it: one box per image, a hit when IoU ≥ 0.5 with any ground-truth box.",
            )
        )
    if saliency_rows:
        section.blocks.append(
            Table(
                [
                    "store",
                    "panel",
                    "benchmark",
                    "preset",
                    "maxFβ %",
                    "IoU %",
                    "accuracy %",
                    "MAE",
                    "S-measure",
                    "published maxFβ / IoU / accuracy, TokenCut ViT-S/16 (README)",
                    "ledger entry",
                ],
                saliency_rows,
                "Saliency as TokenCut's metric.py computes it (β² = 0.3, 255 thresholds, dataset-level max); MAE and S-measure by pysodmetrics.",
            )
        )
    if corloc_rows or saliency_rows:
        section.blocks.append(
            Note(
                "The published numbers use DINO's released ViT-S/16 at each image's own size: TokenCut's CorLoc on the "
                "image zero-padded to whole patches (main_tokencut.py, view native), its saliency on the image resized with "
                "LANCZOS to round(side/16)·16 (unsupervised_saliency_detection/get_saliency.py, view native_resized); a store "
                "of other weights or another view (480 squash) is not expected to match them.",
                "reference",
            )
        )
    else:
        section.missing(f"No object-discovery benchmark scores yet: {HOW}.")
    return section
