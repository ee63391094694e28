"""NAVI multiview correspondence on frozen patch features, as mbanani/probe3d's
``evaluate_navi_correspondence.py`` computes it (``configs/navi_correspondence.yaml``: ``num_corr``
1000, ``scale_factor`` 0.25; ``evals/datasets/navi.py`` at ``image_size`` 512, ``bbox_crop``;
``evals/utils/correspondence.py``), read there and written anew here.

One image's view (``view``; ``NAVI.get_single``):

1. the image (RGB, /255) normalised with ImageNet's mean and std, its depth map (16-bit disparity
   d: depth = 65535 · 10 / d mm, 0 where d = 0) in metres; both resized to short side 512 (torch's
   nearest, on the normalised float image) and centre-cropped to 512 × 512 (torchvision's
   ``Resize(512, NEAREST)``, ``CenterCrop(512)``);
2. the camera: focal f = focal_length · 512 / min(original height, width), principal point at
   the centre; every pixel's 3-D point in the camera's frame, K⁻¹ · depth · (u + ½, v + ½, 1);
3. ``bbox_crop``: the box of the object's pixels (depth > 0) grown to a square about its centre (or,
   where that leaves the image, from its top-left moved back by the padding and clipped at 0), cut
   from image, depth and points, each resized to 512 × 512 by OpenCV's nearest neighbour
   (albumentations' ``Resize(interpolation=0)``); the focal becomes f · 512 / (the square's side).

A pair (``estimate_correspondence_xyz``): the points downsampled ×0.25 (torch's nearest: every
fourth pixel, 128 × 128), the features (the last block's patch tokens, before any final norm; a
/14 network's 512 px input zero-padded about the centre to 518) upsampled bicubically to 128 ×
128; only the object's pixels (z > 0) kept. Each source pixel's two nearest target pixels by cosine
(unit features; the reference's faiss ``IndexFlatL2``), weight 1 − d₁/d₂ of their cosine
distances (each clamped at 1e-9: the ratio test), and the ``num_corr`` source pixels of largest
weight matched to their nearest target. Errors: the source point moved into the target camera
by R₀₁ = Rt₁ Rt₀⁻¹ against the matched target point (3-D, metres), and both projected with the
target's focal (2-D, pixels of the 512 view). Recall at 1, 2, 5 cm and 5, 25, 50 px over every
correspondence of every pair; each pair's recall at 2 cm averaged within the relative-rotation
bins [0°, 30°), [30°, 60°), [60°, 90°), [90°, 120°) (``compute_binned_performance``).

What differs, on purpose: the nearest neighbours are exact (L2 distances of the float32 unit features
in float64; equal distances to the lower target index) where faiss computes them in float32; equal
weights keep the lower source index where ``torch.topk`` leaves ties open; a pair whose object covers
fewer than ``num_corr`` pixels at 128 × 128 keeps all of them (the reference's ``torch.stack`` of
the pairs fails on it). Pure torch and numpy over arrays; files, networks and panels are the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SIDE = 512  # evals/datasets/navi.py: image_size = (512, 512)
SCALE = 0.25  # configs/navi_correspondence.yaml scale_factor
NUM_CORR = 1000  # configs/navi_correspondence.yaml num_corr
CM = (0.01, 0.02, 0.05)  # evaluate_navi_correspondence.py metric_thresh (metres)
PX = (5, 25, 50)  # px_thresh
BIN_THRESHOLD = 0.02  # rec_2cm: the recall the bins average
BINS = (0, 30, 60, 90, 120)  # compute_binned_performance's edges (degrees)
MEAN = (0.485, 0.456, 0.406)  # get_navi_transforms(image_mean="imagenet")
STD = (0.229, 0.224, 0.225)
DISPARITY = 65535 * 10.0  # read_depth: disparity = value / (2**16 - 1) / scale_factor 10


@dataclass
class View:
    """One image as the network and the scorer see it: ``image`` (3, S, S) normalised float32,
    ``points`` (3, S, S) float32 camera-frame points in metres (0 off the object), ``focal`` the
    512 view's focal length in pixels, ``box`` (top, left, side) of the square cut from the 512 crop."""

    image: np.ndarray
    points: np.ndarray
    focal: float
    box: tuple[int, int, int]


def _short_side(tensor, side: int):
    """torchvision ``Resize(side, NEAREST)`` then ``CenterCrop(side)`` of a (C, H, W) float tensor."""
    import torch.nn.functional as F

    h, w = tensor.shape[-2:]
    size = (side, int(side * w / h)) if h <= w else (int(side * h / w), side)
    if (h, w) != size:
        tensor = F.interpolate(tensor[None], size=size, mode="nearest")[0]
    top, left = int(round((size[0] - side) / 2.0)), int(round((size[1] - side) / 2.0))
    return tensor[:, top : top + side, left : left + side]


def depth_metres(disparity: np.ndarray) -> np.ndarray:
    """``read_depth(path) / 1000``: float32 metres from the 16-bit map, 0 where it is 0."""
    d = np.asarray(disparity).astype(np.uint16).astype(np.float32) / np.float32(DISPARITY)
    with np.errstate(divide="ignore"):
        d[d == 0] = np.inf
        return (np.float32(1) / d) / np.float32(1000)


def square_box(mask: np.ndarray) -> tuple[int, int, int]:
    """``bbox_crop``'s square (top, left, side) of a (H, W) object mask."""
    ys, xs = np.nonzero(mask)
    tl, br = np.array([ys.min(), xs.min()]), np.array([ys.max(), xs.max()])
    box = br - tl
    side = int(box.max())
    if side > min(mask.shape):
        raise ValueError("the object's box is wider than the image is high (aspect ratio prevents square crop)")
    pad = side - box
    centred = tl - pad // 2
    if (centred >= 0).all() and (centred + side <= np.array(mask.shape)).all():
        return int(centred[0]), int(centred[1]), side
    far = np.clip(tl - pad, 0, None)
    return int(far[0]), int(far[1]), side


def view(rgb: np.ndarray, disparity: np.ndarray, focal_length: float, original: tuple[int, int], side: int = SIDE) -> View:
    """``rgb`` (H, W, 3) uint8 and ``disparity`` (H, W) uint16 of one image, its annotation's focal
    length and original (height, width) → its ``View``."""
    import cv2
    import torch

    image = torch.from_numpy(np.array(rgb, np.uint8)).permute(2, 0, 1).float().div(255)
    image = (image - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    image = _short_side(image, side)
    depth = _short_side(torch.from_numpy(depth_metres(disparity))[None], side)
    f = focal_length * min(side, side) / min(original)
    k = torch.eye(3)
    k[0, 0], k[1, 1], k[0, 2], k[1, 2] = f, f, 0.5 * side, 0.5 * side
    centres = torch.arange(side, dtype=torch.float32) + 0.5  # torch.linspace(0.5, side - 0.5, side)
    uv1 = torch.stack((centres.view(1, side).repeat(side, 1), centres.view(side, 1).repeat(1, side), torch.ones(side, side)))
    points = (k.inverse() @ (depth * uv1).view(3, side * side)).view(3, side, side)
    if not bool((depth > 0).any()):
        raise ValueError("the depth map holds no object pixel inside the 512 crop")
    top, left, cut = square_box((depth[0] > 0).numpy())

    def resized(t) -> np.ndarray:  # albumentations Resize(side, side, interpolation=0): cv2 nearest on (H, W, C)
        hwc = t[:, top : top + cut, left : left + cut].permute(1, 2, 0).numpy()
        out = cv2.resize(np.ascontiguousarray(hwc), (side, side), interpolation=cv2.INTER_NEAREST)
        return (out[..., None] if out.ndim == 2 else out).transpose(2, 0, 1)

    return View(np.ascontiguousarray(resized(image)), np.ascontiguousarray(resized(points)), f * min(side, side) / cut, (top, left, cut))


def padded(image, patch: int):
    """probe3d's ``center_padding``: zeros about the centre up to whole patches (a (3, H, W) tensor)."""
    import torch.nn.functional as F

    h, w = image.shape[-2:]
    if h % patch == 0 and w % patch == 0:
        return image
    ph, pw = patch - h % patch, patch - w % patch
    return F.pad(image, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))


@dataclass
class Matches:
    """A pair's correspondences: source and target points (m), their pixels in the 512 view, the weights."""

    source: np.ndarray  # (n, 3)
    target: np.ndarray  # (n, 3)
    source_uv: np.ndarray  # (n, 2)
    target_uv: np.ndarray  # (n, 2)
    weight: np.ndarray  # (n,)


def match(feat0, feat1, points0: np.ndarray, points1: np.ndarray, num_corr: int = NUM_CORR, scale: float = SCALE) -> Matches:
    """``estimate_correspondence_xyz`` at ``scale``: ``feat*`` (D, h, w) tensors, ``points*`` (3, S, S)."""
    import torch
    import torch.nn.functional as F

    step = int(round(1 / scale))
    p0, p1 = torch.from_numpy(points0[:, ::step, ::step]), torch.from_numpy(points1[:, ::step, ::step])  # F.interpolate(scale_factor=scale, nearest)
    h, w = p0.shape[-2:]
    f0 = F.interpolate(torch.as_tensor(feat0)[None].float(), size=(h, w), mode="bicubic")[0]
    f1 = F.interpolate(torch.as_tensor(feat1)[None].float(), size=(h, w), mode="bicubic")[0]
    centres = torch.arange(h, dtype=torch.float32) + 0.5
    uv = torch.stack(torch.meshgrid(centres, centres, indexing="xy"), dim=-1)  # (h, w, 2): x then y
    keep0, keep1 = p0[2] > 0, p1[2] > 0
    x = F.normalize(f0.permute(1, 2, 0)[keep0], dim=-1)
    y = F.normalize(f1.permute(1, 2, 0)[keep1], dim=-1)
    if len(x) == 0 or len(y) < 2:
        raise ValueError("an object covers fewer than two pixels at the matching resolution")
    order = nearest_two(x.numpy(), y.numpy())
    nearest = torch.from_numpy(order)
    distances = 1 - F.cosine_similarity(y[nearest], x[:, None, :], dim=-1)
    distances = distances.clamp(min=1e-9)
    weight = (1 - distances[:, 0] / distances[:, 1].clamp(min=1e-9)).numpy()
    chosen = np.lexsort((np.arange(len(weight)), -weight))[: min(num_corr, len(weight))]
    target = order[chosen, 0]
    return Matches(
        p0.permute(1, 2, 0)[keep0].numpy()[chosen],
        p1.permute(1, 2, 0)[keep1].numpy()[target],
        uv[keep0].numpy()[chosen] / scale,
        uv[keep1].numpy()[target] / scale,
        weight[chosen],
    )


def nearest_two(x: np.ndarray, y: np.ndarray, block: int = 1024) -> np.ndarray:
    """(n, 2) indices of each row of ``x``'s two nearest rows of ``y`` by L2 distance (faiss ``IndexFlatL2``'s
    search, exactly: ‖y‖² − 2 x·y in float64, blocks of ``block`` rows; equal distances to the lower index)."""
    y64 = y.astype(np.float64)
    norms = (y64 * y64).sum(1)
    out = np.empty((len(x), 2), np.int64)
    for a in range(0, len(x), block):
        d = norms[None, :] - 2.0 * (x[a : a + block].astype(np.float64) @ y64.T)
        first = d.argmin(axis=1)  # the first of equal minima: the lower index
        d[np.arange(len(d)), first] = np.inf
        out[a : a + block, 0], out[a : a + block, 1] = first, d.argmin(axis=1)
    return out


def relative(camera0, camera1):
    """Rt₀₁ = Rt₁ · Rt₀⁻¹ (3 × 4, float32), the source camera's frame to the target's."""
    return (camera1 @ camera0.inverse()).float()[:3, :4]


def errors(matches: Matches, rt01, focal: float) -> tuple[np.ndarray, np.ndarray]:
    """(3-D error in metres, 2-D error in pixels) of every correspondence (``transform_points_Rt``,
    ``project_3dto2d`` with K = diag(f, f, 1))."""
    import torch

    x0, x1 = torch.from_numpy(matches.source), torch.from_numpy(matches.target)
    moved = x0 @ rt01[:3, :3].transpose(-2, -1) + rt01[None, :3, 3]
    k = torch.eye(3)
    k[:2] = focal * k[:2]

    def project(xyz):
        uvd = xyz @ k.transpose(-1, -2)
        return uvd[:, :2] / uvd[:, 2:3].clamp(min=1e-9)

    return (moved - x1).norm(p=2, dim=1).numpy(), (project(moved) - project(x1)).norm(p=2, dim=1).numpy()


def rotation_angle(rt01) -> float:
    """``so3_rotation_angle`` in degrees (acos((trace − 1) / 2), clamped)."""
    import torch

    r = rt01[:3, :3]
    trace = r[0, 0] + r[1, 1] + r[2, 2]
    if not -1.0 - 1e-4 <= float(trace) <= 3.0 + 1e-4:
        raise ValueError("a relative rotation's trace lies outside [-1, 3]")
    return float(torch.acos(((trace - 1.0) * 0.5).clamp(min=-1, max=1)) * 180.0 / math.pi)


def recall(errors: np.ndarray, threshold: float) -> float:
    """Percentage of errors below ``threshold`` (``100 * (err < th).float().mean()``); NaN when none."""
    import torch

    e = torch.as_tensor(np.asarray(errors, np.float32))
    return float("nan") if e.numel() == 0 else float(100 * (e < threshold).float().mean())


def binned(per_pair: np.ndarray, angles: np.ndarray, edges=BINS) -> np.ndarray:
    """``compute_binned_performance``: the mean of ``per_pair`` within each [edge, next edge) of ``angles`` (NaN where empty)."""
    import torch

    y, x = torch.as_tensor(np.asarray(per_pair, np.float32)), torch.as_tensor(np.asarray(angles, np.float32))
    return np.array([float(y[(x >= lo) & (x < hi)].mean()) for lo, hi in zip(edges[:-1], edges[1:])])
