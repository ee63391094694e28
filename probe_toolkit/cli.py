"""The ``probe`` command line: parse, call one function, print. No science lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .infra.errors import ProbeError

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
    from .infra.memory import keep_memory_flat

    keep_memory_flat()
    try:
        app(standalone_mode=False)
    except ProbeError as error:
        err_console.print(f"[bold red]error:[/] {error.line()}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as error:  # usage errors (typer's bundled click) carry their own message and exit code
        if callable(getattr(error, "show", None)) and isinstance(getattr(error, "exit_code", None), int):
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
    from .infra.errors import ProbeError
    from .store.extract import Settings
    from .store.extract import extract as run

    if (images is None) == (panel is None):
        raise ProbeError(None, "give exactly one of --images DIR or --panel NAME", "e.g. probe extract CKPT --images photos/")
    if on_error not in ("fail", "skip"):
        raise ProbeError(None, f"--on-error {on_error!r} is not fail or skip", "use --on-error skip")
    if attention not in ("last", "all", "none") or interp not in ("dino", "timm"):
        raise ProbeError(None, f"--attention {attention!r} / --interp {interp!r} not understood", "use last|all|none and dino|timm")
    source = images
    if panel is not None:
        from .labels.panels import panel_images

        source = panel_images(panel, cache)
        if store is None:
            from .store.cache import cache_root, store_path
            from .store.checkpoints import sha256_file

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
    from .store.checkpoints import convert_file

    before, after = convert_file(source, out, network)
    console.print(f"{source} → {out}: {before:,} → {after:,} parameters ({before - after:,} dropped: cls_token, pos_embed row 0, norm)")


@app.command()
def info(store: Annotated[Path, typer.Argument(help="A store written by probe extract.")]) -> None:
    """Print a store's manifest, its arrays and how complete it is."""
    from rich.table import Table

    from .store.cache import describe_store

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
    from .demo.samples import ARCHS, LAYOUTS, write_checkpoint
    from .infra.errors import ProbeError

    if layout not in LAYOUTS or arch not in ARCHS:
        raise ProbeError(None, f"--layout {layout} / --arch {arch} unknown", f"layouts: {', '.join(LAYOUTS)}; archs: {', '.join(ARCHS)}")
    write_checkpoint(out, layout, ARCHS[arch], seed)
    console.print(f"wrote {out} ({layout}, {arch}, seed {seed})")


@app.command()
def doctor(cache: CacheOpt = None) -> None:
    """Check this machine: library versions, threads, device, cache root, Chromium."""
    from rich.table import Table

    from .demo.doctor import checks
    from .store.cache import cache_root

    table = Table("check", "", "detail")
    results = checks(cache_root(cache))
    for check in results:
        mark = "[green]ok[/]" if check.ok else ("[red]FAIL[/]" if check.required else "[yellow]missing[/]")
        table.add_row(check.name, mark, check.detail)
    console.print(table)
    if not all(c.ok for c in results if c.required):
        raise typer.Exit(1)


# --- decoder, panels, ledger, scoring ---

panel_app = typer.Typer(no_args_is_help=True, help="Labelled image sets (COCO file + image folder + role).")
ledger_app = typer.Typer(no_args_is_help=True, help="The hash-chained record of every read of labels.")
app.add_typer(panel_app, name="panel")
app.add_typer(ledger_app, name="ledger")

PanelOpt = Annotated[Optional[str], typer.Option("--panel", help="Score on this registered panel (its labels are read through the ledger).")]
UnsealOpt = Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="BLAS threads while decoding (1: per-image problems are small).")]


def _ticker(progress, label: str):
    def start(total: int):
        task = progress.add_task(label, total=total)
        return lambda: progress.advance(task)

    return start


def _scores_table(title: str, scores) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in ("", "AP", "AP50", "AP75", "AR1", "AR10", "AR100"):
        table.add_column(column, justify="right")
    for kind in ("segm", "bbox"):
        values = getattr(scores, kind)
        table.add_row(kind, *(f"{100 * values[m]:.2f}" for m in ("AP", "AP50", "AP75", "AR1", "AR10", "AR100")))
    console.print(table)
    console.print(f"CorLoc {100 * scores.corloc:.2f} %   mean best IoU {100 * scores.mean_best_iou:.2f} %   "
                  f"({scores.counts['images']} images, {scores.counts['objects']} objects, {scores.counts['masks']} masks)")


@app.command()
def decode(
    store: Annotated[Path, typer.Argument(help="A store with keys_480 (probe extract --views 480).")],
    size: Annotated[int, typer.Option(help="View whose keys to cut (keys_<size>).")] = 480,
    preset: Annotated[Optional[str], typer.Option(help="centred (default: centred keys, TokenCut's graph), tokencut or maskcut.")] = None,
    tau: Annotated[Optional[float], typer.Option(help="Link patches whose key cosine is above τ (preset: 0.2; maskcut 0.15).")] = None,
    eps: Annotated[Optional[float], typer.Option(help="Weight of the other edges (1e-5).")] = None,
    masks: Annotated[Optional[int], typer.Option(help="Masks per image: MaskCut's loop when > 1.")] = None,
    center: Annotated[Optional[bool], typer.Option("--center/--no-center", help="Subtract each image's mean key (centred preset: on).")] = None,
    settings: Annotated[Optional[Path], typer.Option("--settings", help="Settings file (default <cache>/decoder-settings.json from the sweep).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="COCO results JSON (default <store>/results/decoder-masks.json).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write a summary JSON here.")] = None,
    panel: PanelOpt = None,
    unseal: UnsealOpt = None,
    threads: ThreadsOpt = 1,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Label-free object masks by a normalized cut on the keys; scored only if --panel is given."""
    from .commands.decode import resolve_settings, run_decode
    from .infra.atomic import write_json
    from .infra.progress import bar

    chosen, source = resolve_settings(preset=preset, overrides=dict(tau=tau, eps=eps, masks=masks, center=center), settings_file=settings, cache_dir=cache)
    with bar("images", quiet) as progress:
        report = run_decode(store, chosen, settings_source=source, size=size, out=out, panel=panel, unseal=unseal, cache_dir=cache,
                            on_start=_ticker(progress, "decode"), threads=threads)
    s = report.settings
    console.print(f"{report.n_images} images → {report.n_masks} masks ({s.preset}: τ {s.tau}, ε {s.eps}, centred {s.center}, rule {s.rule}, "
                  f"≤ {s.masks} masks; {source}) in {report.seconds:.1f} s; {report.degenerate} flagged degenerate; masks → {report.masks_file}")
    if report.scores is not None:
        _scores_table(f"{panel} (ledger entry {report.ledger_entry[:12]})", report.scores)
    if json_path:
        write_json(json_path, report.summary())


@app.command()
def score(
    masks_file: Annotated[Path, typer.Argument(help="COCO results JSON written by probe decode.")],
    panel: Annotated[str, typer.Option("--panel", help="Registered panel to score on.")],
    unseal: UnsealOpt = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the scores as JSON here.")] = None,
    cache: CacheOpt = None,
) -> None:
    """Score masks on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU."""
    from .commands.decode import run_score
    from .infra.atomic import write_json

    report = run_score(masks_file, panel, unseal=unseal, cache_dir=cache)
    _scores_table(f"{panel} (ledger entry {report.ledger_entry[:12]})", report.scores)
    if report.saved:
        console.print(f"saved → {report.saved}")
    if json_path:
        write_json(json_path, {"scores": report.scores.table(), "counts": report.scores.counts, "ledger_entry": report.ledger_entry})


@app.command("decode-sweep")
def decode_sweep(
    store: Annotated[Path, typer.Argument(help="A store with keys_480.")],
    panel: Annotated[str, typer.Option("--panel", help="Validation panel to choose the settings on.")],
    grid: Annotated[Optional[Path], typer.Option(help="TOML grid (lists for preset, center, tau, eps, masks); default 144 settings.")] = None,
    metric: Annotated[str, typer.Option(help="Score that picks the best setting.")] = "segm_AP",
    settings_out: Annotated[Optional[Path], typer.Option("--settings-out", help="Where to write the best settings (default <cache>/decoder-settings.json).")] = None,
    top: Annotated[int, typer.Option(help="Rows of the table to print (best first).")] = 20,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the whole table as JSON here.")] = None,
    unseal: UnsealOpt = None,
    threads: ThreadsOpt = 1,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Decode a grid of settings, read the panel's labels once, and keep the best setting."""
    from rich.table import Table

    from .commands.decode import run_sweep
    from .infra.atomic import write_json
    from .infra.progress import bar

    with bar("images", quiet) as progress:
        report = run_sweep(store, panel, grid=grid, metric=metric, settings_out=settings_out, unseal=unseal, cache_dir=cache,
                           on_start=_ticker(progress, "sweep"), threads=threads)
    rows = sorted(report.table, key=lambda r: -(r[metric] if r[metric] == r[metric] else -1))
    table = Table(title=f"{len(report.table)} settings on {panel} (ledger entry {report.ledger_entry[:12]}), by {metric}")
    for column in ("preset", "center", "tau", "eps", "masks", "segm_AP", "segm_AP50", "bbox_AP50", "corloc", "mean_best_iou"):
        table.add_column(column, justify="right")
    for r in rows[:top]:
        table.add_row(r["preset"], str(r["center"]), f"{r['tau']:g}", f"{r['eps']:g}", str(r["masks"]),
                      *(f"{100 * r[c]:.2f}" for c in ("segm_AP", "segm_AP50", "bbox_AP50", "corloc", "mean_best_iou")))
    console.print(table)
    b = report.best
    console.print(f"best: {b.preset}, centred {b.center}, τ {b.tau}, ε {b.eps}, {b.masks} masks → {report.settings_file}")
    if json_path:
        write_json(json_path, {"metric": metric, "ledger_entry": report.ledger_entry, "table": report.table})


@panel_app.command("add")
def panel_add(
    name: Annotated[str, typer.Argument(help="Panel name (letters, digits, - and _).")],
    annotations: Annotated[Path, typer.Option("--annotations", help="COCO annotation file (not opened now).")],
    images: Annotated[Path, typer.Option("--images", help="The panel's image folder.")],
    role: Annotated[str, typer.Option("--role", help="train, val or test (test panels are sealed).")],
    replace: Annotated[bool, typer.Option("--replace", help="Replace a panel of the same name.")] = False,
    cache: CacheOpt = None,
) -> None:
    """Register a panel in <cache>/panels.toml."""
    from .labels.panels import add_panel

    p = add_panel(name, annotations, images, role, cache=cache, replace=replace)
    console.print(f"panel {p.name}: {p.role}{' (sealed)' if p.sealed else ''}, {p.annotations}, images {p.images}")


@panel_app.command("list")
def panel_list(cache: CacheOpt = None) -> None:
    """List the registered panels."""
    from rich.table import Table

    from .labels.panels import list_panels

    table = Table(title="panels")
    for column in ("name", "role", "annotations", "images", "added"):
        table.add_column(column)
    for p in list_panels(cache):
        table.add_row(p.name, p.role + (" (sealed)" if p.sealed else ""), str(p.annotations), str(p.images), p.added)
    console.print(table)


@ledger_app.command("show")
def ledger_show(
    last: Annotated[Optional[int], typer.Option(help="Only the last N entries.")] = None,
    cache: CacheOpt = None,
) -> None:
    """Every read of labels: when, which panel, how many images, why, for which checkpoint."""
    from rich.table import Table

    from .labels.ledger import entries
    from .store.cache import cache_root

    rows = entries(cache_root(cache))
    table = Table(title=f"ledger ({len(rows)} entries)")
    for column in ("n", "id", "time", "panel", "role", "images", "purpose", "checkpoint", "unseal"):
        table.add_column(column)
    for e in rows[-last:] if last else rows:
        f = e.fields
        table.add_row(str(e.n), e.id[:12], f.get("time", ""), f.get("panel", ""), f.get("role", ""), str(f.get("images", "")),
                      f.get("purpose", ""), (f.get("checkpoint") or "")[:12], f.get("unseal") or "")
    console.print(table)


@ledger_app.command("verify")
def ledger_verify(cache: CacheOpt = None) -> None:
    """Check the hash chain; names every edited, inserted or deleted line (exit 1 if any)."""
    from .labels.ledger import LEDGER, entries, verify
    from .store.cache import cache_root

    root = cache_root(cache)
    problems = verify(root)
    for p in problems:
        err_console.print(f"[bold red]{root / LEDGER}[/] {p}", highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(1)
    console.print(f"{root / LEDGER}: {len(entries(root))} entries, chain intact", soft_wrap=True)


# --- linear probes ---


@app.command("linear")
def linear_probe(
    stores: Annotated[list[Path], typer.Argument(help="Stores to compare (each holds, or sits beside, the panels' images).")],
    train: Annotated[str, typer.Option("--train", help="Panel whose labels fit the probe (and choose its regularisation).")],
    val: Annotated[str, typer.Option("--val", help="Panel whose labels score it, read only after every fit.")],
    level: Annotated[str, typer.Option("--level", help="patch (dense, mIoU) or image (categories present, mAP).")] = "patch",
    epochs: Annotated[int, typer.Option("--epochs", help="Most L-BFGS iterations of the dense probe (each a full pass over the train patches).")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the train hold-out that chooses the regularisation.")] = 0,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the table and its settings as JSON.")] = None,
    unseal: Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel as --val (recorded in the ledger).")] = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Linear probes on the frozen 224 tokens: fit on --train, score on --val, one table for all stores."""
    from rich.table import Table

    from .analyses.linear import FitSettings
    from .commands.linear import run_linear

    def step(what: str) -> None:
        if not quiet:
            err_console.print(f"[dim]{what}[/]", highlight=False)

    report = run_linear(stores, train, val, level=level, settings=FitSettings(epochs=epochs, seed=seed), unseal=unseal,
                        cache_dir=cache, json_path=json_path, on_step=step)
    columns = ("mIoU", "accuracy", "mIoU dense", "weight decay") if report.level == "patch" else ("mAP", "C")
    keys = ("miou", "accuracy", "miou_dense") if report.level == "patch" else ("map",)
    table = Table(title=f"linear probe ({report.level}): {train} → {val}")
    table.add_column("store")
    for column in columns:
        table.add_column(column, justify="right")
    for o in report.outcomes:
        table.add_row(o.name, *(f"{100 * o.scores[k]:.2f}" for k in keys), f"{o.chosen:g}")
    console.print(table)
    console.print(f"ledger: train {report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; "
                  f"{len(report.label_space.ids)} categories{' + background' if report.level == 'patch' else ''}; seed {seed}; saved as results/linear_{report.level}", highlight=False)


# --- analyses: entropy and neighbours (commands/entropy.py, commands/neighbours.py) ---

StoresArg = Annotated[list[Path], typer.Argument(help="Stores written by probe extract (several: side by side).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the numbers to this JSON file.")]
DaskOpt = Annotated[Optional[str], typer.Option("--dask-address", help="Run on a dask.distributed scheduler (e.g. tcp://host:8786).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap over images.")]
BootOpt = Annotated[int, typer.Option("--boot", help="Bootstrap resamples for the 95 % intervals.")]
PartialOpt = Annotated[bool, typer.Option("--partial", help="Summarise a store still being extracted (its finished images).")]


@app.command("entropy")
def entropy_command(
    stores: StoresArg,
    patch: Annotated[Optional[int], typer.Option("--patch", help="Follow this patch of the 224 view (patch = G·row + column).")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="Image id for the --patch tables (default: the first).")] = None,
    json_path: JsonOpt = None,
    dask_address: DaskOpt = None,
    seed: SeedOpt = 0,
    boot: BootOpt = 1000,
    partial: PartialOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """How spread each attention row is: entropy, e^H, e^H / T, mean attention distance."""
    from .commands import summaries
    from .commands.entropy import run_entropy

    run = run_entropy(stores, patch=patch, image=image, json_path=json_path, dask_address=dask_address, seed=seed, boot=boot, partial=partial, quiet=quiet)
    console.print(summaries.entropy_table(run.results))
    if run.followed is not None:
        for store, result in run.results.items():
            for table in summaries.detail_tables(store, result, run.followed):
                console.print(table)


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
    partial: PartialOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Do a patch's most similar patches lie in SelfPatch's 3×3 window? With the rules' selections."""
    from .commands import summaries
    from .commands.neighbours import run_neighbours

    run = run_neighbours(stores, grid=grid, k=k, top=top, wrap=not no_wrap, distance=distance, json_path=json_path,
                         dask_address=dask_address, seed=seed, boot=boot, partial=partial, quiet=quiet)
    console.print(summaries.neighbours_table(run.results))


# --- training (companion: training/, imported only inside the command) ---


@app.command()
def train(
    config: Annotated[str, typer.Argument(help="A TOML config, or a shipped one: selfpatch, contrastive, dino, tiny.")],
    sets: Annotated[Optional[list[str]], typer.Option("--set", help="Override one setting, section.key=value (repeatable).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Train DINO, SelfPatch or the contrastive rule; write checkpoints that probe extract reads."""
    from training import load_config
    from training import train as run_training

    resolved = load_config(config, sets or [])
    console.print_json(resolved.to_json())
    run = run_training(config, sets or [], quiet=quiet)
    console.print(f"{run.steps} steps over {run.epochs} epochs; checkpoint {run.checkpoint}; log {run.log}; manifest {run.manifest}")


# --- demo ---


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Where the report (and the demo's own cache, under work/) go.")] = Path("reports/demo"),
    quick: Annotated[bool, typer.Option("--quick", help="Shorter training and smaller panels (the tests' mode).")] = False,
    quiet: QuietOpt = False,
) -> None:
    """The whole toolkit offline on shipped photographs and scenes: train, extract, measure, decode, probe, report."""
    from .demo.run import run_demo

    result = run_demo(out, quick=quick, quiet=quiet, say=lambda line: err_console.print(f"[dim]{line}[/]", highlight=False))
    console.print(f"demo done in {sum(result.seconds.values()):.0f} s; stores: {', '.join(map(str, result.stores))}")
    if result.html is not None:
        console.print(f"report: {result.html.resolve()}")


# --- report (probe_toolkit/report/) ---


@app.command("report")
def report_command(
    stores: Annotated[list[Path], typer.Argument(help="Stores to report on, side by side (checkpoint comparison).")],
    out: Annotated[Optional[Path], typer.Option("--out", help="Report folder (default reports/<name from the stores>).")] = None,
    follow: Annotated[Optional[str], typer.Option("--follow", help="Image id to follow (default: the first image every store holds).")] = None,
    patch: Annotated[int, typer.Option("--patch", help="Patch of the 224 view to follow (patch = G·row + column; 34 = row 2, column 6 at 14 × 14).")] = 34,
    formats: Annotated[str, typer.Option("--format", help="Figure files beside the report: png, pdf, svg (comma-separated; PNG always).")] = "png,pdf,svg",
    cache: CacheOpt = None,
) -> None:
    """Write report.md, a self-contained report.html with a patch explorer, figures (PNG, PDF, SVG) and tables (CSV, LaTeX)."""
    from .report import write_report

    written = write_report(stores, out, follow=follow, patch=patch, cache_dir=cache, formats=formats)
    present = [s.title for s in written.report.sections if s.present]
    absent = [s.title for s in written.report.sections if not s.present]
    console.print(f"{written.folder}: report.md, report.html, {len(written.figures)} figures; "
                  f"{len(present)} sections present{', not yet: ' + '; '.join(absent) if absent else ''}", soft_wrap=True)
