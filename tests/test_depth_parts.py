"""The pieces of ``probe depth`` against the reference written out here, each from its own code
path: facebookresearch/dinov3 ``dinov3/eval/depth`` (metrics.py, eval.py and datasets_utils.py for
the metrics, loss.py for SigLoss, models/__init__.py for the bins, schedulers.py for
WarmupOneCycleLR, train.py for one step under DDP and SyncBatchNorm, transforms.py for the crops and
the test-time flip) and DINOv2's mmcv schedule; metrics and SigLoss from their definitions in
float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from probe_toolkit.analyses import depth as dep
from probe_toolkit.analyses import depth_augment as aug
from probe_toolkit.analyses import depth_published as pub

# ----------------------------------------------------------------------------------------------
# metrics, from their definitions


def _metrics64(truth: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """One image's metrics in float64: truth (H, W) metres, pred (H, W) at the truth's size."""
    h, w = truth.shape
    gt = np.where((truth >= 10) | (truth <= 1e-3), 0.0, truth.astype(np.float64))
    box = np.zeros((h, w), bool)
    box[int(45 / 480 * h) : int(471 / 480 * h), int(41 / 640 * w) : int(601 / 640 * w)] = True  # the Eigen crop, scaled
    valid = box & (gt > 0)
    g, p = gt[valid], np.clip(pred.astype(np.float64), 1e-3, 10)[valid]
    if not g.size:
        return {"silog": 0.0}
    ratio = np.maximum(g / p, p / g)
    e = np.log(g) - np.log(p)
    return {
        "a1": np.mean(ratio < 1.25),
        "a2": np.mean(ratio < 1.25**2),
        "a3": np.mean(ratio < 1.25**3),
        "abs_rel": np.mean(np.abs(g - p) / g),
        "sq_rel": np.mean((g - p) ** 2 / g),
        "rmse": np.sqrt(np.mean((g - p) ** 2)),
        "rmse_log": np.sqrt(np.mean(e**2)),
        "log_10": np.mean(np.abs(np.log10(g) - np.log10(p))),
        "silog": 100 * np.sqrt(np.mean(e**2) - np.mean(e) ** 2),
        "mae": np.mean(np.abs(g - p)),
    }


@pytest.mark.parametrize("shape", [(480, 640), (48, 64), (37, 50)])
def test_metrics_are_the_definitions_on_the_eigen_crop_with_invalid_pixels(shape):
    rng = np.random.default_rng(3)
    truth = rng.uniform(0.5, 9.0, shape).astype(np.float32)
    truth[rng.random(shape) < 0.2] = 0  # no measurement
    truth[rng.random(shape) < 0.05] = 10.0  # at the range's end: ignored
    truth[rng.random(shape) < 0.05] = 12.0  # beyond it
    truth[rng.random(shape) < 0.02] = 5e-4  # below it
    pred = rng.uniform(0.0, 11.0, shape).astype(np.float32)  # outside [1e-3, 10] too: clamped
    got = dep.image_metrics(torch.from_numpy(truth)[None, None], torch.from_numpy(pred)[None, None])
    want = _metrics64(truth, pred)
    assert set(got) == set(pub.METRICS)
    for k in pub.METRICS:
        assert math.isclose(got[k], want[k], rel_tol=2e-5), (k, got[k], want[k])


def test_a_prediction_at_the_patch_grid_is_upsampled_bilinearly_to_the_truth():
    rng = np.random.default_rng(4)
    truth = rng.uniform(1, 8, (48, 64)).astype(np.float32)
    small = torch.from_numpy(rng.uniform(1, 8, (1, 1, 3, 4)).astype(np.float64))
    up = F.interpolate(small, size=(48, 64), mode="bilinear", align_corners=False)[0, 0].numpy()  # float64
    got = dep.image_metrics(torch.from_numpy(truth)[None, None], small.float())
    want = _metrics64(truth, up)
    for k in ("rmse", "abs_rel", "a1", "log_10"):
        assert math.isclose(got[k], want[k], rel_tol=2e-5), k


def test_an_image_without_valid_pixels_counts_silog_zero_and_nothing_else():
    empty = torch.zeros(1, 1, 48, 64)
    got = dep.image_metrics(empty, torch.ones(1, 1, 48, 64))
    assert got["silog"] == 0.0 and all(math.isnan(got[k]) for k in pub.METRICS if k != "silog")  # metrics.py: NaN silog set to 0
    per_image = {k: np.array([np.float32(2.0), got[k]], np.float32) for k in pub.METRICS}
    means = dep.mean_metrics(per_image)
    assert means["rmse"] == 2.0 and means["silog"] == 1.0  # nanmean: the empty image's NaN left out, its silog 0 counted


def test_the_valid_mask_is_the_eigen_box_and_nonzero_truth():
    truth = torch.ones(1, 1, 480, 640)
    truth[0, 0, 100, 100] = 0
    mask = dep.valid_mask(truth)[0, 0].numpy()
    assert mask.sum() == (471 - 45) * (601 - 41) - 1 and mask[45, 41] and not mask[44, 41] and not mask[45, 40] and mask[470, 600]
    assert not mask[471, 600] and not mask[470, 601] and not mask[100, 100]


# ----------------------------------------------------------------------------------------------
# bins, SigLoss and the loss over groups


def test_logits_become_the_mean_of_linear_bins_under_relu_plus_a_tenth():
    x = torch.randn(2, 256, 3, 4, dtype=torch.float64)
    bins = 1e-3 + np.arange(256) * (10 - 1e-3) / 255
    w = np.maximum(x.numpy(), 0) + 0.1
    want = (w / w.sum(1, keepdims=True) * bins[None, :, None, None]).sum(1, keepdims=True)
    assert np.allclose(dep.to_depth(x).numpy(), want, rtol=1e-12)


def _sigloss64(pred: np.ndarray, truth: np.ndarray, warm: bool) -> float:
    valid = truth != 0
    g = np.log(pred[valid].astype(np.float64) + 1e-3) - np.log(truth[valid].astype(np.float64) + 1e-3)
    d = 0.15 * g.mean() ** 2 + (0.0 if warm else g.var(ddof=1))
    return math.sqrt(d)


@pytest.mark.parametrize("warm", [True, False])
def test_sigloss_is_its_definition_over_the_valid_pixels(warm):
    rng = np.random.default_rng(5)
    truth = rng.uniform(0.5, 9, (2, 1, 16, 20)).astype(np.float32)
    truth[:, :, -3:] = 0
    pred = rng.uniform(0.5, 9, truth.shape).astype(np.float32)
    t, p = torch.from_numpy(truth), torch.from_numpy(pred)
    got = float(dep.sigloss(p, t, t != 0, warm))
    assert math.isclose(got, _sigloss64(pred, truth, warm), rel_tol=1e-5)


# ----------------------------------------------------------------------------------------------
# the schedules, written out as the references step them


class _ReferenceOneCycle(torch.optim.lr_scheduler.LRScheduler):
    """dinov3 schedulers.WarmupOneCycleLR as config-nyu.yaml builds it (warmup_ratio 0, cos, use_beta1),
    written out: step_num from _step_count, momentum left at 0 during the warm-up."""

    def __init__(self, optimizer, total_steps, warmup_iters, max_lr):
        self.total_steps, self.warmup_iters = total_steps, warmup_iters
        for group in optimizer.param_groups:
            group["max_lr"], group["min_lr"] = max_lr, max_lr / 25.0 / 1000.0
            group["betas"] = (0.95, *group["betas"][1:])
        super().__init__(optimizer, -1)

    @staticmethod
    def _cos(start, end, pct):
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    def get_lr(self):
        out = []
        for group in self.optimizer.param_groups:
            step = (self._step_count - 1) if self.last_epoch != -1 else 0
            momentum = 0
            if step < self.warmup_iters:
                gmax = group["max_lr"] * (1 + math.cos(math.pi * step / float(self.total_steps))) / 2
                lr = group["max_lr"] / 1000.0 + gmax * step / float(self.warmup_iters)
            else:
                momentum = self._cos(0.85, 0.95, (step - self.warmup_iters) / float(self.total_steps - self.warmup_iters))
                lr = self._cos(group["max_lr"], group["min_lr"], (step + 1) / float(self.total_steps))
            group["betas"] = (momentum, *group["betas"][1:])
            out.append(lr)
        return out


def test_the_onecycle_schedule_is_dinov3s_as_train_py_steps_it():
    w = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([w], lr=3e-4, betas=(0.9, 0.99))
    scheduler = _ReferenceOneCycle(optimizer, 300, 100, 3e-4)
    for step in range(300):
        lr, beta1 = dep.schedule(step, lr=3e-4, iterations=300, warmup=100, kind="onecycle")
        group = optimizer.param_groups[0]
        assert math.isclose(lr, group["lr"], rel_tol=1e-12, abs_tol=1e-18) and math.isclose(beta1, group["betas"][0], abs_tol=1e-15), step
        optimizer.step()
        scheduler.step()
    assert dep.schedule(0, lr=3e-4, iterations=300, warmup=100, kind="onecycle") == (3e-7, 0.0)


def test_the_cosine_schedule_is_mmcvs_with_linear_warmup_and_onecycle_momentum():
    total, warmup, base = 200, 60, 1e-4

    def cos(start, end, factor):  # mmcv lr_updater.annealing_cos
        return end + 0.5 * (start - end) * (math.cos(math.pi * factor) + 1)

    phases = [{"end": float(0.3 * total) - 1, "start_m": 0.95, "end_m": 0.85}, {"end": total - 1, "start_m": 0.85, "end_m": 0.95}]
    for it in range(total):
        regular = cos(base, base * 1e-8, it / total)  # CosineAnnealingLrUpdaterHook(min_lr_ratio=1e-8), by iteration
        lr = regular * (1 - (1 - it / warmup) * (1 - 1e-3)) if it < warmup else regular  # warmup='linear', warmup_ratio=1e-3
        start = 0
        for i, phase in enumerate(phases):  # OneCycleMomentumUpdaterHook.get_momentum
            if it <= phase["end"] or i == len(phases) - 1:
                momentum = cos(phase["start_m"], phase["end_m"], (it - start) / (phase["end"] - start))
                break
            start = phase["end"]
        got = dep.schedule(it, lr=base, iterations=total, warmup=warmup, kind="cosine")
        assert math.isclose(got[0], lr, rel_tol=1e-12) and math.isclose(got[1], momentum, rel_tol=1e-12), it


# ----------------------------------------------------------------------------------------------
# one training step against train.py's under DDP (2 ranks) and SyncBatchNorm


def _blocks(seed: int, b: int, d: int, h: int, w: int, cls: bool):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, d, h, w, generator=g), torch.randn(b, d, generator=g) if cls else None)]


@pytest.mark.parametrize("preset", ["dinov3", "dinov2-lin1"])
def test_one_training_step_is_the_references_under_ddp(preset, monkeypatch):
    monkeypatch.setattr(pub, "CLIP", 0.01)  # so the clipping branch runs on a tiny head
    p = pub.PRESETS[preset]
    d, bins, group = 6, 16, 2
    blocks = _blocks(1, 4, d, 3, 4, p.class_token)
    truth = torch.rand(4, 1, 24, 32, generator=torch.Generator().manual_seed(2)) * 8 + 0.5
    truth[:, :, :3] = 0
    head = dep.DepthHead(d * (2 if p.class_token else 1), p, torch.Generator().manual_seed(0), bins=bins)
    start = {k: v.detach().clone().double() for k, v in head.state_dict().items()}
    lr, beta1 = dep.schedule(7, lr=p.lr, iterations=10, warmup=2, kind=p.schedule)
    optimizer = torch.optim.AdamW(head.parameters(), lr=p.lr, betas=p.betas, weight_decay=p.weight_decay)
    loss = dep.train_step(head, optimizer, blocks, truth, lr, beta1, group, warm=False)

    # the reference, written out in float64: SyncBatchNorm over both ranks' crops, each rank's SigLoss, DDP's mean gradient
    weight = start["conv.weight"].clone().requires_grad_()
    bias = start["conv.bias"].clone().requires_grad_()
    params = [weight, bias]
    patch, cls = blocks[0]
    x = patch.double()
    if p.class_token:
        x = torch.cat([x, cls.double()[:, :, None, None].expand_as(x)], 1)
    x = F.interpolate(x, scale_factor=p.upsample, mode="bilinear", align_corners=False) if p.upsample > 1 else x
    if p.batchnorm:
        gamma, beta = start["bn.weight"].clone().requires_grad_(), start["bn.bias"].clone().requires_grad_()
        params = [gamma, beta, *params]
        mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
        x = (x - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + 1e-5) * gamma[None, :, None, None] + beta[None, :, None, None]
    logits = torch.einsum("bchw,kc->bkhw", x, weight[:, :, 0, 0]) + bias[None, :, None, None]
    wgt = torch.relu(logits) + 0.1
    depth = (wgt / wgt.sum(1, keepdim=True) * torch.linspace(1e-3, 10, bins, dtype=torch.float64)[None, :, None, None]).sum(1, keepdim=True)
    depth = F.interpolate(depth, size=(24, 32), mode="bilinear", align_corners=False)
    t = truth.double()
    losses = []
    for r in range(2):
        v = t[2 * r : 2 * r + 2] != 0
        g = torch.log(depth[2 * r : 2 * r + 2][v] + 1e-3) - torch.log(t[2 * r : 2 * r + 2][v] + 1e-3)
        losses.append(torch.sqrt(g.var() + 0.15 * g.mean() ** 2))
    grads = [sum(gs) / 2 for gs in zip(*(torch.autograd.grad(part, params, retain_graph=True) for part in losses))]
    norm = torch.sqrt(sum((gr**2).sum() for gr in grads))
    if norm > 0.01:  # clip_grad_norm_
        grads = [gr * (0.01 / (norm + 1e-6)) for gr in grads]
    b2 = p.betas[1]
    names = (["bn.weight", "bn.bias"] if p.batchnorm else []) + ["conv.weight", "conv.bias"]
    after = head.state_dict()
    for name, q, gr in zip(names, params, grads):
        m, v2 = (1 - beta1) * gr, (1 - b2) * gr**2
        step = q.detach() * (1 - lr * p.weight_decay) - lr * (m / (1 - beta1)) / (torch.sqrt(v2 / (1 - b2)) + 1e-8)
        assert torch.allclose(after[name].double(), step, rtol=1e-5, atol=1e-9), name
    assert math.isclose(loss, float(sum(losses).detach() / 2), rel_tol=1e-5)
    assert norm > 0.01  # the clip ran
    if p.batchnorm:
        assert torch.allclose(after["bn.running_mean"].double(), 0.1 * patch.double().mean((0, 2, 3)), rtol=1e-5)
        assert torch.allclose(after["bn.running_var"].double(), 0.9 + 0.1 * patch.double().var((0, 2, 3), unbiased=True), rtol=1e-5)


def test_the_sigloss_warmup_keeps_only_the_mean_term_for_100_iterations():
    assert pub.SIGLOSS_WARMUP == 100
    blocks = _blocks(3, 2, 4, 2, 2, False)
    truth = torch.full((2, 1, 8, 8), 3.0)
    p = pub.PRESETS["dinov3"]
    head = dep.DepthHead(4, p, torch.Generator().manual_seed(0), bins=8)
    warm = float(dep.depth_loss(head, blocks, truth, 2, True).detach())
    pred = F.interpolate(dep.to_depth(head(blocks)), size=(8, 8), mode="bilinear", align_corners=False)
    assert math.isclose(warm, _sigloss64(pred.detach().numpy(), truth.numpy(), True), rel_tol=1e-5)


# ----------------------------------------------------------------------------------------------
# the crops, against transforms.py's pipeline run through torchvision's v2 dispatch


def _reference_crop(picture: np.ndarray, depth_mm: np.ndarray, made: aug.Crop, crop: tuple[int, int]):
    """transforms.make_depth_train_transforms (fixed_crop NYU, normalization 1000) with the draws
    ``made`` took, through v2 transforms and a Depth tv_tensor whose rotate kernel is registered as
    transforms.py registers it."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    class Depth(tv_tensors.Mask):
        pass

    @v2.functional.register_kernel(functional="rotate", tv_tensor_cls=Depth)
    def _rotate(dp, angle, *args, **kwargs):
        return tv_tensors.wrap(TF.rotate(dp, angle=angle, interpolation=T.InterpolationMode.NEAREST), like=dp)

    class Rotation(v2.RandomRotation):
        def make_params(self, flat_inputs):
            return {"angle": made.angle}

    class Crop(v2.RandomCrop):
        def make_params(self, flat_inputs):
            return {**super().make_params(flat_inputs), "top": made.box[0], "left": made.box[1], "needs_crop": True}

    h, w = depth_mm.shape
    box = (int(43 / 640 * w), int(45 / 480 * h), int(608 / 640 * w), int(472 / 480 * h))  # NYUCrop
    img = T.ToTensor()(Image.fromarray(picture).crop(box))
    label = Depth(Image.fromarray(depth_mm).crop(box), dtype=torch.uint16)
    label = Depth(label / 1000.0)  # NormalizeDepth
    if made.angle is not None:
        img, label = Rotation(degrees=2.5, interpolation=T.InterpolationMode.BILINEAR)(img, label)
    if made.flipped:
        img, label = v2.RandomHorizontalFlip(p=1.0)(img, label)
    img, label = Crop(crop)(img, label)
    if made.colour is not None:  # ColorAug, as written there
        gamma, brightness, colours = made.colour
        image = img.permute((1, 2, 0)) * 255
        image_aug = image ** np.float64(gamma)
        image_aug = image_aug * np.float64(brightness)
        white = np.ones((image.shape[0], image.shape[1]), dtype=np.float32)
        color_image = np.stack([white * np.float64(colours[i]) for i in range(3)], axis=2)
        image_aug = torch.from_numpy(image_aug.numpy() * color_image)  # float32 tensor × float64 array, as numpy computes it
        img = (torch.clip(image_aug, 0, 255) / 255).permute((2, 0, 1))
    img = v2.Normalize(mean=aug.MEAN, std=aug.STD)(img)
    return img.float(), label.as_subclass(torch.Tensor)


def test_training_crops_are_transforms_pys_pipeline():
    from probe_toolkit.demo.rooms import room

    picture, depth = room(7, (96, 72))
    seen = set()
    for k in range(40):
        made = aug.training_crop(np.random.default_rng([5, k]), picture, depth, aug.Augment(crop=(48, 64)))
        seen.add((made.angle is not None, made.flipped, made.colour is not None))
        img, label = _reference_crop(picture, depth, made, (48, 64))
        assert made.image.dtype == torch.float32 and made.image.shape == (3, 48, 64) and made.depth.shape == (1, 48, 64)
        assert torch.equal(made.depth, label), k
        assert torch.allclose(made.image, img, rtol=0, atol=1e-6), (k, (made.image - img).abs().max())
    assert len(seen) == 8  # every combination of rotation, flip and colour drawn


def test_the_nyu_crop_box_scales_and_truncates_as_nyucrop():
    assert aug.nyu_box(480, 640) == (43, 45, 608, 472)
    assert aug.nyu_box(72, 96) == (6, 6, 91, 70)


# ----------------------------------------------------------------------------------------------
# the test-time flip


def test_the_test_time_flip_is_left_right_flip_aug_with_its_inverse_hook():
    import torchvision.transforms.functional as TF

    p = pub.PRESETS["dinov3"]
    projection = torch.randn(8, 3, generator=torch.Generator().manual_seed(4))

    def features(images):  # a per-patch network: flipping the image flips its patch grid
        pooled = F.avg_pool2d(images, 16)
        return [(torch.einsum("bchw,dc->bdhw", pooled, projection), None)]

    head = dep.DepthHead(8, p, torch.Generator().manual_seed(1), bins=32)
    head.train()
    head(features(torch.randn(4, 3, 32, 48)))  # running statistics other than the initial ones
    image = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(6))
    batch = torch.cat([image, TF.hflip(image)])  # LeftRightFlipAug(flip=True), batched as eval.py does
    head.eval()
    with torch.no_grad():
        out = dep.to_depth(head(features(batch)))
    want = (out[:1] + TF.hflip(out[1:])) / 2  # inverse_tta_hook
    assert torch.allclose(dep.predict_flipped(head, features, image), want, rtol=1e-6)
