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
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ..analyses import knn
from ..infra.errors import ProbeError
from ..infra.owned import write_summary
from ..infra.placement import Placement, sharded
from ..infra.runner import check_placement, map_images, placed
from ..infra.shared import shared_blocks
from ..labels.panels import ClassLabels, check_readable, read_classes, train_and_val
from ..results import records
from ..store import arrays, cache, images, parts
from .panel_stores import locate, panel_ids
from .runs import result_provenance

FEATURES = ("auto", "cls-normed", "cls", "mean")
VIEWS = (images.EVAL, "224")  # DINO's evaluation view first; the 224 view where a store lacks it


def view_text(view: str) -> str:
    """What the features saw, and, off DINO's view, how to get it."""
    text = f"{view} view: {arrays.geometry(view)}"
    if view != images.EVAL:
        text += (f"; not DINO's (facebookresearch/dino eval_knn.py: short side 256, centre crop 224): "
                 f"`probe extract --views {images.EVAL}` adds that view")
    return text


def stored_name(feature: str, view: str) -> str:
    return f"{'cls_tokens' if feature.startswith('cls') else 'tokens'}_{view}"


def choose_view(datasets: Sequence[xr.Dataset], feature: str) -> str:
    """DINO's evaluation view where every dataset holds the feature's array in it, else the 224 view."""
    return next((v for v in VIEWS if all(stored_name(feature, v) in ds for ds in datasets)), "224")


@dataclass
class KnnReport:
    store: Path
    name: str
    result: knn.KnnResult
    feature: str
    classes: list[str]
    counts: dict[str, int]
    ledger: dict[str, str]
    saved: Path | None
    waiting: list[int] = field(default_factory=list)  # a shard done before the others: the shards still missing
    temperature: float = knn.TEMPERATURE
    view: str = images.EVAL

    @property
    def view_line(self) -> str:
        return view_text(self.view)

    def summary(self) -> dict[str, Any]:
        return {
            "store": str(self.store), "name": self.name, "feature": self.feature, "view": self.view, "view_text": view_text(self.view),
            "temperature": self.temperature, "ledger": self.ledger, "counts": self.counts, "classes": self.classes,
            "k": list(self.result.ks), "top1": [float(v) for v in self.result.top1],
            "top5": [None if not np.isfinite(v) else float(v) for v in self.result.top5],
        }


def choose_feature(feature: str, arch: dict[str, Any], where: Path) -> str:
    if feature not in FEATURES:
        raise ProbeError("--feature", f"{feature!r} is not one of {', '.join(FEATURES)}", "use --feature auto")
    token = bool(arch.get("class_token"))
    if feature == "auto":
        return ("cls-normed" if arch.get("final_norm") else "cls") if token else "mean"
    if feature.startswith("cls") and not token:
        raise ProbeError(where, "has no class token (its network has none)", "use --feature mean (mean-pooled patch tokens)")
    if feature == "cls-normed" and not arch.get("final_norm"):
        raise ProbeError(where, "comes from a network without a final norm", "use --feature cls")
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


def feature_array(ds: xr.Dataset, ids: Sequence[str], feature: str, view: str) -> xr.DataArray:
    """The stored array the feature is made from, lazily, at the given images (in their order)."""
    return cache.require(ds, stored_name(feature, view)).sel(image=list(ids))


def reader(ds: xr.Dataset, ids: Sequence[str], feature: str, norm: parts.FinalNorm | None, view: str) -> Callable[[int, int], np.ndarray]:
    """Rows a..b of the chosen feature, read from the store only when asked."""
    array = feature_array(ds, ids, feature, view)
    return lambda a, b: knn.features(array.isel(image=slice(a, b)).values, feature, norm)


def train_bank(ds: xr.Dataset, ids: Sequence[str], feature: str, norm: parts.FinalNorm | None, view: str):
    """The train images' features, L2-normalised, one block at a time, as the workers read them
    (a ``Shared`` file written block by block: memory holds one block, whatever the train set)."""
    rows = reader(ds, ids, feature, norm, view)
    n = len(ids)
    return (knn.normalise(rows(a, min(a + knn.TRAIN_BLOCK, n))) for a in range(0, n, knn.TRAIN_BLOCK))


def feature_width(ds: xr.Dataset, feature: str, view: str) -> int:
    """D of the chosen feature (the stored array's last axis)."""
    return int(cache.require(ds, stored_name(feature, view)).shape[-1])


def shard_nearest(store: Path, shard: str | None, fn, values: dict[str, xr.DataArray], val_ids: list[str], train_ids: list[str], feature: str,
                  view: str, k: int, where, progress, test_block: int = knn.TEST_BLOCK, torch_free: bool = True) -> tuple[dict[str, np.ndarray] | None, list[int]]:
    """This shard's val rows (whole test blocks) saved as a part; (every row's neighbours, []) once all parts are in."""
    from . import shards

    which, (a, b) = shards.share(shard, len(val_ids), knn.TEST_BLOCK)
    if b > a:
        near = map_images(fn, values, where=where, block=test_block, fixed=True, progress=progress, image_range=(a, b), torch_free=torch_free)
    else:
        near = {"similarity": np.zeros((0, k), np.float32), "neighbour": np.zeros((0, k), np.int64)}
    part = xr.Dataset({name: (("image", "rank"), array) for name, array in near.items()}, coords={"image": val_ids[a:b]})
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
    above it given on the command line is refused; DINO's default list is narrowed to the ks
    that fit (to ``n_train`` alone when none does)."""
    ks = tuple(sorted(set(int(k) for k in ks)))
    fit = tuple(k for k in ks if k <= n_train)
    if fit == ks:
        return ks, None
    if given:
        raise ProbeError("--k", f"{ks[-1]} exceeds the {n_train} train images of panel {panel!r}",
                         f"use k ≤ {n_train}, e.g. --k {','.join(map(str, fit)) or n_train}")
    fit = fit or (n_train,)
    return fit, (f"note: --k {','.join(map(str, ks))} (DINO's default) narrowed to --k {','.join(map(str, fit))}: "
                 f"panel {panel!r} has {n_train} train images")


def run_knn(
    store: str | Path,
    train: str,
    val: str,
    *,
    ks: Sequence[int] | None = None,
    temperature: float = knn.TEMPERATURE,
    feature: str = "auto",
    unseal: str | None = None,
    cache_dir: str | Path | None = None,
    json_path: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
    command: str = "probe knn",
    placement: Placement = Placement(workers=1),
) -> KnnReport:
    """Classify the val panel's images by their nearest train images; save ``results/knn``.

    ``ks``: None is DINO's 10, 20, 100, 200, narrowed to the ks the train panel can answer; ks
    given are refused when one exceeds the train images (both before any label is read).

    Blocks of val rows run on ``placement.workers`` local processes (None: every core) or the dask cluster
    at ``placement.dask_address``, each against the train bank (``infra.shared.Shared``: a file written
    block by block and read block by block by every worker, so no process holds it whole: train × D
    float32 is 2 GB for ImageNet at D = 384); ``placement.backend`` torch searches with torch on
    ``placement.device`` (cpu, or cuda: one process by default, the bank moved to the GPU once), with
    the numpy search's neighbours and cosines (``analyses.search_torch``); ``placement.shard`` i/n: this
    process's share of the val rows (``commands.shards``), the last shard scores."""
    from ..analyses import search_torch
    from ..analyses.decoder_blocks import check_backend, default_workers

    check_backend(placement.backend, placement.device)  # a GPU asked for and absent: before any label read
    device = placement.device if placement.backend == "torch" else None
    workers = default_workers(placement.workers, placement.device, placement.dask_address)
    dask_address, shard = placement.dask_address, placement.shard
    given = ks is not None
    ks = tuple(knn.KS if ks is None else ks)
    if not ks or any(int(k) < 1 for k in ks):
        raise ProbeError("--k", f"{list(ks)} must be positive integers", "use --k 10,20,100,200")
    if not temperature > 0:
        raise ProbeError("--temperature", f"{temperature} must be positive", "use DINO's 0.07")
    # every refusal that needs no label and no compute comes here, before the first ledger line
    check_placement(workers, dask_address)
    train_panel, val_panel = train_and_val(train, val, cache_dir, use="hold the neighbours")
    check_readable(val_panel, unseal, cache_dir)  # a sealed val panel without --unseal: before the train labels are read
    store = Path(store)
    panels = [(train_panel, panel_ids(train_panel)), (val_panel, panel_ids(val_panel))]
    ks, narrowed = fitting_ks(ks, len(panels[0][1]), train_panel.name, given)
    if train_panel.kind == val_panel.kind == "classes":  # class folders: every image is the panel's, known without a label
        from ..labels import hygiene
        from ..store.cache import cache_root

        hygiene.check_apart(*((p.name, p.role, p.images, ids) for p, ids in panels), cache_root(cache_dir))
    source = locate(store, panels, "image", VIEWS)
    meta = source.manifest
    chosen = choose_feature(feature, meta.get("arch", {}), store)
    norm = parts.final_norm(meta, store) if chosen == "cls-normed" else None
    checkpoint = str((meta.get("checkpoint") or {}).get("sha256", "?"))
    train_labels = read_classes(train_panel, purpose="knn: neighbours' classes", checkpoint=checkpoint, cache=cache_dir)
    val_labels = read_classes(val_panel, purpose="knn: score", checkpoint=checkpoint, unseal=unseal, cache=cache_dir)
    classes = train_labels.classes
    unknown = sorted(set(val_labels.classes[i] for i in set(val_labels.labels.tolist())) - set(classes))
    if unknown:
        raise ProbeError(val_panel.images, f"has classes the train panel lacks ({', '.join(unknown[:5])})", "give both panels the same class folders")
    val_targets = np.asarray([classes.index(val_labels.classes[i]) for i in val_labels.labels], np.int64)
    n_train = len(train_labels.image_ids)
    if ks[-1] > n_train:  # a COCO panel annotating fewer images than its folder holds: known only now
        ks, narrowed = fitting_ks(knn.KS if not given else ks, n_train, train_panel.name, given)
    train_ds, train_found = source.panel_stores[train_panel.name]
    val_ds, val_found = source.panel_stores[val_panel.name]
    train_ids = _store_ids(train_labels, panels[0][1], train_found, store)
    val_ids = _store_ids(val_labels, panels[1][1], val_found, store)
    view = choose_view([train_ds, val_ds], chosen)
    if narrowed:  # printed once every refusal has passed: a refused run prints its one line only
        print(narrowed, file=sys.stderr)
    on_gpu = device not in (None, "cpu")
    test_block = knn.DEVICE_TEST_BLOCK if on_gpu else knn.TEST_BLOCK
    bank_shape = (len(train_ids), feature_width(train_ds, chosen, view))
    folder = records.results_path(train_ds.attrs.get("store") or store, "")
    with placed(workers, dask_address) as where, shared_blocks(train_bank(train_ds, train_ids, chosen, norm, view), bank_shape, np.float32, folder, "knn-bank") as bank:
        fn = functools.partial(knn.nearest_block, bank=bank, feature=chosen, norm=norm, k=ks[-1],
                               train_block=knn.DEVICE_TRAIN_BLOCK if on_gpu else knn.TRAIN_BLOCK, device=device)
        values = {"values": feature_array(val_ds, val_ids, chosen, view)}
        try:
            if not sharded(shard):
                near = map_images(fn, values, where=where, block=test_block, fixed=True, progress=progress, torch_free=device is None)
            else:
                near, missing = shard_nearest(store, shard, fn, values, val_ids, train_ids, chosen, view, ks[-1], where, progress, test_block, device is None)
                if near is None:  # a shard that finished before the others
                    return KnnReport(store, source.name, None, chosen, classes, {}, {"train": train_labels.entry_id, "val": val_labels.entry_id}, None, missing,
                                     temperature=float(temperature), view=view)
        finally:
            search_torch.forget()
    width = knn.vote_width(len(classes))
    ranked = knn.ranked_votes(near["similarity"], near["neighbour"], train_labels.labels, len(classes), ks, temperature, width)
    result = knn.scored(ks, ranked, val_targets, len(classes), near["neighbour"], near["similarity"], min(5, ks[-1]))
    family = str(meta.get("arch", {}).get("family", "vit"))
    text = describe(chosen, str((meta.get("checkpoint") or {}).get("path", "?")), family)
    counts = {"train": n_train, "val": len(val_ids), "classes": len(classes), "val_dropped": val_labels.dropped, "train_dropped": train_labels.dropped}
    ledger = {"train": train_labels.entry_id, "val": val_labels.entry_id}
    ds = xr.Dataset(
        {
            "top1": ("k", result.top1), "top5": ("k", result.top5),
            "prediction": (("k", "image"), result.predictions.astype(np.int32)),
            "neighbour": (("image", "rank"), result.neighbours.astype(np.int32)),
            "similarity": (("image", "rank"), result.similarity),
            "label": ("image", val_targets.astype(np.int32)),
        },
        coords={"k": list(ks), "image": val_ids, "train_image": train_ids, "class": classes},
    )
    attrs = {
        "feature": chosen, "feature_text": text, "view": view, "view_text": view_text(view), "temperature": float(temperature), "ledger": ledger,
        "panels": {"train": {"name": train_panel.name, "role": train_panel.role, "rule": train_labels.rule},
                   "val": {"name": val_panel.name, "role": val_panel.role, "rule": val_labels.rule}},
        "counts": counts, "source": SOURCES.get(family, SOURCE),
        "search": f"exact: float32 rounding of float64 products, running top-{ks[-1]}, equal cosines by train index ({'torch on ' + device if device else 'numpy'})",
        "stores": {"train": str(train_ds.attrs.get("store") or store), "val": str(val_ds.attrs.get("store") or store)},  # where each panel's images were read
        "provenance": result_provenance(train_ds, command),
    }
    saved = records.save(store, "knn", ds, attrs)
    report = KnnReport(store, source.name, result, text, classes, counts, ledger, saved, temperature=float(temperature), view=view)
    if json_path is not None:
        write_summary(json_path, report.summary(), indent=1)
    return report
