"""What a ViT is, as the store and the manifest know it: its shape, and the released sizes by name.

Plain data, no torch: a command that reads a store (``probe knn``, ``probe linear``) learns the
network's patch and width from here without importing timm and torchvision (a second and more
of start-up); ``backbone`` builds the network from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

# the rules that resample a position table to another grid (``backbone``); --interp's values, declared here
# (plain data) so that a fix command naming them imports no torch
Interpolation = Literal["auto", "dino", "dinov2-reg", "timm"]
INTERPOLATIONS = ("auto", "dino", "dinov2-reg", "timm")
# each rule as the manifest records it (``interpolation_rule``)
RULES = {
    "dino": "bicubic, scale_factor (g+0.1)/g0, no antialias (facebookresearch/dino vision_transformer.py; DINOv2 with interpolate_offset=0.1)",
    "dinov2-reg": "bicubic, size (rows, cols), antialias, float32 (DINOv2 register models: interpolate_offset=0.0, interpolate_antialias=True)",
    "timm": "timm resample_abs_pos_embed (bicubic, size, antialias)",
    "none": "no position table: DINOv3's RoPE is computed per grid (any multiple of the patch is native), nothing interpolated",
}
AttentionMode = Literal["last", "all", "none"]


@dataclass(frozen=True)
class Arch:
    """A ViT's shape, inferred from its tensors so tiny test models and ViT-S/16 share one path."""

    width: int
    depth: int
    heads: int
    patch: int
    class_token: bool
    final_norm: bool
    pos_grid: int  # side of the grid the position table was trained on (14 for 224 px, 37 for DINOv2's 518 px)
    mlp_hidden: int
    registers: int = 0  # DINOv2's register tokens / DINOv3's storage tokens (between the class token and the patches)
    layerscale: bool = False  # DINOv2's / DINOv3's per-channel LayerScale on both residual branches
    family: str = "vit"  # "dinov3": timm's Eva with axial RoPE (base 100), no position table, LayerNorm eps 1e-5
    ffn: str = "mlp"  # "swiglu": DINOv3's SwiGLU feed-forward (S+/16, L+/16, H+/16, 7B/16); mlp_hidden is its width
    qkv_bias: bool = True  # DINOv3 7B/16 has no q/k/v bias at all

    @property
    def prefix(self) -> int:
        """Tokens before the patches in every sequence: the class token, then the registers."""
        return int(self.class_token) + self.registers

    @property
    def pos_prefix(self) -> int:
        """Rows of the position table before the patch rows (timm's ``no_embed_class`` has none)."""
        return 0 if self.registers else int(self.class_token)

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``arch``; ``registers``, ``layerscale`` and the DINOv3 fields only where set,
        so a DINO or SelfPatch store written before DINOv2 or DINOv3 were supported keeps its
        identity (and resumes)."""
        out = asdict(self)
        for key, default in (("registers", 0), ("layerscale", False), ("family", "vit"), ("ffn", "mlp"), ("qkv_bias", True)):
            if out[key] == default:
                del out[key]
        return out


def resolve_interpolation(method: str, arch: Arch) -> str:
    """``auto``: the rule the checkpoint's own code uses (DINOv2's register models differ; DINOv3
    has no table, so ``none``, and any other rule is refused rather than recorded untrue)."""
    if arch.family == "dinov3":
        if method not in ("auto", "none"):
            raise ValueError(f"interpolation {method!r}: a DINOv3 network has no position table (RoPE); use auto")
        return "none"
    if method not in INTERPOLATIONS:
        raise ValueError(f"interpolation {method!r} is not one of {INTERPOLATIONS}")
    if method != "auto":
        return method
    return "dinov2-reg" if arch.registers else "dino"


VIT_S16 = Arch(width=384, depth=12, heads=6, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=1536)
VIT_S8 = replace(VIT_S16, patch=8, pos_grid=28)
VIT_B16 = Arch(width=768, depth=12, heads=12, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=3072)
VIT_B8 = replace(VIT_B16, patch=8, pos_grid=28)
# DINOv2 (facebookresearch/dinov2 hub/backbones.py: img_size 518, patch 14, init_values 1.0)
DINOV2_S14 = replace(VIT_S16, patch=14, pos_grid=37, layerscale=True)
DINOV2_B14 = replace(VIT_B16, patch=14, pos_grid=37, layerscale=True)
DINOV2_S14_REG = replace(DINOV2_S14, registers=4)
DINOV2_B14_REG = replace(DINOV2_B14, registers=4)
# DINOv3 (facebookresearch/dinov3 hub/backbones.py, commit 6876159): patch 16, 4 storage tokens,
# LayerScale, RoPE instead of a position table (pos_grid 0: there is no table to interpolate).
# SwiGLU widths are DINOv3's SwiGLUFFN: int(width * ffn_ratio * 2/3) rounded up to align_to (8; 64 at 7B).
DINOV3_S16 = Arch(width=384, depth=12, heads=6, patch=16, class_token=True, final_norm=True, pos_grid=0, mlp_hidden=1536, registers=4, layerscale=True, family="dinov3")
DINOV3_S16_PLUS = replace(DINOV3_S16, ffn="swiglu")  # ffn_ratio 6: int(2304 * 2/3) = 1536
DINOV3_B16 = replace(DINOV3_S16, width=768, heads=12, mlp_hidden=3072)
DINOV3_L16 = replace(DINOV3_S16, width=1024, depth=24, heads=16, mlp_hidden=4096)
DINOV3_L16_PLUS = replace(DINOV3_L16, ffn="swiglu")  # ffn_ratio 6: int(6144 * 2/3) = 4096
DINOV3_H16_PLUS = replace(DINOV3_S16, width=1280, depth=32, heads=20, mlp_hidden=5120, ffn="swiglu")  # int(7680 * 2/3)
DINOV3_7B16 = replace(DINOV3_S16, width=4096, depth=40, heads=32, mlp_hidden=8192, ffn="swiglu", qkv_bias=False)  # ffn_ratio 3, head width 128
# kept apart from RELEASED (whose sizes the README's table and the DINO/DINOv2 count tests enumerate);
# ``probe make-checkpoint --arch`` offers both
DINOV3_RELEASED = {
    "vit-s16-dinov3": DINOV3_S16,
    "vit-s16plus-dinov3": DINOV3_S16_PLUS,
    "vit-b16-dinov3": DINOV3_B16,
    "vit-l16-dinov3": DINOV3_L16,
    "vit-l16plus-dinov3": DINOV3_L16_PLUS,
    "vit-h16plus-dinov3": DINOV3_H16_PLUS,
    "vit-7b16-dinov3": DINOV3_7B16,
}
# the released sizes by name (``probe make-checkpoint --arch``, ``benchmarks/extract.py --arch``)
RELEASED = {
    "vit-s16": VIT_S16,
    "vit-s8": VIT_S8,
    "vit-b16": VIT_B16,
    "vit-b8": VIT_B8,
    "dinov2-s14": DINOV2_S14,
    "dinov2-s14-reg": DINOV2_S14_REG,
    "dinov2-b14": DINOV2_B14,
    "dinov2-b14-reg": DINOV2_B14_REG,
}


# The head width of the networks a training file's ``args.arch`` names: DINO's
# vision_transformer.py builds vit_tiny (192 wide, 3 heads), vit_small (384, 6) and vit_base (768,
# 12), all of 64 channels a head (SelfPatch reuses them; DINO's first files said deit_*).
HEAD_WIDTH_BY_ARGS_ARCH = {"vit_tiny": 64, "vit_small": 64, "vit_base": 64, "deit_tiny": 64, "deit_small": 64, "deit_base": 64}


def heads_from_args(args: Any, width: int) -> tuple[str, int] | None:
    """``(arch name, heads)`` when a training file's ``args`` fixes the head count, else None."""
    name = args.get("arch") if isinstance(args, dict) else None
    if not isinstance(name, str) or name not in HEAD_WIDTH_BY_ARGS_ARCH or width % HEAD_WIDTH_BY_ARGS_ARCH[name]:
        return None
    return name, width // HEAD_WIDTH_BY_ARGS_ARCH[name]
