"""What ``probe depth`` prints: the trained head's NYUv2 metrics with the schedule that produced
them, beside the published RMSE of released weights (marked as other weights: not this checkpoint)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.table import Table

from .tables import Unwrapped

if TYPE_CHECKING:
    from .depth_report import DepthReport

SHOWN = (("rmse", "RMSE (m)"), ("abs_rel", "AbsRel"), ("a1", "δ1"), ("a2", "δ2"), ("a3", "δ3"), ("log_10", "log10"))


def value(metric: str, v: float) -> str:
    """A metric as the tables show it: δ in %, the others to three decimals; NaN as –."""
    if not math.isfinite(v):
        return "–"
    return f"{100 * v:.1f}" if metric in ("a1", "a2", "a3") else f"{v:.3f}"


def depth(report: DepthReport) -> list[Any]:
    """``probe depth``: the metrics beside the published RMSE (other weights), then the schedule, blocks, panels and ledger."""
    from ..analyses.depth_published import ITERATIONS, PUBLISHED

    short = "" if report.full_schedule else " (short schedule)"
    table = Table(title=f"Linear depth ({report.preset} preset): {report.run.inputs.train} → {report.run.inputs.val}")
    table.add_column("")
    for _, heading in SHOWN:
        table.add_column(heading, justify="right")
    table.add_row(f"{report.name}{short}", *(value(m, report.metrics[m]) for m, _ in SHOWN))
    published = [(name, rmse) for name, preset, rmse in PUBLISHED if preset == report.preset]
    for name, rmse in published:
        table.add_row(f"published, other weights: {name}", f"{rmse:.3f}", *("–" for _ in SHOWN[1:]))
    if not published:
        table.caption = "no published numbers for this preset here (DINOv2's model card tables its 4-layer head)"
    counts = report.counts
    schedule = (
        "the published schedule"
        if report.full_schedule
        else f"short schedule: {counts['iterations']} of {ITERATIONS} iterations, batch {counts['batch']} of 16, not comparable with the published numbers"
    )
    if report.unpublished:
        schedule += "; settings other than the published: " + ", ".join(f"{k} {v}" for k, v in report.unpublished.items())
    return [
        table,
        Unwrapped(
            f"{schedule}; blocks {', '.join(map(str, report.blocks))}; {counts['train']} train images, {counts['iterations']} "
            f"iterations of {counts['batch']} crops; {counts['val']} val images ({counts['scored']} with valid pixels), Eigen crop, "
            f"depth in (0.001, 10) m, mean over images; loss {report.losses[0]:.3f} → {report.losses[-1]:.3f}; ledger: train "
            f"{report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; saved as results/linear-depth"
        ),
    ]
