"""What the label-free protocols print at the terminal (rank, position, similarity, overcluster):
rich tables built from a run's report, nothing read or computed here."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table

from .summaries import store_label

if TYPE_CHECKING:
    from .overcluster_report import OverclusterReport
    from .position_report import PositionReport
    from .rank_report import RankReport
    from .similarity_report import SimilarityReport


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if value is not None and math.isfinite(value) else "–"


def rank(report: RankReport) -> list[Any]:
    """``probe rank``: RankMe per store and kind of tokens, the sample-size curve, LiDAR."""
    kinds = list(report.stores[0].rankme) if report.stores else []
    table = Table(title=f"RankMe at the {report.view} view (Garrido et al. 2023; ε = 1e-7)")
    table.add_column("store")
    table.add_column("block", justify="right")
    for kind in kinds:
        table.add_column(f"{kind} tokens (rows)", justify="right")
    table.add_column("LiDAR", justify="right")
    for s in report.stores:
        table.add_row(store_label(str(s.store)), str(s.block), *(f"{_num(s.rankme[k])} of {s.width} ({s.rows[k]:,})" for k in kinds), _num(s.lidar))
    out: list[Any] = [table]
    for s in report.stores:
        for kind, curve in s.curve.items():
            if curve:
                out.append(f"{store_label(str(s.store))} {kind} tokens, RankMe by rows: " + ", ".join(f"{n:,}: {_num(v)}" for n, v in curve.items()))
        if not math.isfinite(s.lidar):
            out.append(f"{store_label(str(s.store))}: no LiDAR — {s.lidar_note}")
    return out


def position(report: PositionReport) -> list[Any]:
    """``probe position``: the held-out error of the position probe per store."""
    table = Table(title=f"Linear position probe at the {report.view} view (NVlabs/RADIO position_predictor.py)")
    table.add_column("store", overflow="fold")
    for column in ("block", "grid", "train/held", "L1", "row", "col", "SmoothL1", "chance"):
        table.add_column(column, justify="right")
    for s in report.stores:
        f = s.fit
        table.add_row(
            store_label(str(s.store)),
            str(s.block),
            f"{s.grid}×{s.grid}",
            f"{s.images['train']} / {s.images['held_out']}",
            _num(f.l1, 4),
            _num(f.l1_row, 4),
            _num(f.l1_col, 4),
            _num(f.loss, 4),
            _num(f.chance, 3),
        )
    return [
        table,
        (
            "L1: mean |prediction − target| on the held-out images, in the targets' [-1, 1] units (about 0.02 for a trained ViT); "
            "SmoothL1: RADIO's reported loss; chance: the L1 of the best constant on the grid."
        ),
    ]


def similarity(report: SimilarityReport) -> list[Any]:
    """``probe similarity``: the CKA matrix (sets of the first store as rows), the minibatch estimator's beside it."""
    rows = list(range(len(report.sets)))
    cols = [j for j, s in enumerate(report.sets) if s.startswith("b:")] if report.other else rows
    if report.other:
        rows = [i for i, s in enumerate(report.sets) if s.startswith("a:")]
    out: list[Any] = []
    for name, matrix in (("linear CKA (Kornblith et al. 2019)", report.cka), ("unbiased minibatch CKA (Nguyen et al. 2021)", report.cka_minibatch)):
        if not math.isfinite(float(matrix[rows[0], cols[0]])):
            continue
        out.append(f"{name}: rows {store_label(str(report.store))}" + (f", columns {store_label(str(report.other))}" if report.other else ""))
        table = Table()
        table.add_column("set")
        for j in cols:
            table.add_column(report.sets[j], justify="right")
        for i in rows:
            table.add_row(report.sets[i], *(_num(float(matrix[i, j]), 3) for j in cols))
        out.append(table)
    out.append(
        f"{report.examples:,} examples; sets are <store>:<block> (a = {store_label(str(report.store))}"
        + (f", b = {store_label(str(report.other))}" if report.other else "")
        + ")"
    )
    if report.minibatch_note:
        out.append(f"minibatch estimator not computed: {report.minibatch_note}")
    return out


def overcluster(report: OverclusterReport) -> list[Any]:
    """``probe overcluster``: mIoU at each k, mean over seeds and its spread."""
    table = Table(title=f"Overclustering on {report.panel} (vpariza/NeCo eval_overcluster.py)")
    for column in ("k", "matching", "mIoU (%)", "over seeds (%)"):
        table.add_column(column, justify="right")
    for i, k in enumerate(report.ks):
        seeds = report.miou_seed[i]
        table.add_row(str(k), report.matching[i], f"{100 * report.miou[i]:.2f}", f"{100 * seeds.min():.2f} – {100 * seeds.max():.2f} ({len(seeds)})")
    return [
        table,
        f"{report.counts['images']} images, {report.counts['tokens']:,} patch tokens, {report.counts['pixels']:,} scored pixels at 100 × 100; "
        f"labels: ledger entry {report.ledger[:12]}",
    ]
