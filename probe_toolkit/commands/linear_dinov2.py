"""``probe linear-dinov2 STORE --train PANEL --val PANEL [--test PANEL]``: DINOv2's linear
classification protocol (``analyses/linear_dinov2.py``) on a store's ``eval224`` features.

Order, which the ledger shows: the store is checked for every panel's images, view and blocks (no
label read); the train panel's classes are read (purpose ``linear-dinov2: fit``) and every
classifier trained; then the val panel's (``linear-dinov2: choose``), which scores every classifier
and chooses the best, as the reference does; then, given ``--test``, the test panel's
(``linear-dinov2: score``), where the chosen classifier alone is reported. Without ``--test`` the
reported number is the val accuracy of the classifier chosen on val (the reference's default: its
test sets default to the val set).

Features per image, as DINOv2's ``get_intermediate_layers(n=4, return_class_token=True, norm=True)``
gives them: the class tokens of the last blocks and the last block's patch tokens, each through the
network's final norm (recorded in the store), the patch tokens then averaged. The store holds the
last block; ``n_last_blocks`` 4 reads the last four (``store.cache.require(..., block=)``, a store
extracted with them). Result ``results/linear-dinov2``:

    top1_val, top5_val   (classifier)            every classifier's val accuracy (fractions)
    evaluated            (classifier)            whether the reference evaluates it (its names)
    top1_test            (classifier)            on the test panel (NaN without one, or not chosen)
    loss                 (iteration)             the summed cross-entropy of every iteration
    weight, bias         (class, input), (class) the chosen classifier
    coords: classifier (names), blocks, avgpool, rate, scaled_rate (classifier), class (names)
    attrs: chosen, accuracy, reported_on, settings, feature, view, ledger, panels, counts, provenance
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses import linear_dinov2 as ld
from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from ..labels.panels import ClassLabels, read_classes
from ..protocols.context import Inputs, RunContext, Saving
from ..results.linear_dinov2_report import LinearDinov2Report
from ..store import cache, images, parts
from . import token_rows
from .panel_stores import locate, panel_ids
from .runs import result_provenance

RESULT = "linear-dinov2"
VIEW = images.EVAL  # DINOv2's make_classification_eval_transform: resize 256 (bicubic), centre crop 224
READ_CHUNK = 256  # images normed and averaged at a time
FEATURE = (
    "class tokens of the last {blocks} through the final norm (DINOv2's get_intermediate_layers(norm=True)), the last block's patch tokens through it averaged per image"
)


def blocks_read(ds, blocks: int) -> list[int]:
    """The blocks whose class tokens ``blocks`` last blocks are, oldest first; refused when the store lacks one."""
    last = token_rows.last_block(ds)
    wanted = list(range(last - blocks + 1, last + 1))
    held = token_rows.held_blocks(ds, "class", VIEW)
    if wanted[0] < 0 or any(b not in held for b in wanted):
        raise SettingError(
            "n_last_blocks",
            f"holds block{'s' if len(held) > 1 else ''} {', '.join(map(str, held))} of cls_tokens_{VIEW}; "
            f"n_last_blocks={blocks} reads blocks {', '.join(map(str, wanted))}",
            "run with n_last_blocks=1, or extract the store again holding the last blocks",
            ds.attrs.get("store"),
        )
    return wanted


def features(ds, ids: Sequence[str], blocks: Sequence[int], norm: parts.FinalNorm | None) -> tuple[np.ndarray, np.ndarray]:
    """(images, blocks, D) class tokens and (images, D) mean patch token, each token through the final norm."""

    def normed(values: np.ndarray) -> np.ndarray:
        return norm(values) if norm is not None else np.asarray(values, np.float32)

    cls = np.stack([normed(token_rows.read(ds, "class", VIEW, b).sel(image=list(ids)).values) for b in blocks], axis=1)
    patches = token_rows.read(ds, "patch", VIEW, blocks[-1]).sel(image=list(ids))
    means = np.empty((len(ids), cls.shape[-1]), np.float32)
    for a in range(0, len(ids), READ_CHUNK):
        means[a : a + READ_CHUNK] = ld.patch_mean(normed(patches.isel(image=slice(a, a + READ_CHUNK)).values)).numpy()
    token_rows.check_finite(ds.attrs.get("store"), f"cls_tokens_{VIEW}", cls)
    token_rows.check_finite(ds.attrs.get("store"), f"tokens_{VIEW}", means)
    return cls, means


def _targets(labels: ClassLabels, classes: list[str], where: Any) -> np.ndarray:
    unknown = sorted({labels.classes[i] for i in set(labels.labels.tolist())} - set(classes))
    if unknown:
        raise ProbeError(where, f"has classes the train panel lacks ({', '.join(unknown[:5])})", "give every panel the train panel's class folders")
    position = {c: n for n, c in enumerate(classes)}  # once per class, not a search of the classes per image
    return np.asarray([position.get(c, -1) for c in labels.classes], np.int64)[labels.labels]  # -1: a class no image has


def _store_ids(labels: ClassLabels, panel_order: list[str], store_order: list[str]) -> list[str]:
    mapping = dict(zip(panel_order, store_order))
    return [mapping[i] for i in labels.image_ids]


def run(inputs: Inputs, settings, context: RunContext) -> LinearDinov2Report:
    """Train DINOv2's grid of linear classifiers on the train panel, choose on val, score; save ``results/linear-dinov2``."""
    from ..labels import hygiene
    from ..store.cache import cache_root

    train_panel, val_panel = context.panel("train"), context.panel("val")
    test_panel = context.panel("test") if inputs.get("test") is not None else None
    panels = [(p, panel_ids(p)) for p in (train_panel, val_panel, test_panel) if p is not None]
    if all(p.kind == "classes" for p, _ in panels):  # class folders: every image is the panel's, known without a label
        for (a, a_ids), (b, b_ids) in itertools.combinations(panels, 2):
            hygiene.check_apart((a.name, a.role, a.images, a_ids), (b.name, b.role, b.images, b_ids), cache_root(context.cache_dir))
    store = Path(inputs.store)
    if not (cache.manifest(cache.open_store(store, plain=True)).get("arch") or {}).get("class_token"):  # before any view is asked for
        import shlex

        knn = shlex.join(["probe", "knn", str(store), "--train", train_panel.name, "--val", val_panel.name])
        raise ProbeError(
            store,
            "comes from a network without a class token; DINOv2's linear protocol reads class tokens",
            f"classify on its mean patch token with DINO's k-NN: `{knn}`",
        )
    source = locate(store, panels, "image", (VIEW,), plain=True)  # xarray only to save the result
    meta = source.manifest
    stores = {p.name: source.panel_stores[p.name] for p, _ in panels}
    wanted = {name: blocks_read(ds, max(settings.n_last_blocks)) for name, (ds, _) in stores.items()}
    norm = parts.final_norm(meta, store)
    classifiers = ld.grid(settings.n_last_blocks, settings.avgpool, settings.learning_rates, settings.batch_size)
    checkpoint = str((meta.get("checkpoint") or {}).get("sha256", "?"))

    def panel_features(panel, labels) -> tuple[np.ndarray, np.ndarray]:
        ds, found = stores[panel.name]
        ids = _store_ids(labels, next(i for p, i in panels if p is panel), found)
        return features(ds, ids, wanted[panel.name], norm)

    # 1. train labels, then the training
    train_labels = context.read("train", read_classes, purpose="linear-dinov2: fit", checkpoint=checkpoint)
    classes = list(train_labels.classes)
    x_cls, x_mean = panel_features(train_panel, train_labels)
    device = str(context.device(auto="cpu"))  # resolved with torch, which the training imports anyway
    training = ld.train(
        x_cls,
        x_mean,
        train_labels.labels,
        classifiers,
        len(classes),
        epochs=settings.epochs,
        epoch_length=settings.epoch_length,
        batch_size=settings.batch_size,
        seed=settings.seed,
        init_seed=settings.init_seed,
        device=device,
        on_step=context.task("linear-dinov2", settings.epochs * settings.epoch_length),
    )
    # 2. val labels: every classifier scored, the best chosen
    val_labels = context.read("val", read_classes, purpose="linear-dinov2: choose", checkpoint=checkpoint)
    v_cls, v_mean = panel_features(val_panel, val_labels)
    scores = ld.accuracies(training, v_cls, v_mean, _targets(val_labels, classes, val_panel.images), device)
    chosen = ld.best_on_val(classifiers, scores[:, 0])
    accuracy, reported_on, top1_test = (float(scores[chosen, 0]) if chosen is not None else 0.0), "val", np.full(len(classifiers), np.nan)
    ledger = {"train": train_labels.entry_id, "val": val_labels.entry_id}
    counts = {"train": len(train_labels.image_ids), "val": len(val_labels.image_ids), "classes": len(classes)}
    # 3. test labels, where given: the chosen classifier's accuracy there
    if test_panel is not None:
        test_labels = context.read("test", read_classes, purpose="linear-dinov2: score", checkpoint=checkpoint)
        t_cls, t_mean = panel_features(test_panel, test_labels)
        on_test = ld.accuracies(training, t_cls, t_mean, _targets(test_labels, classes, test_panel.images), device)
        top1_test = np.where([i == chosen for i in range(len(classifiers))], on_test[:, 0], np.nan)
        accuracy, reported_on = (float(on_test[chosen, 0]) if chosen is not None else 0.0), "test"
        ledger["test"] = test_labels.entry_id
        counts["test"] = len(test_labels.image_ids)
    evaluated = ld.evaluated(classifiers)
    best = training.weights[chosen] if chosen is not None else None
    width = x_cls.shape[-1]
    import xarray as xr

    ds = xr.Dataset(
        {
            "top1_val": ("classifier", scores[:, 0]),
            "top5_val": ("classifier", scores[:, 1]),
            "top1_test": ("classifier", top1_test),
            "evaluated": ("classifier", np.isin(np.arange(len(classifiers)), evaluated)),
            "loss": ("iteration", np.asarray(training.losses, np.float64)),
            "weight": (("class", "input"), best.weight.detach().cpu().numpy() if best is not None else np.zeros((len(classes), 0), np.float32)),
            "bias": ("class", best.bias.detach().cpu().numpy() if best is not None else np.zeros(len(classes), np.float32)),
        },
        coords={
            "classifier": [c.name for c in classifiers],
            "blocks": ("classifier", [c.blocks for c in classifiers]),
            "avgpool": ("classifier", [c.avgpool for c in classifiers]),
            "rate": ("classifier", [c.rate for c in classifiers]),
            "scaled_rate": ("classifier", [c.scaled for c in classifiers]),
            "class": classes,
        },
    )
    panels_attr = {role: {"name": p.name, "role": p.role} for role, p in (("train", train_panel), ("val", val_panel), ("test", test_panel)) if p is not None}
    attrs = {
        "chosen": classifiers[chosen].name if chosen is not None else "",
        "accuracy": accuracy,
        "reported_on": reported_on,
        "feature": FEATURE.format(blocks=f"{max(settings.n_last_blocks)} blocks"),
        "width": int(width),
        "view": VIEW,
        "blocks": wanted[train_panel.name],
        "ledger": ledger,
        "panels": panels_attr,
        "counts": counts,
        "provenance": result_provenance(stores[train_panel.name][0], context.command),
    }
    report = LinearDinov2Report(store, source.name, classifiers, scores[:, 0], scores[:, 1], evaluated, chosen, accuracy, reported_on, counts, ledger)
    return context.finish(report, Saving(store, RESULT, ds, attrs))
