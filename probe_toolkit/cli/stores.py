"""Commands on checkpoints and stores: extract, convert, info, make-checkpoint, doctor, and the catalogue and records listings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..infra.errors import ProbeError
from .app import CacheOpt, QuietOpt, app, console, err_console


@app.command()
def extract(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file (DINO/SelfPatch layouts, full or backbone).")],
    images: Annotated[Path | None, typer.Option("--images", help="Folder of photographs (recursive).")] = None,
    panel: Annotated[str | None, typer.Option("--panel", help="Use a registered panel's image folder.")] = None,
    views: Annotated[str, typer.Option(help="Views to read: 96, 224 (tokens, attention), eval224 (tokens; short side 256, crop 224: DINO's eval_knn.py view, read by "
                                            "probe knn), 480 (keys), native (keys, tokens; own size, zero-padded as TokenCut/LOST), native_crop (keys, tokens; own "
                                            "size, cut to whole patches as DSM's extract.py), native_resized (keys, tokens; resized with LANCZOS to round(side/p) "
                                            "patches as TokenCut's saliency get_saliency.py), hbird512 (tokens; Hummingbird's query view) and "
                                            "hbird512_aug0,hbird512_aug1 (tokens; its memory views, read by probe hummingbird). A later run may add views to a "
                                            "store.")] = "224,480",
    resample: Annotated[str | None, typer.Option("--resample", help="Filter of the 480 squash: bicubic (default) or lanczos (CutLER maskcut.py).")] = None,
    attention: Annotated[str, typer.Option(help="Attention maps at 224: last, all (12 blocks) or none.")] = "last",
    dtype: Annotated[str, typer.Option(help="float16 or float32.")] = "float16",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")] = 16,
    chunk: Annotated[int, typer.Option(help="Images per zarr chunk (the unit of resume and sharding).")] = 16,
    network: Annotated[str, typer.Option(help="teacher or student.")] = "teacher",
    heads: Annotated[int | None, typer.Option(help="Attention heads (default width/64).")] = None,
    convert: Annotated[bool, typer.Option("--convert", help="Drop class token and final norm first (SelfPatch-style).")] = False,
    interp: Annotated[str, typer.Option("--interp",
                                        help="Position-table interpolation: auto (the checkpoint's own code: dinov2-reg for DINOv2 register models, else dino), dino, "
                                             "dinov2-reg or timm.")] = "auto",
    shard: Annotated[str | None, typer.Option(help="i/n: this process's share (default from torchrun RANK/WORLD_SIZE).")] = None,
    on_error: Annotated[str, typer.Option("--on-error", help="fail, or skip unreadable images and record them.")] = "fail",
    limit: Annotated[int | None, typer.Option(help="Process at most N more images now (the last chunk is cut; rerun to finish).")] = None,
    store: Annotated[Path | None, typer.Option(help="Store path (default <cache>/<stem>-<sha8>/<network>.zarr).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    decoders: Annotated[int | None,
                        typer.Option("--decoders", help="Threads decoding and resizing images beside the forward pass, and runs written at once, up to 4 (default: the "
                                                        "cores it leaves free; at least 1).")] = None,
    repair: Annotated[bool, typer.Option("--repair",
                                         help="Read every chunk of the store's --views first and extract again the images of any damaged or missing chunk (probe info "
                                              "--verify lists them).")] = False,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Cache the last block's tokens (224), keys (480) and attention (224) of a checkpoint."""
    from ..store import views as view_table

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
        from ..labels.panels import panel_images

        source = panel_images(panel, cache)
        if store is None:
            from ..store.cache import cache_root, store_path
            from ..store.checkpoint_files import sha256_file

            store = store_path(cache_root(cache), checkpoint, sha256_file(checkpoint), f"{network}{'-converted' if convert else ''}-panel-{panel}")
    view_list = tuple(v.strip() for v in views.split(",") if v.strip())
    for view in view_list:  # option errors before torch and timm are imported
        if view.lower().replace("-", "_") not in view_table.NAMES:
            raise ProbeError(None, f"--views {view} is not one of {', '.join(view_table.NAMES)}", "use e.g. --views 224,480 or --views native,native_resized")
    if dtype not in ("float16", "float32"):
        raise ProbeError(None, f"--dtype {dtype} is not float16 or float32", "use --dtype float16")
    if device not in ("auto", "cpu", "cuda"):
        raise ProbeError(None, f"--device {device!r} is not auto, cpu or cuda", "use --device auto")
    if resample is not None and "480" not in view_list:
        raise ProbeError(None, f"--resample {resample} applies to the 480 view, which --views {views} does not include", "add 480 to --views, or drop --resample")
    from ..store.extract import Settings
    from ..store.extract import extract as run

    settings = Settings(views=view_list, attention=attention, dtype=dtype, chunk=chunk, interpolation=interp, resample=resample or "bicubic")
    try:
        report = run(
            checkpoint, source, settings=settings, network=network, convert=convert, heads=heads, cache_dir=cache, store=store,
            shard=shard, on_error=on_error, limit=limit, batch_size=batch_size, device=device, decoders=decoders, quiet=quiet, repair=repair,
        )
    except KeyboardInterrupt:
        from ..infra.errors import Interrupted

        raise Interrupted("probe extract stopped; the store keeps every finished chunk and is resumable: rerun the same command") from None
    for line in report.skipped:
        err_console.print(f"[yellow]skipped:[/] {line}", highlight=False)
    failed = f"; {report.failed} recorded as failed and left out (probe info lists them)" if report.failed else ""
    console.print(f"{report.store}: {report.done}/{report.n_images} images extracted in views {','.join(report.views)} ({report.written} written now, "
                  f"{len(report.skipped)} skipped now{failed})", soft_wrap=True)
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
    from ..store.checkpoints import convert_file

    before, after = convert_file(source, out, network, force=force)
    console.print(f"{source} → {out}: {before:,} → {after:,} parameters ({before - after:,} dropped: cls_token, pos_embed row 0, norm)")


@app.command()
def info(store: Annotated[Path, typer.Argument(help="A store written by probe extract.")],
         verify: Annotated[bool, typer.Option("--verify", help="Read every chunk and check its checksum; exit 1 when any is damaged or missing.")] = False) -> None:
    """Print a store's manifest, each view's grid and completeness, its arrays."""
    from rich.table import Table

    from ..results import records
    from ..store.describe import describe_store

    if verify:
        from ..infra.errors import IntegrityError
        from ..store.verify import verify as read_every_chunk

        found = read_every_chunk(store)
        if found.damaged:
            raise IntegrityError(None, found.line())
        console.print(found.line(), soft_wrap=True, highlight=False)
        return

    table = Table(title=str(store), show_header=False)
    for field, value in describe_store(store):
        table.add_row(field, value)
    table.add_row("results", ", ".join(f"{n} ({len(records.runs(store, n))})" for n in records.results(store)) or "none yet")
    console.print(table)


@app.command("make-checkpoint")
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="File to write.")],
    layout: Annotated[str, typer.Option(help="dino-backbone, selfpatch-backbone, dino-full, selfpatch-full, dinov2-backbone, dinov2-reg-backbone, ...")] = "dino-full",
    arch: Annotated[str, typer.Option(help="tiny, tiny-p8, tiny-dinov2-reg (seconds on a CPU) or a released size: vit-s16, vit-s8, vit-b16, vit-b8, dinov2-s14(-reg), "
                                           "dinov2-b14(-reg).")] = "tiny",
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
) -> None:
    """Write a random-weight checkpoint in a released layout (to try the pipeline offline)."""
    from ..demo.samples import ALL_LAYOUTS, ARCHS, write_checkpoint
    from ..infra.errors import ProbeError

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

    from ..demo.doctor import checks
    from ..store.cache import cache_root

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



@app.command("list")
def list_command() -> None:
    """Print the protocols, views, architectures and panel kinds, each with its published reference."""
    from ..labels.catalogue import KINDS
    from ..protocols.registry import protocols
    from ..results.tables import catalogue
    from ..store.architectures import DINOV3_RELEASED, RELEASED
    from ..store.views import TABLE

    for table in catalogue(protocols(), list(TABLE), {**RELEASED, **DINOV3_RELEASED}, KINDS):
        console.print(table)


@app.command("results")
def results_command(
    store: Annotated[Path, typer.Argument(help="A store written by probe extract.")],
    result: Annotated[str | None, typer.Option("--result", help="Only the records of this result (e.g. decoder, scores_voc07).")] = None,
) -> None:
    """List a store's records: every run of every protocol, oldest first (none is ever overwritten)."""
    from ..protocols.registry import protocols
    from ..results import records
    from ..results.tables import records as records_table

    protocols()  # each protocol's defaults, for records written before they carried theirs
    if not (Path(store) / "zarr.json").is_file():
        raise ProbeError(store, "is not a store written by probe extract", "pass a store folder (probe info STORE shows one)")
    found = records.runs(store, result) if result else records.every_record(store)
    if result and not found:
        raise ProbeError(store, f"holds no record of {result!r}", f"results it holds: {', '.join(records.results(store)) or 'none yet'}")
    console.print(records_table(found))
