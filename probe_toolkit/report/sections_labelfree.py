"""The report sections of the label-free protocols: rank (RankMe, LiDAR), position (the linear
position probe's error), similarity (the CKA matrix) and overcluster (k-means mIoU).

They read the records only (``results/rank``, ``results/position``, ``results/similarity``,
``results/overcluster``). Rank and position are one record per block: their figures draw every
record of a store, the latest of each block, one line per store (checkpoint) over the blocks.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure as MplFigure

from ..results import records
from . import figures
from .content import Note, Section, Table
from .sections_blocks import per_block_figure
from .sections_kit import lacking, results_section

RANK_HOW = "run `probe rank STORE...` (reads the 224 view's tokens; no panel)"
POSITION_HOW = "run `probe position STORE...` (reads the 224 view's patch tokens; no panel)"
SIMILARITY_HOW = "run `probe similarity STORE` (between its blocks) or `probe similarity STORE --other STORE2` (between checkpoints)"
OVERCLUSTER_HOW = "run `probe overcluster STORE --panel PANEL` (a VOC segmentation panel extracted with --views hbird@448)"


def _num(value, digits: int = 2) -> str:
    v = float(value)
    return f"{v:.{digits}f}" if np.isfinite(v) else "–"


def placeholders(note: str, stores: dict) -> str:
    """A record's note with its stores' paths as STORE and OTHER: a report names no folder of the machine it was made on."""
    import shlex

    for key, placeholder in (("a", "STORE"), ("b", "OTHER")):
        path = (stores.get(key) or {}).get("path")
        if path:
            note = note.replace(shlex.quote(path), placeholder).replace(path, placeholder)
    return note


def by_block(store, result: str, like: dict) -> dict[int, object]:
    """The latest record of ``result`` of each block in ``store`` whose attrs agree with ``like`` (comparable runs only)."""
    out = {}
    for record in records.runs(store, result):
        ds = records.load(store, result, record.run_id)
        if ds is None or any(ds.attrs.get(k) != v for k, v in like.items()):
            continue
        out[int(ds.attrs.get("block", -1))] = ds  # runs sort oldest first: the latest of a block wins
    return dict(sorted(out.items()))


def rank(ctx) -> Section:
    section, found = results_section(ctx, "rank", "Rank of the tokens (RankMe, LiDAR)", "rank", "rank results", RANK_HOW)
    rows, lines = [], {}
    for label, (store, ds) in found.items():
        kinds = [str(k) for k in ds.tokens.values]
        width = int(ds.attrs.get("width", 0))
        for i, kind in enumerate(kinds):
            curve = ", ".join(f"{int(n):,}: {_num(v)}" for n, v in zip(ds.n.values, ds.curve.values[i]) if np.isfinite(v))
            rows.append(
                [
                    label,
                    str(int(ds.attrs.get("block", -1))),
                    kind,
                    f"{_num(ds.rankme.values[i])} of {width}",
                    f"{int(ds.rows.values[i]):,}",
                    curve or "–",
                    _num(ds.lidar.values) if kind == "class" else "–",
                ]
            )
        like = {"view": ds.attrs.get("view")}
        for kind in kinds:
            points = {b: float(r.rankme.sel(tokens=kind)) for b, r in by_block(store.path, "rank", like).items() if kind in r.tokens.values}
            if points:
                lines[f"{label} ({kind})"] = points
        if not np.isfinite(float(ds.lidar.values)):
            section.blocks.append(Note(f"{label}: no LiDAR — {ds.attrs.get('lidar_note', '?')}."))
    if rows:
        section.blocks.append(
            Table(
                ["store", "block", "tokens", "RankMe", "rows", "RankMe by rows (nested seeded subsets)", "LiDAR"],
                rows,
                "RankMe = exp(entropy of the singular values normalised to sum 1, + 1e-7) of the block's tokens, not "
                "centred (Garrido et al. 2023); at most min(rows, width). It grows with the rows until rows ≫ width: "
                "compare stores at the same rows (the curve). LiDAR: RADIO's calc_lidar over the views the store holds "
                "of each image.",
            )
        )
    if lines:
        section.blocks.append(
            ctx.figure(
                "rank-by-block", per_block_figure(lines, "RankMe"), "RankMe of each store's tokens at every block it was measured on (the latest record of each block)."
            )
        )
    return lacking(section, ctx, found, "rank results", RANK_HOW)


def position(ctx) -> Section:
    section, found = results_section(ctx, "position", "Positional information (linear position probe)", "position", "position results", POSITION_HOW)
    rows, lines, chance = [], {}, None
    for label, (store, ds) in found.items():
        images, settings = ds.attrs.get("images", {}), ds.attrs.get("settings", {})
        grid = int(ds.attrs.get("grid", 0))
        rows.append(
            [
                label,
                str(int(ds.attrs.get("block", -1))),
                f"{grid}×{grid}",
                f"{images.get('train', '?')} / {images.get('held_out', '?')}",
                _num(ds.l1.values, 4),
                _num(ds.l1_row.values, 4),
                _num(ds.l1_col.values, 4),
                _num(ds.loss.values, 4),
                _num(ds.chance.values, 3),
            ]
        )
        like = {"view": ds.attrs.get("view"), "grid": grid}
        points = {b: float(r.l1.values) for b, r in by_block(store.path, "position", like).items()}
        if points:
            lines[label] = points
            chance = float(ds.chance.values)
        section.blocks.append(
            Note(
                f"{label}: view {ds.attrs.get('view')}, held-out share {settings.get('held_out', '?')} (seed {settings.get('seed', '?')}), "
                f"Adam lr {settings.get('lr', '?')}, {settings.get('epochs', '?')} epochs of batches of {settings.get('batch', '?')} images."
            )
        )
    if rows:
        section.blocks.append(
            Table(
                ["store", "block", "grid", "train / held out", "L1", "row", "col", "SmoothL1 (RADIO)", "chance L1"],
                rows,
                "Held-out error of a linear map from each L2-normalised patch token to its (row, col) in [-1, 1] "
                "(NVlabs/RADIO position_predictor.py): about 0.02 for a trained ViT; chance is the best constant's L1.",
            )
        )
    if lines:
        section.blocks.append(
            ctx.figure(
                "position-by-block",
                per_block_figure(lines, "held-out L1 error", chance),
                "Position probe error of each store's patch tokens at every block it was measured on; dashed: chance.",
            )
        )
    return lacking(section, ctx, found, "position results", POSITION_HOW)


def cka_figure(matrix: np.ndarray, rows: list[str], cols: list[str], title: str) -> figures.Drawing:
    """The block-by-block CKA matrix, 0 to 1, each cell written."""
    fig = MplFigure(figsize=(1.0 + 0.45 * len(cols), 0.8 + 0.4 * len(rows)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="magma", origin="lower")
    ax.set_xticks(range(len(cols)), cols, fontsize=6, rotation=90)
    ax.set_yticks(range(len(rows)), rows, fontsize=6)
    if len(rows) * len(cols) <= 400:
        for i in range(len(rows)):
            for j in range(len(cols)):
                if np.isfinite(matrix[i, j]):
                    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=5, color="white" if matrix[i, j] < 0.6 else "black")
    ax.set_title(title, fontsize=7)
    fig.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=6)
    return figures.png(fig)


def similarity(ctx) -> Section:
    section, found = results_section(ctx, "similarity", "Representation similarity (linear CKA)", "similarity", "similarity results", SIMILARITY_HOW)
    for label, (_, ds) in found.items():
        sets = [str(s) for s in ds.set.values]
        stores = ds.attrs.get("stores", {})
        two = "b" in stores
        rows = [i for i, s in enumerate(sets) if s.startswith("a:")]
        cols = [i for i, s in enumerate(sets) if s.startswith("b:")] if two else rows
        other = str(stores.get("b", {}).get("path", "b"))
        names = {"a": label, "b": next((s.label for s in ctx.stores if str(s.path.absolute()) == other), other)}
        against = f"{label} against {names['b']}" if two else f"{label}, block against block"
        for variable, what in (("cka", "linear CKA (Kornblith et al. 2019)"), ("cka_minibatch", "unbiased minibatch CKA (Nguyen et al. 2021)")):
            matrix = np.asarray(ds[variable].values)[np.ix_(rows, cols)]
            if not np.isfinite(matrix).any():
                continue
            row_names = [f"block {ds.block.values[i]}" for i in rows]
            col_names = [f"block {ds.block.values[j]}" for j in cols]
            section.blocks.append(
                Table(
                    ["", *col_names],
                    [[r, *(_num(v, 3) for v in line)] for r, line in zip(row_names, matrix)],
                    f"{against}: {what}; {ds.attrs.get('examples_count', '?'):,} examples ({ds.attrs.get('examples')}) at the "
                    f"{ds.attrs.get('view')} view" + (f", {ds.attrs.get('batches')} minibatches of {ds.attrs.get('batch')}" if variable == "cka_minibatch" else "") + ".",
                )
            )
            section.blocks.append(
                ctx.figure(
                    f"cka-{variable}",
                    cka_figure(matrix, row_names, col_names, f"{what}\n{figures.wrap(against, 50)}"),
                    f"{against}: {what}, rows and columns the blocks (0-based).",
                )
            )
        if ds.attrs.get("minibatch_note"):
            section.blocks.append(Note(f"{label}: minibatch estimator not computed — {placeholders(ds.attrs['minibatch_note'], ds.attrs.get('stores') or {})}."))
        if ds.attrs.get("examples") != "class" or int(ds.attrs.get("examples_count", 0)) < 10 * 384:
            section.blocks.append(
                Note(
                    "The full estimator is biased towards 1 when examples are few against the features "
                    "(Kornblith et al. 2019; Nguyen et al. 2021): read the minibatch estimator where both exist."
                )
            )
    return lacking(section, ctx, found, "similarity results", SIMILARITY_HOW)


def overcluster(ctx) -> Section:
    section, found = results_section(
        ctx, "overcluster", "Overclustering (k-means on patch tokens, NeCo's protocol)", "overcluster", "overclustering results", OVERCLUSTER_HOW
    )
    for label, (_, ds) in found.items():
        matching, panel, counts = ds.attrs.get("matching", {}), ds.attrs.get("panel", {}), ds.attrs.get("counts", {})
        rows = [
            [
                str(int(k)),
                str(matching.get(str(int(k)), "?")),
                _num(100 * ds.miou.values[i]),
                f"{_num(100 * ds.miou_seed.values[i].min())} – {_num(100 * ds.miou_seed.values[i].max())}",
            ]
            for i, k in enumerate(ds.k.values)
        ]
        settings = ds.attrs.get("settings", {})
        section.blocks.append(
            Table(
                ["k", "matching", "mIoU (%)", "over seeds (%)"],
                rows,
                f"{label}: {panel.get('name', '?')} ({counts.get('images', '?')} images, {counts.get('tokens', 0):,} patch tokens at the "
                f"{ds.attrs.get('view')} view), standardised, PCA {settings.get('pca_dim', '?')}, faiss k-means "
                f"({settings.get('iterations', '?')} iterations, {settings.get('restarts', '?')} restarts), mean over "
                f"{ds.sizes.get('seed', '?')} seeds; {ds.attrs.get('mask_side')} × {ds.attrs.get('mask_side')} maps, 255 ignored, mean over "
                f"all {ds.sizes.get('class', '?')} classes.",
            )
        )
        section.blocks.append(Note(f"{label}: features — {ds.attrs.get('feature', '?')}; labels read to score only: {ctx.book.describe(ds.attrs.get('ledger'))}."))
    return lacking(section, ctx, found, "overclustering results", OVERCLUSTER_HOW)
