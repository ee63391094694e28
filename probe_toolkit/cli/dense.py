"""The dense frozen-feature protocols: hummingbird (in-context retrieval)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..infra.errors import ProbeError
from .app import SCORED, ShardOpt, app, console, counted, options, show, waiting_line


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
    backend: Annotated[str, typer.Option("--backend", help="scipy: the numpy search; torch: the same search in torch on --device (same neighbours).")] = "scipy",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda (--backend torch): where the memory is searched.")] = "cpu",
    shard: ShardOpt = None,
    **scored: Any,
) -> None:
    """Hummingbird dense retrieval (vpariza/open-hummingbird-eval): VOC or ADE20K mIoU at each memory size."""
    from ..results import tables

    sizes = memory_sizes(memory)
    cache, quiet = scored.pop("cache"), scored.pop("quiet")
    report = counted("hummingbird", "images", quiet, store, train=train, val=val, memory=sizes, k=k, temperature=temperature,
                     augmentation_epochs=augmentation_epochs, seed=seed, matching=matching, cache_dir=cache, json_path=json_path,
                     backend=backend, device=device, shard=shard, **scored)
    if report.waiting:
        console.print(waiting_line(shard, report.waiting, "the last one saves results/hummingbird"))
        return
    show(tables.hummingbird(report, train, val))
