"""The pieces of ``probe segment`` against the reference code written out plainly here:
facebookresearch/dinov3 ``dinov3/eval/segmentation`` (transforms.py, inference.py
``slide_inference``, metrics.py, schedulers.py ``WarmupOneCycleLR`` as train.py steps it, loss.py,
models/heads/linear_head.py) and the mmsegmentation 0.x pipeline of DINOv2's linear config (mmcv
``imrescale``, ``PhotoMetricDistortion``, poly schedule with linear warm-up)."""

from __future__ import annotations

import copy
import math

import cv2
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image

from probe_toolkit.analyses import segment as seg
from probe_toolkit.analyses import segment_augment as aug

MEAN = torch.tensor([123.675, 116.28, 103.53])
STD = torch.tensor([58.395, 57.12, 57.375])


def _picture(seed: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    label = rng.integers(0, 6, (h // 8 + 1, w // 8 + 1)).astype(np.uint8).repeat(8, 0).repeat(8, 1)[:h, :w]
    label[:3] = 0
    label[-2:, :5] = 255
    return image, label


# ----------------------------------------------------------------------------------------------
# augmentation: the reference's calls, in the reference's order of draws (its np.random replaced by
# the generator probe is handed, draw for draw)


def _convert(x, alpha=1.0, beta=0.0):
    return np.clip(x.astype(np.float32) * alpha + beta, 0, 255).astype(np.uint8)


def _photometric(rng, a, saturation, hue):
    """PhotoMetricDistortion's steps in the order and with the draws both references make:
    brightness, contrast (before or after the colour steps, by ``mode``), saturation, hue;
    ``saturation(a, factor)`` and ``hue(a, rng)`` are each reference's own colour-space code."""
    if rng.integers(2):
        a = _convert(a, beta=rng.uniform(-32, 32))
    mode = rng.integers(2)
    if mode == 1 and rng.integers(2):
        a = _convert(a, alpha=rng.uniform(0.5, 1.5))
    if rng.integers(2):
        a = saturation(a, rng.uniform(0.5, 1.5))
    if rng.integers(2):
        a = hue(a, rng)
    if mode == 0 and rng.integers(2):
        a = _convert(a, alpha=rng.uniform(0.5, 1.5))
    return a


def _dinov3_reference(rng, image, label, size, crop, photometric):
    ratio = rng.random() * (2.0 - 0.5) + 0.5  # FixedSideResize._random_sample_ratio
    small = int(size * ratio)
    pil = Image.fromarray(image)
    w0, h0 = pil.size
    if h0 > w0:
        new = (int(small * h0 / w0 + 0.5), small)
    else:
        new = (small, int(small * w0 / h0 + 0.5))
    pil = T.Resize(size=new, interpolation=T.InterpolationMode.BILINEAR)(pil)
    mask = T.Resize(size=new, interpolation=T.InterpolationMode.NEAREST)(torch.from_numpy(label)[None])
    img = torch.from_numpy(np.array(pil)).permute(2, 0, 1)  # v2.PILToTensor
    m = mask.clone().long()  # ReduceZeroLabel: preprocess_nonzero_labels
    m[m == 255] += 1
    m -= 1
    m[m == -1] = 255

    def bbox():
        mh, mw = max(img.shape[-2] - crop, 0), max(img.shape[-1] - crop, 0)
        oh, ow = int(rng.integers(0, mh + 1)), int(rng.integers(0, mw + 1))
        return oh, oh + crop, ow, ow + crop

    box = bbox()
    for _ in range(10):
        part = m[:, box[0] : box[1], box[2] : box[3]]
        values, cnt = np.unique(part.numpy(), return_counts=True)
        cnt = cnt[values != 255]
        if len(cnt) > 1 and np.max(cnt) / np.sum(cnt) < 0.75:
            break
        box = bbox()
    img, m = img[:, box[0] : box[1], box[2] : box[3]], m[:, box[0] : box[1], box[2] : box[3]]
    if rng.random() < 0.5:
        img, m = TF.hflip(img), TF.hflip(m)
    if photometric:
        a = _photometric(
            rng,
            img.permute(1, 2, 0).numpy(),
            lambda a, f: TF.adjust_saturation(torch.tensor(a).permute(2, 0, 1), f).permute(1, 2, 0).numpy(),
            lambda a, rng: TF.adjust_hue(torch.tensor(a).permute(2, 0, 1), rng.uniform(-0.5, 0.5)).permute(1, 2, 0).numpy(),
        )
        img = torch.tensor(a.astype(np.float32)).permute(2, 0, 1)
    img = TF.normalize(img.float(), MEAN.tolist(), STD.tolist())
    h, w = img.shape[-2:]
    img = F.pad(img, (0, crop - w, 0, crop - h), value=0)
    m = F.pad(m, (0, crop - w, 0, crop - h), value=255)
    return img, m[0]


def _dinov2_reference(rng, image, label, size, crop):
    ratio = rng.random() * (2.0 - 0.5) + 0.5  # mmseg Resize.random_sample_ratio
    scale = (int(99999999 * ratio), int(size * ratio))
    h0, w0 = label.shape
    factor = min(max(scale) / max(h0, w0), min(scale) / min(h0, w0))  # mmcv.rescale_size
    new = (int(w0 * factor + 0.5), int(h0 * factor + 0.5))
    img = cv2.resize(image, new, interpolation=cv2.INTER_LINEAR)
    m = cv2.resize(label, new, interpolation=cv2.INTER_NEAREST).astype(np.int64)
    m = np.where(m == 0, 256, m) - 1  # LoadAnnotations(reduce_zero_label=True): 0 → 255, 255 stays
    m[m == 254] = 255
    mh, mw = max(m.shape[0] - crop, 0), max(m.shape[1] - crop, 0)

    def bbox():
        oh, ow = int(rng.integers(0, mh + 1)), int(rng.integers(0, mw + 1))
        return oh, ow

    oh, ow = bbox()
    for _ in range(10):
        values, cnt = np.unique(m[oh : oh + crop, ow : ow + crop], return_counts=True)
        cnt = cnt[values != 255]
        if len(cnt) > 1 and np.max(cnt) / np.sum(cnt) < 0.75:
            break
        oh, ow = bbox()
    img, m = img[oh : oh + crop, ow : ow + crop], m[oh : oh + crop, ow : ow + crop]
    if rng.random() < 0.5:
        img, m = img[:, ::-1], m[:, ::-1]
    bgr = np.ascontiguousarray(img[..., ::-1])  # mmseg works on BGR; its HSV is OpenCV's BGR2HSV

    def saturation(bgr, factor):
        hsv = cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)
        hsv[:, :, 1] = _convert(hsv[:, :, 1], alpha=factor)
        return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)

    def hue(bgr, rng):
        hsv = cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)
        hsv[:, :, 0] = (hsv[:, :, 0].astype(int) + rng.integers(-18, 18)) % 180
        return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)

    bgr = _photometric(rng, bgr, saturation, hue)
    rgb = bgr[..., ::-1].astype(np.float32)  # Normalize(to_rgb=True)
    img = torch.from_numpy((rgb - MEAN.numpy()) / STD.numpy()).permute(2, 0, 1)
    h, w = m.shape
    img = F.pad(img, (0, crop - w, 0, crop - h), value=0)
    return img, F.pad(torch.from_numpy(np.ascontiguousarray(m)), (0, crop - w, 0, crop - h), value=255)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [(30, 44), (50, 28)])
def test_dinov3_crops_equal_torchvision_and_pil_as_the_reference_calls_them(seed, shape):
    image, label = _picture(seed, *shape)
    augment = aug.Augment("dinov3", size=24, crop=32)
    ours = aug.training_crop(np.random.default_rng(seed), image, label, augment, reduce_zero=True)
    img, m = _dinov3_reference(np.random.default_rng(seed), image, label, 24, 32, photometric=True)
    assert torch.equal(ours.label, m.long())
    assert torch.allclose(ours.image, img, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_dinov2_crops_equal_mmcv_and_mmseg_as_written_out(seed):
    image, label = _picture(seed, 34, 46)
    augment = aug.Augment("dinov2", size=24, crop=32)
    ours = aug.training_crop(np.random.default_rng(seed), image, label, augment, reduce_zero=True)
    img, m = _dinov2_reference(np.random.default_rng(seed), image, label, 24, 32)
    assert torch.equal(ours.label, m.long())
    assert torch.allclose(ours.image, img.float(), atol=1e-5)


def test_geometry_of_a_crop_larger_than_the_image_pads_with_the_ignore_label():
    image, label = _picture(3, 20, 18)
    ours = aug.training_crop(np.random.default_rng(0), image, label, aug.Augment("dinov3", size=10, crop=40, photometric=False), reduce_zero=False)
    assert ours.short < 20 and ours.box == (0, 0)
    h, w = aug.resized_shape(20, 18, ours.short, "dinov3")
    assert (ours.label[h:] == 255).all() and (ours.label[:, w:] == 255).all() and (ours.image[:, h:] == 0).all()
    assert (ours.label[:h, :w] != 255).any()


# ----------------------------------------------------------------------------------------------
# schedule: WarmupOneCycleLR written out as dinov3's schedulers.py has it, stepped as train.py steps it


class _OneCycle(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, total, warmup, ratio=1e-6):
        self.total, self.warmup, self.ratio = total, warmup, ratio
        for g in optimizer.param_groups:
            g["max_lr"] = g["lr"]
            g["min_lr"] = g["lr"] / 25 / math.inf
            g["lr"] = g["lr"] / math.inf
        super().__init__(optimizer)

    def get_lr(self):
        out = []
        step = (self._step_count - 1) if self.last_epoch != -1 else 0
        for g in self.optimizer.param_groups:
            if step < self.warmup:
                k = (1 - step / self.warmup) * (1 - self.ratio)
                out.append(g["max_lr"] * (1 - k) * (1 - step / self.total))
            else:
                pct = (step + 1) / self.total
                out.append(g["min_lr"] + (g["max_lr"] - g["min_lr"]) / 2 * (math.cos(math.pi * pct) + 1))
        return out


@pytest.mark.parametrize("total,warmup", [(40000, 1500), (60, 2), (7, 0)])
def test_cosine_schedule_equals_dinov3s_scheduler_as_train_py_steps_it(total, warmup):
    optimizer = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = _OneCycle(optimizer, total, warmup)
    steps = list(range(0, total, max(total // 200, 1))) + [total - 1]
    seen = {}
    optimizer.step()  # (no gradient: nothing moves) so that torch does not warn about the order below
    for global_step in range(total):
        seen[global_step] = optimizer.param_groups[0]["lr"]  # the rate optimizer.step() uses at this iteration
        if global_step > 0:
            scheduler.step()
    for s in steps:
        assert math.isclose(seg.learning_rate(s, lr=1e-3, iterations=total, warmup=warmup, decay="cosine"), seen[s], rel_tol=1e-12, abs_tol=1e-18)


def test_poly_schedule_equals_mmcvs_poly_with_linear_warmup():
    for step in (0, 1, 700, 1499, 1500, 1501, 20000, 39999):
        regular = (1e-3 - 0.0) * (1 - step / 40000) ** 1.0 + 0.0
        expected = regular * (1 - (1 - step / 1500) * (1 - 1e-6)) if step < 1500 else regular
        assert math.isclose(seg.learning_rate(step, lr=1e-3, iterations=40000, warmup=1500, decay="poly"), expected, rel_tol=1e-12)
    assert seg.published_warmup(40000) == 1500 and seg.published_warmup(4000) == 150 and seg.published_warmup(3) == 0


# ----------------------------------------------------------------------------------------------
# the head, its loss and one step: the reference's modules (nn.Conv2d, BatchNorm, AdamW, mmseg's
# mean over every pixel)


def _features(images: torch.Tensor) -> torch.Tensor:
    """A stand-in frozen network: 8×8 average pooling and a fixed channel mix (no gradient)."""
    mix = torch.linspace(-1, 1, 3 * 6).reshape(6, 3)
    pooled = F.avg_pool2d(images, 8)
    return torch.einsum("dc,bchw->bdhw", mix, pooled).tanh() + pooled.mean(1, keepdim=True)


def test_one_training_step_equals_the_references_head_loss_and_adamw():
    torch.manual_seed(0)
    head = seg.LinearHead(6, 5, 0.0, torch.Generator().manual_seed(4))
    ref_bn, ref_conv = copy.deepcopy(head.bn), copy.deepcopy(head.conv)
    assert float(head.conv.bias.detach().abs().max()) == 0 and 0.004 < float(head.conv.weight.detach().std()) < 0.02
    images = torch.randn(3, 3, 32, 40)
    target = torch.randint(0, 5, (3, 32, 40))
    target[:, :4] = 255
    optimizer = seg.make_optimizer(head, 1e-3)
    loss = seg.train_step(head, optimizer, _features(images), target, 7e-4)

    params = [*ref_bn.parameters(), *ref_conv.parameters()]
    ref_opt = torch.optim.AdamW(params, lr=7e-4, betas=(0.9, 0.999), weight_decay=1e-3)
    ref_bn.train()
    pred = ref_conv(ref_bn(_features(images)))
    pred = F.interpolate(pred, size=target.shape[-2:], mode="bilinear", align_corners=False)
    per_pixel = F.cross_entropy(pred, target, reduction="none", ignore_index=255)
    ref_loss = per_pixel.sum() / per_pixel.numel()  # weight_reduce_loss: mean over every pixel
    ref_loss.backward()
    torch.nn.utils.clip_grad_norm_(params, float("inf"))
    ref_opt.step()
    assert math.isclose(loss, float(ref_loss), rel_tol=1e-6)
    for ours, ref in (
        (head.conv.weight, ref_conv.weight),
        (head.conv.bias, ref_conv.bias),
        (head.bn.weight, ref_bn.weight),
        (head.bn.running_mean, ref_bn.running_mean),
        (head.bn.running_var, ref_bn.running_var),
    ):
        assert torch.allclose(ours, ref, atol=1e-7)


def test_channel_dropout_drops_whole_channels_and_rescales_the_rest():
    head = seg.LinearHead(64, 3, 0.25, torch.Generator().manual_seed(0))
    head.conv = nn.Identity()
    head.bn = nn.Identity()
    head.train()
    x = torch.ones(4, 64, 3, 5)
    y = head(x, torch.Generator().manual_seed(9))
    per_channel = y[:, :, 0, 0]
    assert ((y == 0) | (y == 1 / 0.75)).all() and (y == y[:, :, :1, :1]).all()  # a channel is dropped whole
    assert 0.1 < float((per_channel == 0).float().mean()) < 0.4
    head.eval()
    assert torch.equal(head(x), x)


# ----------------------------------------------------------------------------------------------
# sliding windows: dinov3 inference.py slide_inference + make_inference, written out


def _slide_reference(x, head, crop, stride, n):
    h_stride = w_stride = stride
    h_crop = w_crop = crop
    _, _, h_img, w_img = x.shape
    if h_crop > h_img and w_crop > w_img:
        h_crop, w_crop = min(h_img, w_img), min(h_img, w_img)
    h_grids = max(h_img - h_crop + h_stride - 1, 0) // h_stride + 1
    w_grids = max(w_img - w_crop + w_stride - 1, 0) // w_stride + 1
    preds = x.new_zeros((1, n, h_img, w_img))
    count = x.new_zeros((1, 1, h_img, w_img))
    head.eval()
    for hi in range(h_grids):
        for wi in range(w_grids):
            y1, x1 = hi * h_stride, wi * w_stride
            y2, x2 = min(y1 + h_crop, h_img), min(x1 + w_crop, w_img)
            y1, x1 = max(y2 - h_crop, 0), max(x2 - w_crop, 0)
            c = x[:, :, y1:y2, x1:x2]
            with torch.no_grad():
                p = F.interpolate(head.conv(head.bn(_features(c))), size=c.shape[2:], mode="bilinear")  # LinearHead.predict
            preds += F.pad(p, (int(x1), int(preds.shape[-1] - x2), int(y1), int(preds.shape[-2] - y2)))
            count[:, :, y1:y2, x1:x2] += 1
    assert (count == 0).sum() == 0
    return preds / count


@pytest.mark.parametrize("shape", [(32, 80), (48, 48), (24, 30), (40, 33)])
def test_sliding_windows_equal_dinov3s_slide_inference(shape):
    head = seg.LinearHead(6, 4, 0.1, torch.Generator().manual_seed(1))
    with torch.no_grad():
        head.bn.running_mean.uniform_(-0.2, 0.2)
        head.bn.running_var.uniform_(0.5, 2)
        head.conv.weight.normal_(0, 1)
    x = torch.randn(1, 3, *shape)
    ours = seg.slide_logits(x, head, _features, 4, crop=32, stride=21, batch=3)
    ref = _slide_reference(x, head, 32, 21, 4)
    assert torch.allclose(ours, ref, atol=1e-5)
    labels = (33, 50)
    expected = F.interpolate(ref, size=labels, mode="bilinear", align_corners=False).softmax(1).argmax(1)[0].numpy()
    assert np.array_equal(seg.predict(x, labels, head, _features, 4, crop=32, stride=21), expected)


def test_windows_of_an_image_smaller_than_the_crop_and_centre_padding():
    assert seg.window_boxes(20, 30, 32, 21) == [(0, 20, 0, 20), (0, 20, 10, 30)]
    assert seg.window_boxes(32, 75, 32, 21) == [(0, 32, 0, 32), (0, 32, 21, 53), (0, 32, 42, 74), (0, 32, 43, 75)]
    padded = seg.center_pad(torch.ones(1, 3, 512, 510), 14)
    assert padded.shape[-2:] == (518, 518) and float(padded[0, 0, :3].abs().sum()) == 0 and float(padded[0, 0, 3:515, 4:514].min()) == 1
    assert seg.center_pad(torch.ones(1, 3, 512, 512), 16).shape[-1] == 512


# ----------------------------------------------------------------------------------------------
# the metric: dinov3 metrics.py calculate_intersect_and_union + total_area_to_metrics, written out


def _areas_reference(pred, label, n, reduce_zero):
    label = torch.from_numpy(label.astype(np.int64))
    pred = torch.from_numpy(pred.astype(np.int64)).float()
    if reduce_zero:
        label = label.clone()
        label[label == 255] += 1
        label -= 1
        label[label == -1] = 255
    mask = label != 255
    pred, label = pred[mask], label[mask]
    inter = pred[pred == label]
    ai = torch.histc(inter.float(), bins=n, min=0, max=n - 1)
    ap = torch.histc(pred.float(), bins=n, min=0, max=n - 1)
    al = torch.histc(label.float(), bins=n, min=0, max=n - 1)
    return torch.stack([ai, ap + al - ai, ap, al])


def test_miou_equals_dinov3s_metric_with_absent_classes_left_out():
    rng = np.random.default_rng(2)
    n = 7
    total = torch.zeros(4, n)
    ours = np.zeros((4, n), np.int64)
    for _ in range(4):
        label = rng.integers(0, 7, (30, 41)).astype(np.uint8)  # after the reduction 0..5: class 6 never labelled
        label[:2] = 255
        pred = rng.integers(0, 5, (30, 41)).astype(np.uint8)  # classes 5 and 6 never predicted
        total += _areas_reference(pred, label, n, reduce_zero=True)
        ours += seg.intersect_union(pred, aug.reduce_zero_label(label), n)
    assert np.array_equal(ours, total.numpy().astype(np.int64))
    iou = total[0] / total[1]
    s = seg.scores(ours)
    assert np.isnan(s.iou[6]) and bool(torch.isnan(iou[6])) and s.iou[5] == 0  # class 5: labelled, never predicted: 0
    assert math.isclose(s.miou, float(iou.nanmean()), rel_tol=1e-6) and math.isclose(s.accuracy, float(total[0].sum() / total[3].sum()), rel_tol=1e-6)
