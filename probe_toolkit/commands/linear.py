"""The pipeline behind ``probe linear``: stores and panels in, fitted probes and scores out.

Order, which the ledger shows: every store is checked for both panels' images (from the panels'
image folders, no label read); the train panel's labels are read (ledger purpose
``linear-<level>: fit``); every store's probe is fitted; only then are the val panel's labels
read (``linear-<level>: score``) and the probes scored. Val labels never reach a fit or a
choice of regularisation.

Which store holds each panel's images is ``commands.panel_stores``' question (``locate``).
Results are saved into the STORE given.

Results saved per store (``cache.save_results``), ``linear_patch``:

    miou, accuracy, miou_dense        ()                  val scores, fractions in [0, 1]
    iou, iou_dense                    (class)             per class; NaN where the union is empty
    confusion, confusion_dense        (class, predicted)  val counts (patches / original pixels)
    holdout_miou                      (weight_decay)      train hold-out mIoU that chose the decay
    prediction                        (image, patch)      val argmax class, int16
    weight (class, channel), bias (class), channel_mean, channel_scale (channel): the probe
    coords: class (names, background first), category_id (class; 0 = background),
            predicted (= class), weight_decay, image (val panel ids: paths relative to its
            folder, the COCO file_name)

``linear_image``:

    map                               ()                  val mean average precision
    ap                                (category)          per category; NaN without a val positive
    holdout_map                       (c)                 train hold-out mAP that chose C
    score                             (image, category)   val decision scores
    coords: category (names), category_id (category), c, image

attrs of both: ``level``, ``settings`` (fit settings, chosen weight decay or C, label rule),
``label_space``, ``ledger`` ({train, val}: entry ids), ``panels`` ({train, val}: name, role),
``counts``, ``feature``, ``dense_resolution``, ``manifest`` (the store's), ``provenance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analyses import linear
from ..infra import provenance
from ..infra.errors import ProbeError
from ..labels.panels import LabelRead, read_labels
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.linear import LinearSettings
from ..results.linear_report import LinearReport, StoreScores
from ..store import cache, images
from ..store.completion import computed_on
from .panel_stores import Level, Source, image_sizes, locate, panel_ids

if TYPE_CHECKING:
    import xarray as xr

DENSE_RESOLUTION = "original pixels of the 224 view's crop region (centres inside the view); logits sampled bilinearly there"


def features(ds: xr.Dataset, ids: Sequence[str], level: Level, class_token: bool) -> np.ndarray:
    """float32 tokens (image, patch, channel) at patch level; (image, channel) at image level."""
    if level == "image" and class_token:
        return cache.require(ds, "cls_tokens_224").sel(image=list(ids)).values.astype(np.float32)
    tokens = cache.require(ds, "tokens_224").sel(image=list(ids)).values.astype(np.float32)
    return tokens.mean(1) if level == "image" else tokens


def _labelled(read: LabelRead, source: Source, panel: str, ids: Sequence[str]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Positions (in ``ids``) of the images the annotation file covers, their COCO ids and sizes.

    Sizes come from the store and must agree with the annotation file's.
    """
    ds, store_ids = source.panel_stores[panel]
    sizes = image_sizes(ds, store_ids)
    keep = [(k, read.image_map[sid], sizes[k]) for k, sid in enumerate(ids) if sid in read.image_map]
    if not keep:
        raise ProbeError(read.panel.annotations, f"annotates none of the images of panel {read.panel.name!r}", "check the file names in its images list")
    for k, cid, (w, h) in keep:
        record = read.coco.imgs[cid]
        if (int(record.get("width", -1)), int(record.get("height", -1))) != (w, h):
            raise ProbeError(
                read.panel.annotations,
                f"says {ids[k]} is {record.get('width')}×{record.get('height')}, the image is {w}×{h}",
                "fix the annotation file's width and height",
            )
    return [k[0] for k in keep], [k[1] for k in keep], [k[2] for k in keep]


def panel_features(source: Source, panel: str, positions: Sequence[int], level: Level) -> np.ndarray:
    ds, store_ids = source.panel_stores[panel]
    return features(ds, [store_ids[k] for k in positions], level, bool(source.manifest["arch"].get("class_token")))


# ----------------------------------------------------------------------------------------------
# labels → arrays


def patch_targets(read: LabelRead, coco_ids: Sequence[int], sizes: Sequence[tuple[int, int]], space: linear.LabelSpace, patch: int = linear.PATCH) -> np.ndarray:
    """(image, patch) classes of the 224 view on the grid of ``patch`` px patches (see ``linear``'s docstring for the rule)."""
    n = len(space.patch_classes)
    out = [
        linear.patch_labels(linear.view_labels(linear.class_map(read.coco, cid, space), images.geometry(w, h, linear.VIEW)), n, patch)
        for cid, (w, h) in zip(coco_ids, sizes)
    ]
    return np.stack(out) if out else np.zeros((0, (linear.VIEW // patch) ** 2), np.int16)


def store_patch(source: Source) -> int:
    """The patch size of a store's network (its 224 view's grid is 224 // patch)."""
    return int(source.manifest["arch"].get("patch", linear.PATCH))


def _space_of(read: LabelRead) -> linear.LabelSpace:
    return linear.LabelSpace.from_categories(read.coco.dataset.get("categories", []))


# ----------------------------------------------------------------------------------------------
# the run


def run(inputs: Inputs, settings: LinearSettings, context: RunContext) -> LinearReport:
    """Fit on the train panel, then score on the val panel, for every store; one record per store."""
    level = settings.level
    stores = inputs.stores
    train_panel, val_panel = context.panel("train"), context.panel("val")  # roles and seals checked before the run
    train_ids, val_ids = panel_ids(train_panel), panel_ids(val_panel)
    sources = [locate(s, [(train_panel, train_ids), (val_panel, val_ids)], level, plain=True) for s in stores]  # xarray only to save the results
    checkpoints = ",".join(dict.fromkeys(s.manifest["checkpoint"]["sha256"] for s in sources))

    # 1. train labels, then every fit
    train_read = context.read("train", read_labels, purpose=f"linear-{level}: fit", checkpoint=checkpoints, images=train_ids)
    space = _space_of(train_read)
    if not space.ids:
        raise ProbeError(train_panel.annotations, "lists no categories", "a probe needs the panel's categories")
    t_pos, t_coco, t_sizes = _labelled(train_read, sources[0], train_panel.name, train_ids)
    if len(t_pos) < 2:
        raise ProbeError(train_panel.name, f"annotates {len(t_pos)} image; choosing the regularisation needs at least 2", "use a larger train panel")
    if level == "patch":  # one label grid per patch size among the stores (ViT-S/16: 14 x 14, ViT-S/8: 28 x 28)
        t_targets = {p: patch_targets(train_read, t_coco, t_sizes, space, p) for p in dict.fromkeys(map(store_patch, sources))}
    else:
        t_targets = linear.image_categories(train_read.coco, t_coco, space)
    fits: list[Any] = []
    for source in sources:
        context.step(f"fit {source.name}")
        x = panel_features(source, train_panel.name, t_pos, level)
        if level == "patch":
            fits.append(linear.fit_patch_level(x, t_targets[store_patch(source)], len(space.patch_classes), settings))
        else:
            fits.append(linear.fit_image_level(x, t_targets, holdout=settings.holdout, seed=settings.seed))

    # 2. only now the val labels
    val_read = context.read("val", read_labels, purpose=f"linear-{level}: score", checkpoint=checkpoints, images=val_ids)
    extra = space.missing(_space_of(val_read))
    if extra:
        raise ProbeError(val_panel.annotations, f"has categories the train panel lacks ({', '.join(extra[:5])})", "use panels with one label space")
    v_pos, v_coco, v_sizes = _labelled(val_read, sources[0], val_panel.name, val_ids)
    v_ids = [val_ids[k] for k in v_pos]
    if level == "patch":
        v_by_patch = {p: patch_targets(val_read, v_coco, v_sizes, space, p) for p in dict.fromkeys(map(store_patch, sources))}
    else:
        v_targets = linear.image_categories(val_read.coco, v_coco, space)
    ledger_ids = {"train": train_read.entry_id, "val": val_read.entry_id}
    common = {
        "level": level,
        "label_space": space.as_dict(),
        "ledger": ledger_ids,
        "panels": {"train": {"name": train_panel.name, "role": train_panel.role}, "val": {"name": val_panel.name, "role": val_panel.role}},
        "provenance": provenance.stamp(),
    }
    outcomes, saving = [], []
    for source, fit in zip(sources, fits):
        context.step(f"score {source.name}")
        x = panel_features(source, val_panel.name, v_pos, level)
        attrs = {**common, "manifest": source.manifest, "computed_on": computed_on(source.store, v_ids, scope="panel")}
        if level == "patch":
            v_targets = v_by_patch[store_patch(source)]
            ds, scores = patch_results(fit, x, v_targets, val_read, v_coco, v_sizes, v_ids, space, settings)
            attrs.update(
                feature="tokens_224",
                dense_resolution=DENSE_RESOLUTION,
                settings={**linear.fit_record(settings), "weight_decay": fit.probe.weight_decay, "label_rule": LABEL_RULE},
                patch=store_patch(source),
                counts={
                    "train_images": len(t_pos),
                    "train_patches": fit.n_fit_patches,
                    "train_patches_ignored": fit.n_ignored_patches,
                    "val_images": len(v_pos),
                    "val_patches": int((v_targets != linear.IGNORE).sum()),
                    "val_patches_ignored": int((v_targets == linear.IGNORE).sum()),
                },
            )
            chosen = fit.probe.weight_decay
        else:
            ds, scores = image_results(fit, x, v_targets, v_ids, space)
            class_token = bool(source.manifest["arch"].get("class_token"))
            attrs.update(
                feature="cls_tokens_224" if class_token else "tokens_224, mean over patches",
                settings={
                    "classifier": "StandardScaler + OneVsRest(LogisticRegression(lbfgs, max_iter=1000))",
                    "cs": list(linear.IMAGE_CS),
                    "c": fit.c,
                    "holdout": settings.holdout,
                    "seed": settings.seed,
                },
                counts={"train_images": len(t_pos), "val_images": len(v_pos), "val_positives": v_targets.sum(0).astype(int).tolist()},
            )
            chosen = fit.c
        saving.append(Saving(source.store, f"linear_{level}", ds, attrs))
        outcomes.append(StoreScores(source.store, source.name, scores, chosen))
    return context.finish(LinearReport(level, outcomes, ledger_ids, space, linear.fit_record(settings)), *saving)


LABEL_RULE = (
    f"class map at original size (crowd = ignore, then instances by decreasing area), nearest into the 224 view; "
    f"a patch takes the class covering most of its pixels (16x16 at /16, 8x8 at /8, 14x14 at /14) if it covers >= {linear.MAJORITY:.0%}, else ignore ({linear.IGNORE})"
)


def patch_results(
    fit: linear.PatchFit,
    tokens: np.ndarray,
    labels: np.ndarray,
    read: LabelRead,
    coco_ids: Sequence[int],
    sizes: Sequence[tuple[int, int]],
    ids: Sequence[str],
    space: linear.LabelSpace,
    settings: linear.FitSettings,
) -> tuple[xr.Dataset, dict[str, float]]:
    """Score a fitted dense probe on the val panel: patch and dense confusions, the saved Dataset."""
    n = len(space.patch_classes)
    logits = fit.probe.logits(tokens)  # (image, patch, class)
    predicted = logits.argmax(-1).astype(np.int16)
    conf = linear.confusion(labels, predicted, n)
    dense = np.zeros((n, n), dtype=np.int64)
    g = int(round(np.sqrt(tokens.shape[1])))
    for i, (cid, (w, h)) in enumerate(zip(coco_ids, sizes)):
        geometry = images.geometry(w, h, linear.VIEW)
        x0, y0, x1, y1 = geometry.source_region()
        region = linear.class_map(read.coco, cid, space)[y0:y1, x0:x1]
        dense += linear.dense_confusion(logits[i].T.reshape(n, g, g), region, geometry, n)
    scores = {"miou": linear.mean_iou(conf), "accuracy": linear.accuracy(conf), "miou_dense": linear.mean_iou(dense)}
    import xarray as xr

    names = list(space.patch_classes)
    ds = xr.Dataset(
        {
            "miou": ((), scores["miou"]),
            "accuracy": ((), scores["accuracy"]),
            "miou_dense": ((), scores["miou_dense"]),
            "iou": ("class", linear.iou(conf)),
            "iou_dense": ("class", linear.iou(dense)),
            "confusion": (("class", "predicted"), conf),
            "confusion_dense": (("class", "predicted"), dense),
            "holdout_miou": ("weight_decay", fit.holdout_miou),
            "prediction": (("image", "patch"), predicted),
            "weight": (("class", "channel"), fit.probe.weight),
            "bias": ("class", fit.probe.bias),
            "channel_mean": ("channel", fit.probe.mean),
            "channel_scale": ("channel", fit.probe.scale),
        },
        coords={
            "class": np.asarray(names, dtype=object),
            "predicted": np.asarray(names, dtype=object),
            "category_id": ("class", np.asarray([0, *space.ids], dtype=np.int64)),
            "weight_decay": np.asarray(settings.weight_decays, dtype=np.float64),
            "image": np.asarray(list(ids), dtype=object),
        },
    )
    return ds, scores


def image_results(
    fit: linear.ImageFit, features_val: np.ndarray, targets: np.ndarray, ids: Sequence[str], space: linear.LabelSpace
) -> tuple[xr.Dataset, dict[str, float]]:
    scores_val = linear.image_scores(fit.model, features_val)
    ap = linear.average_precision(targets, scores_val)
    m = float(np.nanmean(ap)) if np.isfinite(ap).any() else float("nan")
    import xarray as xr

    ds = xr.Dataset(
        {"map": ((), m), "ap": ("category", ap), "holdout_map": ("c", fit.holdout_map), "score": (("image", "category"), scores_val)},
        coords={
            "category": np.asarray(space.names, dtype=object),
            "category_id": ("category", np.asarray(space.ids, dtype=np.int64)),
            "c": np.asarray(linear.IMAGE_CS, dtype=np.float64),
            "image": np.asarray(list(ids), dtype=object),
        },
    )
    return ds, {"map": m}
