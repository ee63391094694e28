"""What a ViT is, as the store and the manifest know it: its shape, and the released sizes by name.

Plain data, no torch: a command that reads a store (``probe knn``, ``probe linear``) learns the
network's patch and width from here without importing timm and torchvision (a second and more
of start-up); ``backbone`` builds the network from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


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
    registers: int = 0  # DINOv2's register tokens (between the class token and the patches)
    layerscale: bool = False  # DINOv2's per-channel LayerScale on both residual branches

    @property
    def prefix(self) -> int:
        """Tokens before the patches in every sequence: the class token, then the registers."""
        return int(self.class_token) + self.registers

    @property
    def pos_prefix(self) -> int:
        """Rows of the position table before the patch rows (timm's ``no_embed_class`` has none)."""
        return 0 if self.registers else int(self.class_token)

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``arch``; ``registers`` and ``layerscale`` only where set, so a DINO or
        SelfPatch store written before DINOv2 was supported keeps its identity (and resumes)."""
        out = asdict(self)
        for key, default in (("registers", 0), ("layerscale", False)):
            if out[key] == default:
                del out[key]
        return out


VIT_S16 = Arch(width=384, depth=12, heads=6, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=1536)
VIT_S8 = replace(VIT_S16, patch=8, pos_grid=28)
VIT_B16 = Arch(width=768, depth=12, heads=12, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=3072)
VIT_B8 = replace(VIT_B16, patch=8, pos_grid=28)
# DINOv2 (facebookresearch/dinov2 hub/backbones.py: img_size 518, patch 14, init_values 1.0)
DINOV2_S14 = replace(VIT_S16, patch=14, pos_grid=37, layerscale=True)
DINOV2_B14 = replace(VIT_B16, patch=14, pos_grid=37, layerscale=True)
DINOV2_S14_REG = replace(DINOV2_S14, registers=4)
DINOV2_B14_REG = replace(DINOV2_B14, registers=4)
# the released sizes by name (``probe make-checkpoint --arch``, ``benchmarks/extract.py --arch``)
RELEASED = {
    "vit-s16": VIT_S16, "vit-s8": VIT_S8, "vit-b16": VIT_B16, "vit-b8": VIT_B8,
    "dinov2-s14": DINOV2_S14, "dinov2-s14-reg": DINOV2_S14_REG, "dinov2-b14": DINOV2_B14, "dinov2-b14-reg": DINOV2_B14_REG,
}

