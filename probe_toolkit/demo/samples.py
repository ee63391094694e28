"""Checkpoints made on the spot, in the exact released layouts, from random weights.

They let the pipeline run with no download (the README's first command, the tests): the same
keys, prefixes, heads, ``args`` and loss centres as DINO's and SelfPatch's files, at ViT-S/16
size or at a tiny width and depth that runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from ..store.backbone import VIT_S16, Arch, build_vit
from ..store.checkpoints import save_state

TINY = Arch(width=128, depth=2, heads=2, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=512)
LAYOUTS = ("dino-backbone", "selfpatch-backbone", "dino-full", "selfpatch-full", "dino-full-wrapped", "selfpatch-backbone-wrapped")
ARCHS = {"tiny": TINY, "vit-s16": VIT_S16}


def random_backbone(arch: Arch, seed: int = 0) -> dict[str, torch.Tensor]:
    """timm's own initialisation (trunc-normal 0.02), made non-trivial in norms and biases."""
    torch.manual_seed(seed)
    state = build_vit(arch).state_dict()
    generator = torch.Generator().manual_seed(seed + 1)
    for key, value in state.items():
        if key.endswith(".bias") or "norm" in key:
            value.add_(0.05 * torch.randn(value.shape, generator=generator))
    return state


def dino_head(width: int, out: int, hidden: int, bottleneck: int, seed: int) -> dict[str, torch.Tensor]:
    """DINOHead's keys (mlp.0/2/4, weight-normed last_layer as weight_g / weight_v)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "mlp.0.weight": (hidden, width), "mlp.0.bias": (hidden,),
        "mlp.2.weight": (hidden, hidden), "mlp.2.bias": (hidden,),
        "mlp.4.weight": (bottleneck, hidden), "mlp.4.bias": (bottleneck,),
        "last_layer.weight_v": (out, bottleneck),
    }
    head = {k: 0.02 * torch.randn(s, generator=g) for k, s in shapes.items()}
    head["last_layer.weight_g"] = torch.ones(out, 1)
    return head


def aggregation_head(width: int, mlp_hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """SelfPatch's ``ca_head``: query token, 2 class-attention blocks with separate q/k/v, final norm."""
    g = torch.Generator().manual_seed(seed)
    head = {"cls_token": 0.02 * torch.randn(1, 1, width, generator=g)}
    for i in range(2):
        p = f"cls_blocks.{i}."
        for norm in ("norm1", "norm2"):
            head[p + norm + ".weight"] = torch.ones(width)
            head[p + norm + ".bias"] = torch.zeros(width)
        for lin in ("q", "k", "v", "proj"):
            head[p + f"attn.{lin}.weight"] = 0.02 * torch.randn(width, width, generator=g)
            head[p + f"attn.{lin}.bias"] = torch.zeros(width)
        head[p + "mlp.fc1.weight"] = 0.02 * torch.randn(mlp_hidden, width, generator=g)
        head[p + "mlp.fc1.bias"] = torch.zeros(mlp_hidden)
        head[p + "mlp.fc2.weight"] = 0.02 * torch.randn(width, mlp_hidden, generator=g)
        head[p + "mlp.fc2.bias"] = torch.zeros(width)
    head["norm.weight"] = torch.ones(width)
    head["norm.bias"] = torch.zeros(width)
    return head


def _prefixed(parts: dict[str, dict[str, torch.Tensor]], prefix: str = "") -> dict[str, torch.Tensor]:
    return {f"{prefix}{name}.{k}": v.clone() for name, part in parts.items() for k, v in part.items()}


def make_checkpoint(layout: str, arch: Arch = TINY, seed: int = 0) -> dict:
    """The object a released file of ``layout`` holds (DINO backbone layouts keep the class token)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    selfpatch = layout.startswith("selfpatch")
    arch = replace(arch, class_token=not selfpatch, final_norm=not selfpatch)
    teacher = random_backbone(arch, seed)
    student = random_backbone(arch, seed + 100)
    small = arch.width < 384
    out, pout = (256, 64) if small else (65536, 4096)
    hidden, bottleneck = (256, 64) if small else (2048, 256)
    if layout in ("dino-backbone", "selfpatch-backbone"):
        return teacher
    if layout == "selfpatch-backbone-wrapped":
        return {"state_dict": teacher}
    if selfpatch:
        def heads(s: int) -> dict[str, dict[str, torch.Tensor]]:
            return {
                "ca_head": aggregation_head(arch.width, arch.mlp_hidden, s),
                "c_head": dino_head(arch.width, out, hidden, bottleneck, s + 1),
                "p_head": dino_head(arch.width, pout, hidden, bottleneck, s + 2),
            }
        loss = {"center": torch.zeros(1, 1, out), "patch_center": torch.zeros(1, pout)}
        arch_name = "vit_small"
    else:
        def heads(s: int) -> dict[str, dict[str, torch.Tensor]]:
            return {"head": dino_head(arch.width, out, hidden, bottleneck, s)}
        loss = {"center": torch.zeros(1, out)}
        arch_name = "vit_small"
    full = {
        "student": _prefixed({"backbone": student, **heads(seed + 200)}, "module."),
        "teacher": _prefixed({"backbone": teacher, **heads(seed + 300)}),
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.0, "weight_decay": 0.04, "params": []}]},
        "epoch": 100,
        "args": argparse.Namespace(arch=arch_name, patch_size=arch.patch, out_dim=out, momentum_teacher=0.996),
        "dino_loss": loss,
    }
    return {"model": full} if layout == "dino-full-wrapped" else full


def write_checkpoint(path: str | Path, layout: str = "dino-full", arch: Arch = TINY, seed: int = 0) -> Path:
    """Write a random-weight checkpoint of ``layout`` to ``path`` (atomically)."""
    return save_state(make_checkpoint(layout, arch, seed), path)


def sample_photos() -> Path:
    """The real photographs shipped with the package (scikit-image's bundle, see SOURCES.md)."""
    return Path(__file__).parent / "data" / "photos"
