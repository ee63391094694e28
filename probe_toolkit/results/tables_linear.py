"""What ``probe linear-dinov2`` prints at the terminal: every classifier's val accuracy by family,
the chosen one, and where its reported number was measured; built from the run's report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from .summaries import store_label

if TYPE_CHECKING:
    from .linear_dinov2_report import LinearDinov2Report


def linear_dinov2(report: LinearDinov2Report) -> list[Any]:
    """One row per (blocks, avgpool) family, one column per rate: val top-1 (%), the chosen one marked."""
    rates = list(dict.fromkeys(c.rate for c in report.classifiers))
    families = list(dict.fromkeys((c.blocks, c.avgpool) for c in report.classifiers))
    table = Table(title=f"DINOv2 linear protocol, val top-1 %: {report.run.inputs.train} → {report.run.inputs.val} ({store_label(str(report.store))})")
    table.add_column("blocks, avgpool")
    for rate in rates:
        table.add_column(f"lr {rate:g}", justify="right")
    cells = {(c.blocks, c.avgpool, c.rate): i for i, c in enumerate(report.classifiers)}
    for blocks, pool in families:
        row = []
        for rate in rates:
            i = cells[(blocks, pool, rate)]
            text = f"{100 * report.top1_val[i]:.2f}" if i in report.evaluated else "(name taken)"
            row.append(f"[bold]{text} ◀[/]" if i == report.chosen else text)
        table.add_row(f"{blocks}, {'on' if pool else 'off'}", *row)
    chosen = report.chosen_name or "none (every classifier scored 0 on val)"
    where = f"on {report.run.inputs.get('test')} (test)" if report.reported_on == "test" else "on val, where it was chosen (no test panel)"
    return [
        table,
        f"chosen on val: {chosen}; top-1 {100 * report.accuracy:.2f} % {where}",
        f"{report.counts['train']} train, {report.counts['val']} val images, {report.counts['classes']} classes; saved as results/linear-dinov2",
    ]
