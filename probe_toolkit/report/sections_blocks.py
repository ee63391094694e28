"""The per-block curves: each protocol's number against the block it read (``probe <protocol>
--blocks 3,7,11``: one record per block, each naming its block in ``selection``).

For every store and protocol with records of two blocks or more, the latest record of each block
among the runs of one setting (comparable runs only), one line per store: k-NN
top-1 (k = 20, else the first k), linear accuracy, CorLoc, Hummingbird mIoU (the largest memory),
PCK@0.10 (the mean over categories, every pair), and the patch rows' entropy (from records of
``probe entropy --block``; without those, one record of every block's maps or statistics draws
its own per-block line). Each is headed as ``probe table`` heads it (``report.paper.METRICS``
where that table has the protocol): its unit, in per cent as the protocol's own table prints
it, and the setting that chose it (the k, the memory), so the curve reads beside the tables.
Blocks are 0-based, as ``--block`` and ``get_intermediate_layers`` count them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..results import records
from . import figures
from .content import Section, Table
from .context import Context
from .paper import METRICS, Number

HOW = "run a protocol once per block: `probe knn STORE --train A --val B --blocks 3,7,11` (the store extracted with `--blocks`)"


@dataclass(frozen=True)
class Curve:
    result: str  # the result's name; a prefix where it carries a panel (``scores_``)
    label: str  # what the section's missing note calls it
    numbers: Callable  # the record's Dataset → {heading (its unit and the setting that chose it): Number}


def _last(numbers: dict[str, Number]) -> dict[str, Number]:
    """The last of a record's numbers (Hummingbird's: its largest memory)."""
    heading = list(numbers)[-1]
    return {heading: numbers[heading]}


def _linear(level: str) -> Callable:
    return lambda ds: {f"linear accuracy (%), {level} level": Number(float(ds.accuracy.values))}


def _pck(ds) -> dict[str, Number]:
    thresholds = [float(t) for t in ds.threshold.values] if "threshold" in ds.coords else []
    values = np.asarray(ds.pck_mean.values)
    column = thresholds.index(0.1) if 0.1 in thresholds else 0
    at = f"@{thresholds[column]:.2f}" if thresholds else ""
    return {f"PCK{at} (%), mean over categories": Number(float(values[-1, column]) if values.ndim == 2 else float(values.ravel()[0]))}


ENTROPY = "patch rows' entropy (nats)"


def _entropy(ds) -> dict[str, Number]:
    return {ENTROPY: Number(float(ds.summary_mean.sel(statistic="patch_entropy").values), share=False)}


CURVES = (  # the paper table's numbers (``report.paper.METRICS``) where it has the protocol: the same heading, unit and choice
    Curve("knn", "k-NN top-1", METRICS["knn"].numbers),
    Curve("linear_patch", "linear accuracy (patch)", _linear("patch")),
    Curve("linear_image", "linear accuracy (image)", _linear("image")),
    Curve("scores_", "CorLoc", METRICS["decode"].numbers),
    Curve("hummingbird", "Hummingbird mIoU", lambda ds: _last(METRICS["hummingbird"].numbers(ds))),
    Curve("correspond", "PCK@0.10", _pck),
    Curve("entropy", ENTROPY, _entropy),
)


def by_block(store: Path, result: str) -> dict[int, records.Record]:
    """The latest record of ``result`` of each block (``selection``), among the runs of one setting
    (comparable runs only): the setting with the most blocks, the latest run's where they tie."""
    import json

    groups: dict[str, dict[int, records.Record]] = {}
    order: dict[str, int] = {}
    for i, record in enumerate(records.runs(store, result)):  # oldest first: the latest of a block wins
        block = (record.meta.get("selection") or {}).get("block")
        if block is None:
            continue
        key = json.dumps(record.meta.get("settings"), sort_keys=True, default=str)
        groups.setdefault(key, {})[int(block)] = record
        order[key] = i
    if not groups:
        return {}
    best = max(groups, key=lambda key: (len(groups[key]), order[key]))
    return dict(sorted(groups[best].items()))


def every_block_entropy(ds) -> dict[int, float]:
    """One entropy record's own per-block line (a store with every block's maps or the statistics):
    its ``set_block_patch_entropy`` over heads; its ``block`` coordinate counts from 1, shown from 0."""
    if ds is None or "set_block_patch_entropy" not in ds:
        return {}
    values = np.asarray(ds.set_block_patch_entropy.values, dtype=np.float64).mean(-1)
    return {int(b) - 1: float(v) for b, v in zip(ds.block.values, values)}


def _results(store: Path, prefix: str) -> list[str]:
    return [r for r in records.results(store) if r == prefix or (prefix.endswith("_") and r.startswith(prefix))]


def blocks(ctx: Context) -> Section:
    """Each protocol's number at every block a store's records read: one figure and table per
    heading (a number measured otherwise, another k or memory, gets its own)."""
    section = Section("blocks", "Per block")
    drawn = 0
    for curve in CURVES:
        lines: dict[str, dict[str, dict[int, Number]]] = {}  # heading → line → block → number
        for store in ctx.stores:
            for result in _results(store.path, curve.result):
                points: dict[str, dict[int, Number]] = {}
                for block, record in by_block(store.path, result).items():
                    ds = records.load(store.path, result, record.run_id)
                    for heading, number in (curve.numbers(ds) if ds is not None else {}).items():
                        points.setdefault(heading, {})[block] = number
                if curve.result == "entropy" and len(points.get(ENTROPY, {})) < 2:
                    points = {ENTROPY: {b: Number(v, share=False) for b, v in every_block_entropy(store.result("entropy")).items()}}
                for heading, at in points.items():
                    if len(at) >= 2:
                        lines.setdefault(heading, {})[store.label + ("" if result == curve.result else f" ({result})")] = at
        for i, (heading, drawn_lines) in enumerate(lines.items()):
            drawn += 1
            scale = {label: {b: (100.0 if n.share else 1.0) * n.value for b, n in at.items()} for label, at in drawn_lines.items()}
            section.blocks.append(
                ctx.figure(
                    f"blocks-{curve.result.rstrip('_')}" + (f"-{i}" if i else ""),
                    per_block_figure(scale, heading),
                    f"{heading}: each store at every block its records read (the latest record of each block).",
                )
            )
            rows = [[label, str(b), n.text(2 if n.share else 3)] for label, at in drawn_lines.items() for b, n in at.items()]
            section.blocks.append(Table(["store", "block", heading], rows, f"{heading}, by block (0-based)."))
    if not drawn:
        drawn_here = ", ".join(curve.label for curve in CURVES)
        section.missing(f"None of these was measured at two blocks or more yet: {drawn_here} (rank and position draw theirs in their own sections): {HOW}.")
    return section


def per_block_figure(lines: dict[str, dict[int, float]], ylabel: str, chance: float | None = None) -> figures.Drawing:
    """One line per store over its blocks (0-based, as ``get_intermediate_layers`` and the records number them)."""
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.ticker import MaxNLocator

    fig = MplFigure(figsize=(5.2, 2.8), layout="constrained")
    ax = fig.subplots()
    for label, points in lines.items():
        ordered = sorted(points)
        ax.plot(ordered, [points[b] for b in ordered], marker="o", ms=3, lw=1, label=figures.wrap(label, 30))
    if chance is not None:
        ax.axhline(chance, color="grey", lw=0.8, ls="--", label="chance")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("block (0-based)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    return figures.png(fig)
