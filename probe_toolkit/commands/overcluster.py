"""``probe overcluster STORE --panel PANEL``: k-means on the panel's patch tokens, clusters matched
to its classes, mIoU, saved as ``results/overcluster``.

Order, which the ledger shows: every refusal that needs no label first (the panel's kind and
role, the store's squashed view, hbird@448 by default, for every image of the panel); then the tokens are read, passed
through the network's final norm, standardised, projected and clustered at every k and seed
(``analyses.overcluster``), with no label in sight; only then are the panel's label maps read
(purpose ``overcluster: score``), squashed to the view as its images were, and scored. Result:

    miou            (k)               mean over seeds of the matched mIoU (NeCo's figure)
    miou_seed       (k, seed)
    iou             (k, seed, class)
    assignment      (k, seed, cluster)  the class each cluster became (-1 past k)
    attrs: matching per k, settings, panel, ledger, counts, view, grid, mask side, feature, provenance
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analyses import overcluster as oc
from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from ..labels import voc_segmentation
from ..protocols.context import Inputs, RunContext, Saving
from ..results.overcluster_report import OverclusterReport
from ..store import cache, hbird_views, parts, views
from .panel_stores import locate, panel_extract, panel_ids
from .runs import result_provenance

RESULT = "overcluster"
READ_BLOCK = 64  # images read at a time


def check_panel(panel) -> None:
    if panel.kind != voc_segmentation.KIND:
        raise ProbeError(
            panel.name,
            f"is a {panel.kind} panel; overcluster scores the label maps of a {voc_segmentation.KIND} panel",
            f"register the VOC2012 folder: probe panel add NAME --voc-segmentation DIR --split val --role {panel.role}",
        )


def features(ds, ids: list[str], norm, view: str) -> tuple[np.ndarray, int]:
    """(images · patches, D) float32: the view's patch tokens of ``ids``, through the final norm; and the grid side."""
    array = cache.require(ds, f"tokens_{view}").sel(image=list(ids))
    n, patches, width = (int(s) for s in array.shape)
    side = int(round(patches**0.5))
    out = np.empty((n * patches, width), np.float32)
    for a in range(0, n, READ_BLOCK):
        b = min(a + READ_BLOCK, n)
        values = np.asarray(array.isel(image=slice(a, b)).values, np.float32).reshape(-1, width)
        if not np.isfinite(values).all():
            raise ProbeError(ds.attrs.get("store"), f"holds a value of tokens_{view} that is not finite", "extract the store again")
        out[a * patches : b * patches] = norm(values) if norm is not None else values
    return out, side


def run(inputs: Inputs, settings, context: RunContext) -> OverclusterReport:
    """Cluster the panel's patch tokens at every k and seed, then read its label maps (once) and score; save ``results/overcluster``."""
    from ..infra.runner import task_threads

    the_panel = context.panel("panel")  # its seal checked before the run
    check_panel(the_panel)
    classes = len(voc_segmentation.CLASSES)
    if min(settings.k) < classes:
        raise SettingError("k", f"k {min(settings.k)} is below the panel's {classes} classes: a cluster per class at least", f"use k ≥ {classes} (NeCo: 100, 300, 500)")
    store = Path(inputs.store)
    view = views.canonical(settings.view)
    try:
        source = locate(store, [(the_panel, panel_ids(the_panel))], "patch", (view,), plain=True)  # xarray only to save the result
    except ProbeError as error:
        if f"has no array tokens_{view}" not in error.problem:
            raise
        extract = panel_extract(cache.manifest(cache.open_store(store)), store, the_panel.name, [view])  # the view, not another one: overcluster reads this one
        raise ProbeError(error.where, f"has no {view} view for panel {the_panel.name!r}", f"run `{extract}`") from None
    ds, ids = source.panel_stores[the_panel.name]
    norm = parts.final_norm(source.manifest, store)
    tokens, side = features(ds, list(ids), norm, view)
    if len(tokens) < max(settings.k):
        raise ProbeError(store, f"holds {len(tokens)} patch tokens of panel {the_panel.name!r}, fewer than k = {max(settings.k)}", "extract more images, or lower k")
    n_images = len(ids)
    advance = context.task("k-means", len(settings.k) * settings.seeds)
    import faiss  # noqa: F401  loaded before the limit, which binds only the libraries already loaded: faiss's OpenMP would spin on every core

    with task_threads(1):  # one BLAS / OpenMP thread: the same clusters on any machine
        projected = oc.project(oc.standardise(tokens), settings.pca_dim)
        clusters = {}
        for k in settings.k:
            for seed in range(settings.seeds):
                clusters[k, seed] = oc.nearest(oc.kmeans(projected, k, seed, settings.iterations, settings.restarts).reshape(n_images, side, side), oc.MASK_SIDE)
                advance(1)
    del tokens, projected
    checkpoint = str((source.manifest.get("checkpoint") or {}).get("sha256", "?"))
    read = context.read("panel", voc_segmentation.read_label_maps, purpose="overcluster: score", checkpoint=checkpoint, images=list(ids), command=context.command)
    by_name = dict(zip(read.ids, read.maps, strict=True))
    cut = side * int(source.manifest["arch"]["patch"])  # the pixels the network read
    truth = np.stack([oc.nearest(hbird_views.label_view(by_name[read.image_map[i]], view, read.image_map[i])[None, :cut, :cut], oc.MASK_SIDE)[0] for i in ids])
    report, data, attrs = scored(
        store,
        ds,
        the_panel,
        settings,
        clusters,
        truth,
        classes,
        read.entry_id,
        {"images": n_images, "tokens": n_images * side * side},
        side,
        cut,
        norm is not None,
        context.command,
        view,
    )
    if norm is None:
        context.note("note: the network has no final norm; its stored patch tokens are the features")
    return context.finish(report, Saving(store, RESULT, data, attrs))


def scored(store, ds, panel, settings, clusters, truth, classes: int, ledger: str, counts: dict, side: int, cut: int, normed: bool, command: str, view: str):
    """(the report, the record's dataset, its attributes): every clustering matched and scored."""
    import xarray as xr

    ks, seeds, widest = list(settings.k), settings.seeds, max(settings.k)
    miou_seed = np.zeros((len(ks), seeds))
    iou = np.zeros((len(ks), seeds, classes))
    assignment = np.full((len(ks), seeds, widest), -1, np.int64)
    matching = []
    for a, k in enumerate(ks):
        for s in range(seeds):
            matched = oc.match(oc.confusion(truth, clusters[k, s], classes, k))
            miou_seed[a, s], iou[a, s], assignment[a, s, :k] = matched.miou, matched.iou, matched.assignment
        matching.append(matched.matching)
    counts = {**counts, "pixels": int((truth != oc.IGNORE).sum())}
    result = xr.Dataset(
        {
            "miou": ("k", miou_seed.mean(axis=1)),
            "miou_seed": (("k", "seed"), miou_seed),
            "iou": (("k", "seed", "class"), iou),
            "assignment": (("k", "seed", "cluster"), assignment),
        },
        coords={"k": ks, "seed": np.arange(seeds), "class": list(voc_segmentation.CLASSES), "cluster": np.arange(widest)},
    )
    attrs = {
        "settings": settings.as_dict(),
        "matching": dict(zip(map(str, ks), matching)),
        "ledger": ledger,
        "counts": counts,
        "panel": {"name": panel.name, "role": panel.role, "split": panel.split, "kind": panel.kind},
        "view": view,
        "grid": int(side),
        "pixels_side": int(cut),
        "mask_side": oc.MASK_SIDE,
        "feature": "last-block patch tokens through the final norm" if normed else "last-block patch tokens (the network has no final norm)",
        "source": "vpariza/NeCo experiments/overcluster/eval_overcluster.py, experiments/utils.py",
        "provenance": result_provenance(ds, command),
    }
    report = OverclusterReport(Path(store), panel.name, ks, [float(v) for v in result.miou.values], miou_seed, matching, counts, ledger)
    return report, result, attrs
