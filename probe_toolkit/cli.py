"""The ``probe`` command line: parse, call one function, print. No science lives here."""

from __future__ import annotations

import math
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
    """Console entry point: a failure is one line on stderr and a status (2 bad input, 1 integrity, 130 interrupted)."""
    from .infra.errors import EXIT_INTEGRITY, EXIT_INTERRUPTED, IntegrityError, Interrupted, os_error_line
    from .infra.collector import fewer_full_collections
    from .infra.memory import keep_memory_flat

    fewer_full_collections()  # before the command's imports (torch, timm)
    keep_memory_flat()
    try:
        code = app(standalone_mode=False)  # typer returns the status of typer.Exit (and 130 on Ctrl-C) here
    except IntegrityError as error:
        err_console.print(f"[bold red]integrity:[/] {error.line()}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INTEGRITY)
    except ProbeError as error:
        err_console.print(f"[bold red]error:[/] {error.line()}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Interrupted as error:
        err_console.print(f"[bold yellow]interrupted:[/] {error}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INTERRUPTED)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("interrupted; nothing half-written is kept, rerun the command", highlight=False)
        sys.exit(EXIT_INTERRUPTED)
    except OSError as error:  # a full disk, a read-only folder, a file where a folder belongs: one line, not a traceback
        err_console.print(f"[bold red]error:[/] {os_error_line(error)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Exception as error:  # usage errors (typer's bundled click) carry their own message and exit code
        if callable(getattr(error, "show", None)) and isinstance(getattr(error, "exit_code", None), int):
            error.show()
            sys.exit(error.exit_code)
        raise
    if code == EXIT_INTERRUPTED:
        err_console.print("interrupted; nothing half-written is kept, rerun the command", highlight=False)
    if isinstance(code, int) and code:
        sys.exit(code)


# --- foundation: checkpoints, extraction, stores ---


@app.command()
def extract(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file (DINO/SelfPatch layouts, full or backbone).")],
    images: Annotated[Optional[Path], typer.Option("--images", help="Folder of photographs (recursive).")] = None,
    panel: Annotated[Optional[str], typer.Option("--panel", help="Use a registered panel's image folder.")] = None,
    views: Annotated[str, typer.Option(help="Views to read: 96, 224 (tokens, attention), eval224 (tokens; short side 256, crop 224: DINO's eval_knn.py view, read by probe knn), 480 (keys), native (keys, tokens; own size, zero-padded as TokenCut/LOST), native_crop (keys, tokens; own size, cut to whole patches as DSM's extract.py), native_resized (keys, tokens; resized with LANCZOS to round(side/p) patches as TokenCut's saliency get_saliency.py). A later run may add views to a store.")] = "224,480",
    resample: Annotated[Optional[str], typer.Option("--resample", help="Filter of the 480 squash: bicubic (default) or lanczos (CutLER maskcut.py).")] = None,
    attention: Annotated[str, typer.Option(help="Attention maps at 224: last, all (12 blocks) or none.")] = "last",
    dtype: Annotated[str, typer.Option(help="float16 or float32.")] = "float16",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")] = 16,
    chunk: Annotated[int, typer.Option(help="Images per zarr chunk (the unit of resume and sharding).")] = 16,
    network: Annotated[str, typer.Option(help="teacher or student.")] = "teacher",
    heads: Annotated[Optional[int], typer.Option(help="Attention heads (default width/64).")] = None,
    convert: Annotated[bool, typer.Option("--convert", help="Drop class token and final norm first (SelfPatch-style).")] = False,
    interp: Annotated[str, typer.Option("--interp", help="Position-table interpolation: auto (the checkpoint's own code: dinov2-reg for DINOv2 register models, else dino), dino, dinov2-reg or timm.")] = "auto",
    shard: Annotated[Optional[str], typer.Option(help="i/n: this process's share (default from torchrun RANK/WORLD_SIZE).")] = None,
    on_error: Annotated[str, typer.Option("--on-error", help="fail, or skip unreadable images and record them.")] = "fail",
    limit: Annotated[Optional[int], typer.Option(help="Process at most N more images now (the last chunk is cut; rerun to finish).")] = None,
    store: Annotated[Optional[Path], typer.Option(help="Store path (default <cache>/<stem>-<sha8>/<network>.zarr).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    decoders: Annotated[Optional[int], typer.Option("--decoders", help="Threads decoding and resizing images beside the forward pass, and runs written at once, up to 4 (default: the cores it leaves free; at least 1).")] = None,
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
    if attention not in ("last", "all", "none") or interp not in ("auto", "dino", "dinov2-reg", "timm"):
        raise ProbeError(None, f"--attention {attention!r} / --interp {interp!r} not understood", "use last|all|none and auto|dino|dinov2-reg|timm")
    if store is not None and store.exists() and not store.is_dir():
        raise ProbeError(store, "is a file, not a store folder (--store)", "pass --store a new path or an existing store")
    source = images
    if panel is not None:
        from .labels.panels import panel_images

        source = panel_images(panel, cache)
        if store is None:
            from .store.cache import cache_root, store_path
            from .store.checkpoints import sha256_file

            store = store_path(cache_root(cache), checkpoint, sha256_file(checkpoint), f"{network}{'-converted' if convert else ''}-panel-{panel}")
    view_list = tuple(v.strip() for v in views.split(",") if v.strip())
    if resample is not None and "480" not in view_list:
        raise ProbeError(None, f"--resample {resample} applies to the 480 view, which --views {views} does not include", "add 480 to --views, or drop --resample")
    settings = Settings(views=view_list, attention=attention, dtype=dtype, chunk=chunk, interpolation=interp, resample=resample or "bicubic")
    try:
        report = run(
            checkpoint, source, settings=settings, network=network, convert=convert, heads=heads, cache_dir=cache, store=store,
            shard=shard, on_error=on_error, limit=limit, batch_size=batch_size, device=device, decoders=decoders, quiet=quiet,
        )
    except KeyboardInterrupt:
        from .infra.errors import Interrupted

        raise Interrupted("probe extract stopped; the store keeps every finished chunk and is resumable: rerun the same command") from None
    for line in report.skipped:
        err_console.print(f"[yellow]skipped:[/] {line}", highlight=False)
    console.print(f"{report.store}: {report.done}/{report.n_images} images done in views {','.join(report.views)} ({report.written} written now, {len(report.skipped)} skipped)", soft_wrap=True)
    if report.limit is not None and report.left:
        console.print(f"--limit {report.limit}: {report.left} images of this shard left; rerun the same command to continue", soft_wrap=True)


@app.command()
def convert(
    source: Annotated[Path, typer.Argument(help="A DINO file (backbone or full checkpoint).")],
    out: Annotated[Path, typer.Argument(help="Where to write the SelfPatch-style backbone.")],
    network: Annotated[str, typer.Option(help="teacher or student, for full checkpoints.")] = "teacher",
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists (never the source itself).")] = False,
) -> None:
    """Write the SelfPatch-style backbone of a DINO file (no class token, no final norm)."""
    from .store.checkpoints import convert_file

    before, after = convert_file(source, out, network, force=force)
    console.print(f"{source} → {out}: {before:,} → {after:,} parameters ({before - after:,} dropped: cls_token, pos_embed row 0, norm)")


@app.command()
def info(store: Annotated[Path, typer.Argument(help="A store written by probe extract.")]) -> None:
    """Print a store's manifest, each view's grid and completeness, its arrays."""
    from rich.table import Table

    from .store.cache import describe_store

    table = Table(title=str(store), show_header=False)
    for field, value in describe_store(store):
        table.add_row(field, value)
    console.print(table)


@app.command("make-checkpoint")
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="File to write.")],
    layout: Annotated[str, typer.Option(help="dino-backbone, selfpatch-backbone, dino-full, selfpatch-full, dinov2-backbone, dinov2-reg-backbone, ...")] = "dino-full",
    arch: Annotated[str, typer.Option(help="tiny, tiny-p8, tiny-dinov2-reg (seconds on a CPU) or a released size: vit-s16, vit-s8, vit-b16, vit-b8, dinov2-s14(-reg), dinov2-b14(-reg).")] = "tiny",
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
) -> None:
    """Write a random-weight checkpoint in a released layout (to try the pipeline offline)."""
    from .demo.samples import ALL_LAYOUTS, ARCHS, write_checkpoint
    from .infra.errors import ProbeError

    if layout not in ALL_LAYOUTS or arch not in ARCHS:
        raise ProbeError(None, f"--layout {layout} / --arch {arch} unknown", f"layouts: {', '.join(ALL_LAYOUTS)}; archs: {', '.join(ARCHS)}")
    try:
        write_checkpoint(out, layout, ARCHS[arch], seed, force=force)
    except ValueError as error:
        raise ProbeError(None, f"--layout {layout} --arch {arch}: {error}", "DINOv2 layouts take a dinov2 arch, DINO/SelfPatch layouts the others") from None
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
    failed = [c.name for c in results if c.required and not c.ok]
    if failed:
        err_console.print(f"[bold red]doctor:[/] {len(failed)} required check{'s' if len(failed) > 1 else ''} failed "
                          f"({', '.join(failed)}); see the table above", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


# --- decoder, panels, ledger, scoring ---
DecodeViewOpt = Annotated[Optional[str], typer.Option("--view", help="480 (default), native: each image at its own size, zero-padded to the patch (TokenCut's and LOST's main_*.py), native_crop: cut to whole patches (DSM's extract/extract.py), or native_resized: resized with LANCZOS to round(side/p) patches (TokenCut's unsupervised_saliency_detection/get_saliency.py).")]

panel_app = typer.Typer(no_args_is_help=True, help="Labelled image sets (COCO file + image folder + role).")
ledger_app = typer.Typer(no_args_is_help=True, help="The hash-chained record of every read of labels.")
app.add_typer(panel_app, name="panel")
app.add_typer(ledger_app, name="ledger")

PanelOpt = Annotated[Optional[str], typer.Option("--panel", help="Score on this registered panel (its labels are read through the ledger).")]
UnsealOpt = Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="BLAS threads while decoding (1: per-image problems are small).")]
# where per-image analyses run (infra/runner.py): every local core, a dask cluster, a backend
WorkersOpt = Annotated[Optional[int], typer.Option("--workers", help="Local processes, one BLAS thread each (default: every core; one with --device cuda).")]
ClusterOpt = Annotated[Optional[str], typer.Option("--dask-address", help="Run on a dask.distributed scheduler (e.g. tcp://host:8786).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="scipy (per image) or torch (a batch of images at once).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda (--backend torch).")]


def _at_least(option: str, value: int, low: int) -> None:
    """A numeric option refused at the boundary, before any work (one line, exit 2)."""
    if value < low:
        raise ProbeError(None, f"{option} {value} must be at least {low}", f"use e.g. {option} {max(low, 1)}")


def _ticker(progress, label: str):
    def start(total: int):
        task = progress.add_task(label, total=total)
        return lambda: progress.advance(task)

    return start


def _scores_table(title: str, scores) -> None:
    from rich.table import Table

    if not hasattr(scores, "segm"):  # a saliency panel (labels/saliency.py)
        console.print(f"{title}: maxFβ {100 * scores.max_f:.2f}   IoU {100 * scores.iou:.2f}   accuracy {100 * scores.accuracy:.2f}   "
                      f"MAE {scores.mae:.4f}   S-measure {scores.s_measure:.4f}   ({scores.counts['images']} images)")
        return

    def pct(value: float, unit: str = "") -> str:  # NaN: undefined (segm and mean best IoU on a panel of boxes)
        return f"{100 * value:.2f}{unit}" if math.isfinite(value) else "–"

    table = Table(title=title)
    for column in ("", "AP", "AP50", "AP75", "AR1", "AR10", "AR100"):
        table.add_column(column, justify="right")
    for kind in ("segm", "bbox"):
        values = getattr(scores, kind)
        table.add_row(kind, *(pct(values[m]) for m in ("AP", "AP50", "AP75", "AR1", "AR10", "AR100")))
    console.print(table)
    console.print(f"CorLoc {pct(scores.corloc, ' %')}   mean best IoU {pct(scores.mean_best_iou, ' %')}   "
                  f"({scores.counts['images']} images, {scores.counts['objects']} objects, {scores.counts['masks']} masks)")


@app.command()
def decode(
    store: Annotated[Path, typer.Argument(help="A store with keys_480 (probe extract --views 480), or a checkpoint with --images.")],
    size: Annotated[int, typer.Option(help="Fixed view whose keys to cut (keys_<size>); --view overrides it.")] = 480,
    view: DecodeViewOpt = None,
    images: StreamImagesOpt = None,
    shard: StreamShardOpt = None,
    batch_size: StreamBatchOpt = 16,
    chunk: StreamChunkOpt = 16,
    preset: Annotated[Optional[str], typer.Option(help="centred (default: centred keys, TokenCut's graph), tokencut, maskcut, lost (valeoai/LOST) or dsm (deep-spectral-segmentation).")] = None,
    tau: Annotated[Optional[float], typer.Option(help="Link patches whose key cosine is above τ (preset: 0.2; maskcut 0.15).")] = None,
    eps: Annotated[Optional[float], typer.Option(help="Weight of the other edges (1e-5).")] = None,
    masks: Annotated[Optional[int], typer.Option(help="Masks per image: MaskCut's loop when > 1.")] = None,
    center: Annotated[Optional[bool], typer.Option("--center/--no-center", help="Subtract each image's mean key (centred preset: on).")] = None,
    settings: Annotated[Optional[Path], typer.Option("--settings", help="Settings file (default <cache>/decoder-settings.json from the sweep).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="COCO results JSON (default <store>/results/decoder-masks.json).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write a summary JSON here.")] = None,
    refine: Annotated[Optional[str], typer.Option("--refine", help="bilateral: TokenCut's bilateral-solver refinement before saliency scores (+ BS).")] = None,
    color_lambda: Annotated[Optional[float], typer.Option("--color-lambda", help="dsm: weight of DSM's KNN colour affinity (0, off, as published).")] = None,
    panel: PanelOpt = None,
    unseal: UnsealOpt = None,
    threads: ThreadsOpt = 1,
    workers: WorkersOpt = None,
    dask_address: ClusterOpt = None,
    backend: BackendOpt = "scipy",
    device: DeviceOpt = "cpu",
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Label-free object masks by a normalized cut on the keys; scored only if --panel is given."""
    from .commands.decode import resolve_settings, run_decode
    from .infra.atomic import write_json
    from .infra.progress import bar

    _at_least("--threads", threads, 1)

    chosen, source = resolve_settings(preset=preset, overrides=dict(tau=tau, eps=eps, masks=masks, center=center, color_lambda=color_lambda),
                                      settings_file=settings, cache_dir=cache)
    size = view or size  # --view 480|native|native_crop|native_resized (keys_<view>); --size stays the fixed views' spelling
    if images is not None:
        if panel is not None:
            raise ProbeError(None, "--images streams without --panel", "score the masks JSON with `probe score`")
        return _decode_stream(store, images, chosen, source, size=size, shard=shard, batch_size=batch_size, chunk=chunk, workers=workers,
                              dask_address=dask_address, backend=backend, device=device, cache=cache, quiet=quiet, json_path=json_path)
    with bar("images", quiet) as progress:
        report = run_decode(store, chosen, settings_source=source, size=size, out=out, panel=panel, unseal=unseal, cache_dir=cache,
                            on_start=_ticker(progress, "decode"), threads=threads, refine=refine, workers=workers, dask_address=dask_address,
                            backend=backend, device=device, shard=shard)
    if report.masks_file is None:  # a shard that finished before the others
        console.print(f"shard {shard or 'of torchrun'} done; waiting for shards {report.extra['waiting_for_shards']} (the last one writes the masks)")
        return
    s = report.settings
    console.print(f"{report.n_images} images → {report.n_masks} masks ({s.preset}: τ {s.tau}, ε {s.eps}, centred {s.center}, rule {s.rule}, "
                  f"≤ {s.masks} masks; {source}) in {report.seconds:.1f} s; {report.degenerate} flagged degenerate; masks → {report.masks_file}")
    for warning in report.extra.get("warnings", []):
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    if report.scores is not None:
        _scores_table(f"{panel} (ledger entry {report.ledger_entry[:12]})", report.scores)
    if json_path:
        write_json(json_path, report.summary())


# streaming (commands/stream.py): checkpoint + images → masks, keys kept in memory only
StreamImagesOpt = Annotated[Optional[Path], typer.Option("--images", help="Stream this folder through the checkpoint (STORE is then a checkpoint); only masks are written.")]
StreamShardOpt = Annotated[Optional[str], typer.Option("--shard", help="i/n: this process's share of the images (default from torchrun RANK/WORLD_SIZE).")]
StreamBatchOpt = Annotated[int, typer.Option("--batch-size", help="With --images: images per forward pass.")]
StreamChunkOpt = Annotated[int, typer.Option("--chunk", help="With --images: images per chunk (the unit of resume and sharding).")]


def _decode_stream(checkpoint: Path, images: Path, chosen, source: str, *, size, shard, batch_size, chunk, workers, dask_address, backend, device, cache,
                   quiet, json_path) -> None:
    from .commands.stream import run_stream
    from .infra.atomic import write_json
    from .infra.progress import bar

    with bar("images", quiet) as progress:
        def start(total: int):
            task = progress.add_task("stream", total=total)
            return lambda n: progress.advance(task, n)

        report = run_stream(checkpoint, images, chosen, size=size, shard=shard, batch_size=batch_size, chunk=chunk, workers=workers,
                            dask_address=dask_address, backend=backend, device=device, cache_dir=cache, settings_source=source, on_start=start)
    tail = f"masks → {report.masks_file}" if report.masks_file else "other shards still running; the last to finish writes the masks"
    console.print(f"{report.store}: {report.done}/{report.n_images} images decoded ({report.written} now, in {report.seconds:.1f} s); {tail}")
    if json_path:
        write_json(json_path, {"store": str(report.store), "images": report.n_images, "done": report.done, "written": report.written,
                               "masks_file": str(report.masks_file) if report.masks_file else None, "settings": chosen.as_dict()})


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
    for warning in report.warnings:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
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
    view: DecodeViewOpt = None,
    top: Annotated[int, typer.Option(help="Rows of the table to print (best first).")] = 20,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the whole table as JSON here.")] = None,
    unseal: UnsealOpt = None,
    threads: ThreadsOpt = 1,
    workers: WorkersOpt = None,
    dask_address: ClusterOpt = None,
    backend: BackendOpt = "scipy",
    device: DeviceOpt = "cpu",
    shard: StreamShardOpt = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Decode a grid of settings, read the panel's labels once, and keep the best setting."""
    from rich.table import Table

    from .commands.decode import run_sweep
    from .infra.atomic import write_json
    from .infra.progress import bar

    _at_least("--top", top, 1)
    _at_least("--threads", threads, 1)

    with bar("images", quiet) as progress:
        report = run_sweep(store, panel, grid=grid, metric=metric, settings_out=settings_out, unseal=unseal, cache_dir=cache,
                           on_start=_ticker(progress, "sweep"), threads=threads, workers=workers, dask_address=dask_address,
                           backend=backend, device=device, size=view or 480, shard=shard)
    if report.waiting:
        console.print(f"shard {shard or 'of torchrun'} done; waiting for shards {report.waiting} (the last one scores every setting)")
        return
    from rich import box

    rows = sorted(report.table, key=lambda r: -(r[metric] if r[metric] == r[metric] else -1))
    table = Table(title=f"{len(report.table)} settings on {panel} (ledger entry {report.ledger_entry[:12]}), by {metric}",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)  # ten columns readable at 80
    for column in ("preset", "centred", "τ", "ε", "masks", "segm\nAP", "segm\nAP50", "bbox\nAP50", "CorLoc", "best\nIoU"):
        table.add_column(column, justify="right", no_wrap=True)
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
    role: Annotated[str, typer.Option("--role", help="train, val or test (test panels are sealed).")],
    annotations: Annotated[Optional[Path], typer.Option("--annotations", help="COCO annotation file (not opened now).")] = None,
    images: Annotated[Optional[Path], typer.Option("--images", help="The panel's image folder (VOC: default <DIR>/JPEGImages).")] = None,
    voc: Annotated[Optional[Path], typer.Option("--voc", help="Pascal VOC year folder (Annotations/, JPEGImages/, ImageSets/Main/).")] = None,
    split: Annotated[str, typer.Option("--split", help="VOC split: a file of ImageSets/Main (trainval, as LOST and TokenCut).")] = "trainval",
    no_hard: Annotated[bool, typer.Option("--no-hard", help="VOC: drop difficult/truncated boxes and images with only those (LOST --no_hard).")] = False,
    coco20k: Annotated[bool, typer.Option("--coco20k", help="Restrict COCO-2014 train --annotations to LOST's and TokenCut's 19,817 images, crowd boxes removed.")] = False,
    masks: Annotated[Optional[Path], typer.Option("--masks", help="Saliency: folder of binary ground-truth masks named like the --images (ECSSD, DUTS-TE, DUT-OMRON).")] = None,
    classes_from_folders: Annotated[Optional[Path], typer.Option("--classes-from-folders", help="A folder with one sub-folder of images per class (ImageNet's layout): a classification panel.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a panel of the same name.")] = False,
    cache: CacheOpt = None,
) -> None:
    """Register a panel in <cache>/panels.toml: a COCO file, a VOC folder, COCO20k or a saliency mask folder."""
    from .labels.panels import add_panel

    if classes_from_folders is not None:
        if any(v is not None for v in (annotations, images, voc, masks)) or coco20k:
            raise ProbeError("--classes-from-folders", "cannot be combined with --annotations, --images, --voc, --masks or --coco20k", "give either the class folder or another kind of panel")
        p = add_panel(name, classes_from_folders, classes_from_folders, role, cache=cache, replace=replace, kind="classes")
        console.print(f"panel {p.name}: {p.role}{' (sealed)' if p.sealed else ''}, classes from {p.images}")
        return
    given = [flag for flag, value in (("--voc", voc), ("--masks", masks), ("--coco20k", coco20k or None)) if value is not None]
    if len(given) > 1:
        raise ProbeError(None, f"{' and '.join(given)} name different kinds of panel", "pass one of --voc, --masks, --coco20k")
    kind = {"--voc": "voc", "--masks": "saliency", "--coco20k": "coco20k"}.get(given[0], "coco") if given else "coco"
    source = voc if kind == "voc" else masks if kind == "saliency" else annotations
    if source is None or (kind == "coco" and images is None):
        raise ProbeError(None, "a panel needs --annotations A.json --images DIR, --voc DIR, or --masks DIR --images DIR", "see probe panel add --help")
    p = add_panel(name, source, images, role, cache=cache, replace=replace, kind=kind, split=split if kind == "voc" else "", no_hard=no_hard)
    console.print(f"panel {p.name}: {p.role}{' (sealed)' if p.sealed else ''}, {p.annotations}, images {p.images}")


@panel_app.command("list")
def panel_list(cache: CacheOpt = None) -> None:
    """List the registered panels."""
    from rich.table import Table

    from .labels.panels import list_panels

    table = Table(title="panels")
    for column in ("name", "role", "kind", "annotations", "images", "added"):
        table.add_column(column)
    for p in list_panels(cache):
        kind = p.kind + (f" {p.split}" if p.split else "") + (" no-hard" if p.no_hard else "")
        table.add_row(p.name, p.role + (" (sealed)" if p.sealed else ""), kind, str(p.annotations), str(p.images), p.added)
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

    from .infra.errors import IntegrityError

    root = cache_root(cache)
    problems = verify(root)
    for p in problems:
        console.print(f"[bold red]{root / LEDGER}[/] {p}", highlight=False, soft_wrap=True)
    if problems:
        more = f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""
        raise IntegrityError(root / LEDGER, f"the hash chain is broken: {problems[0]}{more}", "restore the ledger from a copy; its results' ledger entries cannot be trusted")
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
    workers: WorkersOpt = None,
    dask_address: ClusterOpt = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Linear probes on the frozen 224 tokens: fit on --train, score on --val, one table for all stores."""
    from rich.table import Table

    from .analyses.linear import FitSettings
    from .commands.linear import run_linear

    _at_least("--epochs", epochs, 1)

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


# --- frozen-feature protocols of DINO and SelfPatch (commands/knn.py, attention_masks.py, propagate.py) ---


@app.command("knn")
def knn_command(
    store: Annotated[Path, typer.Argument(help="A store holding (or beside a store holding) both panels' images.")],
    train: Annotated[str, typer.Option("--train", help="Panel whose images vote (class folders, or COCO: largest category).")],
    val: Annotated[str, typer.Option("--val", help="Panel whose images are classified and scored.")],
    k: Annotated[Optional[str], typer.Option("--k", help="Neighbour counts, all in one pass (default DINO's eval_knn.py: 10,20,100,200, narrowed to the train panel's size).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="Vote weight exp(cos / T) (DINO: 0.07).")] = 0.07,
    feature: Annotated[str, typer.Option("--feature", help="auto, cls-normed (DINO's), cls (as stored) or mean (patch tokens).")] = "auto",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the accuracies and settings as JSON.")] = None,
    unseal: Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel as --val (recorded in the ledger).")] = None,
    workers: WorkersOpt = None,
    dask_address: ClusterOpt = None,
    shard: StreamShardOpt = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """DINO's weighted k-NN (facebookresearch/dino eval_knn.py): top-1 and top-5 for every k."""
    from rich.table import Table

    from .commands.knn import run_knn, view_text
    from .infra.progress import bar

    try:
        ks = None if k is None else [int(v) for v in k.split(",") if v.strip()]
    except ValueError:
        raise ProbeError("--k", f"{k!r} is not a list of integers", "use --k 10,20,100,200") from None
    with bar("images", quiet) as progress:
        task = progress.add_task("k-NN", total=None)
        report = run_knn(store, train, val, ks=ks, temperature=temperature, feature=feature, unseal=unseal, cache_dir=cache,
                         json_path=json_path, progress=lambda n: progress.advance(task, n), workers=workers, dask_address=dask_address, shard=shard)
    if report.waiting:
        console.print(f"shard {shard or 'of torchrun'} done; waiting for shards {report.waiting} (the last one saves results/knn)")
        return
    table = Table(title=f"k-NN: {train} → {val}")
    for column in ("k", "top-1", "top-5"):
        table.add_column(column, justify="right")
    for kk, t1, t5 in zip(report.result.ks, report.result.top1, report.result.top5):
        table.add_row(str(kk), f"{100 * t1:.2f}", "–" if t5 != t5 else f"{100 * t5:.2f}")
    console.print(table)
    console.print(f"{report.counts['train']} train → {report.counts['val']} val images, {report.counts['classes']} classes; feature: {report.feature}; "
                  f"T {temperature}; ledger: train {report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; saved as results/knn", highlight=False, soft_wrap=True)
    console.print(f"view: {view_text(report.view)}", highlight=False, soft_wrap=True)
    if report.counts["classes"] <= 5:
        console.print("top-5 is undefined with 5 classes or fewer (shown as –)", highlight=False)


@app.command("attention-masks")
def attention_masks_command(
    store: Annotated[Path, typer.Argument(help="A store with attention_224 (or tokens_224 for SelfPatch's aggregation head).")],
    panel: Annotated[Optional[str], typer.Option("--panel", help="Score the masks by Jaccard against this panel's objects (read through the ledger).")] = None,
    mass: Annotated[float, typer.Option("--mass", help="Share of the row's attention each head's mask holds (DINO: 0.6).")] = 0.6,
    row: Annotated[str, typer.Option("--row", help="auto, cls (class token), aggregation (SelfPatch's ca_head) or mean (of the patch rows).")] = "auto",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the Jaccards and settings as JSON.")] = None,
    unseal: Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")] = None,
    partial: Annotated[bool, typer.Option("--partial", help="Use a store still being extracted (its finished images).")] = False,
    workers: WorkersOpt = None,
    dask_address: ClusterOpt = None,
    shard: StreamShardOpt = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """DINO's attention masks (facebookresearch/dino visualize_attention.py): per head, 60 % of the mass; Jaccard per head and best head."""
    from rich.table import Table

    from .commands.attention_masks import run_attention_masks
    from .infra.progress import bar

    with bar("images", quiet) as progress:
        task = progress.add_task("masks", total=None)
        report = run_attention_masks(store, panel=panel, mass=mass, row=row, unseal=unseal, cache_dir=cache, json_path=json_path,
                                     partial=partial, on_block=lambda n: progress.advance(task, n), workers=workers, dask_address=dask_address,
                                     shard=shard)
    if report.waiting:
        console.print(f"shard {shard or 'of torchrun'} done; waiting for shards {report.waiting} (the last one saves results/attention_masks)")
        return
    console.print(f"{report.n_images} images: each head's smallest set of patches holding {100 * report.mass:.0f} % of {report.summary()['row_text']}; "
                  f"saved as results/attention_masks", highlight=False, soft_wrap=True)
    if report.jaccard_mean is not None:
        table = Table(title=f"Jaccard on {panel} (ledger entry {report.ledger[:12]}; {report.scored} images, {report.counts['objects']} objects)")
        table.add_column("")
        for h in range(len(report.jaccard_mean)):
            table.add_column(f"head {h}", justify="right")
        table.add_column("best head", justify="right")
        table.add_column("per object (dino #54)", justify="right")
        table.add_row("Jaccard (%)", *[f"{100 * v:.1f}" for v in report.jaccard_mean], f"{100 * report.best_mean:.1f}", f"{100 * report.per_object_mean:.1f}")
        console.print(table)


@app.command("propagate")
def propagate_command(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file (any layout probe extract reads).")],
    davis_dir: Annotated[Path, typer.Option("--davis", help="DAVIS-2017 folder: JPEGImages/480p, Annotations/480p, ImageSets/2017.")],
    out: Annotated[Path, typer.Option("--out", help="Where the indexed PNGs (one folder per sequence) and the J&F tables go.")],
    n_last_frames: Annotated[int, typer.Option("--n-last-frames", help="Previous frames in the context besides the first (DINO: 7).")] = 7,
    size_mask_neighborhood: Annotated[int, typer.Option("--size-mask-neighborhood", help="Window radius in patches (DINO: 12; 0: no window).")] = 12,
    topk: Annotated[int, typer.Option("--topk", help="Sources per target patch, chosen over all context frames (DINO: 5).")] = 5,
    subset: Annotated[str, typer.Option("--set", help="ImageSets/2017/<set>.txt lists the sequences.")] = "val",
    sequence: Annotated[Optional[list[str]], typer.Option("--sequence", help="Only this sequence (repeatable).")] = None,
    network: Annotated[str, typer.Option(help="teacher or student.")] = "teacher",
    no_score: Annotated[bool, typer.Option("--no-score", help="Write the predictions only; read no annotation but the first frames'.")] = False,
    store: Annotated[Optional[Path], typer.Option("--store", help="Save results/davis here (default: the checkpoint's store, when it exists).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    workers: Annotated[Optional[int], typer.Option("--workers", help="Local processes, one sequence and one torch thread each (default: every core; one on a GPU).")] = None,
    dask_address: ClusterOpt = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="i/n: this process's share of the sequences (default from torchrun RANK/WORLD_SIZE); the last to finish scores.")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the J&F tables and settings as JSON.")] = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """DAVIS-2017 label propagation (facebookresearch/dino eval_video_segmentation.py), scored as davis2017-evaluation does."""
    from rich.table import Table

    from .commands.propagate import Settings, run_propagate
    from .infra.progress import bar

    with bar("frames", quiet) as progress:
        task = progress.add_task("propagate", total=None)
        report = run_propagate(checkpoint, davis_dir, out, settings=Settings(n_last_frames, size_mask_neighborhood, topk, subset), network=network,
                               sequences=sequence, score=not no_score, store=store, device=device, cache_dir=cache, json_path=json_path,
                               on_frame=lambda n: progress.advance(task, n), workers=workers, dask_address=dask_address, shard=shard)
    console.print(f"{len(report.sequences)} sequences, {report.frames} frames in {report.seconds:.1f} s → {report.out}", highlight=False)
    if report.waiting:
        console.print(f"shard {shard or 'of torchrun'} done; waiting for shards {report.waiting} (the last one scores every sequence)")
    if report.global_scores is not None:
        table = Table(title=f"DAVIS {subset} (ledger: first frames {report.ledger['first_frames'][:12]}, score {report.ledger['score'][:12]})")
        for column in ("J&F-Mean", "J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay"):
            table.add_column(column, justify="right")
        table.add_row(*[f"{report.global_scores[c]:.3f}" for c in ("J&F-Mean", "J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay")])
        console.print(table)
        console.print(f"tables: {report.out}/global_results-{subset}.csv, per-sequence_results-{subset}.csv"
                      + (f"; saved as {report.saved}" if report.saved else ""), highlight=False, soft_wrap=True)


# --- analyses: entropy and neighbours (commands/entropy.py, commands/neighbours.py) ---

StoresArg = Annotated[list[Path], typer.Argument(help="Stores written by probe extract (several: side by side).")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the numbers to this JSON file.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap over images.")]
BootOpt = Annotated[int, typer.Option("--boot", help="Bootstrap resamples for the 95 % intervals.")]
PartialOpt = Annotated[bool, typer.Option("--partial", help="Summarise a store still being extracted (its finished images).")]


@app.command("entropy")
def entropy_command(
    stores: StoresArg,
    patch: Annotated[Optional[int], typer.Option("--patch", help="Follow this patch of the 224 view (patch = G·row + column).")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="Image id for the --patch tables (default: the first).")] = None,
    json_path: JsonOpt = None,
    dask_address: ClusterOpt = None,
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
    view: Annotated[Optional[str], typer.Option("--view", help="224 (default) or 96: the view's tokens, at whatever grid the store holds (ViT-S/16 at 224: 14x14; ViT-S/8: 28x28).")] = None,
    grid: Annotated[Optional[int], typer.Option("--grid", help="Accepted when it is the grid the store holds (picks the view with that grid).")] = None,
    k: Annotated[int, typer.Option("--k", help="Positives per anchor (SelfPatch k_num = 4).")] = 4,
    top: Annotated[int, typer.Option("--top", help="How many of the most similar patches to test against the window.")] = 8,
    no_wrap: Annotated[bool, typer.Option("--no-wrap", help="Plain borders instead of SelfPatch's wrap-around.")] = False,
    distance: Annotated[str, typer.Option("--distance", help="chebyshev or euclidean (on the torus unless --no-wrap).")] = "chebyshev",
    json_path: JsonOpt = None,
    dask_address: ClusterOpt = None,
    seed: SeedOpt = 0,
    boot: BootOpt = 1000,
    partial: PartialOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Do a patch's most similar patches lie in SelfPatch's 3×3 window? With the rules' selections."""
    from .commands import summaries
    from .commands.neighbours import run_neighbours

    run = run_neighbours(stores, view=view, grid=grid, k=k, top=top, wrap=not no_wrap, distance=distance, json_path=json_path,
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
    patch: Annotated[int, typer.Option("--patch", help="Patch of the first store's 224 grid to follow (patch = G·row + column; 34 = row 2, column 6 at 14 × 14); stores on other grids follow the patch under its centre.")] = 34,
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
