"""Checkpoints made on the spot, in the exact released layouts, from random weights.

They let the pipeline run with no download (the README's first command, the tests): the same
keys, prefixes, heads, ``args`` and loss centres as DINO's and SelfPatch's files, and the keys
of DINOv2's released backbones (LayerScale, ``mask_token``, ``register_tokens``), at a released
size (``RELEASED``) or at a tiny width and depth that runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

import torch

from ..store import dinov3_layouts
from ..store.architectures import DINOV3_RELEASED, RELEASED, VIT_S16, Arch  # noqa: F401  (VIT_S16 kept for callers)
from ..store.backbone import build_vit
from ..store.checkpoint_files import save_state

TINY = Arch(width=128, depth=2, heads=2, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=512)
# tiny versions of the other families: patch 8 (DINO ViT-S/8-like) and DINOv2 with registers
TINY_P8 = replace(TINY, patch=8, pos_grid=28)
TINY_B8 = replace(TINY_P8, width=192, heads=3, mlp_hidden=768)  # ViT-B/8's shape at tiny size (head width 64, as ViT-B's 768 / 12)
TINY_DINOV2_REG = replace(TINY, patch=14, pos_grid=37, layerscale=True, registers=4)
TINY_DINOV2 = replace(TINY_DINOV2_REG, registers=0)
# DINOv3 at tiny size: head width 64 as every released size but 7B, 4 storage tokens
TINY_DINOV3 = Arch(width=128, depth=2, heads=2, patch=16, class_token=True, final_norm=True, pos_grid=0, mlp_hidden=512, registers=4, layerscale=True, family="dinov3")
TINY_DINOV3_SWIGLU = replace(TINY_DINOV3, ffn="swiglu", mlp_hidden=344)  # S+/H+'s SwiGLU feed-forward
DINOV2_LAYOUTS = ("dinov2-backbone", "dinov2-reg-backbone")
DINOV3_LAYOUTS = dinov3_layouts.LAYOUTS  # dinov3-official, dinov3-timm, dinov3-hf (safetensors)
LAYOUTS = ("dino-backbone", "selfpatch-backbone", "dino-full", "selfpatch-full", "dino-full-wrapped", "selfpatch-backbone-wrapped")
ALL_LAYOUTS = (*LAYOUTS, *DINOV2_LAYOUTS, *DINOV3_LAYOUTS)
ARCHS = {
    "tiny": TINY,
    "tiny-p8": TINY_P8,
    "tiny-dinov2": TINY_DINOV2,
    "tiny-dinov2-reg": TINY_DINOV2_REG,
    "tiny-dinov3": TINY_DINOV3,
    "tiny-dinov3-swiglu": TINY_DINOV3_SWIGLU,
    **RELEASED,
    **DINOV3_RELEASED,
}


def random_backbone(arch: Arch, seed: int = 0) -> dict[str, torch.Tensor]:
    """timm's own initialisation (trunc-normal 0.02), made non-trivial in norms and biases."""
    torch.manual_seed(seed)
    state = build_vit(arch).state_dict()
    generator = torch.Generator().manual_seed(seed + 1)
    for key, value in state.items():
        if key.endswith(".bias") or "norm" in key:
            value.add_(0.05 * torch.randn(value.shape, generator=generator))
        elif key.endswith(".gamma"):  # LayerScale: trained DINOv2 gammas are far from their init of 1
            value.copy_(0.1 + 0.05 * torch.randn(value.shape, generator=generator))
        elif key == "reg_token":
            value.normal_(0.0, 0.02, generator=generator)
    return state


def dinov3_backbone(arch: Arch, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """timm's DINOv3 network at random, in timm's names with its float32 ``rope.periods``, every
    parameter made to matter: LayerScale far from its 1e-5 init, biases, norms and tokens perturbed."""
    torch.manual_seed(seed)
    state = build_vit(arch).state_dict()
    generator = torch.Generator().manual_seed(seed + 1)
    for key, value in state.items():
        if key.endswith(("bias", ".q_bias", ".v_bias")) or "norm" in key:
            value.add_(0.05 * torch.randn(value.shape, generator=generator))
        elif key.endswith((".gamma_1", ".gamma_2")):
            value.copy_(0.1 + 0.05 * torch.randn(value.shape, generator=generator))
        elif key in ("reg_token", "cls_token"):
            value.normal_(0.0, 0.02, generator=generator)
    state["rope.periods"] = dinov3_layouts.rope_periods(arch.width // arch.heads)
    heads = {"mask_token": {"mask_token": 0.02 * torch.randn(1, arch.width, generator=generator)}}
    return state, heads


def dinov3_file(layout: str, arch: Arch, seed: int = 0) -> dict[str, torch.Tensor]:
    """The flat dict of a DINOv3 file in ``layout``. The official one's key bias is random, not zero,
    and masked by ``bias_mask`` as in the released files, so loading must apply the mask."""
    if arch.family != "dinov3":
        raise ValueError(f"layout {layout!r} needs a DINOv3 arch, e.g. {', '.join(a for a in ARCHS if 'dinov3' in a)}")
    backbone, heads = dinov3_backbone(arch, seed)
    head_dim = arch.width // arch.heads
    if layout == "dinov3-timm":
        return dinov3_layouts.to_timm(backbone, head_dim)
    if layout == "dinov3-hf":
        return dinov3_layouts.to_hf(backbone, head_dim, heads)
    state = dinov3_layouts.to_official(backbone, heads)
    generator = torch.Generator().manual_seed(seed + 3)
    for key, value in state.items():
        if key.endswith(".attn.qkv.bias"):
            third = value.shape[0] // 3
            value[third : 2 * third] = 0.5 * torch.randn(third, generator=generator)
    return state


def dinov2_file(arch: Arch, seed: int = 0) -> dict[str, torch.Tensor]:
    """The flat dict of DINOv2's ``*_pretrain.pth``: timm's keys in DINOv2's names and table.

    DINOv2 keeps a class row in ``pos_embed`` even with registers, calls them
    ``register_tokens``, and stores iBOT's ``mask_token`` (1, D).
    """
    arch = replace(arch, class_token=True, final_norm=True, layerscale=True)
    state = random_backbone(arch, seed)
    generator = torch.Generator().manual_seed(seed + 2)
    width = arch.width
    if arch.registers:
        state["register_tokens"] = state.pop("reg_token")
        class_row = 0.02 * torch.randn(1, 1, width, generator=generator)
        state["pos_embed"] = torch.cat([class_row, state["pos_embed"]], dim=1)
    state["mask_token"] = 0.02 * torch.randn(1, width, generator=generator)
    return state


def dino_head(width: int, out: int, hidden: int, bottleneck: int, seed: int) -> dict[str, torch.Tensor]:
    """DINOHead's keys (mlp.0/2/4, weight-normed last_layer as weight_g / weight_v)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "mlp.0.weight": (hidden, width),
        "mlp.0.bias": (hidden,),
        "mlp.2.weight": (hidden, hidden),
        "mlp.2.bias": (hidden,),
        "mlp.4.weight": (bottleneck, hidden),
        "mlp.4.bias": (bottleneck,),
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
    if layout not in ALL_LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {ALL_LAYOUTS}")
    if layout in DINOV3_LAYOUTS:
        return dinov3_file(layout, arch, seed)
    if arch.family == "dinov3":
        raise ValueError(f"layout {layout!r} is not a DINOv3 layout ({', '.join(DINOV3_LAYOUTS)})")
    if layout in DINOV2_LAYOUTS:
        if not arch.layerscale:
            raise ValueError(f"layout {layout!r} needs a DINOv2 arch (LayerScale), e.g. {', '.join(a for a in ARCHS if 'dinov2' in a)}")
        return dinov2_file(replace(arch, registers=(arch.registers or 4) if layout == "dinov2-reg-backbone" else 0), seed)
    if arch.registers or arch.layerscale:
        raise ValueError(f"layout {layout!r} is a DINO/SelfPatch layout, which has no LayerScale or register tokens")
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
        arch_name = _arch_name(arch)
    else:

        def heads(s: int) -> dict[str, dict[str, torch.Tensor]]:
            return {"head": dino_head(arch.width, out, hidden, bottleneck, s)}

        loss = {"center": torch.zeros(1, out)}
        arch_name = _arch_name(arch)
    full = {
        "student": _prefixed({"backbone": student, **heads(seed + 200)}, "module."),
        "teacher": _prefixed({"backbone": teacher, **heads(seed + 300)}),
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.0, "weight_decay": 0.04, "params": []}]},
        "epoch": 100,
        "args": argparse.Namespace(arch=arch_name, patch_size=arch.patch, out_dim=out, momentum_teacher=0.996),
        "dino_loss": loss,
    }
    return {"model": full} if layout == "dino-full-wrapped" else full


def _arch_name(arch: Arch) -> str:
    """DINO's ``--arch`` for a width (vit_small 384, vit_base 768; tiny models pass as vit_small)."""
    return "vit_base" if arch.width >= 768 else "vit_small"


def write_checkpoint(path: str | Path, layout: str = "dino-full", arch: Arch = TINY, seed: int = 0, *, force: bool = True) -> Path:
    """Write a random-weight checkpoint of ``layout`` to ``path`` (atomically; ``dinov3-hf`` as
    safetensors); an existing file is replaced only with ``force`` (``probe make-checkpoint``
    passes its ``--force``)."""
    from ..infra.owned import refuse_existing

    refuse_existing(path, force, "checkpoint file")
    from ..infra.origin import mark_random

    state = make_checkpoint(layout, arch, seed)
    written = save_safetensors(state, path) if layout == "dinov3-hf" else save_state(state, path)
    mark_random(written, f"random weights made by probe ({layout}, width {arch.width}, depth {arch.depth}, seed {seed})")
    return written


def save_safetensors(state: dict[str, torch.Tensor], out: str | Path) -> Path:
    """A safetensors file as ``save_pretrained`` writes one (metadata format pt), to a temporary
    name first (pid-suffixed, so a killed run's is recognised and swept)."""
    from safetensors.torch import save_file

    from ..infra.atomic import publish

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        save_file({k: v.contiguous().clone() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
        publish(tmp, out)  # the umask's mode, as every file probe writes (save_file makes it 0600)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def sample_photos() -> Path:
    """The real photographs shipped with the package (scikit-image's bundle, see SOURCES.md)."""
    return Path(__file__).parent / "data" / "photos"
