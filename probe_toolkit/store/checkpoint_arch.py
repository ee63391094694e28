"""A backbone's architecture read from its own tensors (width, depth, patch, heads, tokens), and
the strict check that its keys and shapes are exactly those of the network built for it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from ..infra.errors import ProbeError
from . import hints
from .architectures import Arch


def _trunk(backbone: dict[str, torch.Tensor], path: Path, needed: tuple[str, ...], missing: str, fix: str, embedding: str) -> tuple[int, int, int]:
    """(width, patch, depth) of a ViT backbone that holds the ``needed`` keys (``missing`` words the
    error, with ``{key}`` and ``{found}``) and a (width, 3, p, p) patch embedding (``embedding`` names it)."""
    for key in needed:
        if key not in backbone:
            raise ProbeError(path, missing.format(key=key, found=", ".join(sorted(backbone)[:5]) or "nothing"), fix)
    proj = backbone["patch_embed.proj.weight"]
    if proj.ndim != 4 or proj.shape[1] != 3 or proj.shape[2] != proj.shape[3]:
        raise ProbeError(path, f"{embedding} has shape {tuple(proj.shape)}, not (width, 3, p, p)", "pass a ViT checkpoint")
    depth = 1 + max(int(m.group(1)) for k in backbone if (m := re.match(r"blocks\.(\d+)\.", k)))
    return int(proj.shape[0]), int(proj.shape[2]), depth


def infer_arch(backbone: dict[str, torch.Tensor], path: Path, heads: int | None = None) -> Arch:
    """Width, depth, patch, class token, final norm and grid from the tensors; heads = width/64 unless given."""
    if "patch_embed.proj.weight" not in backbone:
        hints.refuse_prefixed(backbone, "patch_embed.proj.weight", path)  # e.g. a PyTorch Lightning module's model.patch_embed...
    width, patch, depth = _trunk(
        backbone,
        path,
        ("patch_embed.proj.weight", "pos_embed", "blocks.0.mlp.fc1.weight"),
        "is not a ViT backbone in DINO/timm layout (no {key}; found {found}...)",
        "pass a DINO or SelfPatch checkpoint",
        "patch_embed.proj.weight",
    )
    class_token = "cls_token" in backbone
    registers = int(backbone["reg_token"].shape[1]) if "reg_token" in backbone else 0
    rows = int(backbone["pos_embed"].shape[1]) - int(class_token and not registers)
    grid = math.isqrt(rows)
    if grid * grid != rows:
        raise ProbeError(path, f"pos_embed has {rows} patch rows, not a square grid", "is the class-token row missing or extra?")
    head_count = heads if heads is not None else max(width // 64, 1)
    if width % head_count:
        raise ProbeError(path, f"width {width} is not divisible by {head_count} heads", "pass --heads")
    return Arch(
        width=width,
        depth=depth,
        heads=head_count,
        patch=patch,
        class_token=class_token,
        final_norm="norm.weight" in backbone,
        pos_grid=grid,
        mlp_hidden=int(backbone["blocks.0.mlp.fc1.weight"].shape[0]),
        registers=registers,
        layerscale="blocks.0.ls1.gamma" in backbone,
    )


def expected_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """Every backbone key and shape for ``arch`` (timm's names, which are DINO's names). timm is
    imported here, when a checkpoint is read, not by every command that names this module.
    A DINOv3 backbone also carries its RoPE periods (``rope.periods``, head width / 4)."""
    from .backbone import build_vit

    shapes = {k: tuple(v.shape) for k, v in build_vit(arch, device="meta", init=False).state_dict().items()}
    if arch.family == "dinov3":
        shapes["rope.periods"] = (arch.width // arch.heads // 4,)
    return shapes


# heads of the released DINOv3 ViTs by width (hub/backbones.py); a file without RoPE periods
# (timm's, or transformers' without its config.json) does not say its head count otherwise
DINOV3_HEADS = {384: 6, 768: 12, 1024: 16, 1280: 20, 4096: 32}


def dinov3_heads(backbone: dict[str, torch.Tensor], width: int, path: Path, heads: int | None) -> int:
    """Head count: from the RoPE periods (head width / 4 of them) of an official file, else ``heads``,
    else a transformers ``config.json`` beside the file, else the released sizes, else width / 64."""
    periods = backbone.get("rope.periods")
    if periods is not None and periods.ndim == 1 and periods.numel() and width % (4 * periods.numel()) == 0:
        found = width // (4 * periods.numel())
        if heads is not None and heads != found:
            raise ProbeError(path, f"its rope.periods ({periods.numel()}) give {found} heads, not --heads {heads}", f"pass --heads {found} or omit it")
        return found
    if heads is not None:
        return heads
    config = path.with_name("config.json")
    if config.is_file():
        import json

        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("num_attention_heads")
        except (ValueError, OSError):
            value = None
        if isinstance(value, int) and value > 0:
            return value
    return DINOV3_HEADS.get(width, max(width // 64, 1))


def infer_dinov3_arch(backbone: dict[str, torch.Tensor], path: Path, heads: int | None = None) -> Arch:
    """Width, depth, patch, storage tokens, feed-forward and bias of a DINOv3 backbone in timm's names."""
    swiglu = "blocks.0.mlp.fc1_g.weight" in backbone
    fc1 = "blocks.0.mlp.fc1_g.weight" if swiglu else "blocks.0.mlp.fc1.weight"
    width, patch, depth = _trunk(
        backbone,
        path,
        ("patch_embed.proj.weight", fc1),
        "is not a DINOv3 ViT backbone (no {key} in timm's names; found {found}...)",
        "pass a DINOv3 checkpoint",
        "its patch embedding",
    )
    head_count = dinov3_heads(backbone, width, path, heads)
    if width % head_count or (width // head_count) % 4:
        raise ProbeError(path, f"width {width} does not split into {head_count} heads of a multiple of 4", "pass --heads")
    reg = backbone.get("reg_token")
    return Arch(
        width=width,
        depth=depth,
        heads=head_count,
        patch=patch,
        class_token=True,
        final_norm=True,
        pos_grid=0,
        mlp_hidden=int(backbone[fc1].shape[0]),
        registers=int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0,
        layerscale=True,
        family="dinov3",
        ffn="swiglu" if swiglu else "mlp",
        qkv_bias="blocks.0.attn.q_bias" in backbone,
    )


def check_backbone(backbone: dict[str, torch.Tensor], arch: Arch, path: Path) -> None:
    """Strict: missing, unexpected or misshapen keys are an error that lists them."""
    expected = expected_shapes(arch)
    missing = sorted(set(expected) - set(backbone))
    unexpected = sorted(set(backbone) - set(expected))
    misshapen = sorted(k for k in set(expected) & set(backbone) if tuple(backbone[k].shape) != expected[k])
    if missing or unexpected or misshapen:
        parts = []
        if missing:
            parts.append(f"missing {missing[:10]}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
        if misshapen:
            parts.append(f"wrong shape {[(k, tuple(backbone[k].shape), expected[k]) for k in misshapen[:5]]}")
        what = f"a DINOv3 ViT in timm's names ({arch.width} wide, {arch.heads} heads)" if arch.family == "dinov3" else "a ViT"
        raise ProbeError(path, f"backbone keys do not match {what}: " + "; ".join(parts), "is it another architecture?")
