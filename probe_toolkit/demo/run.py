"""``probe demo``: the whole toolkit, offline, on a CPU, in minutes.

Everything it needs ships with the package or is made on the spot: the real photographs of
``data/photos``, two labelled panels of synthetic scenes with exact masks (``scenes.py``;
``demo-train`` and ``demo-val``), and a tiny SelfPatch network (the real design, 2 blocks of
width 128) at random initialisation and after a short run of ``training/``. Both networks are
extracted, measured (entropy, neighbours), decoded and scored on the val panel (and by LOST on
the same scenes as a saliency panel, ``demo-sal``), probed, run through DINO's protocols (k-NN,
attention masks, label propagation on a synthetic DAVIS folder made by ``video.py``), scored
on keypoint correspondence (a synthetic SPair-71k panel made by ``spair.py``, ``demo-spair``) and NAVI's
multiview correspondence (a synthetic NAVI folder made by ``navi.py``, ``demo-navi``), by
Hummingbird's dense retrieval and a short linear segmentation on scenes written in VOC 2012's
layout (``demo-seg-train``, ``demo-seg-val``), a short linear depth on rooms written in NYU Depth v2's
layout (``rooms.py``: ``demo-nyu-train``, ``demo-nyu-test``), measured without labels (rank and position of each
network's tokens, linear CKA between their blocks and between the two networks, and k-means
overclustering of the VOC-layout val scenes, whose labels only score the clusters), and compared in one report.
Its cache, ledger and runs live under ``<out>/work`` so a demo never touches a user's own cache;
rerunning it resumes (finished stores and runs are reused). Each stage prints its wall time and the
processor time the run spent on it (this process and its finished children): on a busy machine the
first grows with the load, the second much less.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..labels import panels
from ..protocols.api import run as run_protocol
from ..store.extract import Settings, extract
from . import scenes
from .samples import TINY, sample_photos, write_checkpoint

FOLLOW = "photos/chelsea.jpg"  # the followed image: a real photograph with one clear animal


@dataclass
class Demo:
    out: Path
    html: Path | None = None  # set when the report is written, the last stage
    stores: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each stage
    cpu: dict[str, float] = field(default_factory=dict)  # processor time of each stage (user + system, children included)


def _cpu() -> float:
    """Processor seconds this process and its waited-for children have used (user + system)."""
    import os

    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _data(work: Path, quick: bool) -> Path:
    """photos/ (the shipped photographs) and the two panels' folders, under one image root."""
    root = work / "data"
    photos = root / "photos"
    if not photos.is_dir():
        photos.mkdir(parents=True)
        for path in sorted(sample_photos().glob("*.jpg")):
            shutil.copy(path, photos / path.name)
    for name, count, seed in (("demo-train", 6 if quick else 16, 1), ("demo-val", 4 if quick else 8, 2)):
        if not (root / name / "annotations.json").is_file():
            scenes.write_panel(root / name, count, seed)
    return root


def run_demo(out: str | Path = Path("reports/demo"), *, quick: bool = False, quiet: bool = False, say: Callable[[str], None] = print, formats: str | None = None) -> Demo:
    """Run every stage; ``quick`` shortens training and the panels (the test suite's mode);
    ``formats``: the report's figure files (default PNG, PDF and SVG; PNG alone when ``quick``)."""
    from ..infra import owned

    out = Path(out)
    owned.claim(out, "out").adopt("demo", ["work/"])  # the user's own folder is refused; the report beside work/ is probe's
    work = out / "work"
    cache = work / "cache"
    demo = Demo(out=out)
    clock, used = time.perf_counter(), _cpu()

    def lap(stage: str) -> None:
        nonlocal clock, used
        now, spent = time.perf_counter(), _cpu()
        demo.seconds[stage], demo.cpu[stage] = round(now - clock, 2), round(spent - used, 2)
        clock, used = now, spent
        say(f"{stage}: {demo.seconds[stage]:.1f} s (processor {demo.cpu[stage]:.1f} s)")

    root = _data(work, quick)
    for name, role in (("demo-train", "train"), ("demo-val", "val")):
        if name not in {p.name for p in panels.list_panels(cache)}:
            panels.add_panel(name, annotations=root / name / "annotations.json", images=root / name / "images", role=role, cache=cache)
    if "demo-sal" not in {p.name for p in panels.list_panels(cache)}:  # the val scenes as a saliency benchmark
        masks = scenes.write_masks(work / "saliency-masks", 4 if quick else 8, 2)  # outside the image root: never extracted
        panels.add_panel("demo-sal", masks, root / "demo-val" / "images", "val", cache=cache, kind="saliency")
    lap("data and panels")

    random_init = work / "checkpoints" / "tiny-random.pth"
    if not random_init.is_file():
        write_checkpoint(random_init, "selfpatch-full", TINY, seed=0)
    from training import train

    # a short run: a higher learning rate and a faster teacher (EMA 0.9 instead of 0.996) so
    # that a dozen steps move the teacher, which is the network probe extract reads
    run = train(
        "tiny",
        {
            "data.images": str(root / "photos"),
            "run.out": str(work / "runs" / "tiny-selfpatch"),
            "init.checkpoint": str(random_init),
            "optim.epochs": 4 if quick else 12,
            "optim.warmup_epochs": 1 if quick else 2,
            "optim.lr_backbone": 2e-3,
            "optim.lr_heads": 2e-3,
            "optim.momentum_teacher": 0.9,
        },
        quiet=quiet,
    )
    lap("training (tiny SelfPatch, from the random network)")

    # every block's arrays (the tiny networks have two): probe similarity compares a network's blocks
    settings = Settings(views=(96, 224, 480), attention="all", blocks="all", chunk=8)
    for checkpoint in (random_init, run.checkpoint):
        demo.stores.append(extract(checkpoint, root, settings=settings, cache_dir=cache, batch_size=8, quiet=quiet).store)
    lap("extraction (96, 224, 480)")

    run_protocol("entropy", demo.stores, patch=34, image=FOLLOW)
    for view in ("224", "96"):
        run_protocol("neighbours", demo.stores, view=view)
    lap("entropy and neighbours")

    # every protocol through probe.run, as the command line runs it: each record carries its settings, defaults, inputs
    # and placement (the report's freshness and settings columns read them)
    for store in demo.stores:  # LOST on the saliency panel first: the centred decode then leaves its masks in results/decoder
        run_protocol("decode", store, preset="lost", panel="demo-sal", cache_dir=cache)
        run_protocol("decode", store, preset="centred", panel="demo-val", cache_dir=cache)
    lap("decoder, scored on demo-val")

    for level in ("patch", "image"):
        run_protocol("linear", demo.stores, train="demo-train", val="demo-val", level=level, epochs=50 if quick else 100, cache_dir=cache)
    lap("linear probes (demo-train → demo-val)")

    from .video import write_davis

    davis = work / "davis"
    if not (davis / "ImageSets").is_dir():
        write_davis(davis, {"shapes": 4}, size=(96, 72))
    for checkpoint, store in zip((random_init, run.checkpoint), demo.stores):
        run_protocol("knn", store, train="demo-train", val="demo-val", ks=(1, 3, 5), cache_dir=cache, workers=1)
        run_protocol("attention-masks", store, panel="demo-val", cache_dir=cache, workers=1)
        run_protocol("propagate", checkpoint, davis=davis, out=work / "davis-out" / store.parent.name, store=store, cache_dir=cache)
    lap("k-NN, attention masks, DAVIS label propagation")

    from ..commands.correspond import VIEW
    from .spair import write_spair

    if "demo-spair" not in {p.name for p in panels.list_panels(cache)}:  # outside the image root: extracted in its own view only
        panels.add_panel("demo-spair", write_spair(work / "spair", {"cat": 3, "dog": 3}, seed=3), None, "val", cache=cache, kind="spair", split="test")
    spair_images = panels.get_panel("demo-spair", cache).images
    for checkpoint, store in zip((random_init, run.checkpoint), demo.stores):  # each store's panel sibling, as `probe extract --panel` names it
        sibling = store.parent / f"{store.name.removesuffix('.zarr')}-panel-demo-spair.zarr"
        extract(checkpoint, spair_images, settings=Settings(views=(VIEW,), dtype="float32"), store=sibling, cache_dir=cache, quiet=quiet)
        run_protocol("correspond", store, panel="demo-spair", cache_dir=cache)
    _navi(demo.stores, work, cache)
    lap("keypoint correspondence (demo-spair) and multiview correspondence (demo-navi)")
    _hummingbird(demo.stores, (random_init, run.checkpoint), work, cache, quick, quiet)
    lap("Hummingbird (VOC-layout scenes, 512 px views in stores beside each network's)")
    _segment(demo.stores, (random_init, run.checkpoint), cache, quick)
    lap("linear segmentation (a short schedule on the VOC-layout scenes)")
    _depth(demo.stores, (random_init, run.checkpoint), work, cache, quick)
    lap("linear depth (a short schedule on NYU-layout rooms)")
    _label_free(demo.stores, cache)
    lap("rank, position, similarity, overclustering (no label but to score the clusters)")

    demo.html = _report(demo.stores, out, quiet, formats or ("png" if quick else None))
    lap("report" if formats or not quick else "report (PNG figures; the full demo writes PDF and SVG beside them)")
    return demo


def _navi(stores: list[Path], work: Path, cache: Path) -> None:
    """NAVI's multiview correspondence (probe3d's protocol) on a synthetic NAVI folder (``navi.py``,
    ``demo-navi``): two objects, two pairs; the network runs on the pairs' own 512 px views."""
    from .navi import write_navi

    if "demo-navi" not in {p.name for p in panels.list_panels(cache)}:
        root = write_navi(work / "navi" / "navi_v1", {"bottle": [0, 20, 45, 70, 100], "mug": [5, 35, 60]}, seed=5)
        panels.add_panel("demo-navi", root, None, "val", cache=cache, kind="navi", split="test")
    for store in stores:
        run_protocol("correspond", store, panel="demo-navi", cache_dir=cache)


def _hummingbird(stores: list[Path], checkpoints: tuple[Path, Path], work: Path, cache: Path, quick: bool, quiet: bool) -> None:
    """Dense retrieval on scenes written in VOC 2012's layout (outside the image root, so the main
    stores never hold them): each panel's 512 px views extracted beside each store
    (``<network>-panel-NAME.zarr``), then ``probe hummingbird`` at a bounded and the full memory."""
    year = work / "voc" / "VOC2012"
    if not (year / "ImageSets").is_dir():
        scenes.write_voc(year, {"train": (6 if quick else 12, 3), "val": (4 if quick else 8, 4)})
    known = {p.name for p in panels.list_panels(cache)}
    for name, split in (("demo-seg-train", "train"), ("demo-seg-val", "val")):
        if name not in known:
            panels.add_panel(name, year, None, split, cache=cache, kind="voc-segmentation", split=split)
    for checkpoint, store in zip(checkpoints, stores):
        for name, views in (("demo-seg-train", ("hbird512_aug0", "hbird512_aug1")), ("demo-seg-val", ("hbird512",))):
            extract(
                checkpoint,
                year / "JPEGImages",
                settings=Settings(views=views, chunk=8),
                store=store.parent / f"{store.stem}-panel-{name}.zarr",
                batch_size=8,
                quiet=quiet,
            )
        run_protocol("hummingbird", store, train="demo-seg-train", val="demo-seg-val", memory=(1000, None), cache_dir=cache)


def _segment(stores: list[Path], checkpoints: tuple[Path, Path], cache: Path, quick: bool) -> None:
    """``probe segment`` on the same VOC-layout scenes: DINOv3's recipe on a schedule and crops a
    CPU runs in seconds (the record and the table name every setting that differs from the published)."""
    short = {"iterations": 4 if quick else 20, "batch_size": 2, "crop": 32, "size": 32, "stride": 21, "chunk": 2}
    for checkpoint, store in zip(checkpoints, stores):
        run_protocol("linear-segmentation", checkpoint, train="demo-seg-train", val="demo-seg-val", store=store, cache_dir=cache, **short)


def _depth(stores: list[Path], checkpoints: tuple[Path, Path], work: Path, cache: Path, quick: bool) -> None:
    """``probe depth`` on rooms written in NYU Depth v2's layout (``rooms.py``; ``demo-nyu-train``,
    ``demo-nyu-test``): DINOv3's recipe on a schedule and crops a CPU runs in seconds."""
    import probe_toolkit as probe

    from .rooms import write_nyu

    root = work / "nyu"
    if not (root / "nyu_test.txt").is_file():
        write_nyu(
            root,
            {"train": [f"kitchen_{i // 2:04d}/{i:05d}" for i in range(4 if quick else 8)], "test": [f"bathroom_{i // 2:04d}/{i:05d}" for i in range(2 if quick else 4)]},
        )
    known = {p.name for p in panels.list_panels(cache)}
    for name, split, role in (("demo-nyu-train", "train", "train"), ("demo-nyu-test", "test", "val")):
        if name not in known:
            panels.add_panel(name, root, None, role, cache=cache, kind="nyu", split=split)
    for checkpoint, store in zip(checkpoints, stores, strict=True):
        probe.run(
            "linear-depth",
            checkpoint,
            train="demo-nyu-train",
            val="demo-nyu-test",
            store=store,
            cache_dir=cache,
            device="cpu",
            iterations=4 if quick else 20,
            batch_size=2,
            replicas=1,
            crop=(48, 64),
            chunk=2,
        )


def _label_free(stores: list[Path], cache: Path) -> None:
    """The label-free protocols: RankMe and the position probe of each network's patch tokens (the demo's
    SelfPatch checkpoints hold no class token), linear CKA between the two networks and between the trained
    network's blocks, and NeCo's overclustering of the VOC-layout val scenes in their 512 px view (the
    Hummingbird stores beside each network's hold it), at k = 21 (one cluster per VOC class: Hungarian
    matching) and 100 (many-to-one), which the scenes' 1,024 patches per image allow."""
    for store in stores:
        run_protocol("rank", store, tokens=("patch",))
        run_protocol("position", store)
    run_protocol("similarity", stores[0], other=stores[1])
    run_protocol("similarity", stores[1])
    for store in stores:
        run_protocol("overcluster", store, panel="demo-seg-val", view="hbird@512", k=(21, 100), cache_dir=cache)


def _report(stores: list[Path], out: Path, quiet: bool, formats: str | None = None) -> Path:
    """The comparison report of both networks, following patch 34 of the followed photograph."""
    from ..report import render_report

    names = ("tiny ViT, random weights", "tiny ViT, trained (SelfPatch)")
    return render_report(stores, out=out, follow=FOLLOW, patch=34, quiet=quiet, formats=formats, labels=[f"{name}={store}" for name, store in zip(names, stores)])
