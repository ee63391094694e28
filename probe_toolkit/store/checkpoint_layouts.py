"""Which layout a checkpoint's state dict is in, and its backbone and heads under timm's names:
wrappers unwrapped, ``module.`` and ``backbone.`` stripped as prefixes only, the heads of DINO
and SelfPatch (with DINO's first head names), DINOv2's names, and the DINOv3 layouts
(``store.dinov3_layouts``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..infra.errors import ProbeError
from . import dinov3_layouts
from .architectures import Arch
from .checkpoint_arch import dinov3_heads, infer_dinov3_arch

HEAD_PREFIXES = ("head.", "ca_head.", "c_head.", "p_head.")
# tensors of a backbone file that the readout never uses, kept as named heads (strict loading)
UNUSED_BACKBONE_KEYS = {"mask_token": "mask_token"}
NETWORKS = ("teacher", "student")
TRAINER_MARK = "probe-training"
# DINO's first published full checkpoints used older names inside the heads (dino #30, #65)
OLD_HEAD_NAMES = {"projection_head.": "mlp.", "prototypes.": "last_layer."}


def unwrap(obj: Any, path: Path) -> Any:
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and not (set(obj) & set(NETWORKS)) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
    return obj


def _strip(key: str, prefix: str) -> str:
    return key[len(prefix) :] if key.startswith(prefix) else key


def split_heads(state: dict[str, Any], path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Backbone and heads of one network's state dict; ``module.`` is stripped as a prefix only."""
    state = {_strip(k, "module."): v for k, v in state.items()}
    if not any(k.startswith("backbone.") for k in state):
        return state, {}
    backbone: dict[str, torch.Tensor] = {}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    stray = []
    for key, value in state.items():
        if key.startswith("backbone."):
            backbone[key[len("backbone.") :]] = value
            continue
        prefix = next((p for p in HEAD_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            stray.append(key)
            continue
        name = key[len(prefix) :]
        for old, new in OLD_HEAD_NAMES.items():
            name = new + name[len(old) :] if name.startswith(old) else name
        heads.setdefault(prefix[:-1], {})[name] = value
    if stray:
        raise ProbeError(path, f"has keys outside backbone and the known heads: {sorted(stray)[:8]}", "is it a DINO or SelfPatch checkpoint?")
    return backbone, heads


def from_dinov2(backbone: dict[str, torch.Tensor], heads: dict[str, dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """DINOv2's names → timm's: ``mask_token`` set aside as a head, registers as ``reg_token``.

    With registers, timm's model has no table row for the class token (``no_embed_class``),
    so that row is added to ``cls_token`` here, once, instead of in every forward pass.
    """
    out = dict(backbone)
    heads = dict(heads)
    for key, head in UNUSED_BACKBONE_KEYS.items():
        if key in out:
            heads[head] = {key: out.pop(key)}
    if "register_tokens" in out:
        out["reg_token"] = out.pop("register_tokens")
        if "cls_token" in out and "pos_embed" in out:
            out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
            out["pos_embed"] = out["pos_embed"][:, 1:]
    return out, heads


def file_format(full: bool, heads: dict[str, Any], extra: dict[str, Any], backbone: dict[str, Any]) -> str:
    if not full:
        if "reg_token" in backbone:
            return "dinov2-reg-backbone"
        if "mask_token" in heads or "blocks.0.ls1.gamma" in backbone:
            return "dinov2-backbone"
        return "dino-backbone" if "cls_token" in backbone else "selfpatch-backbone"
    args = extra.get("args")
    if isinstance(args, dict) and args.get("trainer") == TRAINER_MARK:
        return TRAINER_MARK
    return "selfpatch-full" if "ca_head" in heads else "dino-full"


def read_dinov3(state: dict[str, torch.Tensor], layout: str, path: Path, heads: int | None) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], Arch]:
    """A DINOv3 file's backbone in timm's names (with ``rope.periods``), its heads and its shape."""
    if layout == "dinov3-official":
        try:
            backbone, head_states = dinov3_layouts.from_official(state)
        except dinov3_layouts.LayoutError as error:
            raise ProbeError(path, str(error), "pass the network's own released file") from None
        return backbone, head_states, infer_dinov3_arch(backbone, path, heads)
    # timm's and transformers' files carry no periods: the head count decides their number
    proj = state.get("patch_embed.proj.weight", state.get("embeddings.patch_embeddings.weight"))
    width = int(proj.shape[0]) if proj is not None and proj.ndim else 0
    head_dim = width // dinov3_heads({}, width, path, heads) if width else 64
    try:
        backbone, head_states = dinov3_layouts.to_timm_names(state, layout, head_dim)
    except dinov3_layouts.LayoutError as error:
        raise ProbeError(path, str(error), "pass the network's own released file") from None
    return backbone, head_states, infer_dinov3_arch(backbone, path, heads)
