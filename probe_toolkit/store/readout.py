"""What one forward pass of one view gives, for every backbone family (``store.backbone``'s
timm ViT and ``store.dinov3``'s Eva): the arrays ``probe extract`` stores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def whole_patches(images: torch.Tensor, patch: int) -> tuple[torch.Tensor, int, int]:
    """A batch of views cut to whole ``patch``-px patches (pixels past the last whole patch are
    unused, as the released networks' patch embedding leaves them), with its rows and cols."""
    rows, cols = images.shape[-2] // patch, images.shape[-1] // patch
    if rows < 1 or cols < 1:
        raise ValueError(f"a view of {tuple(images.shape[-2:])} px holds no {patch} px patch")
    return images[..., : rows * patch, : cols * patch], rows, cols


@dataclass
class Readout:
    """What one forward pass of one view gives. Patch arrays exclude the class and register tokens."""

    tokens: torch.Tensor  # (B, N, D) last block output, before any final norm
    keys: torch.Tensor | None  # (B, N, D) k = W_k LN1(z) + b_k of the last block, heads concatenated
    cls_token: torch.Tensor | None  # (B, D)
    cls_key: torch.Tensor | None  # (B, D)
    attention: torch.Tensor | None  # (B, heads, T, T) last block softmax over every token (class, registers, patches)
    attention_blocks: torch.Tensor | None  # (B, blocks, heads, T, T) with attention="all"
    registers: torch.Tensor | None = None  # (B, R, D) last block output of DINOv2's register tokens / DINOv3's storage tokens
    grid: tuple[int, int] = (0, 0)  # (rows, cols) of the patches
    sequence: Any = None  # DINOv3 only: ``store.dinov3.Sequence`` (normed tokens, q and k before and after RoPE)
    keys_rope: torch.Tensor | None = None  # (B, N, D) DINOv3 only: the patch keys after RoPE, as its attention uses them


def last_block(model, images: torch.Tensor, keys: bool, attention: str) -> Readout:
    """``readout`` of either family: one ``capture`` of the last block (``store.taps``), cut into a ``Readout``.
    A DINOv3 network also gives its whole last-block ``sequence`` where keys or maps are asked (``store.dinov3.Sequence``)."""
    from .taps import Taps

    arch = model.arch
    last, p, c = arch.depth - 1, arch.prefix, int(arch.class_token)
    dinov3 = arch.family == "dinov3"
    whole = dinov3 and (keys or attention != "none")
    facets = ("tokens",) + (("normed", "q", "k") if whole else ("k",) if keys else ())
    out = model.capture(images, Taps(blocks=(last,), facets=facets, maps=attention))
    x = out.sequences[("tokens", last)]
    k = out.sequences.get(("keys", last)) if keys else None
    sequence = None
    if whole:
        from .dinov3 import Sequence

        sequence = Sequence(*(out.sequences[(kind, last)] for kind in ("normed", "queries", "keys", "queries_rope", "keys_rope")))
    return Readout(
        tokens=x[:, p:],
        keys=k[:, p:] if k is not None else None,
        cls_token=x[:, 0] if c else None,
        cls_key=k[:, 0] if (c and k is not None) else None,
        attention=out.maps[-1] if out.maps else None,
        attention_blocks=torch.stack(out.maps, dim=1) if attention == "all" and out.maps else None,
        registers=x[:, c:p] if p > c else None,
        grid=out.grid,
        sequence=sequence,
        keys_rope=out.sequences[("keys_rope", last)][:, p:] if keys and dinov3 else None,
    )
