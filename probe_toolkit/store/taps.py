"""What one forward pass keeps, for every backbone family (``store.backbone``'s timm ViT and
``store.dinov3``'s Eva): the facets of the chosen blocks, the explicit attention maps, the
attention statistics. ``Taps`` asks; ``Capture`` answers with whole sequences (class token,
registers or storage tokens, patches), which ``extract_forward`` cuts into the stored arrays.

The facets, per block b (0-based, as ``get_intermediate_layers`` counts), as DINOv2's and
DINOv3's ``get_intermediate_layers`` and their attention compute them:

- ``tokens``: block b's output (``norm=False``);
- ``normed``: block b's output through the final norm (``norm=True``; DINO's own
  ``get_intermediate_layers`` always applies it);
- ``q``, ``k``, ``v``: block b's attention inputs, W · LN1(z) + bias, heads concatenated in head
  order (timm's ``qkv`` split); DINOv3's q and k also after RoPE (``queries_rope``, ``keys_rope``:
  the patch tokens rotated, the prefix not), as its attention uses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import attention_stats


@dataclass(frozen=True)
class Taps:
    blocks: tuple[int, ...] = ()  # blocks whose facets are kept (0-based)
    facets: tuple[str, ...] = ()  # of store.layout.FACETS
    maps: str = "none"  # none, last (the last block's softmax), all (every block's)
    stats: bool = False  # every block's attention statistics (store.attention_stats)

    @property
    def qkv_blocks(self) -> tuple[int, ...]:
        """Blocks whose attention inputs are read."""
        return self.blocks if any(f in self.facets for f in ("q", "k", "v")) else ()

    @property
    def output_blocks(self) -> tuple[int, ...]:
        """Blocks whose outputs are read."""
        return self.blocks if any(f in self.facets for f in ("tokens", "normed")) else ()


@dataclass
class Capture:
    """What one pass kept: ``sequences[(kind, block)]`` (B, T, D) in token order class, registers,
    patches (kinds: tokens, normed, queries, keys, values, queries_rope, keys_rope); the explicit
    maps (B, heads, T, T) of the watched blocks in block order; ``stats[name]`` one (B, heads, ...)
    tensor per block in block order."""

    sequences: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    maps: list[torch.Tensor] = field(default_factory=list)
    stats: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    grid: tuple[int, int] = (0, 0)

    def keep(
        self,
        taps: Taps,
        block: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        class_token: bool,
        registers: int,
        q_rope: torch.Tensor | None = None,
        k_rope: torch.Tensor | None = None,
    ) -> None:
        """One block's attention inputs, (B, heads, T, d) each (after RoPE where given): its facets
        where asked, its statistics (from the rotated q and k where the network rotates them)."""
        if block in taps.qkv_blocks:
            named = {"q": (("queries", q), ("queries_rope", q_rope)), "k": (("keys", k), ("keys_rope", k_rope)), "v": (("values", v),)}
            for facet in ("q", "k", "v"):
                if facet in taps.facets:
                    for kind, value in named[facet]:
                        if value is not None:
                            self.sequences[(kind, block)] = value.transpose(1, 2).flatten(2)
        if taps.stats:
            found = attention_stats.statistics(
                q if q_rope is None else q_rope, k if k_rope is None else k_rope, class_token=class_token, registers=registers, grid=self.grid
            )
            for name, value in found.items():
                self.stats.setdefault(name, []).append(value)
