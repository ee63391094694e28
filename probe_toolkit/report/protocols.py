"""Report sections for the frozen-feature protocols of DINO and SelfPatch: k-NN, attention masks,
DAVIS label propagation. Each reads its saved result (``results/knn``, ``results/attention_masks``,
``results/davis``) and shows the published numbers beside it only as numbers measured elsewhere
(other weights, other data), with their sources.
"""

from __future__ import annotations

from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure as MplFigure

from . import figures, protocol_figures
from .content import Note, Section, Table
from .sections_kit import results_section
from .sources import shown_path

ELSEWHERE = "published elsewhere (other weights and data; not comparable with the numbers above)"
KNN_PUBLISHED = "DINO ViT-S/16 on ImageNet: k-NN (k = 20) 74.5 % top-1, linear 77.0 % (DINO paper, Caron et al. 2021, Table 2; also facebookresearch/dino README.md)."
MASKS_PUBLISHED = (
    "Jaccard of the 60 % class-token masks with the objects on PASCAL VOC12 val, ViT-S/16: DINO 45.9, "
    "supervised 27.3, random weights 22.0 (DINO paper, Caron et al. 2021, Figure 4; best head per object, "
    "as described in facebookresearch/dino issue #54)."
)
DAVIS_PUBLISHED = (
    "DAVIS-2017 val J&F-mean, ViT-S/16 label propagation: DINO 60.7 and DINO + SelfPatch 62.7 (SelfPatch paper, "
    "Yun et al. 2022, its DAVIS-2017 table); DINO 61.8 (DINO paper, Caron et al. 2021, Table 5)."
)
HOW = {
    "knn": "run `probe knn STORE --train PANEL --val PANEL`",
    "attention_masks": "run `probe attention-masks STORE --panel NAME` (needs `--views 224 --attention last`)",
    "davis": "run `probe propagate CKPT --davis DIR --out DIR` (results are saved into the checkpoint's store)",
}


def _pct(x: Any, digits: int = 1) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if not np.isfinite(v) else f"{100 * v:.{digits}f}"


def _begin(ctx, key: str, title: str, result: str, what: str) -> tuple[Section, dict]:
    """The section and each store's saved ``result``; a line saying how to make it when none has it."""
    section, found = results_section(ctx, key, title, result, what, HOW[result])
    return section, {label: ds for label, (_, ds) in found.items()}


def _lacking(section: Section, ctx, found: dict, what: str, how: str) -> None:
    missing = [s.label for s in ctx.stores if s.label not in found]
    if missing:
        section.missing(f"No {what} for {', '.join(missing)}: {how}.")


def knn(ctx) -> Section:
    section, found = _begin(ctx, "knn", "k-NN classification on frozen features (DINO's eval_knn.py)", "knn", "k-NN results")
    if not found:
        return section
    for label, ds in found.items():
        rows = [[str(int(k)), _pct(ds.top1.values[i], 2), _pct(ds.top5.values[i], 2)] for i, k in enumerate(ds.k.values)]
        pan, counts = ds.attrs.get("panels", {}), ds.attrs.get("counts", {})
        section.blocks.append(
            Table(
                ["k", "top-1 (%)", "top-5 (%)"],
                rows,
                f"{label}: {pan.get('train', {}).get('name', '?')} ({counts.get('train', '?')} images) → "
                f"{pan.get('val', {}).get('name', '?')} ({counts.get('val', '?')} images, {counts.get('classes', '?')} classes); "
                f"T = {ds.attrs.get('temperature')}; top-5 is undefined (–) with 5 classes or fewer.",
            )
        )
        led = ds.attrs.get("ledger", {})
        section.blocks.append(
            Note(
                f"{label}: feature — {ds.attrs.get('feature_text', '?')}; view — {ds.attrs.get('view_text', ds.attrs.get('view', '?'))}. "
                f"Labels: train {ctx.book.describe(led.get('train'))}; val {ctx.book.describe(led.get('val'))}."
            )
        )
        if "neighbour" in ds:
            grid, from_tokens, nothing = protocol_figures.knn_figure(ctx, next(s for s in ctx.stores if s.label == label), ds)
            section.blocks.append(grid)
            if from_tokens:
                section.blocks.append(
                    Note(
                        f"{label}: no image file found for {', '.join(from_tokens)} (looked under the image folders of the "
                        "stores k-NN read); drawn from their tokens' first three principal components."
                    )
                )
            if nothing:
                section.blocks.append(Note(f"{label}: no picture of {', '.join(nothing)}: neither its file nor its 224 tokens were found.", "missing"))
    section.blocks.append(Note(f"{ELSEWHERE}: {KNN_PUBLISHED}", "reference"))
    _lacking(section, ctx, found, "k-NN results", HOW["knn"])
    return section


def head_masks(rgb: np.ndarray, masks: np.ndarray, grid: tuple[int, int], title: str) -> bytes:
    """The followed image with each head's mask filled and outlined (DINO's Figure 3 picture)."""
    heads = masks.shape[0]
    rows, cols = grid
    fig = MplFigure(figsize=(2.0 * (heads + 1), 2.4))
    axes = fig.subplots(1, heads + 1, squeeze=False)[0]
    axes[0].imshow(rgb)
    axes[0].set_title("image", fontsize=9)
    colour = matplotlib.colors.to_rgb(figures.PALETTE[0])
    for h in range(heads):
        m = masks[h].reshape(rows, cols).astype(bool)
        big = np.kron(m, np.ones((rgb.shape[0] // rows, rgb.shape[1] // cols), bool))
        ax = axes[h + 1]
        ax.imshow(rgb)
        overlay = np.zeros((*big.shape, 4))
        overlay[big] = (*colour, 0.55)
        ax.imshow(overlay)
        if big.any() and not big.all():
            ax.contour(big.astype(float), levels=[0.5], colors=[colour], linewidths=1.2)
        ax.set_title(f"head {h}: {int(m.sum())} patches", fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return figures.png(fig)


def attention_masks(ctx) -> Section:
    section, found = _begin(
        ctx, "attention-masks", "Attention masks: 60 % of the attention per head (DINO's visualize_attention.py)", "attention_masks", "attention masks"
    )
    if not found:
        return section
    for label, ds in found.items():
        mass = float(ds.attrs.get("mass", 0.6))
        if "jaccard_mean" in ds:
            heads = [f"head {int(h)}" for h in ds["head"].values]
            counts = ds.attrs.get("counts", {})
            section.blocks.append(
                Table(
                    ["", *heads, "best head (per image)", "best head per object (dino #54)"],
                    [["Jaccard (%)", *[_pct(v) for v in ds.jaccard_mean.values], _pct(ds.best_mean.values), _pct(ds.per_object_mean.values)]],
                    f"{label}: masks of {ds.attrs.get('row_text', '?')}, {100 * mass:.0f} % of the mass, against the objects of panel "
                    f"{ds.attrs.get('panel', {}).get('name', '?')} ({counts.get('scored', '?')} images, {counts.get('objects', '?')} objects; "
                    f"{ctx.book.describe(ds.attrs.get('ledger_entry'))}); mean over images.",
                )
            )
        else:
            section.blocks.append(Note(f"{label}: masks of {ds.attrs.get('row_text', '?')} without a panel (no Jaccard); add `--panel NAME` to score them."))
        ids = [str(i) for i in ds.image.values]
        if ctx.follow in ids and ctx.picture is not None and ctx.picture.rgb is not None:
            grid = tuple(int(v) for v in ds.attrs.get("grid", [int(round(ds.sizes["patch"] ** 0.5))] * 2))
            masks = ds["mask"].values[ids.index(ctx.follow)]
            png = head_masks(ctx.picture.rgb, masks, grid, f"{label}: {ctx.follow}, each head's {100 * mass:.0f} % mask")
            section.blocks.append(
                ctx.figure(
                    "attention-masks",
                    png,
                    f"{label}: the smallest set of patches holding {100 * mass:.0f} % of {ds.attrs.get('row_text', '?')}, head by head, on {ctx.follow}'s 224 view.",
                )
            )
        looks = ds.attrs.get("looks")
        if looks:  # storage (register) tokens: where the class token and each of them look
            section.blocks.append(
                Table(
                    ["token", "on the class token (%)", "on the storage tokens (%)", "on the patches (%)", "its mask: share of the patches (%)"],
                    [[token, *[_pct(looks[key][i]) for key in ("on_class", "on_storage", "on_patches", "mask_share")]] for i, token in enumerate(looks["token"])],
                    f"{label}: where the class token and each storage token look in the last block, mean over images and heads; "
                    f"the class token's masks above are its row over the patches alone, each storage token's own "
                    f"{100 * mass:.0f} % masks are kept apart (storage_mask).",
                )
            )
        section.blocks.append(Note(f"Resolution: {ds.attrs.get('resolution', '?')}."))
    section.blocks.append(Note(f"{ELSEWHERE}: {MASKS_PUBLISHED}", "reference"))
    _lacking(section, ctx, found, "attention masks", HOW["attention_masks"])
    return section


def propagation(ctx) -> Section:
    section, found = _begin(ctx, "davis", "DAVIS-2017 label propagation (DINO's eval_video_segmentation.py)", "davis", "label propagation")
    if not found:
        return section
    columns = (("jf_mean", "J&F-Mean"), ("j", "J-Mean"), ("f", "F-Mean"))
    rows = [
        [label, *[f"{float(ds[key].values):.3f}" for key, _ in columns], str(len(ds.attrs.get("sequences", []))), str(ds.attrs.get("frames", "?"))]
        for label, ds in found.items()
    ]
    section.blocks.append(
        Table(
            ["store", *[name for _, name in columns], "sequences", "frames"],
            rows,
            "davis2017-evaluation's semi-supervised measures (first and last frames not scored); fractions, as its CSV tables.",
        )
    )
    for label, ds in found.items():
        per = [
            [
                str(o),
                f"{float(ds.j_mean.values[i]):.3f}",
                f"{float(ds.f_mean.values[i]):.3f}",
                f"{float(ds.j_recall.values[i]):.3f}",
                f"{float(ds.j_decay.values[i]):.3f}",
            ]
            for i, o in enumerate(ds.object.values)
        ]
        st = ds.attrs.get("settings", {})
        led = ds.attrs.get("ledger", {})
        section.blocks.append(
            Table(
                ["object", "J-Mean", "F-Mean", "J-Recall", "J-Decay"],
                per,
                f"{label}: per object; context the first frame + {st.get('n_last_frames')} previous, window radius "
                f"{st.get('size_mask_neighborhood')}, top {st.get('topk')}; predictions in {shown_path(ds.attrs.get('out'))}.",
            )
        )
        section.blocks.append(
            Note(
                f"{label}: frames — {ds.attrs.get('frame_size', '?')}; features — {ds.attrs.get('feature', '?')}. Labels: first frames "
                f"{ctx.book.describe(led.get('first_frames'))}; scorer {ctx.book.describe(led.get('score'))}."
            )
        )
        section.blocks.append(protocol_figures.propagation_figure(ctx, label, ds))
    section.blocks.append(Note(f"{ELSEWHERE}: {DAVIS_PUBLISHED}", "reference"))
    _lacking(section, ctx, found, "label propagation", HOW["davis"])
    return section
