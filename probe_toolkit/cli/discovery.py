"""Object discovery commands: decode (and its streaming mode), score, decode-sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..infra.errors import ProbeError
from .app import PLACEMENT, AllowPartialOpt, CacheOpt, PanelOpt, QuietOpt, UnsealOpt, app, console, err_console, options, run, show, ticker

DecodeViewOpt = Annotated[Optional[str], typer.Option("--view", help="480 (default), native: each image at its own size, zero-padded to the patch (TokenCut's and LOST's main_*.py), native_crop: cut to whole patches (DSM's extract/extract.py), or native_resized: resized with LANCZOS to round(side/p) patches (TokenCut's unsupervised_saliency_detection/get_saliency.py).")]

KeysOpt = Annotated[str, typer.Option("--keys", help="plain: the keys before RoPE (every network's; the default, measured better for cuts on DINOv3); rope: a DINOv3 store's keys after RoPE, as its attention uses them.")]

# streaming (commands/stream.py): checkpoint + images → masks, keys kept in memory only
StreamImagesOpt = Annotated[Optional[Path], typer.Option("--images", help="Stream this folder through the checkpoint (STORE is then a checkpoint); only masks are written.")]
StreamBatchOpt = Annotated[int, typer.Option("--batch-size", help="With --images: images per forward pass.")]
StreamChunkOpt = Annotated[int, typer.Option("--chunk", help="With --images: images per chunk (the unit of resume and sharding).")]


@app.command()
@options(PLACEMENT)
def decode(
    store: Annotated[Path, typer.Argument(help="A store with keys_480 (probe extract --views 480), or a checkpoint with --images.")],
    size: Annotated[int, typer.Option(help="Fixed view whose keys to cut (keys_<size>); --view overrides it.")] = 480,
    view: DecodeViewOpt = None,
    images: StreamImagesOpt = None,
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
    keys: KeysOpt = "plain",
    panel: PanelOpt = None,
    allow_partial: AllowPartialOpt = False,
    unseal: UnsealOpt = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
    **placement: Any,
) -> None:
    """Label-free object masks by a normalized cut on the keys; scored only if --panel is given."""
    from ..infra.atomic import write_json
    from ..infra.progress import bar
    from ..results import tables

    chosen = dict(preset=preset, tau=tau, eps=eps, masks=masks, center=center, color_lambda=color_lambda, view=str(view or size), refine=refine,
                  settings_file=settings, keys=keys)
    if images is not None:
        if panel is not None:
            raise ProbeError(None, "--images streams without --panel", "score the masks JSON with `probe score`")
        if refine is not None:
            raise ProbeError(None, "--refine applies to a store's masks scored on a saliency panel, not to --images", "drop --refine")
        chosen.pop("refine")
        with bar("images", quiet) as progress:
            def start(total: int):
                task = progress.add_task("stream", total=total)
                return lambda n: progress.advance(task, n)

            report = run("decode-stream", None, checkpoint=store, images=images, batch_size=batch_size, chunk=chunk, cache_dir=cache,
                         on_start=start, **chosen, **placement).report
        tail = f"masks → {report.masks_file}" if report.masks_file else "other shards still running; the last to finish writes the masks"
        console.print(f"{report.store}: {report.done}/{report.n_images} images decoded ({report.written} now, in {report.seconds:.1f} s); {tail}")
        if json_path:
            write_json(json_path, {"store": str(report.store), "images": report.n_images, "done": report.done, "written": report.written,
                                   "masks_file": str(report.masks_file) if report.masks_file else None, "settings": report.chosen.as_dict()})
        return
    with bar("images", quiet) as progress:
        report = run("decode", store, out=out, panel=panel, allow_partial=allow_partial, unseal=unseal, cache_dir=cache, on_start=ticker(progress, "decode"), **chosen, **placement).report
    if report.masks_file is None:  # a shard that finished before the others
        console.print(tables.waiting_line(placement["shard"], report.extra["waiting_for_shards"], "the last one writes the masks"))
        return
    console.print(tables.decode_summary(report, report.extra["settings_source"]))
    for warning in report.extra.get("warnings", []):
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    if report.scores is not None:
        show(tables.scores(f"{panel} (ledger entry {report.ledger_entry[:12]})", report.scores))
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
    from ..infra.atomic import write_json
    from ..results import tables

    report = run("score", masks_file, panel=panel, unseal=unseal, cache_dir=cache).report
    for warning in report.warnings:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    show(tables.scores(f"{panel} (ledger entry {report.ledger_entry[:12]})", report.scores))
    if report.saved:
        console.print(f"saved → {report.saved}")
    if json_path:
        write_json(json_path, {"scores": report.scores.table(), "counts": report.scores.counts, "ledger_entry": report.ledger_entry})


@app.command("decode-sweep")
@options(PLACEMENT)
def decode_sweep(
    store: Annotated[Path, typer.Argument(help="A store with keys_480.")],
    panel: Annotated[str, typer.Option("--panel", help="Validation panel to choose the settings on.")],
    grid: Annotated[Optional[Path], typer.Option(help="TOML grid (lists for preset, center, tau, eps, masks); default 144 settings.")] = None,
    metric: Annotated[str, typer.Option(help="Score that picks the best setting.")] = "segm_AP",
    settings_out: Annotated[Optional[Path], typer.Option("--settings-out", help="Where to write the best settings (default <cache>/decoder-settings.json).")] = None,
    view: DecodeViewOpt = None,
    keys: KeysOpt = "plain",
    top: Annotated[int, typer.Option(help="Rows of the table to print (best first).")] = 20,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the whole table as JSON here.")] = None,
    allow_partial: AllowPartialOpt = False,
    unseal: UnsealOpt = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
    **placement: Any,
) -> None:
    """Decode a grid of settings, read the panel's labels once, and keep the best setting."""
    from ..infra.atomic import write_json
    from ..infra.progress import bar
    from ..results import tables

    if top < 1:
        raise ProbeError(None, f"--top {top} must be at least 1", "use e.g. --top 20")
    with bar("images", quiet) as progress:
        report = run("decode-sweep", store, panel=panel, grid=grid, metric=metric, settings_out=settings_out, view=str(view or 480), keys=keys, allow_partial=allow_partial, unseal=unseal,
                     cache_dir=cache, on_start=ticker(progress, "sweep"), **placement).report
    if report.waiting:
        console.print(tables.waiting_line(placement["shard"], report.waiting, "the last one scores every setting"))
        return
    show(tables.sweep(report, panel, metric, top))
    if json_path:
        write_json(json_path, {"metric": metric, "ledger_entry": report.ledger_entry, "table": report.table})
