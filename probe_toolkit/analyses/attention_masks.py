"""DINO's attention masks: per head, the smallest set of patches holding 60 % of an attention row.

The rule of facebookresearch/dino ``visualize_attention.py``: the last block's attention of the
class token over the patches (``attn[0, :, 0, 1:]``), renormalised over the patches; sorted
ascending, cumulative sum, a patch is kept where the cumulative sum exceeds 1 − mass (mass 0.6);
unsorted back onto the grid; nearest-upsampled by the patch size. The sort here is stable (equal
weights keep grid order), where the script's ``torch.sort`` leaves ties unspecified.

Which row, for networks without a class token:

- ``aggregation``: SelfPatch's aggregation head (``ca_head``), its last class-attention block's
  attention of the learned query over the patch tokens (the query's weight on itself dropped,
  the rest renormalised) — the head that summarises the image in SelfPatch;
- ``mean``: the mean of the patch rows (every patch's row, averaged), when there is no such head.

Jaccard against the ground truth, two averages (the paper's Figure 4 numbers, 45.9 for DINO
ViT-S/16 on PASCAL VOC12, come from private code described in dino issue #54):

- ``per_object`` (issue #54's rule): for each object, the IoU with every head's mask, the best
  head taken per object; averaged over the image's objects, then over images;
- ``union``: each head's mask against the union of the image's object masks (per head), and the
  best head per image; averaged over images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # only SelfPatch's aggregation head computes with torch
    import torch


def class_rows(attention: np.ndarray, prefix: int = 1) -> np.ndarray:
    """(..., head, T, T) attention with the class token at 0 → (..., head, N) its row over the patches, renormalised
    (``prefix``: tokens before the patches, 1 + DINOv2's registers, whose keys are left out like the class token's)."""
    rows = np.asarray(attention, dtype=np.float64)[..., 0, prefix:]
    return rows / rows.sum(-1, keepdims=True)


def mean_patch_rows(attention: np.ndarray, prefix: int = 0) -> np.ndarray:
    """(..., head, T, T) → (..., head, N): the mean of the patch rows over the patch keys, renormalised."""
    rows = np.asarray(attention, dtype=np.float64)[..., prefix:, prefix:].mean(-2)
    return rows / rows.sum(-1, keepdims=True)


def aggregation_rows(tokens: np.ndarray, head: dict[str, torch.Tensor], heads: int) -> np.ndarray:
    """(image, N, D) backbone tokens → (image, head, N): SelfPatch ``ca_head``'s last block's class attention.

    Each class-attention block: u = norm1([c, t]); q from u[0] only, scaled by d^-½; k, v from
    all of u; softmax over 1 + N; c += proj(attn v); c += mlp(norm2(c)). The tokens are not updated.
    """
    import torch

    t = torch.as_tensor(np.asarray(tokens, dtype=np.float32))
    b, n, d = t.shape
    blocks = sorted({int(k.split(".")[1]) for k in head if k.startswith("cls_blocks.")})
    c = head["cls_token"].float().expand(b, 1, d)
    scale = (d // heads) ** -0.5

    def lin(x, name):
        return torch.nn.functional.linear(x, head[name + ".weight"], head[name + ".bias"])

    def norm(x, name):
        return torch.nn.functional.layer_norm(x, (d,), head[name + ".weight"], head[name + ".bias"], eps=1e-6)

    attn = None
    with torch.no_grad():
        for i in blocks:
            p = f"cls_blocks.{i}."
            u = norm(torch.cat([c, t], dim=1), p + "norm1")
            q = lin(u[:, :1], p + "attn.q").reshape(b, 1, heads, d // heads).permute(0, 2, 1, 3) * scale
            k = lin(u, p + "attn.k").reshape(b, n + 1, heads, d // heads).permute(0, 2, 1, 3)
            v = lin(u, p + "attn.v").reshape(b, n + 1, heads, d // heads).permute(0, 2, 1, 3)
            attn = (q @ k.transpose(-2, -1)).softmax(-1)  # (b, heads, 1, 1 + n)
            x = (attn @ v).transpose(1, 2).reshape(b, 1, d)
            c = c + lin(x, p + "attn.proj")
            h = norm(c, p + "norm2")
            c = c + lin(torch.nn.functional.gelu(lin(h, p + "mlp.fc1")), p + "mlp.fc2")
    rows = attn[:, :, 0, 1:].double().numpy()
    return rows / rows.sum(-1, keepdims=True)


def mass_masks(rows: np.ndarray, mass: float) -> np.ndarray:
    """(..., N) rows → (..., N) bool: the patches whose ascending cumulative share exceeds 1 − mass."""
    rows = np.asarray(rows, dtype=np.float64)
    order = np.argsort(rows, axis=-1, kind="stable")
    ranked = np.take_along_axis(rows, order, -1)
    keep = np.cumsum(ranked / ranked.sum(-1, keepdims=True), axis=-1) > (1.0 - mass)
    out = np.zeros_like(keep)
    np.put_along_axis(out, order, keep, -1)
    return out


def upsample(masks: np.ndarray, rows: int, cols: int, patch: int) -> np.ndarray:
    """(..., rows·cols) bool → (..., rows·patch, cols·patch): nearest, each patch a patch × patch block."""
    grid = np.asarray(masks, dtype=bool).reshape(*masks.shape[:-1], rows, cols)
    return grid.repeat(patch, -2).repeat(patch, -1)


@dataclass
class ImageJaccard:
    union: np.ndarray  # (head,) IoU of each head's mask with the union of the objects
    best_union: float
    per_object: float  # dino #54: mean over objects of the best head's IoU


def jaccard(head_masks: np.ndarray, objects: np.ndarray) -> ImageJaccard:
    """(head, H, W) bool masks against (object, H, W) bool ground truth (at least one object)."""
    m = np.asarray(head_masks, dtype=bool).reshape(head_masks.shape[0], -1)
    o = np.asarray(objects, dtype=bool).reshape(objects.shape[0], -1)
    union_gt = o.any(0)

    def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # (x, P) vs (y, P) → (x, y)
        inter = a.astype(np.int64) @ b.T.astype(np.int64)
        union = a.sum(1)[:, None] + b.sum(1)[None, :] - inter
        return np.where(union > 0, inter / np.maximum(union, 1), 0.0)

    per_head = iou(m, union_gt[None])[:, 0]
    per_object = iou(m, o).max(0).mean()
    return ImageJaccard(per_head, float(per_head.max()), float(per_object))


def prefix_mass(attention: np.ndarray, prefix: int) -> np.ndarray:
    """(..., head, T, T) → (..., head, prefix, prefix + 1): where each prefix token (the class token,
    then the storage or register tokens) looks: its attention on each prefix token, and (last) on
    all the patches together. Each row sums to 1."""
    rows = np.asarray(attention, dtype=np.float64)[..., :prefix, :]
    return np.concatenate([rows[..., :prefix], rows[..., prefix:].sum(-1, keepdims=True)], axis=-1)


def storage_rows(attention: np.ndarray, prefix: int) -> np.ndarray:
    """(..., head, T, T) → (..., prefix - 1, head, N): each storage (register) token's row over the
    patches, renormalised, as ``class_rows`` takes the class token's."""
    rows = np.asarray(attention, dtype=np.float64)[..., 1:prefix, prefix:]
    return np.moveaxis(rows / rows.sum(-1, keepdims=True), -2, -3)


def looks(prefix_masses: np.ndarray, masks: np.ndarray) -> dict[str, np.ndarray]:
    """Means over images and heads: each prefix token's share on the class token, on the storage
    tokens together and on the patches ((prefix,) each), and its mask's share of the patches.
    ``prefix_masses`` (image, head, prefix, prefix + 1); ``masks`` (image, prefix, head, N) bool."""
    m = np.asarray(prefix_masses, dtype=np.float64).mean((0, 1))
    return {"on_class": m[:, 0], "on_storage": m[:, 1:-1].sum(-1), "on_patches": m[:, -1], "mask_share": np.asarray(masks, dtype=np.float64).mean((0, 2, 3))}


def masks_block(values: np.ndarray, *, row: str, head: dict[str, torch.Tensor] | None, heads: int, prefix: int, mass: float) -> dict[str, np.ndarray]:
    """A block of images' stored arrays → ``{"mask": (image, head, N) uint8}``: the unit the runner
    ships to a worker (attention (image, head, T, T) for ``cls``/``mean``, tokens (image, N, D)
    for ``aggregation``). With storage (register) tokens and the class row, also each storage
    token's masks (``storage_mask``, (image, storage, head, N)) and where every prefix token looks
    (``prefix_mass``, (image, head, prefix, prefix + 1))."""
    values = np.asarray(values, dtype=np.float32)
    if row == "cls":
        rows = class_rows(values, prefix)
        if prefix > 1:
            return {
                "mask": mass_masks(rows, mass).astype(np.uint8),
                "storage_mask": mass_masks(storage_rows(values, prefix), mass).astype(np.uint8),
                "prefix_mass": prefix_mass(values, prefix).astype(np.float32),
            }
    elif row == "aggregation":
        from ..infra.runner import torch_threads

        with torch_threads(1):  # one torch thread on a worker
            rows = aggregation_rows(values, head, heads)
    else:
        rows = mean_patch_rows(values, prefix)
    return {"mask": mass_masks(rows, mass).astype(np.uint8)}
