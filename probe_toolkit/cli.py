"""The ``probe`` command line: parse, call one function, print. No science lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .errors import ProbeError

app = typer.Typer(
    name="probe",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    help="What did this frozen ViT checkpoint learn about patches? Measured without labels leaking.",
)
console = Console()
err_console = Console(stderr=True)

CacheOpt = Annotated[Optional[Path], typer.Option("--cache", help="Cache root (default: $PROBE_CACHE or ./cache).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


def main() -> None:
    """Console entry point: bad input becomes one line on stderr and exit status 2."""
    try:
        app(standalone_mode=False)
    except ProbeError as error:
        err_console.print(f"[bold red]error:[/] {error.line()}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as error:  # click usage errors carry their own exit code
        import click

        if isinstance(error, click.ClickException):
            error.show()
            sys.exit(error.exit_code)
        raise


# --- analyses: entropy and neighbours (probe_toolkit/entropy.py, neighbours.py, selection.py) ---

StoresArg = Annotated[list[Path], typer.Argument(help="Stores written by probe extract (several: side by side).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the numbers to this JSON file.")]
DaskOpt = Annotated[Optional[str], typer.Option("--dask-address", help="Run on a dask.distributed scheduler (e.g. tcp://host:8786).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap over images.")]
BootOpt = Annotated[int, typer.Option("--boot", help="Bootstrap resamples for the 95 % intervals.")]


def _provenance(ds, command: str) -> dict:
    """What a saved result must say about where it came from."""
    import datetime

    from . import __version__

    meta = ds.attrs.get("manifest", {})
    return {
        "command": command,
        "toolkit_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "store_manifest": {key: meta.get(key) for key in ("checkpoint", "network", "arch", "views", "interpolation", "dtype", "image_list_sha256", "git_revision")},
    }


def _run_over_stores(stores: list[Path], analyse, quiet: bool) -> dict:
    """Open each store, run ``analyse(ds, progress)`` with a progress bar; results by store path."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    from .cache import open_store

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed:,.0f} img/s" if task.speed else "")

    results = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeRemainingColumn())
    with Progress(*columns, console=err_console, disable=quiet) as bar:
        for store in dict.fromkeys(stores):  # each store once, in the order given
            ds = open_store(store)
            task = bar.add_task(str(store), total=ds.sizes.get("image", 0))
            results[str(store)] = (ds, analyse(ds, lambda n, task=task: bar.advance(task, n)))
    return results


def _write_json(path: Path, payload: dict) -> None:
    import json
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


@app.command("entropy")
def entropy_command(
    stores: StoresArg,
    patch: Annotated[Optional[int], typer.Option("--patch", help="Follow this patch (course: 34, the dog's nose).")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="Image id for the --patch tables (default: the first).")] = None,
    json_path: JsonOpt = None,
    dask_address: DaskOpt = None,
    seed: SeedOpt = 0,
    boot: BootOpt = 1000,
    quiet: QuietOpt = False,
) -> None:
    """How spread each attention row is: entropy, e^H, e^H / T, mean attention distance."""
    from . import summaries
    from .cache import require, save_results
    from .chunked import connect
    from .entropy import entropy

    client = connect(dask_address)

    def analyse(ds, progress):
        arch = ds.attrs["manifest"].get("arch", {})
        blocks = ds["attention_blocks_224"] if "attention_blocks_224" in ds else None
        return entropy(
            require(ds, "attention_224"), class_token=bool(arch.get("class_token", False)), blocks=blocks, patch=patch,
            n_boot=boot, seed=seed, client=client, progress=progress,
        )

    runs = _run_over_stores(stores, analyse, quiet)
    results = {store: result for store, (_, result) in runs.items()}
    console.print(summaries.entropy_table(results))
    payload = {"analysis": "entropy", "stores": {}}
    for store, (ds, result) in runs.items():
        save_results(store, "entropy", result, _provenance(ds, "probe entropy"))
        index = None
        if patch is not None:
            ids = [str(i) for i in result.image.values]
            if image is not None and image not in ids:
                raise ProbeError(store, f"has no finished image {image!r}", "pass an id from the store's image list")
            index = ids.index(image) if image is not None else 0
            for table in summaries.detail_tables(store, result, index):
                console.print(table)
        payload["stores"][store] = summaries.set_level(result, index)
    if json_path is not None:
        _write_json(json_path, payload)


@app.command("neighbours")
def neighbours_command(
    stores: StoresArg,
    grid: Annotated[int, typer.Option("--grid", help="14 reads tokens_224, 6 reads tokens_96.")] = 14,
    k: Annotated[int, typer.Option("--k", help="Positives per anchor (SelfPatch k_num = 4).")] = 4,
    top: Annotated[int, typer.Option("--top", help="How many of the most similar patches to test against the window.")] = 8,
    no_wrap: Annotated[bool, typer.Option("--no-wrap", help="Plain borders instead of SelfPatch's wrap-around.")] = False,
    distance: Annotated[str, typer.Option("--distance", help="chebyshev or euclidean (on the torus unless --no-wrap).")] = "chebyshev",
    json_path: JsonOpt = None,
    dask_address: DaskOpt = None,
    seed: SeedOpt = 0,
    boot: BootOpt = 1000,
    quiet: QuietOpt = False,
) -> None:
    """Do a patch's most similar patches lie in SelfPatch's 3×3 window? With the rules' selections."""
    from . import summaries
    from .cache import require, save_results
    from .chunked import connect
    from .neighbours import grid_array, neighbours

    array = grid_array(grid)
    client = connect(dask_address)

    def analyse(ds, progress):
        return neighbours(
            require(ds, array), grid, k=k, top=top, wrap=not no_wrap, metric=distance, n_boot=boot, seed=seed, client=client, progress=progress,
        )

    runs = _run_over_stores(stores, analyse, quiet)
    results = {store: result for store, (_, result) in runs.items()}
    console.print(summaries.neighbours_table(results))
    name = f"neighbours_g{grid}" + ("_nowrap" if no_wrap else "")
    payload = {"analysis": name, "stores": {}}
    for store, (ds, result) in runs.items():
        save_results(store, name, result, _provenance(ds, "probe neighbours"))
        payload["stores"][store] = summaries.set_level(result)
    if json_path is not None:
        _write_json(json_path, payload)
