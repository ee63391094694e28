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
console = Console()
err_console = Console(stderr=True)

from ..infra.spelling import FLAGS, flag  # noqa: E402,F401  (one table of parameter -> flag, shared with the fix commands)

CacheOpt = Annotated[Path | None, typer.Option("--cache", help="Cache root (default: $PROBE_CACHE or ./cache).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write the numbers to this JSON file.")]
PanelOpt = Annotated[str | None, typer.Option("--panel", help="Score on this registered panel (its labels are read through the ledger).")]
UnsealOpt = Annotated[str | None, typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")]
AllowPartialOpt = Annotated[bool, typer.Option("--allow-partial", help="Score a store holding only part of the panel's images (the record says how many).")]
PartialOpt = Annotated[bool, typer.Option("--partial", help="Summarise a store still being extracted (its finished images).")]

def _placement_options() -> dict[str, tuple[Any, Any]]:
    """The placement's options, each from its ``Placement`` field (help, type, default: declared once there)."""
    import dataclasses
    import typing

    from ..infra.placement import Placement

    hints = typing.get_type_hints(Placement)
    return {f.name: (Annotated[hints[f.name], typer.Option(flag(f.name), help=f.metadata["setting"].help)], f.default)
            for f in dataclasses.fields(Placement)}


# options every command spells alike (name: (annotation, default)), and groups of them that several
# commands take together; a protocol's ``Command.options`` names them as strings (``cli/protocols.py``)
SHARED = {**_placement_options(), "unseal": (UnsealOpt, None), "cache": (CacheOpt, None),
          "quiet": (QuietOpt, False), "json_path": (JsonOpt, None), "partial": (PartialOpt, False),
          "panel": (PanelOpt, None), "allow_partial": (AllowPartialOpt, False)}


# groups of options several commands take together (names: a setting, an input or a placement
# field of the protocol, or an option of ``SHARED``)
GROUPS = {
    "SHARDED": ("workers", "dask_address", "shard"),
    "PLACEMENT": ("threads", "workers", "dask_address", "shard", "backend", "device"),
    "SCORED": ("unseal", "workers", "dask_address", "cache", "quiet"),  # a protocol scoring panels on local workers or a cluster (no shards)
    "OVER_STORES": ("json_path", "dask_address", "seed", "boot", "partial", "quiet"),
}


def show(renderables: list[Any]) -> None:
    """Print a protocol's presentation (``results/tables.py``): tables, and lines as typed."""
    from ..results.tables import Unwrapped

    for item in renderables:
        if isinstance(item, str):
            console.print(item, highlight=False, soft_wrap=isinstance(item, Unwrapped))
        else:
            console.print(item)


def ticker(progress, label: str):
    """An ``on_start(total)`` hook: one progress task, advanced by one per call of what it returns."""
    def start(total: int):
        task = progress.add_task(label, total=total)
        return lambda: progress.advance(task)

    return start


def run(name: str, source: Any, **keywords: Any):
    """The one call every protocol command makes: the Python API's ``run`` (settings validated,
    placement parsed once, records written)."""
    from ..protocols.api import run as run_protocol

    return run_protocol(name, source, **keywords)


def counted(name: str, unit: str, quiet: bool, source: Any, *, hook: str = "progress", task: str | None = None, **keywords: Any):
    """``run`` under a progress bar of ``unit`` that the protocol advances through its ``hook``
    keyword (``progress(n)`` or ``on_block(n)``): the report."""
    from ..infra.progress import bar

    with bar(unit, quiet) as progress:
        handle = progress.add_task(task or name, total=None)
        return run(name, source, **{hook: lambda n: progress.advance(handle, n)}, **keywords).report
