"""LOST and DSM on torch: a batch of images at once, on the CPU or a GPU (``--backend torch``),
with the scipy path's answers (``analyses/lost.py``, ``analyses/dsm.py``; read them first).

The costly steps run batched on the device in float64: LOST's dot products K Kᵀ, each patch's
degree and the seed's expansion; DSM's affinity, its normalised matrix and a batched dense
``eigh``. The rules that decide the mask run on the CPU, in the scipy path's own functions: LOST's
order of equal degrees (``lost.seed_and_potentials``, its torch.argsort order emulated) and the
seed's component (``lost.result``); DSM's sign rule, mask and flag (``dsm.oriented``).

The same certificate as the scipy path, and one more where two libraries could decide otherwise:
LOST decides signs of dot products (A_ij > 0, M_j > 0), which two float64 sums of the same
numbers (BLAS here and there) give alike unless the value lies within their rounding of zero, so
an image with such a value among those it decides is flagged ``degenerate``; DSM's flag is its
own (λ₃ − λ₂ below ``gap_tol``), and its mask, {v₁ > 0}, is the scipy path's wherever no entry of
v₁ lies within an eigensolver's rounding of zero (the tests hold the two paths to each other).
"""

from __future__ import annotations

import numpy as np
import torch

from .decoder import ImageMasks, dsm_masks, lost_masks
from .decoder_settings import Settings
from .dsm import oriented
from .lost import result, seed_and_potentials

EPS64 = float(np.finfo(np.float64).eps)


def decode_single_batch(keys: np.ndarray, settings: Settings, device: torch.device, grid: tuple[int, int]) -> list[ImageMasks]:
    """LOST's or DSM's mask of every image of ``keys`` (image, rows·cols, channel)."""
    x = torch.from_numpy(np.asarray(keys, dtype=np.float64)).to(device)
    if settings.center:
        x = x - x.mean(dim=1, keepdim=True)
    if settings.rule == "lost":
        return _lost(x, settings, grid)
    return _dsm(x, settings, grid)


def _lost(keys: torch.Tensor, settings: Settings, grid: tuple[int, int]) -> list[ImageMasks]:
    b, n, c = keys.shape
    a = torch.bmm(keys, keys.transpose(1, 2))
    norm = keys.norm(dim=2)
    band = 2.0 * (c + 2) * EPS64 * norm[:, :, None] * norm[:, None, :]  # where two float64 dot products may differ in sign
    off = ~torch.eye(n, dtype=torch.bool, device=keys.device)
    degree = ((a > 0) & off).sum(dim=2).cpu().numpy()
    near = ((a.abs() <= band) & off).any(dim=2).any(dim=1).cpu().numpy()
    out = []
    for i in range(b):
        seed, potentials = seed_and_potentials(degree[i], settings.k_patches, settings.ties)
        row = a[i, seed, torch.from_numpy(potentials).to(keys.device)]
        similar = torch.from_numpy(potentials).to(keys.device)[row > 0]
        expansion = a[i, similar].sum(dim=0)
        reach = (len(similar) + c + 2) * EPS64 * norm[i, similar].sum() * norm[i]  # M_j's rounding
        r = result(expansion.cpu().numpy(), seed, degree[i], grid)
        masks = lost_masks(r)
        masks.degenerate |= bool(near[i]) or bool((expansion.abs() <= reach).any())
        out.append(masks)
    return out


def _dsm(keys: torch.Tensor, settings: Settings, grid: tuple[int, int]) -> list[ImageMasks]:
    norm = keys.norm(dim=2, keepdim=True)
    f = torch.where(norm > 0, keys / torch.where(norm > 0, norm, 1.0), 0.0)
    w = torch.bmm(f, f.transpose(1, 2)).clamp(min=0)
    top = w.amax(dim=(1, 2), keepdim=True)
    w = torch.where(top > 0, w / torch.where(top > 0, top, 1.0), w)
    d = w.sum(dim=2)
    d = torch.where(d < 1e-12, 1.0, d)
    scale = d.rsqrt()
    normal = scale[:, :, None] * w * scale[:, None, :]
    mu, y = torch.linalg.eigh(normal)
    lam = (1.0 - mu[:, -3:].flip(-1)).cpu().numpy()  # λ₁ ≤ λ₂ ≤ λ₃
    v = (scale * y[:, :, -2]).cpu().numpy()
    return [dsm_masks(oriented(v[i], lam[i], grid, settings.gap_tol)) for i in range(len(v))]
