"""The attention sections: the followed patch's attention rows (per head, its five largest keys,
through the blocks) and the attention entropy results (e^H, its histograms and per-block spread)."""

from __future__ import annotations

import numpy as np

from ..analyses.stats import bootstrap_mean
from ..results.summaries import ENTROPY_LABELS, statistic_rows
from . import figures_attention, followed, registers
from .content import Note, Section, Table
from .context import Context
from .sections_kit import HOW, _lacking, _other_grids, _pct

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
        rows.append([str(h), f"{att.effective[h, query]:.1f}", f"{100 * att.effective[h, query] / att.weights.shape[-1]:.1f} %", _weights_cell(att, h, query), cls])
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
        png = figures_attention.attention_rows(
            att.patch_rows(q), att.ranked[:, q], att.effective[:, q], grid, patch, f"{store.label}: row of patch {patch}, last block", att.cls_weight(q), vmax=scale
        )
        section.blocks.append(
            ctx.figure(
                "attention-patch",
                png,
                f"{store.label}: patch {patch}'s row of the last block's attention in every head; five largest weights outlined, the patch itself dashed.",
            )
        )
        section.blocks.append(_row_table(store.label, att, q, f"row of patch {patch}"))
        if att.start > att.registers:  # the network has a class token (token 0)
            png = figures_attention.attention_rows(
                att.patch_rows(0), att.ranked[:, 0], att.effective[:, 0], grid, None, f"{store.label}: the class token's row, last block", vmax=cls_scale
            )
            section.blocks.append(ctx.figure("attention-cls", png, f"{store.label}: where the class token looks, head by head."))
            section.blocks.append(_row_table(store.label, att, 0, "the class token's row"))
        if att.registers:  # DINOv2's register tokens, drawn as the registers paper draws them (report/registers.py)
            png = registers.register_maps(att, grid, f"{store.label}: class token and registers, last block, mean over heads")
            section.blocks.append(
                ctx.figure(
                    "attention-registers",
                    png,
                    f"{store.label}: where the class token and each of the {att.registers} "
                    "register tokens look (Darcet et al. 2024, Vision Transformers Need Registers, Fig. 9).",
                )
            )
        through = followed.blocks(store, ctx.follow, patch)
        if through is None:
            no_blocks.append(store)
            continue
        png = figures_attention.block_rows(through.rows, through.effective, through.blocks, grid, patch, f"{store.label}: patch {patch} through the blocks")
        section.blocks.append(ctx.figure("attention-blocks", png, f"{store.label}: patch {patch}'s row in every block (rows) and head (columns)."))
        section.blocks.append(
            Table(
                ["block", *[f"head {h}" for h in range(through.effective.shape[1])]],
                [[str(b), *[f"{v:.1f}" for v in through.effective[i]]] for i, b in enumerate(through.blocks)],
                f"{store.label}: e^H of patch {patch}'s row in every block and head",
            )
        )
    _lacking(section, without, f"last-block attention of {ctx.follow}", HOW["attention"])
    _lacking(section, no_blocks, "attention of every block", HOW["blocks"])
    return section


# ----------------------------------------------------------------------------------------------
# attention entropy (results/entropy)


def block_interval(ds, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The percentile-bootstrap interval over images of a per-image (image, block, head) array,
    with the result's own bootstrap settings (``n_boot``, ``seed``, ``level``): its summary
    table's intervals, per block and head."""
    values = np.asarray(ds[name].values, dtype=np.float64)
    n, blocks, heads = values.shape
    interval = bootstrap_mean(
        values.reshape(n, blocks * heads), n_boot=int(ds.attrs.get("n_boot", 1000)), seed=int(ds.attrs.get("seed", 0)), level=float(ds.attrs.get("level", 0.95))
    )
    return interval.low.reshape(blocks, heads), interval.high.reshape(blocks, heads)


def entropy(ctx: Context) -> Section:
    section = Section("entropy", "Attention spread: entropy and e^H")
    found = {s.label: s.result("entropy") for s in ctx.stores if s.result("entropy") is not None}
    how = HOW["entropy"].format(patch=ctx.patch)
    if not found:
        section.missing(f"No attention entropy yet: {how}.")
        return section
    labels = list(found)
    level = int(round(100 * float(next(iter(found.values())).attrs.get("level", 0.95))))
    rows = statistic_rows(found, ENTROPY_LABELS)
    rows.append(["keys per row T", *[str(ds.attrs.get("n_keys")) for ds in found.values()]])
    rows.append(["images", *[str(ds.attrs.get("n_images")) for ds in found.values()]])
    section.blocks.append(Table(["statistic", *labels], rows, f"Last block, patch rows over all keys; mean over images [{level} % bootstrap interval]."))
    per_head = []
    for label, ds in found.items():  # one row per store and head: one number per cell
        for h in range(ds.sizes["head"]):
            cls = f"{float(ds.set_cls_effective.values[h]):.1f}" if "set_cls_effective" in ds else "–"
            per_head.append(
                [label, str(h), f"{float(ds.set_patch_effective.values[h]):.1f}", _pct(ds.set_patch_share.values[h]), f"{float(ds.set_distance.values[h]):.2f}", cls]
            )
    section.blocks.append(
        Table(
            ["store", "head", "mean e^H (tokens)", "share of T", "distance (patches)", "[CLS] row e^H"],
            per_head,
            "Per head: mean e^H of a patch row, its share of T, mean attention distance; the class token's row where there is one.",
        )
    )
    png = figures_attention.effective_histograms(
        {label: ds.patch_effective.values for label, ds in found.items()}, {label: int(ds.attrs.get("n_keys", 196)) for label, ds in found.items()}
    )
    section.blocks.append(
        ctx.figure(
            "entropy-histograms",
            png,
            "Per head, how the images' mean e^H of a patch row is distributed: one outline per store on shared bins fitted to the data; dotted: T, a uniform row.",
        )
    )
    blocks = {label: ds for label, ds in found.items() if "set_block_patch_effective" in ds}
    if blocks:
        keys = {int(ds.attrs.get("n_keys", 0)) for ds in blocks.values()}
        png = figures_attention.block_spread(
            {label: ds.set_block_patch_effective.values for label, ds in blocks.items()},
            {label: [int(b) for b in ds.block.values] for label, ds in blocks.items()},
            {label: block_interval(ds, "block_patch_effective") for label, ds in blocks.items()},
            keys.pop() if len(keys) == 1 else None,
        )
        section.blocks.append(
            ctx.figure(
                "entropy-blocks",
                png,
                f"Mean e^H of a patch row in every block, per head, with its {level} % bootstrap "
                "interval over images (band); the axis runs from 0 past T (dotted, a uniform row), "
                "so differences show at their size relative to the whole range.",
            )
        )
        near = {label: ds for label, ds in blocks.items() if "set_block_distance" in ds}
        png = figures_attention.per_block(
            {label: ds.set_block_distance.values for label, ds in near.items()},
            {label: [int(b) for b in ds.block.values] for label, ds in near.items()},
            "mean attention distance (patches)",
            intervals={label: block_interval(ds, "block_distance") for label, ds in near.items()},
        )
        section.blocks.append(
            ctx.figure(
                "attention-distance-blocks",
                png,
                "Mean attention distance of the patch rows (Dosovitskiy et al., ICLR 2021, "
                f"Fig. 7: the attention-weighted distance to every patch) per head against block, "
                f"with its {level} % bootstrap interval over images (band); the axis starts at 0.",
            )
        )
    _lacking(section, [s for s in ctx.stores if s.label not in found], "attention entropy", how)
    return section
