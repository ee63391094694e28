"""The ``probe`` Typer app, its consoles, the options every command shares, and the one table
that maps a protocol parameter to its command-line flag."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

app = typer.Typer(
    name="probe",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    help="What did this frozen ViT checkpoint learn about patches? Measured without labels leaking.",
)
panel_app = typer.Typer(no_args_is_help=True, help="Labelled image sets (COCO file + image folder + role).")
ledger_app = typer.Typer(no_args_is_help=True, help="The hash-chained record of every read of labels.")
app.add_typer(panel_app, name="panel")
app.add_typer(ledger_app, name="ledger")
# no emoji codes: a printed name such as SPair's ``…:cat:`` pair stays as written
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

from ..infra.spelling import FLAGS, flag  # noqa: E402,F401  (one table of parameter -> flag, shared with the fix commands)

CacheOpt = Annotated[Path | None, typer.Option("--cache", help="Cache root (default: $PROBE_CACHE or ./cache).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]

# the options of a protocol's command that no setting, input or placement field declares (``cli/protocols.py``)
SHARED = {"cache": (CacheOpt, None), "quiet": (QuietOpt, False)}


# groups of options several commands take together (names: a setting, an input or a placement
# field of the protocol, or an option of ``SHARED``)
GROUPS = {
    "SHARDED": ("workers", "dask_address", "shard"),
    "PLACEMENT": ("threads", "workers", "dask_address", "shard", "backend", "device"),
    "SCORED": ("unseal", "workers", "dask_address", "cache", "quiet"),  # a protocol scoring panels on local workers or a cluster (no shards)
    "OVER_STORES": ("json_path", "dask_address", "seed", "boot", "partial", "quiet"),
}


def whole(table: Any) -> Any:
    """A table whose every cell is printed whole: a cell wider than its column folds onto the next
    line, where rich would cut it to "…" (at 80 columns a panel's name read ``demo-nyu-t…`` for two
    panels, a number ``63.…``)."""
    from rich.table import Table

    if isinstance(table, Table):
        for column in table.columns:
            if column.overflow == "ellipsis":  # rich's default; a column that chose otherwise keeps it
                column.overflow = "fold"
    return table


def show(renderables: list[Any]) -> None:
    """Print a protocol's presentation (``results/tables.py``): tables, and lines as typed."""
    from ..results.tables import Unwrapped

    for item in renderables:
        if isinstance(item, str):
            console.print(item, highlight=False, soft_wrap=isinstance(item, Unwrapped))
        else:
            console.print(whole(item))


def run(name: str, source: Any, **keywords: Any):
    """The one call every protocol command makes: the Python API's ``run`` (settings validated,
    placement parsed once, records written)."""
    from ..protocols.api import run as run_protocol

    return run_protocol(name, source, **keywords)
