"""``probe segment CHECKPOINT --train PANEL --val PANEL``: linear segmentation as DINOv3 and DINOv2 train it.

Order, which the ledger shows: every refusal that needs no label and no network comes first (the
panels' kinds and roles, a sealed val panel, the store that will hold the record, a window smaller
than a patch); then the train panel's label maps are read (purpose ``linear-segmentation: train``),
the network is built (frozen, eval mode, no gradient) and the head trained; only then are the val
panel's label maps read (``linear-segmentation: score``) and the val images scored by sliding
windows. The science is ``analyses.segment`` and ``analyses.segment_augment``. Result
``results/linear-segmentation``:

    miou, accuracy            ()                      nanmean IoU over classes; labelled pixels right
    iou                       (class)                 NaN: a class neither labelled nor predicted
    areas                     (area, class)           intersection, union, predicted, labelled pixels
    loss, lr                  (iteration)             the training curve and the rate of each iteration
    head_weight, head_bias    (class[, channel])      the trained 1×1 convolution
    bn_mean, bn_var, bn_weight, bn_bias  (channel)    the trained BatchNorm (running statistics, affine)
    image, truth, prediction  (shown, y, x[, rgb])    the first val images, padded (truth 255) to one size
    attrs: settings (resolved), schedule, ledger {train, val}, panels, counts, checkpoint, feature, provenance
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..analyses import segment as seg
from ..analyses import segment_augment as aug
from ..infra import lazy_dask, provenance
from ..infra.errors import ProbeError
from ..infra.spelling import fix_command
from ..labels import ade_segmentation, voc_segmentation
from ..labels.panels import Panel
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.segment import SegmentSettings
from ..results.segment_report import SegmentReport
from ..store import cache
from ..store.images import load_image
from .panel_stores import panel_ids

RESULT = "linear-segmentation"
# panel kind → (reader, the classes scored, whether label 0 is dropped as DINOv3 and mmseg do for ADE20K)
LAYOUTS = {ade_segmentation.KIND: (ade_segmentation, ade_segmentation.CLASSES, True), voc_segmentation.KIND: (voc_segmentation, voc_segmentation.CLASSES, False)}


def _check_kinds(train: Panel, val: Panel) -> None:
    for panel in (train, val):
        if panel.kind not in LAYOUTS:
            raise ProbeError(
                panel.name,
                f"is a {panel.kind} panel; linear segmentation reads label maps of an ade20k or voc-segmentation panel",
                f"register ADEChallengeData2016 with --ade20k (or VOC2012 with --voc-segmentation) and --role {panel.role}",
            )
    if train.kind != val.kind:
        raise ProbeError(
            val.name, f"is a {val.kind} panel and {train.name!r} a {train.kind} one; their classes differ", "score on a val panel of the train panel's data set"
        )


def feature_fn(model, patch: int, chunk: int, device: torch.device) -> seg.Features:
    """The frozen network as ``analyses.segment`` calls it: (B, 3, H, W) → (B, D, rows, cols)
    last-layer patch tokens through the final norm, ``chunk`` crops per pass, no gradient."""
    from ..store.backbone import normed_patch_tokens

    def features(images: torch.Tensor) -> torch.Tensor:
        parts = []
        with torch.no_grad():
            for a in range(0, len(images), chunk):
                x = seg.center_pad(images[a : a + chunk].to(device), patch)
                rows, cols = x.shape[-2] // patch, x.shape[-1] // patch
                tokens = normed_patch_tokens(model, x).float()
                parts.append(tokens.reshape(len(x), rows, cols, -1).permute(0, 3, 1, 2))
        return torch.cat(parts)

    return features


class Stream:
    """The training samples: sample k is image ``order(k // n)[k % n]`` of the train panel,
    augmented with numpy's generator keyed by (seed, k); independent of threads and batch splits."""

    def __init__(self, folder: Path, names: list[str], maps: Sequence[np.ndarray], augment: aug.Augment, reduce_zero: bool, seed: int):
        self.folder, self.names, self.maps, self.augment, self.reduce_zero, self.seed = folder, names, maps, augment, reduce_zero, seed
        self._orders: dict[int, np.ndarray] = {}

    def index(self, k: int) -> int:
        epoch, position = divmod(k, len(self.names))
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.names))}
        return int(self._orders[epoch][position])

    def sample(self, k: int, i: int) -> aug.Crop:
        image = np.asarray(load_image(self.folder / self.names[i]))
        label = self.maps[i]
        if label.shape != image.shape[:2]:
            raise ProbeError(
                self.folder / self.names[i], f"is {image.shape[1]}x{image.shape[0]} px, its mask {label.shape[1]}x{label.shape[0]}", "restore the data set's masks"
            )
        return aug.training_crop(np.random.default_rng([self.seed, k]), image, label, self.augment, self.reduce_zero)

    def batch(self, pool: ThreadPoolExecutor, step: int, size: int):
        ks = range(step * size, (step + 1) * size)
        return [pool.submit(self.sample, k, self.index(k)) for k in ks]


def _shown(arrays: list[np.ndarray], fill: int, tail: tuple[int, ...] = ()) -> np.ndarray:
    """The figure's images or maps in one array, each padded at the bottom and right to the largest."""
    h = max((a.shape[0] for a in arrays), default=1)
    w = max((a.shape[1] for a in arrays), default=1)
    out = np.full((len(arrays), h, w, *tail), fill, np.uint8)
    for n, a in enumerate(arrays):
        out[n, : a.shape[0], : a.shape[1]] = a
    return out


def run(inputs: Inputs, settings: SegmentSettings, context: RunContext) -> SegmentReport:
    """Train the head on the train panel's crops, score the val panel; save ``results/linear-segmentation``."""
    from ..store.checkpoints import load_checkpoint

    checkpoint, store, network = inputs.checkpoint, inputs.store, inputs.network
    train_panel, val_panel = context.panel("train"), context.panel("val")  # roles, kinds and seals checked before the run
    _check_kinds(train_panel, val_panel)
    layout, classes, reduce_zero = LAYOUTS[train_panel.kind]
    for panel in (train_panel, val_panel):
        if not panel_ids(panel):
            raise ProbeError(panel.images, f"holds no image of panel {panel.name!r}", "restore the data set's images")
    device = context.device()
    ck = load_checkpoint(checkpoint, network)
    target = Path(store) if store is not None else cache.store_path(cache.cache_root(context.cache_dir), ck.stem, ck.sha256, network)
    if not (target / "zarr.json").is_file():
        extract = fix_command(
            "extract",
            checkpoint,
            images=val_panel.images,
            views="224",
            store=target if store is not None else None,  # (--panel: a sibling)
            network=network if network != "teacher" and store is None else None,
            cache=context.cache_dir if store is None else None,
        )
        from ..protocols.heads import unextracted

        raise unextracted(target, f"run `{extract}` first")
    patch = int(ck.arch.patch)
    if settings.crop < patch or settings.size < patch:
        raise _small_window(settings, patch)
    resolved = settings.resolved
    preset = seg.PRESETS[settings.preset]
    n_classes = len(classes)

    train_read = context.read("train", layout.read_label_maps, purpose=f"{RESULT}: train", checkpoint=ck.sha256)
    from ..store.backbone import Backbone

    model = Backbone.from_checkpoint(ck).to(device).eval()
    model.requires_grad_(False)
    features = feature_fn(model, patch, settings.chunk, device)
    width = int(ck.arch.width)
    init = torch.Generator().manual_seed(settings.seed)
    dropout_draws = torch.Generator().manual_seed(settings.seed + 1)
    head = seg.LinearHead(width, n_classes, resolved["dropout"], init).to(device)
    optimizer = seg.make_optimizer(head, resolved["weight_decay"])
    augment = aug.Augment(preset.pipeline, settings.size, tuple(settings.scale), settings.crop, flip=settings.flip, photometric=settings.photometric)
    stream = Stream(Path(train_panel.images), list(train_read.ids), train_read.maps, augment, reduce_zero, settings.seed)
    losses = np.zeros(settings.iterations, np.float32)
    rates = np.zeros(settings.iterations, np.float64)
    progress = context.task("segment", settings.iterations + len(panel_ids(val_panel)))
    with context.loaders() as pool:
        pending = stream.batch(pool, 0, settings.batch_size)
        for step in range(settings.iterations):
            crops = [f.result() for f in pending]
            if step + 1 < settings.iterations:
                pending = stream.batch(pool, step + 1, settings.batch_size)
            images = torch.stack([c.image for c in crops])
            target_maps = torch.stack([c.label for c in crops]).to(device)
            rates[step] = seg.learning_rate(step, lr=settings.lr, iterations=settings.iterations, warmup=resolved["warmup"], decay=preset.decay)
            losses[step] = seg.train_step(head, optimizer, features(images), target_maps, rates[step], dropout_draws)
            progress(1)

    val_read = context.read("val", layout.read_label_maps, purpose=f"{RESULT}: score", checkpoint=ck.sha256)
    areas = np.zeros((4, n_classes), np.int64)
    shown_images, shown_truth, shown_pred = [], [], []
    for n, (name, label) in enumerate(zip(val_read.ids, val_read.maps)):
        image = np.asarray(load_image(Path(val_panel.images) / name))
        if label.shape != image.shape[:2]:
            raise ProbeError(
                Path(val_panel.images) / name, f"is {image.shape[1]}x{image.shape[0]} px, its mask {label.shape[1]}x{label.shape[0]}", "restore the data set's masks"
            )
        truth = aug.reduce_zero_label(label) if reduce_zero else label
        predicted = seg.predict(aug.eval_input(image, settings.size, preset.pipeline), truth.shape, head, features, n_classes, settings.crop, settings.stride)
        areas += seg.intersect_union(predicted, truth, n_classes)
        if n < settings.figure_images:
            shown_images.append(image)
            shown_truth.append(truth)
            shown_pred.append(predicted)
        progress(1)
    result = seg.scores(areas)
    full = settings.iterations == seg.ITERATIONS and settings.batch_size == seg.BATCH
    changed = settings.unpublished()
    counts = {"train": len(train_read.ids), "val": len(val_read.ids), "iterations": settings.iterations, "batch": settings.batch_size, "pixels": int(areas[3].sum())}
    ledger = {"train": train_read.entry_id, "val": val_read.entry_id}
    schedule = {
        "iterations": settings.iterations,
        "published_iterations": seg.ITERATIONS,
        "batch": settings.batch_size,
        "published_batch": seg.BATCH,
        "warmup": resolved["warmup"],
        "decay": preset.decay,
        "full": bool(full),
        "label": "published schedule" if full else f"short schedule: {settings.iterations} of {seg.ITERATIONS} iterations, batch {settings.batch_size}",
        "unpublished_settings": {k: resolved[k] for k in changed},
    }
    ds = lazy_dask.xarray().Dataset(
        {
            "miou": ((), result.miou),
            "accuracy": ((), result.accuracy),
            "iou": ("class", result.iou),
            "areas": (("area", "class"), result.areas),
            "loss": ("iteration", losses),
            "lr": ("iteration", rates),
            "head_weight": (("class", "channel"), head.conv.weight.detach().cpu().numpy()[:, :, 0, 0]),
            "head_bias": ("class", head.conv.bias.detach().cpu().numpy()),
            **{
                f"bn_{k}": ("channel", v.detach().cpu().numpy())
                for k, v in (("mean", head.bn.running_mean), ("var", head.bn.running_var), ("weight", head.bn.weight), ("bias", head.bn.bias))
            },
            "image": (("shown", "y", "x", "rgb"), _shown(shown_images, 0, (3,))),
            "truth": (("shown", "y", "x"), _shown(shown_truth, aug.IGNORE)),
            "prediction": (("shown", "y", "x"), _shown(shown_pred, aug.IGNORE)),
        },
        coords={"class": list(classes), "area": ["intersection", "union", "predicted", "labelled"], "shown": list(val_read.ids[: len(shown_truth)])},
    )
    attrs = {
        "settings": resolved,
        "schedule": schedule,
        "preset_source": preset.source,
        "panel_kind": train_panel.kind,
        "reduce_zero_label": reduce_zero,
        "ledger": ledger,
        "counts": counts,
        "checkpoint": ck.describe(),
        "network": network,
        "device": str(device),
        "panels": {
            "train": {"name": train_panel.name, "role": train_panel.role, "split": train_panel.split},
            "val": {"name": val_panel.name, "role": val_panel.role, "split": val_panel.split, "images": str(val_panel.images)},
        },
        "feature": "last-layer patch tokens through the final norm" if ck.arch.final_norm else "last-layer patch tokens (the network has no final norm)",
        "sizes": [list(t.shape) for t in shown_truth],
        "provenance": {"command": context.command, **provenance.stamp()},
    }
    report = SegmentReport(
        target,
        f"{Path(checkpoint).name} ({network})",
        train_panel.kind,
        settings.preset,
        result,
        classes,
        settings.iterations,
        bool(full),
        losses,
        counts,
        ledger,
        resolved,
        {k: resolved[k] for k in changed},
    )
    return context.finish(report, Saving(target, RESULT, ds, attrs))


def _small_window(settings, patch: int):
    """A crop or short side smaller than one patch: no token to train or score on."""
    from ..infra.settings import SettingError

    name = "crop" if settings.crop < patch else "size"
    return SettingError(name, f"{name} {getattr(settings, name)} is smaller than the network's {patch}-pixel patch", f"give {name} ≥ {patch} (published 512)")
