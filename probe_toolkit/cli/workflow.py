"""Training, the demo and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..infra.errors import ProbeError
from .app import CacheOpt, QuietOpt, app, console, err_console


@app.command()
def train(
    config: Annotated[str, typer.Argument(help="A TOML config, or a shipped one: selfpatch, contrastive, dino, tiny.")],
    sets: Annotated[list[str] | None, typer.Option("--set", help="Override one setting, section.key=value (repeatable).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Train DINO, SelfPatch or the contrastive rule; write checkpoints that probe extract reads."""
    from training import load_config
    from training import train as run_training
    from training.data import require_folder

    resolved = load_config(config, sets or [])
    require_folder(resolved.data.images)  # one line, not the config echoed then refused
    console.print_json(resolved.to_json())
    run = run_training(config, sets or [], quiet=quiet)
    console.print(f"{run.steps} steps over {run.epochs} epochs; checkpoint {run.checkpoint}; log {run.log}; manifest {run.manifest}")


# --- demo ---


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Where the report (and the demo's own cache, under work/) go.")] = Path("reports/demo"),
    quick: Annotated[bool, typer.Option("--quick", help="Shorter training, smaller panels and PNG figures only (the tests' mode).")] = False,
    quiet: QuietOpt = False,
) -> None:
    """The whole toolkit offline on shipped photographs and scenes: train, extract, measure, decode, probe, report."""
    from ..demo.run import run_demo

    result = run_demo(out, quick=quick, quiet=quiet, say=lambda line: err_console.print(f"[dim]{line}[/]", highlight=False))
    console.print(f"demo done in {sum(result.seconds.values()):.0f} s; stores: {', '.join(map(str, result.stores))}")
    if result.html is not None:
        console.print(f"report: {result.html.resolve()}")


# --- report (probe_toolkit/report/) ---


@app.command("report")
def report_command(
    stores: Annotated[list[Path], typer.Argument(help="Stores to report on, side by side (checkpoint comparison).")],
    out: Annotated[Path | None, typer.Option("--out", help="Report folder (default reports/<name from the stores>).")] = None,
    follow: Annotated[str | None, typer.Option("--follow", help="Image id to follow (default: the first image every store holds).")] = None,
    patch: Annotated[
        int,
        typer.Option(
            "--patch",
            help="Patch of the first store's 224 grid to follow (patch = G·row + column; 34 = row 2, column 6 at 14 × 14); stores on other "
            "grids follow the patch under its centre.",
        ),
    ] = 34,
    formats: Annotated[str, typer.Option("--format", help="Figure files beside the report: png, pdf, svg (comma-separated; PNG always).")] = "png,pdf,svg",
    run: Annotated[
        str | None, typer.Option("--run", help="Show this run's records (a run id from `probe results`, or its start) where a result has one; the latest elsewhere.")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="Name a store in titles, tables and figures: NAME=STORE (repeatable; default: the manifest's name, else checkpoint and network)."),
    ] = None,
    cache: CacheOpt = None,
) -> None:
    """Write report.md, a self-contained report.html with a patch explorer, figures (PNG, PDF, SVG) and tables (CSV, LaTeX)."""
    from ..report import write_report

    written = write_report(stores, out, follow=follow, patch=patch, cache_dir=cache, formats=formats, run=run, labels=label)
    present = [s.title for s in written.report.sections if s.present]
    absent = [s.title for s in written.report.sections if not s.present]
    console.print(
        f"{written.folder}: report.md, report.html, {len(written.figures)} figures; {len(present)} sections present{', not yet: ' + '; '.join(absent) if absent else ''}",
        soft_wrap=True,
    )


@app.command("table")
def table_command(
    stores: Annotated[list[Path], typer.Argument(help="Stores whose records fill the table, one row each (checkpoint and network).")],
    protocols: Annotated[
        str, typer.Option("--protocols", help="Columns, in this order: any of knn, decode (CorLoc of probe decode --panel), hummingbird, entropy.")
    ] = "knn,decode,hummingbird",
    form: Annotated[str, typer.Option("--format", help="markdown, csv (one line per cell, intervals in their own columns) or latex.")] = "markdown",
    out: Annotated[Path | None, typer.Option("--out", help="Write the table to this file (default: print it).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Name a row: NAME=STORE (repeatable; default: the checkpoint's repository or file stem, and the network).")
    ] = None,
) -> None:
    """One paper table from records alone: checkpoints as rows, protocols as columns; records measured otherwise get columns of their own."""
    from ..infra.owned import refuse_existing
    from ..report import paper
    from ..report.sources import parse_labels

    if form not in paper.FORMATS:
        raise ProbeError("--format", f"{form!r} is not one of {', '.join(paper.FORMATS)}", "use --format markdown, csv or latex")
    if out is not None:
        refuse_existing(out, force, "table file")
    names = {str(store): name for store, name in parse_labels(label, stores).items()}
    text = paper.render(paper.build(stores, [p.strip() for p in protocols.split(",") if p.strip()], names), form)
    if out is None:
        console.print(text, soft_wrap=True, highlight=False, markup=False, end="")
        return
    paper.write(out, text)
    console.print(f"{out}: {len(text.splitlines())} lines ({form})")
