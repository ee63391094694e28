"""DINOv3 ViT state dicts in their three published layouts, read into timm's names and written back.

One network, three spellings (DINOv3, Siméoni et al. 2025; facebookresearch/dinov3 and its Hugging Face port):

- ``dinov3-official``: what facebookresearch/dinov3 saves and ``hub/backbones.py`` loads strictly
  (``dinov3/models/vision_transformer.py``, ``layers/attention.py``, ``layers/layer_scale.py``,
  ``layers/ffn_layers.py``): ``cls_token``, ``storage_tokens``, ``mask_token`` (1, D),
  ``patch_embed.proj.*``, ``rope_embed.periods``, ``blocks.i.{norm1, attn.qkv.{weight, bias,
  bias_mask}, attn.proj, ls1.gamma, norm2, mlp.fc1/fc2 | mlp.w1/w2/w3, ls2.gamma}``, ``norm.*``,
  and at 7B ``local_cls_norm.*`` (a training-only norm of the local crops' class token).
- ``dinov3-timm``: timm's ``Eva`` (``timm/models/eva.py``, ``vit_*_patch16_dinov3[_qkvb]``):
  ``reg_token``, ``blocks.i.attn.{qkv.weight, q_bias, v_bias}``, ``gamma_1``/``gamma_2``,
  ``mlp.fc1_g/fc1_x/fc2`` for SwiGLU; no RoPE buffer, no mask token.
- ``dinov3-hf``: Hugging Face transformers' ``DINOv3ViTModel`` (``models/dinov3_vit/
  modeling_dinov3_vit.py``, a safetensors file): ``embeddings.{cls_token, mask_token (1, 1, D),
  register_tokens, patch_embeddings.{weight, bias}}``, ``layer.i.{norm1, attention.{q,k,v,o}_proj,
  layer_scale1.lambda1, norm2, mlp.{up,down}_proj | mlp.{gate,up,down}_proj, layer_scale2.lambda1}``,
  ``norm.*``; the key projection has no bias (``key_bias=False``), the RoPE frequencies are not saved.

Read into timm's names (the names of the network ``store.dinov3`` builds), plus ``rope.periods``:
the official file's RoPE periods buffer (in the released files rounded to bfloat16, which moves
outputs by up to about 5e-3 against float32 periods), or, for the two layouts that do not save it,
the float32 periods timm computes. The key bias: the official ``LinearKMaskedBias`` multiplies the
qkv bias by ``bias_mask`` (ones, zeros over the key third, ones) in every forward; here that product
is taken once, and its key third must be exactly zero, since timm's attention has a fixed zero key
bias. A key bias that is not masked to zero is refused, never dropped.

Every key of a file is used, set aside as a named head (``mask_token``, ``local_cls_norm``), or left
under its own name so that the strict check lists it as unexpected.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

LAYOUTS = ("dinov3-official", "dinov3-timm", "dinov3-hf")
ROPE_BASE = 100.0  # pos_embed_rope_base of every released ViT (hub/backbones.py)
HEAD_KEYS = ("mask_token", "local_cls_norm")  # in the file, never in the eval forward


class LayoutError(ValueError):
    """A tensor the target network cannot hold as it is (a key bias that is not zero, foreign periods)."""


def detect(keys) -> str | None:
    """The DINOv3 layout of a flat state dict's keys, or None for anything else."""
    keys = set(keys)
    if "storage_tokens" in keys or "rope_embed.periods" in keys:
        return "dinov3-official"
    if "embeddings.cls_token" in keys and any(k.startswith("layer.0.attention.") for k in keys):
        return "dinov3-hf"
    if "blocks.0.gamma_1" in keys and "pos_embed" not in keys:
        return "dinov3-timm"
    return None


def rope_periods(head_dim: int, base: float = ROPE_BASE) -> torch.Tensor:
    """``base ** (2j / (head_dim / 2))``, j < head_dim / 4, in float32: the expression of DINOv3's
    ``RopePositionEmbedding._init_weights`` and timm's ``RotaryEmbeddingDinoV3._compute_periods``."""
    exponents = 2.0 * torch.arange(head_dim // 4, dtype=torch.float32) / (head_dim // 2)
    return base**exponents


def _block_indices(keys, pattern: str) -> list[int]:
    return sorted({int(m.group(1)) for k in keys if (m := re.match(pattern, k))})


def _fold_bias(bias: torch.Tensor, mask: torch.Tensor | None, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_bias, v_bias) of an official qkv bias, the mask applied as ``LinearKMaskedBias`` does."""
    folded = bias * mask.to(bias.dtype) if mask is not None else bias
    q, k, v = folded.chunk(3, dim=-1)
    if not torch.equal(k, torch.zeros_like(k)):
        why = "its bias_mask does not zero the key third" if mask is not None else "there is no bias_mask and the key third is not zero"
        raise LayoutError(f"{key}: {why}; timm's attention has a fixed zero key bias, so the key bias cannot be kept")
    return q, v


# the SwiGLU feed-forward's names: facebookresearch/dinov3 (layers/ffn_layers.py: w1, w2, w3) and timm's
# (timm/layers/mlp.py SwiGLU: fc1_g, fc1_x, fc2)
SWIGLU_NAMES = ((".mlp.w1.", ".mlp.fc1_g."), (".mlp.w2.", ".mlp.fc1_x."), (".mlp.w3.", ".mlp.fc2."))


def _block_name(key: str, swiglu: bool, to_timm: bool) -> str:
    """A block tensor's name in the other layout: LayerScale ``ls1.gamma`` ↔ ``gamma_1``, and the
    SwiGLU feed-forward's names (``SWIGLU_NAMES``)."""
    if to_timm:
        name = re.sub(r"\.ls([12])\.gamma$", lambda m: f".gamma_{m.group(1)}", key)
    else:
        name = re.sub(r"\.gamma_([12])$", lambda m: f".ls{m.group(1)}.gamma", key)
    for official, timm in SWIGLU_NAMES if swiglu else ():
        name = name.replace(official, timm) if to_timm else name.replace(timm, official)
    return name


def from_official(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """facebookresearch/dinov3's names → timm's; returns (backbone, heads)."""
    out: dict[str, torch.Tensor] = {}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    swiglu = any(".mlp.w1." in k for k in state)
    for key, value in state.items():
        if key == "storage_tokens":
            out["reg_token"] = value
        elif key == "rope_embed.periods":
            out["rope.periods"] = value
        elif key == "mask_token":
            heads["mask_token"] = {"mask_token": value}
        elif key.startswith("local_cls_norm."):
            heads.setdefault("local_cls_norm", {})[key[len("local_cls_norm.") :]] = value
        elif key.endswith(".attn.qkv.bias_mask") and key[: -len("_mask")] in state:
            continue  # used with its bias below
        elif key.endswith(".attn.qkv.bias"):
            prefix = key[: -len("qkv.bias")]
            q, v = _fold_bias(value, state.get(key + "_mask"), key)
            out[prefix + "q_bias"], out[prefix + "v_bias"] = q, v
        else:
            out[_block_name(key, swiglu, to_timm=True)] = value
    return out, heads


def from_timm(state: dict[str, torch.Tensor], head_dim: int) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """timm's own names: unchanged, with the float32 periods timm computes at build."""
    out = dict(state)
    out["rope.periods"] = rope_periods(head_dim)
    return out, {}


HF_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.register_tokens$", "reg_token"),
    (r"^embeddings\.patch_embeddings\.(weight|bias)$", r"patch_embed.proj.\1"),
    (r"^layer\.(\d+)\.norm([12])\.", r"blocks.\1.norm\2."),
    (r"^layer\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."),
    (r"^layer\.(\d+)\.attention\.q_proj\.bias$", r"blocks.\1.attn.q_bias"),
    (r"^layer\.(\d+)\.attention\.v_proj\.bias$", r"blocks.\1.attn.v_bias"),
    (r"^layer\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.gamma_\2"),
    (r"^norm\.", "norm."),
)
HF_MLP = {False: (("up_proj", "fc1"), ("down_proj", "fc2")), True: (("gate_proj", "fc1_g"), ("up_proj", "fc1_x"), ("down_proj", "fc2"))}


def from_hf(state: dict[str, torch.Tensor], head_dim: int) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """transformers' ``DINOv3ViTModel`` names → timm's; q, k, v projections stacked into ``qkv``."""
    state = dict(state)
    out: dict[str, torch.Tensor] = {}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    if "embeddings.mask_token" in state:
        heads["mask_token"] = {"mask_token": state.pop("embeddings.mask_token")}
    gated = any(".mlp.gate_proj." in k for k in state)
    for i in _block_indices(state, r"layer\.(\d+)\."):
        p = f"layer.{i}.attention."
        parts = [p + f"{n}_proj.weight" for n in "qkv"]
        if all(k in state for k in parts):  # else the ones present stay, named, as unexpected keys
            out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([state.pop(k) for k in parts], dim=0)
        k_bias = state.get(p + "k_proj.bias")
        if k_bias is not None:
            if not torch.equal(k_bias, torch.zeros_like(k_bias)):
                raise LayoutError(f"{p}k_proj.bias is not zero; timm's attention has a fixed zero key bias, so it cannot be kept")
            del state[p + "k_proj.bias"]
        for hf, timm_name in HF_MLP[gated]:
            for kind in ("weight", "bias"):
                key = f"layer.{i}.mlp.{hf}.{kind}"
                if key in state:
                    out[f"blocks.{i}.mlp.{timm_name}.{kind}"] = state.pop(key)
    for key, value in state.items():
        for pattern, replacement in HF_RENAMES:
            if re.match(pattern, key):
                key = re.sub(pattern, replacement, key)
                break
        out[key] = value
    out.setdefault("rope.periods", rope_periods(head_dim))
    return out, heads


def to_timm_names(state: dict[str, torch.Tensor], layout: str, head_dim: int) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Any of ``LAYOUTS`` → (timm-named backbone with ``rope.periods``, heads)."""
    readers: dict[str, Callable] = {
        "dinov3-official": lambda s: from_official(s),
        "dinov3-timm": lambda s: from_timm(s, head_dim),
        "dinov3-hf": lambda s: from_hf(s, head_dim),
    }
    if layout not in readers:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    return readers[layout](state)


# ----------------------------------------------------------------------------------------------
# writing: timm's names → a layout (probe make-checkpoint, conversion)


def _check_periods(backbone: dict[str, torch.Tensor], head_dim: int, layout: str, keep_periods: bool) -> None:
    periods = backbone["rope.periods"]
    if keep_periods or torch.equal(periods.float(), rope_periods(head_dim)):
        return
    worst = float(((periods.float() - rope_periods(head_dim)).abs() / rope_periods(head_dim)).max())
    raise LayoutError(
        f"the RoPE periods differ from base**(2j/{head_dim // 2}) by up to {worst:.2e} relative (the released files "
        f"round them to bfloat16), and {layout} has no place for them: its network would compute float32 periods "
        "and give other outputs; pass keep_periods=True to accept that"
    )


def to_official(backbone: dict[str, torch.Tensor], heads: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
    """timm's names → facebookresearch/dinov3's (key bias zero and masked, as ``LinearKMaskedBias``)."""
    heads = heads or {}
    out: dict[str, torch.Tensor] = {}
    swiglu = any(".mlp.fc1_g." in k for k in backbone)
    width = backbone["cls_token"].shape[-1]
    for key, value in backbone.items():
        if key == "reg_token":
            out["storage_tokens"] = value
        elif key == "rope.periods":
            out["rope_embed.periods"] = value
        elif key.endswith(".attn.v_bias"):
            continue
        elif key.endswith(".attn.q_bias"):
            prefix = key[: -len("q_bias")]
            q, v = value, backbone[prefix + "v_bias"]
            out[prefix + "qkv.bias"] = torch.cat([q, torch.zeros_like(q), v])
            out[prefix + "qkv.bias_mask"] = torch.cat([torch.ones_like(q), torch.zeros_like(q), torch.ones_like(v)])
        else:
            out[_block_name(key, swiglu, to_timm=False)] = value
    mask = heads.get("mask_token", {}).get("mask_token")
    out["mask_token"] = mask.reshape(1, width) if mask is not None else torch.zeros(1, width)  # DINOv3 initialises it to zeros
    for key, value in heads.get("local_cls_norm", {}).items():
        out[f"local_cls_norm.{key}"] = value
    return out


def to_timm(backbone: dict[str, torch.Tensor], head_dim: int, keep_periods: bool = False) -> dict[str, torch.Tensor]:
    """timm's own state dict: the periods dropped (timm computes them), after checking that is harmless."""
    _check_periods(backbone, head_dim, "dinov3-timm", keep_periods)
    return {k: v for k, v in backbone.items() if k != "rope.periods"}


def to_hf(
    backbone: dict[str, torch.Tensor], head_dim: int, heads: dict[str, dict[str, torch.Tensor]] | None = None, keep_periods: bool = False
) -> dict[str, torch.Tensor]:
    """timm's names → transformers' ``DINOv3ViTModel`` (no key bias; the mask token (1, 1, D))."""
    _check_periods(backbone, head_dim, "dinov3-hf", keep_periods)
    heads = heads or {}
    width = backbone["cls_token"].shape[-1]
    gated = any(".mlp.fc1_g." in k for k in backbone)
    mlp = {timm_name: hf for hf, timm_name in HF_MLP[gated]}
    out: dict[str, torch.Tensor] = {
        "embeddings.cls_token": backbone["cls_token"],
        "embeddings.register_tokens": backbone["reg_token"],
        "embeddings.patch_embeddings.weight": backbone["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.bias": backbone["patch_embed.proj.bias"],
    }
    mask = heads.get("mask_token", {}).get("mask_token")
    out["embeddings.mask_token"] = mask.reshape(1, 1, width) if mask is not None else torch.zeros(1, 1, width)
    for i in _block_indices(backbone, r"blocks\.(\d+)\."):
        b, h = f"blocks.{i}.", f"layer.{i}."
        for n in ("norm1", "norm2"):
            for kind in ("weight", "bias"):
                out[f"{h}{n}.{kind}"] = backbone[f"{b}{n}.{kind}"]
        q, k, v = backbone[b + "attn.qkv.weight"].chunk(3, dim=0)
        out[h + "attention.q_proj.weight"], out[h + "attention.k_proj.weight"], out[h + "attention.v_proj.weight"] = q, k, v
        if b + "attn.q_bias" in backbone:
            out[h + "attention.q_proj.bias"] = backbone[b + "attn.q_bias"]
            out[h + "attention.v_proj.bias"] = backbone[b + "attn.v_bias"]
        out[h + "attention.o_proj.weight"] = backbone[b + "attn.proj.weight"]
        out[h + "attention.o_proj.bias"] = backbone[b + "attn.proj.bias"]
        out[h + "layer_scale1.lambda1"] = backbone[b + "gamma_1"]
        out[h + "layer_scale2.lambda1"] = backbone[b + "gamma_2"]
        for timm_name, hf in mlp.items():
            for kind in ("weight", "bias"):
                out[f"{h}mlp.{hf}.{kind}"] = backbone[f"{b}mlp.{timm_name}.{kind}"]
    out["norm.weight"], out["norm.bias"] = backbone["norm.weight"], backbone["norm.bias"]
    return out


def convert(state: dict[str, torch.Tensor], target: str, head_dim: int, keep_periods: bool = False) -> dict[str, torch.Tensor]:
    """A DINOv3 state dict of any layout → ``target`` layout (the network and its outputs unchanged)."""
    source = detect(state)
    if source is None:
        raise LayoutError("not a DINOv3 state dict in any of " + ", ".join(LAYOUTS))
    backbone, heads = to_timm_names(state, source, head_dim)
    if target == "dinov3-official":
        return to_official(backbone, heads)
    if target == "dinov3-timm":
        return to_timm(backbone, head_dim, keep_periods)
    if target == "dinov3-hf":
        return to_hf(backbone, head_dim, heads, keep_periods)
    raise ValueError(f"target {target!r} is not one of {LAYOUTS}")
