"""Panels (labelled image sets) and the ledger of label reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..infra.errors import ProbeError
from .app import CacheOpt, console, ledger_app, panel_app, whole


@panel_app.command("add")
def panel_add(
    name: Annotated[str, typer.Argument(help="Panel name (letters, digits, - and _).")],
    role: Annotated[str, typer.Option("--role", help="train, val or test (test panels are sealed).")],
    annotations: Annotated[Path | None, typer.Option("--annotations", help="COCO annotation file (not opened now).")] = None,
    images: Annotated[Path | None, typer.Option("--images", help="The panel's image folder (VOC: default <DIR>/JPEGImages).")] = None,
    voc: Annotated[Path | None, typer.Option("--voc", help="Pascal VOC year folder (Annotations/, JPEGImages/, ImageSets/Main/).")] = None,
    voc_segmentation: Annotated[
        Path | None,
        typer.Option(
            "--voc-segmentation",
            help="Pascal VOC 2012 year folder for semantic segmentation (SegmentationClass/, ImageSets/Segmentation/; trainaug: "
            "SegmentationClassAug/), read by probe hummingbird.",
        ),
    ] = None,
    ade20k: Annotated[
        Path | None, typer.Option("--ade20k", help="ADE20K SceneParsing folder (ADEChallengeData2016: images/, annotations/); --split training or validation.")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            help="VOC: a file of ImageSets/Main (default trainval, as LOST and TokenCut); --voc-segmentation: one of "
            "ImageSets/Segmentation (train, val, trainaug; default val, or train for --role train); --ade20k: training or "
            "validation (default by role); SPair: trn, val or test (default test); --nyu: train or test "
            "(nyu_train.txt, nyu_test.txt; default by role); NAVI: test.",
        ),
    ] = None,
    no_hard: Annotated[bool, typer.Option("--no-hard", help="VOC: drop difficult/truncated boxes and images with only those (LOST --no_hard).")] = False,
    coco20k: Annotated[
        bool, typer.Option("--coco20k", help="Restrict COCO-2014 train --annotations to LOST's and TokenCut's 19,817 images, crowd boxes removed.")
    ] = False,
    spair: Annotated[Path | None, typer.Option("--spair", help="SPair-71k folder (PairAnnotation/, ImageAnnotation/, JPEGImages/): keypoint pairs of --split.")] = None,
    navi: Annotated[
        Path | None,
        typer.Option(
            "--navi",
            help="NAVI folder (navi_v1: <object>/<collection>/annotations.json, images/, depth/, with "
            "probe3d's downsampled_ files): the wild_set pairs probe3d scores (--split test).",
        ),
    ] = None,
    nyu: Annotated[
        Path | None,
        typer.Option("--nyu", help="NYU Depth v2 folder (nyu_train.txt, nyu_test.txt and the scene folders they list): depth maps of --split, read by probe depth."),
    ] = None,
    masks: Annotated[
        Path | None, typer.Option("--masks", help="Saliency: folder of binary ground-truth masks named like the --images (ECSSD, DUTS-TE, DUT-OMRON).")
    ] = None,
    classes_from_folders: Annotated[
        Path | None, typer.Option("--classes-from-folders", help="A folder with one sub-folder of images per class (ImageNet's layout): a classification panel.")
    ] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a panel of the same name.")] = False,
    cache: CacheOpt = None,
) -> None:
    """Register a panel in <cache>/panels.toml: a COCO file, a VOC folder, COCO20k, a saliency mask folder, a SPair-71k or an NYU Depth v2 split, or NAVI's wild set."""
    from ..labels.panels import add_panel

    if classes_from_folders is not None:
        if any(v is not None for v in (annotations, images, voc, masks, spair, nyu, navi)) or coco20k:
            raise ProbeError(
                "--classes-from-folders",
                "cannot be combined with --annotations, --images, --voc, --masks or --coco20k",
                "give either the class folder or another kind of panel",
            )
        p = add_panel(name, classes_from_folders, classes_from_folders, role, cache=cache, replace=replace, kind="classes")
        console.print(f"panel {p.name}: {p.role}{' (sealed)' if p.sealed else ''}, classes from {p.images}")
        return
    given = [
        flag
        for flag, value in (
            ("--voc", voc),
            ("--voc-segmentation", voc_segmentation),
            ("--ade20k", ade20k),
            ("--masks", masks),
            ("--coco20k", coco20k or None),
            ("--spair", spair),
            ("--nyu", nyu),
            ("--navi", navi),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ProbeError(
            None, f"{' and '.join(given)} name different kinds of panel", "pass one of --voc, --voc-segmentation, --ade20k, --masks, --coco20k, --spair, --nyu, --navi"
        )
    kind = (
        {
            "--voc": "voc",
            "--voc-segmentation": "voc-segmentation",
            "--ade20k": "ade20k",
            "--masks": "saliency",
            "--coco20k": "coco20k",
            "--spair": "spair",
            "--nyu": "nyu",
            "--navi": "navi",
        }.get(given[0], "coco")
        if given
        else "coco"
    )
    source = {"voc": voc, "voc-segmentation": voc_segmentation, "ade20k": ade20k, "saliency": masks, "spair": spair, "nyu": nyu, "navi": navi}.get(kind, annotations)
    if source is None or (kind == "coco" and images is None):
        raise ProbeError(None, "a panel needs --annotations A.json --images DIR, --voc DIR, or --masks DIR --images DIR", "see probe panel add --help")
    default_split = {
        "voc": "trainval",
        "spair": "test",
        "navi": "test",
        "voc-segmentation": "train" if role == "train" else "val",
        "ade20k": "training" if role == "train" else "validation",
        "nyu": "train" if role == "train" else "test",
    }
    split = (split or default_split[kind]) if kind in default_split else ""
    p = add_panel(name, source, images, role, cache=cache, replace=replace, kind=kind, split=split, no_hard=no_hard)
    console.print(f"panel {p.name}: {p.role}{' (sealed)' if p.sealed else ''}, {p.annotations}, images {p.images}")


@panel_app.command("list")
def panel_list(cache: CacheOpt = None) -> None:
    """List the registered panels."""
    from rich.table import Table

    from ..labels.panels import list_panels

    table = Table(title="panels")
    table.add_column("name", no_wrap=True)  # the name every command takes: never cut nor folded
    for column in ("role", "kind", "annotations", "images", "added"):
        table.add_column(column)
    for p in list_panels(cache):
        kind = p.kind + (f" {p.split}" if p.split else "") + (" no-hard" if p.no_hard else "")
        table.add_row(p.name, p.role + (" (sealed)" if p.sealed else ""), kind, str(p.annotations), str(p.images), p.added)
    console.print(whole(table))


@ledger_app.command("show")
def ledger_show(
    last: Annotated[int | None, typer.Option(help="Only the last N entries.")] = None,
    cache: CacheOpt = None,
) -> None:
    """Every read of labels: when, which panel, how many images, why, for which checkpoint."""
    from rich.table import Table

    from ..labels.ledger import entries
    from ..store.cache import cache_root

    rows = entries(cache_root(cache))
    table = Table(title=f"ledger ({len(rows)} entries)")
    for column in ("n", "id", "time", "panel", "role", "images", "purpose", "checkpoint", "unseal"):
        table.add_column(column, no_wrap=column in ("n", "time", "panel", "role", "images"))  # a panel's name whole, as commands take it
    for e in rows[-last:] if last else rows:
        f = e.fields
        table.add_row(
            str(e.n),
            e.id[:12],
            f.get("time", "")[:16].replace("T", " "),  # to the minute, UTC (the ledger file keeps the seconds and the zone)
            f.get("panel", ""),
            f.get("role", ""),
            str(f.get("images", "")),
            f.get("purpose", ""),
            (f.get("checkpoint") or "")[:12],
            f.get("unseal") or "",
        )
    console.print(whole(table))


@ledger_app.command("verify")
def ledger_verify(cache: CacheOpt = None) -> None:
    """Check the hash chain; names every edited, inserted or deleted line (exit 1 if any)."""
    from ..infra.errors import IntegrityError
    from ..labels.ledger import LEDGER, entries, verify
    from ..store.cache import cache_root

    root = cache_root(cache)
    if not (root / LEDGER).is_file() and not (root / "panels.toml").is_file():  # a mistyped --cache would read as "0 entries, chain intact"
        raise ProbeError(root, "holds no ledger and no panels: it is not a probe cache folder", "pass --cache the folder where `probe panel add` registered your panels")
    problems = verify(root)
    for p in problems:
        console.print(f"[bold red]{root / LEDGER}[/] {p}", highlight=False, soft_wrap=True)
    if problems:
        more = f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""
        raise IntegrityError(
            root / LEDGER, f"the hash chain is broken: {problems[0]}{more}", "restore the ledger from a copy; its results' ledger entries cannot be trusted"
        )
    console.print(f"{root / LEDGER}: {len(entries(root))} entries, chain intact", soft_wrap=True)
