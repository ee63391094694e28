"""``probe depth CHECKPOINT --train PANEL --val PANEL``: linear depth on NYUv2 as DINOv3 (and DINOv2) train it.

Order, which the ledger shows: every refusal that needs no label and no network comes first (the
panels' kinds and roles, a sealed val panel, the store that will hold the record, a network the
preset cannot read, a crop larger than an image); then the train panel's depth maps are read
(purpose ``linear-depth: train``), the network is built (frozen, eval mode, no gradient) and the
head trained; only then are the val panel's depth maps read (``linear-depth: score``) and the val
images scored. The science is ``analyses.depth`` and ``analyses.depth_augment``. Result
``results/linear-depth``:

    rmse, abs_rel, a1, ... (metric)     ()                   the mean over val images of each metric
    per_image                          (image, metric)      each val image's metrics (NaN: no valid pixel)
    loss, lr, beta1                    (iteration)          the training curve, the rate and AdamW's β1 of each iteration
    head_weight, head_bias             (bin[, channel])     the trained 1×1 convolution
    bn_mean, bn_var, bn_weight, bn_bias (channel)           the trained BatchNorm (dinov3 preset)
    picture, truth, prediction, valid  (shown, y, x[, rgb]) the first val images: photograph, depth (m), prediction (m), valid pixels
    attrs: settings (resolved), schedule, blocks, ledger {train, val}, panels, counts, checkpoint, feature, provenance
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..analyses import depth as dep
from ..analyses import depth_augment as aug
from ..analyses import depth_published as pub
from ..analyses.segment import center_pad
from ..infra import lazy_dask, provenance
from ..infra.errors import IntegrityError, ProbeError
from ..infra.settings import SettingError
from ..labels import nyu
from ..labels.panels import Panel
from ..protocols.context import Inputs, RunContext, Saving
from ..results.depth_report import DepthReport
from ..store import cache
from ..store.images import header_size, load_image
from .panel_stores import panel_ids
from .segment import Stream

if TYPE_CHECKING:
    import xarray as xr  # imported where a result is written (lazy_dask.xarray): it brings pandas

RESULT = "linear-depth"


def feature_fn(model, blocks: tuple[int, ...], norm: bool, chunk: int, device: torch.device) -> dep.Features:
    """The frozen network as ``analyses.depth`` calls it: (B, 3, H, W) → per block in ``blocks``,
    (patch map (B, D, rows, cols), class token (B, D) or None), the block's output passed through the
    final norm when ``norm`` (``get_intermediate_layers(n=blocks, reshape=True, return_class_token=True,
    norm=norm)``), kept by the network's own ``capture`` (``store.taps``); centre-padded to the
    patch; ``chunk`` crops per pass, no gradient."""
    from ..store.taps import Taps

    patch, prefix, has_class = int(model.arch.patch), model.prefix, bool(model.arch.class_token)
    kind = "normed" if norm else "tokens"
    taps = Taps(blocks=tuple(blocks), facets=(kind,))

    def features(images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        parts: list[list[tuple[torch.Tensor, torch.Tensor | None]]] = []
        for a in range(0, len(images), chunk):
            x = center_pad(images[a : a + chunk].to(device), patch)
            rows, cols = x.shape[-2] // patch, x.shape[-1] // patch
            kept = model.capture(x, taps).sequences
            part = []
            for b in blocks:
                tokens = kept[(kind, b)].float()
                grid = tokens[:, prefix:].reshape(len(x), rows, cols, -1).permute(0, 3, 1, 2)
                part.append((grid, tokens[:, 0] if has_class else None))
            parts.append(part)
        # torch.cat copies out of inference mode: the head's autograd may keep what it reads
        return [(torch.cat([p[j][0] for p in parts]), None if parts[0][j][1] is None else torch.cat([p[j][1] for p in parts])) for j in range(len(blocks))]

    return features


class DepthStream(Stream):
    """The training samples: sample k is image ``order(k // n)[k % n]`` of the train panel (``Stream``'s
    order), cropped with numpy's generator keyed by (seed, k)."""

    def __init__(self, folder: Path, maps: nyu.DepthMaps, augment: aug.Augment, seed: int):
        self.folder, self.names, self.maps, self.augment, self.seed = folder, list(maps.ids), maps, augment, seed
        self._orders: dict[int, np.ndarray] = {}

    def sample(self, k: int, i: int) -> aug.Crop:
        image = np.asarray(load_image(self.folder / self.names[i]))
        depth = self.maps.map(i)
        if depth.shape != image.shape[:2]:
            raise ProbeError(self.maps.files[i], f"is {depth.shape[1]}x{depth.shape[0]} px, its photograph {image.shape[1]}x{image.shape[0]}", nyu.FIX)
        return aug.training_crop(np.random.default_rng([self.seed, k]), image, depth, self.augment)


def _check_network(settings, ck, preset: pub.Preset, block: int | None = None) -> tuple[int, ...]:
    """The blocks the preset reads of this network (``block``, the run context's, in place of the
    last for a one-block preset); a network it cannot read is refused."""
    arch = ck.arch
    if preset.class_token and not arch.class_token:
        raise SettingError(
            "preset",
            f"has no class token, which preset {preset.name} concatenates to every patch token (DINOv2's BNHead)",
            "use preset dinov3 (patch tokens only)",
            ck.path,
        )
    if preset.blocks == "four" and arch.depth < 4:
        raise SettingError("preset", f"has {arch.depth} blocks; preset {preset.name} reads four", "use preset dinov2-lin1 or dinov3", ck.path)
    if min(settings.crop) < arch.patch:
        raise SettingError("crop", f"crop {tuple(settings.crop)} is smaller than the network's {arch.patch}-pixel patch", "give crop=(416, 544) (published)")
    if block is None:
        return pub.blocks_of(preset, arch.depth)
    if preset.blocks != "last":
        raise SettingError(
            "preset", f"preset {preset.name} reads its own four blocks, not block {block}", "drop block, or use preset dinov3 or dinov2-lin1", others=("block",)
        )
    if not -arch.depth <= block < arch.depth:
        raise ProbeError(ck.path, f"has {arch.depth} blocks, no block {block}", f"give a block from 0 to {arch.depth - 1}")
    return (block % arch.depth,)


def _check_sizes(panel: Panel, names: list[str], crop: tuple[int, int]) -> None:
    """Every train photograph, after the NYU crop, holds the training crop (headers only)."""
    for name in names:
        width, height = header_size(Path(panel.images) / name)
        x1, y1, x2, y2 = aug.nyu_box(height, width)
        if y2 - y1 < crop[0] or x2 - x1 < crop[1]:
            raise SettingError(
                "crop",
                f"is {width}x{height} px: {x2 - x1}x{y2 - y1} inside NYU's border, smaller than the {crop[1]}x{crop[0]} training window",
                "use NYU's 640x480 photographs, or a smaller crop=(HEIGHT, WIDTH)",
                Path(panel.images) / name,
            )


def run(inputs: Inputs, settings, context: RunContext) -> DepthReport:
    """Train the head on the train panel's crops, score the val panel; save ``results/linear-depth``."""
    from ..store.checkpoints import load_checkpoint

    train_panel, val_panel = context.panel("train"), context.panel("val")  # kinds, roles and seals checked before the run
    checkpoint = Path(inputs.checkpoint)
    train_names = panel_ids(train_panel)
    device = context.device()
    ck = load_checkpoint(checkpoint, inputs.network)
    target = Path(inputs.store) if inputs.store is not None else cache.store_path(cache.cache_root(context.cache_dir), ck.stem, ck.sha256, inputs.network)
    if not (target / "zarr.json").is_file():
        from ..protocols.heads import unextracted

        raise unextracted(
            target, f"run `probe extract {checkpoint} --images PHOTOS --views 224` on any folder of photographs (not the NYU folder: its depth maps are labels)"
        )
    preset = pub.PRESETS[settings.preset]
    blocks = _check_network(settings, ck, preset, context.block)
    crop = tuple(settings.crop)
    _check_sizes(train_panel, train_names, crop)
    resolved = settings.resolved

    train_read = context.read("train", nyu.read_depth_maps, purpose=f"{RESULT}: train", checkpoint=ck.sha256, command=context.command)
    from ..store.backbone import Backbone

    model = Backbone.from_checkpoint(ck).to(device).eval()
    model.requires_grad_(False)
    features = feature_fn(model, blocks, preset.backbone_norm, settings.chunk, device)
    channels = dep.channels_of(int(ck.arch.width), preset, int(ck.arch.depth))
    head = dep.DepthHead(channels, preset, torch.Generator().manual_seed(settings.seed)).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=resolved["lr"], betas=preset.betas, weight_decay=resolved["weight_decay"])
    losses, rates, betas = _train(
        context,
        settings,
        resolved,
        preset,
        head,
        optimizer,
        features,
        DepthStream(Path(train_panel.images), train_read, aug.Augment(crop=crop), settings.seed),
        train_panel.name,
    )

    val_read = context.read("val", nyu.read_depth_maps, purpose=f"{RESULT}: score", checkpoint=ck.sha256, command=context.command)
    per_image, shown = _score(context, settings, head, features, val_panel, val_read)
    means = dep.mean_metrics(per_image)
    per_step = settings.batch_size * settings.replicas
    full = settings.iterations == pub.ITERATIONS and per_step == pub.BATCH * pub.REPLICAS
    changed = settings.unpublished()
    counts = {
        "train": len(train_read.ids),
        "val": len(val_read.ids),
        "iterations": settings.iterations,
        "batch": per_step,
        "scored": int(sum(np.isfinite(per_image["rmse"]))),
    }
    ledger = {"train": train_read.entry_id, "val": val_read.entry_id}
    schedule = {
        "iterations": settings.iterations,
        "published_iterations": pub.ITERATIONS,
        "batch": per_step,
        "published_batch": pub.BATCH * pub.REPLICAS,
        "warmup": resolved["warmup"],
        "kind": preset.schedule,
        "full": bool(full),
        "label": "published schedule" if full else f"short schedule: {settings.iterations} of {pub.ITERATIONS} iterations, batch {per_step}",
        "unpublished_settings": {k: resolved[k] for k in changed},
    }
    ds = _dataset(means, per_image, val_read.ids, losses, rates, betas, head, shown)
    attrs = {
        "settings": resolved,
        "schedule": schedule,
        "preset_source": preset.source,
        "blocks": list(blocks),
        "ledger": ledger,
        "counts": counts,
        "checkpoint": ck.describe(),
        "network": inputs.network,
        "device": str(device),
        "depth_range": [pub.MIN_DEPTH, pub.MAX_DEPTH],
        "panels": {
            "train": {"name": train_panel.name, "role": train_panel.role, "split": train_panel.split},
            "val": {"name": val_panel.name, "role": val_panel.role, "split": val_panel.split, "images": str(val_panel.images)},
        },
        "feature": _feature(preset, blocks, ck.arch.final_norm),
        "sizes": [list(t.shape) for t in shown["truth"]],
        "provenance": {"command": context.command, **provenance.stamp()},
    }
    report = DepthReport(
        target,
        f"{checkpoint.name} ({inputs.network})",
        settings.preset,
        means,
        settings.iterations,
        bool(full),
        losses,
        counts,
        ledger,
        blocks,
        resolved,
        {k: resolved[k] for k in changed},
    )
    return context.finish(report, Saving(target, RESULT, ds, attrs))


def _train(context: RunContext, settings, resolved: dict, preset: pub.Preset, head: dep.DepthHead, optimizer, features, stream, panel: str):
    """The training loop: (loss, rate, β1) of every iteration; the crops made by ``--workers`` threads one batch ahead."""
    per_step = settings.batch_size * settings.replicas
    losses = np.zeros(settings.iterations, np.float32)
    rates, betas = np.zeros(settings.iterations, np.float64), np.zeros(settings.iterations, np.float64)
    advance = context.task("training", settings.iterations)
    device = next(head.parameters()).device
    with context.loaders() as pool:
        pending = stream.batch(pool, 0, per_step)
        for step in range(settings.iterations):
            crops = [f.result() for f in pending]
            if step + 1 < settings.iterations:
                pending = stream.batch(pool, step + 1, per_step)
            images = torch.stack([c.image for c in crops])
            truth = torch.stack([c.depth for c in crops]).to(device)
            rates[step], betas[step] = dep.schedule(step, lr=resolved["lr"], iterations=settings.iterations, warmup=resolved["warmup"], kind=preset.schedule)
            losses[step] = dep.train_step(head, optimizer, features(images), truth, rates[step], betas[step], settings.batch_size, warm=step < pub.SIGLOSS_WARMUP)
            if not np.isfinite(losses[step]):  # the head is NaN from here on: no number of this run could be trusted
                raise IntegrityError(
                    panel,
                    f"iteration {step}: the loss is {losses[step]} (a group of {settings.batch_size} crops without one "
                    "measured pixel, or a diverging head); nothing was saved",
                    "check the panel's depth maps, or lower the learning rate",
                )
            advance(1)
    return losses, rates, betas


def _score(context: RunContext, settings, head: dep.DepthHead, features, val_panel: Panel, val_read: nyu.DepthMaps):
    """Each val image's metrics (the mirror averaged in when ``tta``), and the first images' arrays for the figure."""
    per_image = {m: np.zeros(len(val_read.ids), np.float32) for m in pub.METRICS}
    shown: dict[str, list[np.ndarray]] = {"picture": [], "truth": [], "prediction": [], "valid": []}
    advance = context.task("scoring", len(val_read.ids))
    for n, name in enumerate(val_read.ids):
        picture = np.asarray(load_image(Path(val_panel.images) / name))
        depth = val_read.map(n)
        if depth.shape != picture.shape[:2]:
            raise ProbeError(val_read.files[n], f"is {depth.shape[1]}x{depth.shape[0]} px, its photograph {picture.shape[1]}x{picture.shape[0]}", nyu.FIX)
        truth = aug.to_metres(depth)[None]
        pred = (dep.predict_flipped if settings.tta else dep.predict)(head, features, aug.eval_input(picture)).float().cpu()
        for metric, value in dep.image_metrics(truth, pred).items():
            per_image[metric][n] = value
        if n < settings.figure_images:
            up = torch.nn.functional.interpolate(pred, size=truth.shape[-2:], mode="bilinear", align_corners=False).clamp(pub.MIN_DEPTH, pub.MAX_DEPTH)
            ranged = dep.in_range(truth)
            shown["picture"].append(picture)
            shown["truth"].append(ranged[0, 0].numpy())
            shown["prediction"].append(up[0, 0].numpy())
            shown["valid"].append((dep.valid_mask(ranged) & (ranged > 0))[0, 0].numpy())
        advance(1)
    return per_image, shown


def _feature(preset: pub.Preset, blocks: tuple[int, ...], final_norm: bool) -> str:
    which = f"block{'s' if len(blocks) > 1 else ''} {', '.join(map(str, blocks))} (0-based)"
    norm = (
        "through the final norm" if preset.backbone_norm and final_norm else "without the final norm" if not preset.backbone_norm else "(the network has no final norm)"
    )
    cls = ", the class token beside every patch token" if preset.class_token else ""
    up = f", upsampled {preset.upsample}× bilinearly" if preset.upsample > 1 else ""
    return f"patch tokens of {which} {norm}{cls}{up}"


def _padded(arrays: list[np.ndarray], fill, dtype, tail: tuple[int, ...] = ()) -> np.ndarray:
    """The figure's arrays in one, each padded at the bottom and right to the largest."""
    h = max((a.shape[0] for a in arrays), default=1)
    w = max((a.shape[1] for a in arrays), default=1)
    out = np.full((len(arrays), h, w, *tail), fill, dtype)
    for n, a in enumerate(arrays):
        out[n, : a.shape[0], : a.shape[1]] = a
    return out


def _dataset(means, per_image, ids, losses, rates, betas, head: dep.DepthHead, shown) -> xr.Dataset:
    data = {
        **{m: ((), np.float32(v)) for m, v in means.items()},
        "per_image": (("image", "metric"), np.stack([per_image[m] for m in pub.METRICS], axis=1)),
        "loss": ("iteration", losses),
        "lr": ("iteration", rates),
        "beta1": ("iteration", betas),
        "head_weight": (("bin", "channel"), head.conv.weight.detach().cpu().numpy()[:, :, 0, 0]),
        "head_bias": ("bin", head.conv.bias.detach().cpu().numpy()),
        "picture": (("shown", "y", "x", "rgb"), _padded(shown["picture"], 0, np.uint8, (3,))),
        "truth": (("shown", "y", "x"), _padded(shown["truth"], np.nan, np.float32)),
        "prediction": (("shown", "y", "x"), _padded(shown["prediction"], np.nan, np.float32)),
        "valid": (("shown", "y", "x"), _padded(shown["valid"], False, bool)),
    }
    if head.bn is not None:
        data.update(
            {
                f"bn_{k}": ("channel", v.detach().cpu().numpy())
                for k, v in (("mean", head.bn.running_mean), ("var", head.bn.running_var), ("weight", head.bn.weight), ("bias", head.bn.bias))
            }
        )
    return lazy_dask.xarray().Dataset(data, coords={"image": list(ids), "metric": list(pub.METRICS), "shown": list(ids[: len(shown["truth"])])})
