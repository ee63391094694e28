"""What ``probe correspond`` prints for a NAVI panel: the ten numbers mbanani/probe3d's
``evaluate_navi_correspondence.py`` prints, in its order, and the mean of the rotation bins beside them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from .tables import Unwrapped, waiting_line

if TYPE_CHECKING:
    from .navi_report import NaviReport


def navi(report: NaviReport) -> list[Any]:
    if report.waiting:
        return [waiting_line(report.run.placement.shard, report.waiting, "the last one saves results/correspond-navi")]

    def cell(v: float) -> str:
        return f"{v:.2f}" if math.isfinite(v) else "–"

    table = Table(title=f"NAVI correspondence recall (%) on {report.panel} (ledger entry {report.ledger[:12]})", box=box.SIMPLE_HEAD)
    table.add_column("correspondences within")
    table.add_column("recall %", justify="right")
    rows = [
        *(f"{t} cm" for t in (1, 2, 5)),
        *(f"{t} px" for t in (5, 25, 50)),
        *(f"2 cm, pairs turned {b}°" for b in ("0-30", "30-60", "60-90", "90-120")),
        "2 cm, mean of the four rotation bins",
    ]
    for name, value in zip(rows, (*report.recall_cm, *report.recall_px, *report.binned, report.bins_mean)):
        table.add_row(name, cell(value))
    c = report.counts
    return [
        table,
        Unwrapped(
            f"{c['pairs']} pairs of {c['images']} images, {c['correspondences']} correspondences"
            + (f" ({c['pairs_short']} pairs with fewer than num_corr object pixels)" if c.get("pairs_short") else "")
            + f"; {report.seconds:.1f} s"
            + (f"; saved as {report.saved}" if report.saved else "")
        ),
    ]
