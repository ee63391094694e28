"""The dense frozen-feature protocols: hummingbird (in-context retrieval)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..infra.errors import ProbeError
from .app import SCORED, app, counted, options, show


def memory_sizes(text: str) -> tuple[int | None, ...]:
    """``--memory 102400,1024000,full`` → (102400, 1024000, None)."""
    sizes: list[int | None] = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        try:
            sizes.append(None if part == "full" else int(part))
        except ValueError:
            raise ProbeError("--memory", f"{part!r} is not a number of patches or full", "use e.g. --memory 102400,1024000,10240000,full") from None
    return tuple(sizes)


@app.command("hummingbird")
@options(SCORED)
def hummingbird_command(
    store: Annotated[Path, typer.Argument(help="A store holding (or beside a store holding) both panels' images in the hbird512 views.")],
    train: Annotated[str, typer.Option("--train", help="Segmentation panel (VOC or ADE20K) whose augmented views make the memory (VOC trainaug, as published).")],
    val: Annotated[str, typer.Option("--val", help="Segmentation panel of the same data set whose patches are labelled from the memory and scored.")],
    memory: Annotated[str, typer.Option("--memory", help="Memory sizes in patches, all in one run; full: every patch (published: 1024·10², 10³, 10⁴).")] = "102400,1024000,10240000",
    k: Annotated[int, typer.Option("--k", help="Nearest memory patches per query patch (open-hummingbird-eval: 30).")] = 30,
    temperature: Annotated[float, typer.Option("--temperature", help="Softmax temperature of the label transfer (open-hummingbird-eval: 0.02).")] = 0.02,
    augmentation_epochs: Annotated[int, typer.Option("--augmentation-epochs", help="Augmented views of each train image in the memory: 1 or 2 (published: 2).")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bounded memory's draws (eval.py: 123).")] = 123,
    matching: Annotated[str, typer.Option("--matching", help="Headline mIoU: identity (predictions are labels) or hungarian (the reference's matching).")] = "identity",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the scores and settings as JSON.")] = None,
    **scored: Any,
) -> None:
    """Hummingbird dense retrieval (vpariza/open-hummingbird-eval): VOC or ADE20K mIoU at each memory size."""
    from ..results import tables

    sizes = memory_sizes(memory)
    cache, quiet = scored.pop("cache"), scored.pop("quiet")
    report = counted("hummingbird", "images", quiet, store, train=train, val=val, memory=sizes, k=k, temperature=temperature,
                     augmentation_epochs=augmentation_epochs, seed=seed, matching=matching, cache_dir=cache, json_path=json_path, **scored)
    show(tables.hummingbird(report, train, val))


@app.command("segment")
def segment_command(
    checkpoint: Annotated[Path, typer.Argument(help="The checkpoint whose frozen network runs on every crop (its store, under --cache or --store, keeps the record).")],
    train: Annotated[str, typer.Option("--train", help="ADE20K (or VOC) segmentation panel whose augmented crops train the head.")],
    val: Annotated[str, typer.Option("--val", help="Segmentation panel of the same data set, scored by sliding windows after training.")],
    preset: Annotated[str, typer.Option("--preset", help="dinov3 (config-ade20k-linear-training.yaml) or dinov2 (its mmseg linear config).")] = "dinov3",
    iterations: Annotated[int, typer.Option("--iterations", help="Training iterations (published: 40000, a GPU job; fewer: a short run, marked so).")] = 40000,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Crops per iteration (published: 2 × 8 GPUs = 16).")] = 16,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate (published: 1e-3).")] = 1e-3,
    weight_decay: Annotated[Optional[float], typer.Option("--weight-decay", help="Default: the preset's (DINOv3 1e-3, DINOv2 1e-4).")] = None,
    warmup: Annotated[Optional[int], typer.Option("--warmup", help="Warm-up iterations (default: 1500 at 40000, the same share otherwise).")] = None,
    crop: Annotated[int, typer.Option("--crop", help="Training crop and sliding window in pixels (published: 512).")] = 512,
    size: Annotated[int, typer.Option("--size", help="Short side before the random ratio and at evaluation (published: 512).")] = 512,
    stride: Annotated[int, typer.Option("--stride", help="Sliding-window stride (published: 341).")] = 341,
    dropout: Annotated[Optional[float], typer.Option("--dropout", help="Channel dropout before the BatchNorm (default: the preset's, DINOv3 0.1, DINOv2 0).")] = None,
    scale: Annotated[str, typer.Option("--scale", help="low,high: random ratio of the short side (published 0.5,2.0).")] = "0.5,2.0",
    flip: Annotated[float, typer.Option("--flip", help="Horizontal-flip probability (published 0.5).")] = 0.5,
    photometric: Annotated[bool, typer.Option("--photometric/--no-photometric", help="PhotoMetricDistortion of the crops (published: on).")] = True,
    figure_images: Annotated[int, typer.Option("--figure-images", help="Val images whose truth and prediction the record keeps for the report.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the crops, the image order, the head's initial weights and dropout (DINOv3: 100).")] = 100,
    chunk: Annotated[int, typer.Option("--chunk", help="Crops per forward pass of the frozen network (memory only).")] = 16,
    store: Annotated[Optional[Path], typer.Option("--store", help="Store that keeps the record (default: the checkpoint's store for --network under --cache).")] = None,
    network: Annotated[str, typer.Option("--network", help="teacher or student.")] = "teacher",
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")] = "cpu",
    workers: Annotated[Optional[int], typer.Option("--workers", help="Threads that decode and augment the crops (default 2).")] = None,
    unseal: Annotated[Optional[str], typer.Option("--unseal", help="Reason to open a sealed test panel (recorded in the ledger).")] = None,
    cache: Annotated[Optional[Path], typer.Option("--cache", help="Cache root (default: $PROBE_CACHE or ./cache).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the scores and settings as JSON.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Linear segmentation as DINOv3 and DINOv2 train it: a BatchNorm + linear head on frozen patch tokens; mIoU."""
    from ..results import tables

    try:
        low, high = (float(v) for v in scale.split(","))
    except ValueError:
        raise ProbeError("--scale", f"{scale!r} is not two numbers low,high", "use e.g. --scale 0.5,2.0") from None
    report = counted("segment", "steps", quiet, checkpoint, train=train, val=val, preset=preset, iterations=iterations,
                     batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup, crop=crop, size=size, stride=stride, seed=seed,
                     dropout=dropout, scale=(low, high), flip=flip, photometric=photometric, figure_images=figure_images,
                     chunk=chunk, store=store, network=network, device=device, workers=workers, unseal=unseal, cache_dir=cache, json_path=json_path)
    show(tables.segmentation(report, train, val))
