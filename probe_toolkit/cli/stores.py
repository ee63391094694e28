"""Commands on checkpoints and stores: extract, convert, info, make-checkpoint, doctor, and the catalogue and records listings."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from ..infra.errors import ProbeError
from .app import CacheOpt, QuietOpt, app, console, err_console, whole

VIEWS_HELP = "Views to read (default 224,480, or the views --for's protocols read): see `probe list`."
ATTENTION_HELP = (
    "last (the last block's maps), all (every block's) where a view reads attention (the short family: 224), none, or stats: in every view, "
    "each block's and head's per-query entropy, mean attention distance, top-k mass and the class and storage tokens' rows, computed in "
    "tiles of queries (memory linear in the tokens; read by probe entropy)."
)
BLOCKS_HELP = (
    "Blocks whose facets are stored, as DINOv2's and DINOv3's get_intermediate_layers take them: 0-based indices (3,7,11), last4 (their n=4), "
    "all, or last (the default: the stores of before)."
)
FACETS_HELP = (
    "What of each block: tokens (its output), normed (through the final norm, their norm=True), q, k, v (attention inputs, heads "
    "concatenated; DINOv3's q and k also after RoPE); each with its class token's and registers' rows. Default: what each view reads."
)
FOR_HELP = (
    "Store only what these protocols read (e.g. knn,hummingbird,decode: the class token and normed class token at eval224, the "
    "Hummingbird views' tokens, the keys at 480); --views moves them to other sizes of the same families. `probe plan` shows the sizes first."
)


def planned_settings(views: str | None, for_: str | None, blocks: str, facets: str | None, attention: str, dtype: str, chunk: int, interp: str, resample: str | None):
    """``probe extract``'s and ``probe plan``'s settings from their options (errors before torch is imported)."""
    from ..store import views as view_table
    from ..store.extract_plan import Settings

    view_list = tuple(v.strip() for v in (views or ("" if for_ else "224,480")).split(",") if v.strip())
    for view in view_list:
        if not view_table.is_view(view):
            from ..store.images import view_name

            view_name(view)  # the one line naming the views
    wanted: tuple[str, ...] = ()
    if for_:
        from ..protocols.registry import get
        from ..store.plan import wanted as plan_of

        names = [n.strip() for n in for_.split(",") if n.strip()]
        stores = [a for n in names for a in get(n).reads.planned]
        declared = [get(n).reads.blocks for n in names if get(n).reads.blocks]
        if blocks == "last" and declared:  # the blocks a protocol reads (DINOv2's linear: last4), the most any asks, for every array of the plan
            from ..store.extract_plan import resolve_blocks

            blocks = max(declared, key=lambda spec: len(resolve_blocks(spec, 10_000) or ()))
        if not stores:
            raise ProbeError(
                None,
                f"--for {for_}: {', '.join(names)} read{'s' if len(names) == 1 else ''} no store arrays (a checkpoint or masks)",
                "name protocols that read a store, e.g. --for knn,decode",
            )
        from ..store.layout import parse as parse_array

        families = {view_table.view(parse_array(a).view).family for a in stores}
        idle = [v for v in view_list if view_table.view(v).family not in families]
        if idle:  # it would move none of the protocols' arrays, and be dropped without a word
            raise ProbeError(
                None,
                f"--views {','.join(idle)} beside --for {for_}: no array {', '.join(names)} read{'s' if len(names) == 1 else ''} is of its family "
                f"({', '.join(sorted(dict.fromkeys(stores)))})",
                "give --views a size of the family to move them to (e.g. square@S for a 480 array), or drop --views",
            )
        wanted, view_list = plan_of(stores, view_list), ()
    from ..store.layout import view_of

    square = any(view_table.view(v).family == "square" for v in (*view_list, *(view_of(a) for a in wanted)))
    if resample is not None and not square:
        raise ProbeError(None, f"--resample {resample} applies to the square views (480, square@S), which are not asked", "add 480 to --views, or drop --resample")
    chosen = tuple(f.strip() for f in facets.split(",") if f.strip()) if facets is not None else None
    return Settings(
        views=view_list, attention=attention, dtype=dtype, chunk=chunk, interpolation=interp, resample=resample or "bicubic", blocks=blocks, facets=chosen, wanted=wanted
    )


@app.command()
def extract(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="Checkpoint file (DINO, SelfPatch, DINOv2, DINOv3 layouts, full or backbone), a transformers or timm folder "
            "(config.json + model.safetensors), or a Hugging Face Hub name (hf-hub:timm/NAME or org/name, from its cache)."
        ),
    ],
    revision: Annotated[str | None, typer.Option("--revision", help="Branch, tag or commit of a Hub name (default main).")] = None,
    images: Annotated[Path | None, typer.Option("--images", help="Folder of photographs (recursive).")] = None,
    panel: Annotated[str | None, typer.Option("--panel", help="Use a registered panel's image folder.")] = None,
    views: Annotated[str | None, typer.Option(help=VIEWS_HELP)] = None,
    resample: Annotated[str | None, typer.Option("--resample", help="Filter of the square views' squash: bicubic (default) or lanczos (CutLER maskcut.py).")] = None,
    attention: Annotated[str, typer.Option(help=ATTENTION_HELP)] = "last",
    blocks: Annotated[str, typer.Option("--blocks", help=BLOCKS_HELP)] = "last",
    facets: Annotated[str | None, typer.Option("--facets", help=FACETS_HELP)] = None,
    for_: Annotated[str | None, typer.Option("--for", help=FOR_HELP)] = None,
    dtype: Annotated[str, typer.Option(help="float16 or float32.")] = "float16",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")] = 16,
    chunk: Annotated[int, typer.Option(help="Images per zarr chunk (the unit of resume and sharding).")] = 16,
    network: Annotated[str, typer.Option(help="teacher or student.")] = "teacher",
    heads: Annotated[int | None, typer.Option(help="Attention heads (default width/64).")] = None,
    convert: Annotated[bool, typer.Option("--convert", help="Drop class token and final norm first (SelfPatch-style).")] = False,
    interp: Annotated[
        str,
        typer.Option(
            "--interp", help="Position-table interpolation: auto (the checkpoint's own code: dinov2-reg for DINOv2 register models, else dino), dino, dinov2-reg or timm."
        ),
    ] = "auto",
    shard: Annotated[str | None, typer.Option(help="i/n: this process's share (default from torchrun RANK/WORLD_SIZE).")] = None,
    on_error: Annotated[str, typer.Option("--on-error", help="fail, or skip unreadable images and record them.")] = "fail",
    limit: Annotated[int | None, typer.Option(help="Process at most N more images now (the last chunk is cut; rerun to finish).")] = None,
    store: Annotated[Path | None, typer.Option(help="Store path (default <cache>/<stem>-<sha8>/<network>.zarr).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    decoders: Annotated[
        int | None,
        typer.Option(
            "--decoders",
            help="Threads decoding and resizing images beside the forward pass, and runs written at once, up to 4 (default: the cores it leaves free; at least 1).",
        ),
    ] = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Read every chunk of the store's --views first and extract again the images of any damaged or missing chunk (probe info --verify lists them).",
        ),
    ] = False,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Cache a checkpoint's tokens, keys and attention: by default the last block's tokens (224), keys (480) and attention (224)."""
    if (images is None) == (panel is None):
        raise ProbeError(None, "give exactly one of --images DIR or --panel NAME", f"e.g. probe extract {shlex.quote(str(checkpoint))} --images photos/")
    if on_error not in ("fail", "skip"):
        raise ProbeError(None, f"--on-error {on_error!r} is not fail or skip", "use --on-error skip")
    if interp not in ("auto", "dino", "dinov2-reg", "timm"):
        raise ProbeError(None, f"--interp {interp!r} not understood", "use auto|dino|dinov2-reg|timm")
    if store is not None and store.exists() and not store.is_dir():
        raise ProbeError(store, "is a file, not a store folder (--store)", "pass --store a new path or an existing store")
    source = images
    if panel is not None:
        from ..labels.panels import panel_images

        source = panel_images(panel, cache, str(checkpoint))
        if store is None:
            from ..store.cache import cache_root, store_path
            from ..store.checkpoint_files import sha256_file
            from ..store.hub import locate

            located = locate(checkpoint, revision)
            store = store_path(cache_root(cache), located.stem, sha256_file(located.path), f"{network}{'-converted' if convert else ''}-panel-{panel}")
    if dtype not in ("float16", "float32"):
        raise ProbeError(None, f"--dtype {dtype} is not float16 or float32", "use --dtype float16")
    if device not in ("auto", "cpu", "cuda"):
        raise ProbeError(None, f"--device {device!r} is not auto, cpu or cuda", "use --device auto")
    settings = planned_settings(views, for_, blocks, facets, attention, dtype, chunk, interp, resample)  # view and plan errors before torch and timm
    from ..store.extract import extract as run

    try:
        report = run(
            checkpoint,
            source,
            settings=settings,
            network=network,
            convert=convert,
            heads=heads,
            cache_dir=cache,
            store=store,
            revision=revision,
            shard=shard,
            on_error=on_error,
            limit=limit,
            batch_size=batch_size,
            device=device,
            decoders=decoders,
            quiet=quiet,
            repair=repair,
        )
    except KeyboardInterrupt:
        from ..infra.errors import Interrupted

        raise Interrupted("probe extract stopped; the store keeps every finished chunk and is resumable: rerun the same command") from None
    for line in report.skipped:
        err_console.print(f"[yellow]skipped:[/] {line}", highlight=False)
    failed = f"; {report.failed} recorded as failed and left out (`probe info` lists them)" if report.failed else ""
    console.print(
        f"{report.store}: {report.done}/{report.n_images} images extracted in views {','.join(report.views)} ({report.written} written now, "
        f"{len(report.skipped)} skipped now{failed})",
        soft_wrap=True,
    )
    if report.limit is not None and report.left:
        console.print(f"--limit {report.limit}: {report.left} images of this shard left; rerun the same command to continue", soft_wrap=True)


@app.command("plan")
def plan_command(
    checkpoint: Annotated[Path | None, typer.Argument(help="A checkpoint (the network's shape is read from it); without one, --arch.")] = None,
    images: Annotated[str, typer.Option("--images", help="How many images, or a folder of them (the own-size views' grids are read from its files).")] = "1",
    arch: Annotated[str, typer.Option("--arch", help="A released size without a checkpoint: vit-s16, vit-b16, dinov2-s14-reg, vit-s16-dinov3, ...")] = "vit-s16",
    views: Annotated[str | None, typer.Option(help=VIEWS_HELP)] = None,
    attention: Annotated[str, typer.Option(help=ATTENTION_HELP)] = "last",
    blocks: Annotated[str, typer.Option("--blocks", help=BLOCKS_HELP)] = "last",
    facets: Annotated[str | None, typer.Option("--facets", help=FACETS_HELP)] = None,
    for_: Annotated[str | None, typer.Option("--for", help=FOR_HELP)] = None,
    dtype: Annotated[str, typer.Option(help="float16 or float32.")] = "float16",
    chunk: Annotated[int, typer.Option(help="Images per zarr chunk (held in memory whole while written).")] = 16,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per forward pass.")] = 16,
) -> None:
    """Print what `probe extract` with these options will store, array by array, and the disk and memory each takes, before any work."""
    from ..store.plan import describe, size_text

    settings = planned_settings(views, for_, blocks, facets, attention, dtype, chunk, "auto", None)
    count, own = _image_count(images, settings, checkpoint, arch)
    network = _arch(checkpoint, arch)
    planned = describe(network, settings, count, own(network.patch), batch_size)
    console.print(
        f"probe extract plan: {count:,} images, {'checkpoint ' + str(checkpoint) if checkpoint else '--arch ' + arch}; per array: bytes an image, "
        f"on disk for {count:,} images (uncompressed: zstd only shrinks it), in memory while a chunk of {settings.chunk} is written",
        soft_wrap=True,
        highlight=False,
    )
    for row in planned.rows:
        shape = " × ".join(f"{d} {s}" for d, s in zip(row.dims, row.shape))
        console.print(
            f"  {row.name} ({shape}, {row.dtype}): {size_text(row.per_image)} an image, {size_text(row.disk(count))} on disk, "
            f"{size_text(row.per_image * settings.chunk)} a chunk",
            soft_wrap=True,
            highlight=False,
        )
    total = sum(r.per_image for r in planned.rows)
    console.print(
        f"  total: {size_text(total)} an image, {size_text(total * count)} on disk, {size_text(total * settings.chunk)} a chunk", soft_wrap=True, highlight=False
    )
    for what, need in planned.forward.items():
        console.print(f"  forward pass, {what}: {size_text(need)} a batch of {batch_size}", soft_wrap=True, highlight=False)


def _arch(checkpoint: Path | None, arch: str):
    """The network's shape: from the checkpoint, else the released size named."""
    if checkpoint is not None:
        from ..store.checkpoints import load_checkpoint

        return load_checkpoint(checkpoint).arch
    from ..store.architectures import DINOV3_RELEASED, RELEASED

    known = {**RELEASED, **DINOV3_RELEASED}
    if arch not in known:
        raise ProbeError(None, f"--arch {arch} is not a released size", f"use one of {', '.join(known)}, or pass the checkpoint")
    return known[arch]


def _image_count(images: str, settings, checkpoint: Path | None, arch: str):
    """(how many images, own-size patches by view for a patch size): a count, or a folder whose own-size grids are read from its file headers."""
    from ..store import images as image_files

    own_views = tuple(v for v in settings.names if v in image_files.OWN_SIZE)
    if images.strip().isdigit():
        if own_views:
            raise ProbeError(
                None,
                f"--images {images}: the {', '.join(own_views)} view's size is each image's own",
                "pass --images a folder of the images, whose headers give their grids",
            )
        return int(images), lambda patch: {}
    refs = image_files.list_images(images)

    def own(patch: int) -> dict[str, int]:
        from ..store.extract_plan import native_grids

        grids = native_grids(refs, patch, "skip", own_views) if own_views else {}
        return {v: int((r.astype(int) * c.astype(int)).max(initial=0)) for v, (r, c) in grids.items()}

    return len(refs), own


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
def info(
    store: Annotated[Path, typer.Argument(help="A store written by probe extract.")],
    verify: Annotated[bool, typer.Option("--verify", help="Read every chunk and check its checksum; exit 1 when any is damaged or missing.")] = False,
) -> None:
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
    console.print(whole(table))


@app.command("make-checkpoint")
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="File to write.")],
    layout: Annotated[str, typer.Option(help="dino-backbone, selfpatch-backbone, dino-full, selfpatch-full, dinov2-backbone, dinov2-reg-backbone, ...")] = "dino-full",
    arch: Annotated[
        str,
        typer.Option(help="tiny, tiny-p8, tiny-dinov2-reg (seconds on a CPU) or a released size: vit-s16, vit-s8, vit-b16, vit-b8, dinov2-s14(-reg), dinov2-b14(-reg)."),
    ] = "tiny",
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
    console.print(whole(table))
    failed = [c.name for c in results if c.required and not c.ok]
    if failed:
        err_console.print(
            f"[bold red]doctor:[/] {len(failed)} required check{'s' if len(failed) > 1 else ''} failed ({', '.join(failed)}); see the table above",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


@app.command("list")
def list_command() -> None:
    """Print the protocols, views, architectures and panel kinds, each with its published reference."""
    from ..labels.catalogue import KINDS
    from ..protocols.registry import protocols
    from ..results.tables import catalogue
    from ..store.architectures import DINOV3_RELEASED, RELEASED
    from ..store.views import listed

    for table in catalogue(protocols(), list(listed()), {**RELEASED, **DINOV3_RELEASED}, KINDS):
        console.print(whole(table))


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
        raise ProbeError(store, "is not a probe store (no zarr.json)", "pass a store written by `probe extract`")
    found = records.runs(store, result) if result else records.every_record(store)
    if result and not found:
        raise ProbeError(store, f"holds no record of {result!r}", f"results it holds: {', '.join(records.results(store)) or 'none yet'}")
    console.print(whole(records_table(found)))
