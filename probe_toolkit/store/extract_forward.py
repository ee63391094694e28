"""The forward pass of ``probe extract``: one view of a run's images through the backbone in
batches, its arrays laid out for the store (NaN where an image has no value), and which images'
values are all finite."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch

from ..infra.errors import ProbeError
from . import arrays, grids, images
from .backbone import AttentionMode, Backbone
from .extract_load import Loaded
from .extract_plan import Settings
from .writer import SharedBuffers


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU when there is one (torchrun's LOCAL_RANK picks which), else the CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ProbeError(None, f"--device {device!r} is not auto, cpu or cuda", "use --device auto")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeError(None, "--device cuda asked for, but no CUDA device is visible", "use --device cpu (or auto)")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return torch.device(device)

def forward_view(backbone: Backbone, pixels: torch.Tensor, view: str, settings: Settings, batch_size: int, device: torch.device, tick: Callable[[int], None],
                 shared: SharedBuffers | None = None) -> dict[str, np.ndarray]:
    """Forward one view of some images in batches; returns the arrays this view contributes.
    ``shared``: each array is copied from the device, batch by batch, into one shared-memory
    tensor of the whole run (taken from ``shared``), which a writing process then reads without
    a copy (``writer.shared_views``); the same values."""
    dtype = getattr(torch, settings.dtype)
    reads = arrays.READS[view]
    parts: dict[str, list[np.ndarray]] = {}
    whole: dict[str, torch.Tensor] = {}
    attention: AttentionMode = settings.attention if "attention" in reads else "none"

    def put(name: str, value: torch.Tensor | None) -> None:
        # torch rounds to float16 as numpy's astype does (nearest even; an overflow becomes inf,
        # which finite_images then refuses), several times faster, and on the device before the copy
        if value is None:
            return
        if shared is None:
            parts.setdefault(name, []).append(value.float().to(dtype).cpu().numpy())
            return
        if name not in whole:
            whole[name] = shared.take((pixels.shape[0], *value.shape[1:]), dtype)
        whole[name][start:start + value.shape[0]].copy_(value.float().to(dtype))

    for start in range(0, pixels.shape[0], batch_size):
        batch = pixels[start:start + batch_size]
        out = backbone.readout(batch.to(device), keys="keys" in reads, attention=attention)
        if "keys" in reads:
            put(f"keys_{view}", out.keys)
            put(f"cls_keys_{view}", out.cls_key)
            put(f"keys_rope_{view}", out.keys_rope)  # DINOv3: after RoPE (None for a position-table network)
        if "tokens" in reads:
            put(f"tokens_{view}", out.tokens)
            put(f"cls_tokens_{view}", out.cls_token)
        put(f"registers_{view}", out.registers)  # every view of a register model (None otherwise)
        if "attention" in reads:
            put(f"attention_{view}", out.attention)
            put(f"attention_blocks_{view}", out.attention_blocks)
        tick(batch.shape[0])
    if shared is not None:
        return {name: values.numpy() for name, values in whole.items()}
    return {name: chunks[0] if len(chunks) == 1 else np.concatenate(chunks) for name, chunks in parts.items()}


def view_data(backbone: Backbone, loaded: Loaded, view: str, plan: dict, n: int, settings: Settings, batch_size: int, device: torch.device, tick,
              shared: SharedBuffers | None = None) -> dict[str, np.ndarray]:
    """One view's arrays for the ``n`` images of a run: NaN rows where an image has no value
    (``shared``: see ``forward_view``)."""
    names = [name for name in plan if grids.view_of(name) == view]
    if view not in images.OWN_SIZE:
        where, pixels = loaded.fixed[view]
        out = forward_view(backbone, pixels, view, settings, batch_size, device, tick, shared) if pixels is not None else {}
        out = {name: values for name, values in out.items() if name in plan}
        if len(where) == n and sorted(out) == sorted(names) and all(out[k].shape == (n, *plan[k][1]) for k in names):
            return out  # every image decoded: the arrays as they come, no NaN-filled copy
        data = {name: np.full((n, *plan[name][1]), np.nan, dtype=settings.dtype) for name in names}
        for name, values in out.items():
            data[name][where] = values
        return data
    data = {name: np.full((n, *plan[name][1]), np.nan, dtype=settings.dtype) for name in names}
    shapes: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
    for i, tensor in loaded.own[view]:
        shapes.setdefault(tuple(tensor.shape), []).append((i, tensor))
    for group in shapes.values():  # one batch shape per grid: images of one size forward together
        where = [i for i, _ in group]
        out = forward_view(backbone, torch.stack([t for _, t in group]), view, settings, batch_size, device, tick)
        for name, values in ((k, v) for k, v in out.items() if k in plan):
            if name.startswith("cls_"):
                data[name][where] = values
            else:
                data[name][where, : values.shape[1]] = values
    return data


def finite_images(data: dict[str, np.ndarray], view: str, rows: np.ndarray, cols: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Images (among ``ok``) whose every value in the valid region of this view is finite."""
    good = ok.copy()
    for name, values in data.items():
        patches = name.startswith(("tokens_", "keys_"))
        if patches and np.any(rows * cols < values.shape[1]):  # padded grids: each image's own region
            for i in np.flatnonzero(good):
                region = values[i, : int(rows[i]) * int(cols[i])]
                good[i] &= region.size > 0 and bool(_finite_rows(region[None])[0])
        else:
            good &= _finite_rows(values) & (rows * cols > 0 if patches else True)
    return good


def _finite_rows(values: np.ndarray) -> np.ndarray:
    """Per image (first axis): every value finite. float16 by its exponent bits (inf and NaN have
    them all set), which reads the attention maps several times faster than ``np.isfinite``."""
    flat = values.reshape(values.shape[0], -1)
    if flat.shape[1] == 0:
        return np.zeros(flat.shape[0], dtype=bool)
    if flat.dtype == np.float16:
        return (flat.view(np.uint16) & 0x7C00).max(axis=1) < 0x7C00
    return np.isfinite(flat).all(axis=1)
