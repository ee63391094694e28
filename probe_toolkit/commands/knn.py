"""``probe knn STORE --train PANEL --val PANEL``: DINO's weighted k-NN on frozen image features.

Order, which the ledger shows: the store is checked for both panels' images (no label read);
the train panel's classes are read (purpose ``knn: neighbours' classes``), then the val panel's
(``knn: score``); the classifier runs once for every k. Labels are image classes: a class-folder
panel's sub-folders, or a COCO panel's largest annotated category (``panels.read_classes``).

The feature, stated in every output:

- ``cls-normed`` (the default where the network has a class token and a final norm): the class
  token after the final LayerNorm, DINO's ``eval_knn.py`` feature and DINOv3's (``dinov3/eval/knn.py``
  wraps the eval model, whose output is ``x_norm_clstoken``, in ``ModelWithNormalize``: the class
  token through the final norm, eps 1e-5, the storage tokens unused, L2-normalised); the norm's
  weights and eps are those extraction recorded from the checkpoint (``store.parts``; a store
  extracted before that rereads them from the checkpoint, sha256 checked);
- ``cls``: the stored class token (before any final norm);
- ``mean``: the mean of the last block's patch tokens (the default without a class token).

The view is the store's ``eval224`` view where both panels' stores hold it: short side 256,
centre crop 224, DINO's ``eval_knn.py`` transform (``probe extract --views eval224``). A store
with only the 224 view (short side 224, centre crop 224: the crop covers the whole short side,
not its central 87.5 %) is still read, and every output says so. Results ``results/knn``:

    top1, top5        (k)            fractions; top5 NaN with 5 classes or fewer
    prediction        (k, image)     predicted class index of every val image
    neighbour         (image, rank)  the 5 most similar train images (index into train_image)
    similarity        (image, rank)  their cosines
    label             (image)        the val images' classes
    coords: k, image (val store ids), train_image (train store ids), class (names)
    attrs: feature, view (its name), view_text, temperature, ledger {train, val}, panels, counts, provenance,
           stores {train, val}: the store each panel's features were read from (the report draws their images)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analyses import knn
from ..infra.errors import ProbeError
from ..infra.runner import map_images
from ..infra.settings import SettingError
from ..infra.shared import shared_blocks
from ..labels.panels import ClassLabels, read_classes
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.knn import NB_KNN, KnnSettings
from ..results import records
from ..results.knn_report import KnnReport, view_text
from ..store import cache, images, parts
from ..store.completion import computed_on
from .panel_stores import locate, panels_ids
from .runs import result_provenance

if TYPE_CHECKING:
    from ..store.direct import StoreArray, StoreData

VIEWS = (images.EVAL, "224")  # DINO's evaluation view first; the 224 view where a store lacks it


def stored_name(feature: str, view: str) -> str:
    return f"{'cls_tokens' if feature.startswith('cls') else 'tokens'}_{view}"


def choose_view(datasets: Sequence[StoreData], feature: str) -> str:
    """DINO's evaluation view where every dataset holds the feature's array in it, else the 224 view."""
    return next((v for v in VIEWS if all(stored_name(feature, v) in ds for ds in datasets)), "224")


def choose_feature(feature: str, arch: dict[str, Any], where: Path) -> str:
    """The feature ``auto`` stands for on this network, or a refusal naming the store where the network lacks the one asked."""
    token = bool(arch.get("class_token"))
    if feature == "auto":
        return ("cls-normed" if arch.get("final_norm") else "cls") if token else "mean"
    if feature.startswith("cls") and not token:
        raise SettingError("feature", requirement=f"mean on this store: its network ({where}) has no class token", value=feature, example="mean")
    if feature == "cls-normed" and not arch.get("final_norm"):
        raise SettingError("feature", requirement=f"cls or mean on this store: its network ({where}) has no final norm", value=feature, example="cls")
    return feature


SOURCES = {"dinov3": "facebookresearch/dinov3 dinov3/eval/knn.py (KnnModule; ModelWithNormalize of x_norm_clstoken)"}
SOURCE = "facebookresearch/dino eval_knn.py (knn_classifier)"


def describe(feature: str, checkpoint: str, family: str = "vit") -> str:
    if feature == "cls-normed" and family == "dinov3":  # DINOv3's eval/knn.py feature: x_norm_clstoken, L2-normalised
        return f"class token after the final LayerNorm (eps 1e-5, weights from {checkpoint}; DINOv3's x_norm_clstoken, storage tokens unused), L2-normalised"
    return {
        "cls-normed": f"class token after the final LayerNorm (weights from {checkpoint}), L2-normalised",
        "cls": "class token as stored (before any final norm), L2-normalised",
        "mean": "mean of the last block's patch tokens (no class token used), L2-normalised",
    }[feature]


def feature_array(ds: StoreData, ids: Sequence[str], feature: str, view: str) -> StoreArray:
    """The stored array the feature is made from, lazily, at the given images (in their order)."""
    return cache.require(ds, stored_name(feature, view)).sel(image=list(ids))


def reader(ds: StoreData, ids: Sequence[str], feature: str, norm: parts.FinalNorm | None, view: str) -> Callable[[int, int], np.ndarray]:
    """Rows a..b of the chosen feature, read from the store only when asked."""
    array = feature_array(ds, ids, feature, view)
    return lambda a, b: knn.features(array.isel(image=slice(a, b)).values, feature, norm)


def train_bank(ds: StoreData, ids: Sequence[str], feature: str, norm: parts.FinalNorm | None, view: str):
    """The train images' features, L2-normalised, one block at a time, as the workers read them
    (a ``Shared`` file written block by block: memory holds one block, whatever the train set)."""
    rows = reader(ds, ids, feature, norm, view)
    n = len(ids)
    return (knn.normalise(rows(a, min(a + knn.TRAIN_BLOCK, n))) for a in range(0, n, knn.TRAIN_BLOCK))


def feature_width(ds: StoreData, feature: str, view: str) -> int:
    """D of the chosen feature (the stored array's last axis)."""
    return int(cache.require(ds, stored_name(feature, view)).shape[-1])


def shard_nearest(
    store: Path,
    shard: tuple[int, int],
    fn,
    values: dict[str, StoreArray],
    val_ids: Sequence[str],
    train_ids: Sequence[str],
    feature: str,
    view: str,
    k: int,
    where,
    progress,
    test_block: int = knn.TEST_BLOCK,
    torch_free: bool = True,
) -> tuple[dict[str, np.ndarray] | None, list[int]]:
    """This shard's val rows (whole test blocks) saved as a part; (every row's neighbours, []) once all parts are in."""
    from . import shards

    which, (a, b) = shards.share(shard, len(val_ids), knn.TEST_BLOCK)
    if b > a:
        near = map_images(fn, values, where=where, block=test_block, fixed=True, progress=progress, image_range=(a, b), torch_free=torch_free)
    else:
        near = {"similarity": np.zeros((0, k), np.float32), "neighbour": np.zeros((0, k), np.int64)}
    import xarray as xr

    part = xr.Dataset({name: (("image", "rank"), array) for name, array in near.items()}, coords={"image": [str(i) for i in val_ids[a:b]]})
    identity = {"feature": feature, "view": view, "k": int(k), "train_sha256": shards.images_sha256(train_ids), "images_sha256": shards.images_sha256(val_ids)}
    whole, missing = shards.gather(store, "knn", which, part, identity)
    if whole is None:
        return None, missing
    return {name: whole[name].values for name in near}, []


def _store_ids(labels: ClassLabels, panel_order: list[str], store_order: list[str], where: Path) -> list[str]:
    mapping = dict(zip(panel_order, store_order))
    missing = [i for i in labels.image_ids if i not in mapping]
    if missing:
        raise ProbeError(where, f"lacks {len(missing)} labelled images of panel {labels.panel.name!r} (e.g. {missing[0]!r})", "extract from the panel's folder")
    return [mapping[i] for i in labels.image_ids]


def fitting_ks(ks: Sequence[int], n_train: int, panel: str, given: bool) -> tuple[tuple[int, ...], str | None]:
    """The ks a train panel of ``n_train`` images can answer (``n_train``: its image folder's
    count, known without reading a label), and the note to print when they were narrowed. A k
    above it given by the caller is refused; DINO's default list is narrowed to the ks that fit
    (to ``n_train`` alone when none does)."""
    ks = tuple(sorted(set(int(k) for k in ks)))
    fit = tuple(k for k in ks if k <= n_train)
    if fit == ks:
        return ks, None
    if given:
        raise SettingError(
            "ks", requirement=f"integers ≤ {n_train}", value=ks, example=fit or (n_train,), why=f"{ks[-1]} exceeds the {n_train} train images of panel {panel!r}"
        )
    fit = fit or (n_train,)
    return fit, (f"note: {{ks}} {','.join(map(str, ks))} (DINO's default) narrowed to {{ks}} {','.join(map(str, fit))}: panel {panel!r} has {n_train} train images")


def run(inputs: Inputs, settings: KnnSettings, context: RunContext) -> KnnReport:
    """Classify the val panel's images by their nearest train images; save ``results/knn``.

    ``settings.ks``: None is DINO's nb_knn, narrowed to the ks the train panel can answer; ks
    given are refused when one exceeds the train images (both before any label is read).

    Blocks of val rows run where the context places them (local workers or the dask cluster),
    each against the train bank (``infra.shared.Shared``: a file written block by block and read
    block by block by every worker, so no process holds it whole: train × D float32 is 2 GB for
    ImageNet at D = 384); backend torch searches with torch on the placement's device (cpu, or
    cuda: one process by default, the bank moved to the GPU once), with the numpy search's
    neighbours and cosines (``analyses.search_torch``); a shard computes its share of the val rows
    (``commands.shards``), the last shard scores."""
    from ..analyses import search_torch

    device = context.search_device()  # checked before the run: a GPU asked for and absent is refused before any label read
    given = settings.ks is not None
    ks = tuple(NB_KNN if settings.ks is None else settings.ks)
    train_panel, val_panel = context.panel("train"), context.panel("val")  # roles and seals checked before the run
    store = inputs.store
    panels = list(zip((train_panel, val_panel), panels_ids((train_panel, val_panel))))
    ks, narrowed = fitting_ks(ks, len(panels[0][1]), train_panel.name, given)
    if train_panel.kind == val_panel.kind == "classes":  # class folders: every image is the panel's, known without a label
        from ..labels import hygiene
        from ..store.cache import cache_root

        hygiene.check_apart(*((p.name, p.role, p.images, ids) for p, ids in panels), cache_root(context.cache_dir))
    source = locate(store, panels, "image", VIEWS, plain=True)  # zarr alone: xarray is imported once the neighbours are found
    meta = source.manifest
    chosen = choose_feature(settings.feature, meta.get("arch", {}), store)
    norm = parts.final_norm(meta, store) if chosen == "cls-normed" else None
    checkpoint = str((meta.get("checkpoint") or {}).get("sha256", "?"))
    train_labels = context.read("train", read_classes, purpose="knn: neighbours' classes", checkpoint=checkpoint)
    val_labels = context.read("val", read_classes, purpose="knn: score", checkpoint=checkpoint)
    classes = train_labels.classes
    unknown = sorted(set(val_labels.classes[i] for i in set(val_labels.labels.tolist())) - set(classes))
    if unknown:
        raise ProbeError(val_panel.images, f"has classes the train panel lacks ({', '.join(unknown[:5])})", "give both panels the same class folders")
    position = {c: n for n, c in enumerate(classes)}  # each val class's train index, once per class (not a search per image)
    val_targets = np.asarray([position.get(c, -1) for c in val_labels.classes], np.int64)[val_labels.labels]  # -1: a class no val image has
    n_train = len(train_labels.image_ids)
    if ks[-1] > n_train:  # a COCO panel annotating fewer images than its folder holds: known only now
        ks, narrowed = fitting_ks(NB_KNN if not given else ks, n_train, train_panel.name, given)
    train_ds, train_found = source.panel_stores[train_panel.name]
    val_ds, val_found = source.panel_stores[val_panel.name]
    train_ids = _store_ids(train_labels, panels[0][1], train_found, store)
    val_ids = _store_ids(val_labels, panels[1][1], val_found, store)
    view = choose_view([train_ds, val_ds], chosen)
    unread = {} if view == images.EVAL else {str(ds.attrs.get("store")): ds for ds in (train_ds, val_ds) if stored_name(chosen, images.EVAL) not in ds}
    extract = " && ".join(cache.extract_into(ds, images.EVAL) for ds in unread.values())  # pasted, the rerun reads DINO's view
    if narrowed:  # printed once every refusal has passed: a refused run prints its one line only
        context.note(narrowed)
    ledger = {"train": train_labels.entry_id, "val": val_labels.entry_id}
    counts = {"train": n_train, "val": len(val_ids), "classes": len(classes), "val_dropped": val_labels.dropped, "train_dropped": train_labels.dropped}
    rules = {"train": train_labels.rule, "val": val_labels.rule}
    train_classes, name = train_labels.labels, source.name
    # The ids kept as fixed-width text (what the record's coordinates hold), the rest let go: the
    # folder's listing and the labels' ids are a Python string per image, which the search and the
    # record's step (xarray's import) would otherwise sit on.
    train_ids, val_ids = np.asarray(train_ids), np.asarray(val_ids)
    del panels, source, train_labels, val_labels, train_found, val_found
    temperature = float(settings.temperature)
    on_gpu = device not in (None, "cpu")
    test_block = knn.DEVICE_TEST_BLOCK if on_gpu else knn.TEST_BLOCK
    bank_shape = (len(train_ids), feature_width(train_ds, chosen, view))
    folder = records.results_path(train_ds.attrs.get("store") or store, "")
    with context.placed() as where, shared_blocks(train_bank(train_ds, train_ids, chosen, norm, view), bank_shape, np.float32, folder, "knn-bank") as bank:
        fn = functools.partial(
            knn.nearest_block,
            bank=bank,
            feature=chosen,
            norm=norm,
            k=ks[-1],
            train_block=context.search_block(test_block, knn.DEVICE_TRAIN_BLOCK if on_gpu else knn.TRAIN_BLOCK),
            device=device,
        )
        values = {"values": feature_array(val_ds, val_ids, chosen, view)}
        progress = context.task("k-NN", len(val_ids))
        try:
            if not context.sharded:
                near = map_images(fn, values, where=where, block=test_block, fixed=True, progress=progress, torch_free=device is None)
            else:
                near, missing = shard_nearest(store, context.shard(), fn, values, val_ids, train_ids, chosen, view, ks[-1], where, progress, test_block, device is None)
                if near is None:  # a shard that finished before the others
                    return context.finish(KnnReport(store, name, None, chosen, classes, {}, ledger, temperature, view, missing))
        finally:
            search_torch.forget()
    width = knn.vote_width(len(classes))
    ranked = knn.ranked_votes(near["similarity"], near["neighbour"], train_classes, len(classes), ks, temperature, width)
    result = knn.scored(ks, ranked, val_targets, len(classes), near["neighbour"], near["similarity"], min(5, ks[-1]))
    family = str(meta.get("arch", {}).get("family", "vit"))
    text = describe(chosen, str((meta.get("checkpoint") or {}).get("path", "?")), family)
    attrs = {  # before xarray's import: the provenance reads the store's ids, a transient of their own
        "feature": chosen,
        "feature_text": text,
        "view": view,
        "view_text": view_text(view),
        "temperature": temperature,
        "ledger": ledger,
        "panels": {
            "train": {"name": train_panel.name, "role": train_panel.role, "rule": rules["train"]},
            "val": {"name": val_panel.name, "role": val_panel.role, "rule": rules["val"]},
        },
        "counts": counts,
        "source": SOURCES.get(family, SOURCE),
        "search": f"exact: float32 rounding of float64 products, running top-{ks[-1]}, equal cosines by train index ({'torch on ' + device if device else 'numpy'})",
        "stores": {"train": str(train_ds.attrs.get("store") or store), "val": str(val_ds.attrs.get("store") or store)},  # where each panel's images were read
        "provenance": result_provenance(train_ds, context.command),
        "computed_on": computed_on(store, val_ids, scope="panel", read_from=val_ds.attrs.get("store") or store),  # the val images scored (`probe table` groups by them)
    }
    import xarray as xr

    ds = xr.Dataset(
        {
            "top1": ("k", result.top1),
            "top5": ("k", result.top5),
            "prediction": (("k", "image"), result.predictions.astype(np.int32)),
            "neighbour": (("image", "rank"), result.neighbours.astype(np.int32)),
            "similarity": (("image", "rank"), result.similarity),
            "label": ("image", val_targets.astype(np.int32)),
        },
        coords={"k": list(ks), "image": val_ids, "train_image": train_ids, "class": classes},
    )
    report = KnnReport(store, name, result, text, classes, counts, ledger, temperature, view, extract=extract)
    return context.finish(report, Saving(store, "knn", ds, attrs))
