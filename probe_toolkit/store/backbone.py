"""The timm ViT for a checkpoint, and the readout of its last block: tokens, keys, attention.

No hand-written ViT: blocks, patch embedding and norms are timm's ``VisionTransformer``, built
with DINO's settings (LayerNorm eps 1e-6, exact GELU, qkv bias). The one thing done here is
the position table for grids other than the trained one, with DINO's own interpolation by
default (bicubic, ``scale_factor=(g+0.1)/g0``, no antialias, untouched at the trained grid);
timm's ``resample_abs_pos_embed`` is the option ``interpolation="timm"``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Iterator, Literal

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn


@dataclass(frozen=True)
class Arch:
    """A ViT's shape, inferred from its tensors so tiny test models and ViT-S/16 share one path."""

    width: int
    depth: int
    heads: int
    patch: int
    class_token: bool
    final_norm: bool
    pos_grid: int  # side of the grid the position table was trained on (14 for 224 px)
    mlp_hidden: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


VIT_S16 = Arch(width=384, depth=12, heads=6, patch=16, class_token=True, final_norm=True, pos_grid=14, mlp_hidden=1536)


Interpolation = Literal["dino", "timm"]
AttentionMode = Literal["last", "all", "none"]


def build_vit(arch: Arch, device: str | torch.device | None = None, init: bool = True) -> VisionTransformer:
    """timm's VisionTransformer with exactly the keys and settings of DINO / SelfPatch for ``arch``.

    ``init=False`` skips timm's random initialisation (seconds at ViT-S) when weights are loaded next.
    """
    return VisionTransformer(
        weight_init="" if init else "skip",
        img_size=arch.pos_grid * arch.patch,
        patch_size=arch.patch,
        embed_dim=arch.width,
        depth=arch.depth,
        num_heads=arch.heads,
        mlp_ratio=arch.mlp_hidden / arch.width,
        qkv_bias=True,
        class_token=arch.class_token,
        global_pool="token" if arch.class_token else "",
        final_norm=arch.final_norm,
        fc_norm=False,
        num_classes=0,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        act_layer=nn.GELU,
        device=device,
    )


def interpolate_pos_embed(pos_embed: torch.Tensor, grid: int, prefix: int, method: Interpolation = "dino") -> torch.Tensor:
    """The position table for a ``grid`` × ``grid`` input; ``prefix`` class-token rows stay first.

    ``dino``: ``F.interpolate(scale_factor=((g+0.1)/g0,)*2, mode="bicubic")`` in the table's dtype,
    skipped at the trained grid, as in DINO's and SelfPatch's ``interpolate_pos_encoding``.
    ``timm``: ``resample_abs_pos_embed`` (size-based, antialiased), agreeing with DINO only at g0.
    """
    rows = pos_embed.shape[1] - prefix
    g0 = int(round(rows**0.5))
    if grid == g0:
        return pos_embed
    if method == "timm":
        return resample_abs_pos_embed(pos_embed, new_size=(grid, grid), old_size=(g0, g0), num_prefix_tokens=prefix)
    width = pos_embed.shape[-1]
    table = pos_embed[:, prefix:].reshape(1, g0, g0, width).permute(0, 3, 1, 2)
    scale = (grid + 0.1) / g0
    table = F.interpolate(table, scale_factor=(scale, scale), mode="bicubic", align_corners=False)
    if table.shape[-2:] != (grid, grid):
        raise AssertionError(f"DINO interpolation gave {tuple(table.shape[-2:])}, expected {(grid, grid)}")
    table = table.permute(0, 2, 3, 1).reshape(1, grid * grid, width)
    return torch.cat([pos_embed[:, :prefix], table], dim=1)


@dataclass
class Readout:
    """What one forward pass of one view gives. Patch arrays exclude the class token."""

    tokens: torch.Tensor  # (B, N, D) last block output, before any final norm
    keys: torch.Tensor | None  # (B, N, D) k = W_k LN1(z) + b_k of the last block, heads concatenated
    cls_token: torch.Tensor | None  # (B, D)
    cls_key: torch.Tensor | None  # (B, D)
    attention: torch.Tensor | None  # (B, heads, T, T) last block softmax over every token (0 = CLS)
    attention_blocks: torch.Tensor | None  # (B, blocks, heads, T, T) with attention="all"


class Backbone(nn.Module):
    """A checkpoint's ViT: ``forward`` gives patch tokens (training), ``readout`` the cached views."""

    def __init__(self, arch: Arch, interpolation: Interpolation = "dino", init: bool = True):
        super().__init__()
        self.arch = arch
        self.interpolation = interpolation
        self.vit = build_vit(arch, init=init)
        # views of other sizes are allowed; the position table is interpolated per grid below
        self.vit.patch_embed.strict_img_size = False
        self.prefix = int(arch.class_token)

    @classmethod
    def from_checkpoint(cls, checkpoint, interpolation: Interpolation = "dino") -> "Backbone":
        """The eval-mode network of a ``checkpoints.Checkpoint``, weights loaded strictly."""
        model = cls(checkpoint.arch, interpolation, init=False)
        model.vit.load_state_dict(checkpoint.backbone, strict=True)
        return model.eval()

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch embedding, class token, position table: (B, prefix + N, D)."""
        if images.shape[-1] != images.shape[-2] or images.shape[-1] % self.arch.patch:
            raise ValueError(f"views are square multiples of {self.arch.patch} px, got {tuple(images.shape[-2:])}")
        grid = images.shape[-1] // self.arch.patch
        x = self.vit.patch_embed(images)
        if self.prefix:
            x = torch.cat([self.vit.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + interpolate_pos_embed(self.vit.pos_embed, grid, self.prefix, self.interpolation)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Last-block patch tokens (B, N, D), class token dropped, no final norm."""
        return self.vit.blocks(self.embed(images))[:, self.prefix:]

    @contextmanager
    def _taps(self, keys: bool, attention: AttentionMode) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Forward hooks, registered for one pass and always removed; explicit softmax where asked."""
        taps: dict[str, list[torch.Tensor]] = {"keys": [], "attention": []}
        blocks = list(self.vit.blocks)
        watched = {"last": blocks[-1:], "all": blocks, "none": []}[attention]
        handles, fused = [], [(b.attn, b.attn.fused_attn) for b in watched]
        last = blocks[-1].attn
        heads, width = self.arch.heads, self.arch.width

        def on_qkv(module, args, output):
            b, n, _ = output.shape
            taps["keys"].append(output.reshape(b, n, 3, heads, width // heads)[:, :, 1].reshape(b, n, width))

        def on_softmax(module, args, output):
            taps["attention"].append(args[0])

        try:
            if keys:
                handles.append(last.qkv.register_forward_hook(on_qkv))
            for block in watched:
                block.attn.fused_attn = False  # the fused kernel never forms the softmax matrix
                handles.append(block.attn.attn_drop.register_forward_hook(on_softmax))
            yield taps
        finally:
            for handle in handles:
                handle.remove()
            for module, was in fused:
                module.fused_attn = was

    @torch.inference_mode()
    def readout(self, images: torch.Tensor, keys: bool = True, attention: AttentionMode = "last") -> Readout:
        """One forward pass: tokens, keys and attention of the last block, from the same pass."""
        with self._taps(keys, attention) as taps:
            x = self.vit.blocks(self.embed(images))
        p = self.prefix
        k = taps["keys"][0] if keys else None
        maps = torch.stack(taps["attention"], dim=1) if taps["attention"] else None
        return Readout(
            tokens=x[:, p:],
            keys=k[:, p:] if k is not None else None,
            cls_token=x[:, 0] if p else None,
            cls_key=k[:, 0] if (p and k is not None) else None,
            attention=maps[:, -1] if maps is not None else None,
            attention_blocks=maps if attention == "all" else None,
        )


# ----------------------------------------------------------------------------------------------
# frames of any shape (DAVIS label propagation): rectangular grids, features after the final norm


def pos_embed_rect(pos_embed: torch.Tensor, rows: int, cols: int, prefix: int) -> torch.Tensor:
    """The position table for a ``rows`` × ``cols`` grid by DINO's ``interpolate_pos_encoding``:
    bicubic with ``scale_factor=((rows+0.1)/g0, (cols+0.1)/g0)``; square grids go through
    ``interpolate_pos_embed`` (the same formula)."""
    if rows == cols:
        return interpolate_pos_embed(pos_embed, rows, prefix, "dino")
    width = pos_embed.shape[-1]
    g0 = int(round((pos_embed.shape[1] - prefix) ** 0.5))
    table = pos_embed[:, prefix:].reshape(1, g0, g0, width).permute(0, 3, 1, 2)
    table = F.interpolate(table, scale_factor=((rows + 0.1) / g0, (cols + 0.1) / g0), mode="bicubic", align_corners=False)
    if table.shape[-2:] != (rows, cols):
        raise AssertionError(f"DINO interpolation gave {tuple(table.shape[-2:])}, expected {(rows, cols)}")
    return torch.cat([pos_embed[:, :prefix], table.permute(0, 2, 3, 1).reshape(1, rows * cols, width)], dim=1)


@torch.inference_mode()
def normed_patch_tokens(model: Backbone, frames: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W), H and W multiples of the patch → (B, rows·cols, D): last-block patch tokens
    after the final norm when the network has one (DINO's ``get_intermediate_layers(n=1)``),
    class token dropped."""
    patch = model.arch.patch
    rows, cols = frames.shape[-2] // patch, frames.shape[-1] // patch
    if frames.shape[-2] % patch or frames.shape[-1] % patch:
        raise ValueError(f"frames must be multiples of {patch} px, got {tuple(frames.shape[-2:])}")
    x = model.vit.patch_embed(frames)
    if model.prefix:
        x = torch.cat([model.vit.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
    x = model.vit.blocks(x + pos_embed_rect(model.vit.pos_embed, rows, cols, model.prefix))
    x = model.vit.norm(x)  # an Identity without a final norm
    return x[:, model.prefix:]
