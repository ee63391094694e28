"""The frozen-feature protocols: linear, knn, attention-masks, propagate, correspond, entropy, neighbours."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..infra.errors import ProbeError
from .app import (SCORED, SHARDED, CacheOpt, ClusterOpt, QuietOpt, ShardOpt, StoresArg, WorkersOpt, app, console, counted, err_console,
                  options, run, show, summary_command, waiting_line)


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

    from ..results import tables

    def step(what: str) -> None:
        if not quiet:
            err_console.print(f"[dim]{what}[/]", highlight=False)

    report = run("linear", stores, train=train, val=val, level=level, epochs=epochs, seed=seed, unseal=unseal, cache_dir=cache, json_path=json_path,
                 on_step=step, workers=workers, dask_address=dask_address).report
    show(tables.linear(report, train, val, seed))


# --- frozen-feature protocols of DINO and SelfPatch (commands/knn.py, attention_masks.py, propagate.py) ---


@app.command("knn")
@options(SHARDED)
def knn_command(
    store: Annotated[Path, typer.Argument(help="A store holding (or beside a store holding) both panels' images.")],
    train: Annotated[str, typer.Option("--train", help="Panel whose images vote (class folders, or COCO: largest category).")],
    val: Annotated[str, typer.Option("--val", help="Panel whose images are classified and scored.")],
    k: Annotated[Optional[str], typer.Option("--k", help="Neighbour counts, all in one pass (default DINO's eval_knn.py: 10,20,100,200, narrowed to the train panel's size).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="Vote weight exp(cos / T) (DINO: 0.07).")] = 0.07,
    feature: Annotated[str, typer.Option("--feature", help="auto, cls-normed (DINO's), cls (as stored) or mean (patch tokens).")] = "auto",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the accuracies and settings as JSON.")] = None,
    unseal: Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel as --val (recorded in the ledger).")] = None,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
    **placement: Any,
) -> None:
    """DINO's weighted k-NN (facebookresearch/dino eval_knn.py): top-1 and top-5 for every k."""

    from ..commands.knn import view_text
    from ..results import tables

    try:
        ks = None if k is None else tuple(int(v) for v in k.split(",") if v.strip())
    except ValueError:
        raise ProbeError("--k", f"{k!r} is not a list of integers", "use --k 10,20,100,200") from None
    report = counted("knn", "images", quiet, store, task="k-NN", train=train, val=val, ks=ks, temperature=temperature, feature=feature, unseal=unseal,
                     cache_dir=cache, json_path=json_path, **placement)
    if report.waiting:
        console.print(waiting_line(placement["shard"], report.waiting, "the last one saves results/knn"))
        return
    show(tables.knn(report, train, val, temperature, view_text(report.view)))


@app.command("attention-masks")
@options(SHARDED)
def attention_masks_command(
    store: Annotated[Path, typer.Argument(help="A store with attention_224 (or tokens_224 for SelfPatch's aggregation head).")],
    panel: Annotated[Optional[str], typer.Option("--panel", help="Score the masks by Jaccard against this panel's objects (read through the ledger).")] = None,
    mass: Annotated[float, typer.Option("--mass", help="Share of the row's attention each head's mask holds (DINO: 0.6).")] = 0.6,
    row: Annotated[str, typer.Option("--row", help="auto, cls (class token), aggregation (SelfPatch's ca_head) or mean (of the patch rows).")] = "auto",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the Jaccards and settings as JSON.")] = None,
    unseal: Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")] = None,
    partial: Annotated[bool, typer.Option("--partial", help="Use a store still being extracted (its finished images).")] = False,
    cache: CacheOpt = None,
    quiet: QuietOpt = False,
    **placement: Any,
) -> None:
    """DINO's attention masks (facebookresearch/dino visualize_attention.py): per head, 60 % of the mass; Jaccard per head and best head."""

    from ..results import tables

    report = counted("attention-masks", "images", quiet, store, hook="on_block", task="masks", panel=panel, mass=mass, row=row, unseal=unseal,
                     cache_dir=cache, json_path=json_path, partial=partial, **placement)
    if report.waiting:
        console.print(waiting_line(placement["shard"], report.waiting, "the last one saves results/attention_masks"))
        return
    show(tables.attention_masks(report, panel))


@app.command("propagate")
def propagate_command(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file (any layout probe extract reads).")],
    davis_dir: Annotated[Path, typer.Option("--davis", help="DAVIS-2017 folder: JPEGImages/480p, Annotations/480p, ImageSets/2017.")],
    out: Annotated[Path, typer.Option("--out", help="Where the indexed PNGs (one folder per sequence) and the J&F tables go.")],
    n_last_frames: Annotated[int, typer.Option("--n-last-frames", help="Previous frames in the context besides the first (DINO: 7).")] = 7,
    size_mask_neighborhood: Annotated[int, typer.Option("--size-mask-neighborhood", help="Window radius in patches (DINO: 12; 0: no window).")] = 12,
    topk: Annotated[int, typer.Option("--topk", help="Sources per target patch, chosen over all context frames (DINO: 5).")] = 5,
    subset: Annotated[str, typer.Option("--set", help="ImageSets/2017/<set>.txt lists the sequences.")] = "val",
    preset: Annotated[str, typer.Option("--preset", help="dino (eval_video_segmentation.py) or dinov3-tracking (DINOv3's segmentation_tracking notebook: short side 960, circular window, T 0.2).")] = "dino",
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="Affinity temperature (default: the preset's, DINO 0.1, DINOv3 0.2).")] = None,
    short_side: Annotated[Optional[int], typer.Option("--short-side", help="Frames' short side in pixels (default: the preset's, DINO 480, DINOv3 960).")] = None,
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

    from ..results import tables

    report = counted("propagate", "frames", quiet, checkpoint, hook="on_frame", davis=davis_dir, out=out, n_last_frames=n_last_frames,
                     size_mask_neighborhood=size_mask_neighborhood, topk=topk, subset=subset, preset=preset, temperature=temperature,
                     short_side=short_side, network=network, sequences=sequence, score=not no_score, store=store, device=device, cache_dir=cache,
                     json_path=json_path, workers=workers, dask_address=dask_address, shard=shard)
    console.print(f"{len(report.sequences)} sequences, {report.frames} frames in {report.seconds:.1f} s → {report.out}", highlight=False)
    if report.waiting:
        console.print(waiting_line(shard, report.waiting, "the last one scores every sequence"))
    show(tables.propagate(report, subset))


@app.command("correspond")
@options(SCORED)
def correspond_command(
    store: Annotated[Path, typer.Argument(help="A store holding the panel's images in the square800 view (probe extract --panel NAME --views square800).")],
    panel: Annotated[str, typer.Option("--panel", help="A SPair-71k panel (probe panel add NAME --spair DIR --split test).")],
    threshold: Annotated[str, typer.Option("--threshold", help="PCK thresholds, fractions of the target box's larger side (probe3d: 0.1).")] = "0.05,0.1,0.15",
    instances: Annotated[int, typer.Option("--instances", help="Pairs sampled per category and viewpoint bin (probe3d: 200; 0: every pair).")] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the pairs' shuffle (probe3d: random.seed(20)).")] = 20,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the PCK tables and settings as JSON.")] = None,
    shard: ShardOpt = None,
    **scored: Any,
) -> None:
    """SPair-71k keypoint correspondence (mbanani/probe3d evaluate_spair_correspondence.py): PCK per category and viewpoint bin."""
    from ..results import tables

    try:
        thresholds = tuple(float(v) for v in threshold.split(",") if v.strip())
    except ValueError:
        raise ProbeError("--threshold", f"{threshold!r} is not a list of numbers", "use --threshold 0.05,0.1,0.15") from None
    cache, quiet = scored.pop("cache"), scored.pop("quiet")
    report = counted("correspond", "pairs", quiet, store, panel=panel, thresholds=thresholds, instances=instances, seed=seed,
                     cache_dir=cache, json_path=json_path, shard=shard, **scored)
    if report.waiting:
        console.print(waiting_line(shard, report.waiting, "the last one saves results/correspond"))
        return
    show(tables.correspond(report))


# --- analyses: entropy and neighbours (commands/entropy.py, commands/neighbours.py) ---



@summary_command("entropy")
def entropy_command(
    stores: StoresArg,
    patch: Annotated[Optional[int], typer.Option("--patch", help="Follow this patch of the 224 view (patch = G·row + column).")] = None,
    image: Annotated[Optional[str], typer.Option("--image", help="Image id for the --patch tables (default: the first).")] = None,
    **over: Any,
) -> None:
    """How spread each attention row is: entropy, e^H, e^H / T, mean attention distance."""

    from ..results import summaries

    found = run("entropy", stores, patch=patch, image=image, **over).report
    console.print(summaries.entropy_table(found.results))
    if found.followed is not None:
        for store, result in found.results.items():
            for table in summaries.detail_tables(store, result, found.followed):
                console.print(table)


@summary_command("neighbours")
def neighbours_command(
    stores: StoresArg,
    view: Annotated[Optional[str], typer.Option("--view", help="224 (default) or 96: the view's tokens, at whatever grid the store holds (ViT-S/16 at 224: 14x14; ViT-S/8: 28x28).")] = None,
    grid: Annotated[Optional[int], typer.Option("--grid", help="Accepted when it is the grid the store holds (picks the view with that grid).")] = None,
    k: Annotated[int, typer.Option("--k", help="Positives per anchor (SelfPatch k_num = 4).")] = 4,
    top: Annotated[int, typer.Option("--top", help="How many of the most similar patches to test against the window.")] = 8,
    no_wrap: Annotated[bool, typer.Option("--no-wrap", help="Plain borders instead of SelfPatch's wrap-around.")] = False,
    distance: Annotated[str, typer.Option("--distance", help="chebyshev or euclidean (on the torus unless --no-wrap).")] = "chebyshev",
    **over: Any,
) -> None:
    """Do a patch's most similar patches lie in SelfPatch's 3×3 window? With the rules' selections."""

    from ..results import summaries

    found = run("neighbours", stores, view=view, grid=grid, k=k, top=top, wrap=not no_wrap, distance=distance, **over).report
    console.print(summaries.neighbours_table(found.results))

