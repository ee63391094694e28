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

# a setting's parameter (protocol settings, Placement) -> its flag, where the two spellings differ
FLAGS = {
    "boot": "--boot", "n_boot": "--boot", "n_last_frames": "--n-last-frames", "size_mask_neighborhood": "--size-mask-neighborhood", "ks": "--k",
    "subset": "--set", "color_lambda": "--color-lambda", "settings_file": "--settings", "settings_out": "--settings-out",
    "dask_address": "--dask-address", "wrap": "--no-wrap", "thresholds": "--threshold", "memory": "--memory",
    "json_path": "--json", "cache_dir": "--cache", "sequences": "--sequence", "score": "--no-score",
}


def flag(parameter: str) -> str:
    return FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


CacheOpt = Annotated[Path | None, typer.Option("--cache", help="Cache root (default: $PROBE_CACHE or ./cache).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write the numbers to this JSON file.")]
PanelOpt = Annotated[str | None, typer.Option("--panel", help="Score on this registered panel (its labels are read through the ledger).")]
UnsealOpt = Annotated[str | None, typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="BLAS threads while decoding (1: per-image problems are small).")]
# where per-block work runs (infra/placement.py, infra/runner.py): every local core, a dask cluster, a shard, a backend
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="Local processes, one BLAS thread each (default: every core; one with --device cuda).")]
ClusterOpt = Annotated[str | None, typer.Option("--dask-address", help="Run on a dask.distributed scheduler (e.g. tcp://host:8786).")]
ShardOpt = Annotated[str | None, typer.Option("--shard", help="i/n: this process's share of the images (default from torchrun RANK/WORLD_SIZE).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="scipy (per image) or torch (a batch of images at once).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda (--backend torch).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap over images.")]
BootOpt = Annotated[int, typer.Option("--boot", help="Bootstrap resamples for the 95 % intervals.")]
AllowPartialOpt = Annotated[bool, typer.Option("--allow-partial", help="Score a store holding only part of the panel's images (the record says how many).")]
PartialOpt = Annotated[bool, typer.Option("--partial", help="Summarise a store still being extracted (its finished images).")]

# options every command spells alike (name: (annotation, default)), and groups of them that several
# commands take together; a protocol's ``Command.options`` names them as strings (``cli/protocols.py``)
SHARED = {"workers": (WorkersOpt, None), "dask_address": (ClusterOpt, None), "shard": (ShardOpt, None), "threads": (ThreadsOpt, 1),
          "backend": (BackendOpt, "scipy"), "device": (DeviceOpt, "cpu"), "unseal": (UnsealOpt, None), "cache": (CacheOpt, None),
          "quiet": (QuietOpt, False), "json_path": (JsonOpt, None), "seed": (SeedOpt, 0), "boot": (BootOpt, 1000), "partial": (PartialOpt, False),
          "panel": (PanelOpt, None), "allow_partial": (AllowPartialOpt, False)}


def _group(*names: str) -> dict[str, tuple[Any, Any]]:
    return {name: SHARED[name] for name in names}


SHARDED = _group("workers", "dask_address", "shard")
PLACEMENT = _group("threads", "workers", "dask_address", "shard", "backend", "device")
SCORED = _group("unseal", "workers", "dask_address", "cache", "quiet")  # a protocol scoring panels on local workers or a cluster (no shards)
OVER_STORES = _group("json_path", "dask_address", "seed", "boot", "partial", "quiet")
GROUPS = {"SHARDED": SHARDED, "PLACEMENT": PLACEMENT, "SCORED": SCORED, "OVER_STORES": OVER_STORES}


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
