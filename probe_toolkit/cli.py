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


# --- foundation: checkpoints, extraction, stores ---


@app.command()
def extract(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file (DINO/SelfPatch layouts, full or backbone).")],
    images: Annotated[Optional[Path], typer.Option("--images", help="Folder of photographs (recursive).")] = None,
    panel: Annotated[Optional[str], typer.Option("--panel", help="Use a registered panel's image folder.")] = None,
    views: Annotated[str, typer.Option(help="Views to read: 96, 224 (tokens, attention), 480 (keys).")] = "224,480",
    attention: Annotated[str, typer.Option(help="Attention maps at 224: last, all (12 blocks) or none.")] = "last",
    dtype: Annotated[str, typer.Option(help="float16 or float32.")] = "float16",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")] = 16,
    chunk: Annotated[int, typer.Option(help="Images per zarr chunk (the unit of resume and sharding).")] = 16,
    network: Annotated[str, typer.Option(help="teacher or student.")] = "teacher",
    heads: Annotated[Optional[int], typer.Option(help="Attention heads (default width/64).")] = None,
    convert: Annotated[bool, typer.Option("--convert", help="Drop class token and final norm first (SelfPatch-style).")] = False,
    interp: Annotated[str, typer.Option("--interp", help="Position-table interpolation: dino or timm.")] = "dino",
    shard: Annotated[Optional[str], typer.Option(help="i/n: this process's share (default from torchrun RANK/WORLD_SIZE).")] = None,
    on_error: Annotated[str, typer.Option("--on-error", help="fail, or skip unreadable images and record them.")] = "fail",
    limit: Annotated[Optional[int], typer.Option(help="Process at most N more images now (whole chunks).")] = None,
    store: Annotated[Optional[Path], typer.Option(help="Store path (default <cache>/<stem>-<sha8>/<network>.zarr).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Cache the last block's tokens (224), keys (480) and attention (224) of a checkpoint."""
    from .extract import Settings, extract as run
    from .errors import ProbeError

    if (images is None) == (panel is None):
        raise ProbeError(None, "give exactly one of --images DIR or --panel NAME", "e.g. probe extract CKPT --images photos/")
    if on_error not in ("fail", "skip"):
        raise ProbeError(None, f"--on-error {on_error!r} is not fail or skip", "use --on-error skip")
    if attention not in ("last", "all", "none") or interp not in ("dino", "timm"):
        raise ProbeError(None, f"--attention {attention!r} / --interp {interp!r} not understood", "use last|all|none and dino|timm")
    source = images
    if panel is not None:
        from .panels import panel_images

        source = panel_images(panel, cache)
        if store is None:
            from .cache import cache_root, store_path
            from .checkpoints import sha256_file

            store = store_path(cache_root(cache), checkpoint, sha256_file(checkpoint), f"{network}{'-converted' if convert else ''}-panel-{panel}")
    settings = Settings(views=tuple(int(v) for v in views.split(",") if v), attention=attention, dtype=dtype, chunk=chunk, interpolation=interp)
    report = run(
        checkpoint, source, settings=settings, network=network, convert=convert, heads=heads, cache_dir=cache, store=store,
        shard=shard, on_error=on_error, limit=limit, batch_size=batch_size, device=device, quiet=quiet,
    )
    for line in report.skipped:
        err_console.print(f"[yellow]skipped:[/] {line}", highlight=False)
    console.print(f"{report.store}: {report.done}/{report.n_images} images done ({report.written} written now, {len(report.skipped)} skipped)")


@app.command()
def convert(
    source: Annotated[Path, typer.Argument(help="A DINO file (backbone or full checkpoint).")],
    out: Annotated[Path, typer.Argument(help="Where to write the SelfPatch-style backbone.")],
    network: Annotated[str, typer.Option(help="teacher or student, for full checkpoints.")] = "teacher",
) -> None:
    """Write the SelfPatch-style backbone of a DINO file (no class token, no final norm)."""
    from .checkpoints import convert_file

    before, after = convert_file(source, out, network)
    console.print(f"{source} → {out}: {before:,} → {after:,} parameters ({before - after:,} dropped: cls_token, pos_embed row 0, norm)")


@app.command()
def info(store: Annotated[Path, typer.Argument(help="A store written by probe extract.")]) -> None:
    """Print a store's manifest, its arrays and how complete it is."""
    from rich.table import Table

    from .cache import describe_store

    table = Table(title=str(store), show_header=False)
    for field, value in describe_store(store):
        table.add_row(field, value)
    console.print(table)


@app.command("make-checkpoint")
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="File to write.")],
    layout: Annotated[str, typer.Option(help="dino-backbone, selfpatch-backbone, dino-full, selfpatch-full, ...")] = "dino-full",
    arch: Annotated[str, typer.Option(help="tiny (seconds on a CPU) or vit-s16 (the released size).")] = "tiny",
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Write a random-weight checkpoint in a released layout (to try the pipeline offline)."""
    from .errors import ProbeError
    from .samples import ARCHS, LAYOUTS, write_checkpoint

    if layout not in LAYOUTS or arch not in ARCHS:
        raise ProbeError(None, f"--layout {layout} / --arch {arch} unknown", f"layouts: {', '.join(LAYOUTS)}; archs: {', '.join(ARCHS)}")
    write_checkpoint(out, layout, ARCHS[arch], seed)
    console.print(f"wrote {out} ({layout}, {arch}, seed {seed})")


@app.command()
def doctor(cache: CacheOpt = None) -> None:
    """Check this machine: library versions, threads, device, cache root, Chromium."""
    from rich.table import Table

    from .cache import cache_root
    from .doctor import checks

    table = Table("check", "", "detail")
    results = checks(cache_root(cache))
    for check in results:
        mark = "[green]ok[/]" if check.ok else ("[red]FAIL[/]" if check.required else "[yellow]missing[/]")
        table.add_row(check.name, mark, check.detail)
    console.print(table)
    if not all(c.ok for c in results if c.required):
        raise typer.Exit(1)


# --- analyses: entropy and neighbours (probe_toolkit/entropy.py, neighbours.py, selection.py) ---

StoresArg = Annotated[list[Path], typer.Argument(help="Stores written by probe extract (several: side by side).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the numbers to this JSON file.")]
DaskOpt = Annotated[Optional[str], typer.Option("--dask-address", help="Run on a dask.distributed scheduler (e.g. tcp://host:8786).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap over images.")]
BootOpt = Annotated[int, typer.Option("--boot", help="Bootstrap resamples for the 95 % intervals.")]


def _provenance(ds, command: str) -> dict:
    """What a saved result must say about where it came from: this run, and the store it read."""
    from . import provenance

    meta = ds.attrs.get("manifest", {})
    store = {key: meta.get(key) for key in ("checkpoint", "network", "arch", "views", "interpolation", "dtype", "image_list_sha256", "git_revision")}
    return {"command": command, **provenance.stamp(), "store_manifest": store}


def _run_over_stores(stores: list[Path], analyse, quiet: bool) -> dict:
    """Open each store, run ``analyse(ds, progress)`` with a progress bar; results by store path."""
    from .cache import open_store
    from .progress import bar

    results = {}
    with bar("images", quiet) as progress:
        for store in dict.fromkeys(stores):  # each store once, in the order given
            ds = open_store(store)
            task = progress.add_task(str(store), total=ds.sizes.get("image", 0))
            results[str(store)] = (ds, analyse(ds, lambda n, task=task: progress.advance(task, n)))
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


# --- training (companion: training/, imported only inside the command) ---


@app.command()
def train(
    config: Annotated[str, typer.Argument(help="A TOML config, or a shipped one: selfpatch, contrastive, dino, tiny.")],
    sets: Annotated[Optional[list[str]], typer.Option("--set", help="Override one setting, section.key=value (repeatable).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Train DINO, SelfPatch or the contrastive rule; write checkpoints that probe extract reads."""
    from training import load_config, train as run_training

    resolved = load_config(config, sets or [])
    console.print_json(resolved.to_json())
    run = run_training(config, sets or [], quiet=quiet)
    console.print(f"{run.steps} steps over {run.epochs} epochs; checkpoint {run.checkpoint}; log {run.log}; manifest {run.manifest}")
