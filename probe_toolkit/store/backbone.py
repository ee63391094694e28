"""The timm ViT for a checkpoint, and the readout of its last block: tokens, keys, attention.

No hand-written ViT: blocks, patch embedding, LayerScale and norms are timm's
``VisionTransformer``, built with DINO's settings (LayerNorm eps 1e-6, exact GELU, qkv bias;
DINOv2 adds LayerScale ``ls1``/``ls2`` and, in its register models, register tokens). The one
thing done here is the position table for grids other than the trained one, by one of the
rules in ``INTERPOLATIONS`` (``auto`` picks the rule of the checkpoint's own code):

- ``dino``: bicubic, ``scale_factor=(g+0.1)/g0``, no antialias (facebookresearch/dino
  ``vision_transformer.py``; also DINOv2's ``interpolate_pos_encoding`` with its default
  ``interpolate_offset=0.1``, the setting of DINOv2's models without registers);
- ``dinov2-reg``: bicubic, ``size=(rows, cols)``, antialias, in float32 (DINOv2's
  ``hub/backbones.py`` builds its register models with ``interpolate_offset=0.0,
  interpolate_antialias=True``, so ``interpolate_pos_encoding`` takes its ``size`` branch);
- ``timm``: timm's ``resample_abs_pos_embed`` (size-based, antialiased).

Every rule leaves the table untouched at the trained grid. Views whose side is not a multiple
of the patch use the largest multiple from the top-left corner (the pixels a strided patch
convolution never reaches, as in DINO's ``PatchEmbed``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from ..infra.progress import within
from .architectures import INTERPOLATIONS, Arch, AttentionMode, Interpolation, resolve_interpolation
from .readout import Readout, last_block, whole_patches
from .taps import Capture, Taps

# tokens in one forward pass from which its blocks show as steps under the bar (``infra.progress.within``):
# a 1024 × 1024 image at /16; below it a pass is short and a line per pass would only flicker
LONG_FORWARD_TOKENS = 4096


def build_vit(arch: Arch, device: str | torch.device | None = None, init: bool = True) -> VisionTransformer:
    """timm's VisionTransformer with exactly the keys and settings of DINO / SelfPatch / DINOv2 for ``arch``.

    Register models use timm's ``reg_token`` with ``no_embed_class`` (the class row of DINOv2's
    table is folded into the class token when a file is read, as timm's own DINOv2 loader does).
    ``init=False`` skips timm's random initialisation (seconds at ViT-S) when weights are loaded next.
    A DINOv3 arch gets timm's DINOv3 ``Eva`` instead (``store.dinov3``).
    """
    if arch.family == "dinov3":
        from .dinov3 import build_dinov3

        return build_dinov3(arch, device=device, init=init)
    return VisionTransformer(
        weight_init="" if init else "skip",
        img_size=arch.pos_grid * arch.patch,
        patch_size=arch.patch,
        embed_dim=arch.width,
        depth=arch.depth,
        num_heads=arch.heads,
        mlp_ratio=arch.mlp_hidden / arch.width,
        qkv_bias=True,
        init_values=1.0 if arch.layerscale else None,
        class_token=arch.class_token,
        reg_tokens=arch.registers,
        no_embed_class=bool(arch.registers),
        global_pool="token" if arch.class_token else "",
        final_norm=arch.final_norm,
        fc_norm=False,
        num_classes=0,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        act_layer=nn.GELU,
        device=device,
    )


def _grid(grid: int | tuple[int, int]) -> tuple[int, int]:
    return (int(grid), int(grid)) if isinstance(grid, int) else (int(grid[0]), int(grid[1]))


def interpolate_pos_embed(pos_embed: torch.Tensor, grid: int | tuple[int, int], prefix: int, method: Interpolation = "dino") -> torch.Tensor:
    """The position table for a ``rows`` × ``cols`` input (``grid`` an int for a square); ``prefix`` rows stay first.

    ``dino``: ``F.interpolate(scale_factor=((rows+0.1)/g0, (cols+0.1)/g0), mode="bicubic")`` in the
    table's dtype, as in DINO's and SelfPatch's ``interpolate_pos_encoding``. ``dinov2-reg``:
    ``F.interpolate(size=(rows, cols), mode="bicubic", antialias=True)`` in float32, as DINOv2's
    register models. ``timm``: ``resample_abs_pos_embed``. All skip the trained grid.
    """
    rows, cols = _grid(grid)
    n = pos_embed.shape[1] - prefix
    g0 = int(round(n**0.5))
    if (rows, cols) == (g0, g0):
        return pos_embed
    if method == "timm":
        return resample_abs_pos_embed(pos_embed, new_size=(rows, cols), old_size=(g0, g0), num_prefix_tokens=prefix)
    width = pos_embed.shape[-1]
    table = pos_embed[:, prefix:].reshape(1, g0, g0, width).permute(0, 3, 1, 2)
    if method == "dinov2-reg":
        table = F.interpolate(table.float(), size=(rows, cols), mode="bicubic", antialias=True).to(pos_embed.dtype)
    elif method == "dino":
        scale = ((rows + 0.1) / g0, (cols + 0.1) / g0)
        table = F.interpolate(table, scale_factor=scale, mode="bicubic", align_corners=False)
    else:
        raise ValueError(f"interpolation {method!r} is not one of {INTERPOLATIONS[1:]}")
    if table.shape[-2:] != (rows, cols):
        raise AssertionError(f"{method} interpolation gave {tuple(table.shape[-2:])}, expected {(rows, cols)}")
    table = table.permute(0, 2, 3, 1).reshape(1, rows * cols, width)
    return torch.cat([pos_embed[:, :prefix], table], dim=1)


class Backbone(nn.Module):
    """A checkpoint's ViT: ``forward`` gives patch tokens (training), ``readout`` the cached views."""

    def __init__(self, arch: Arch, interpolation: Interpolation = "auto", init: bool = True):
        super().__init__()
        self.arch = arch
        self.interpolation = resolve_interpolation(interpolation, arch)
        self.vit = build_vit(arch, init=init)
        # views of other sizes are allowed; the position table is interpolated per grid below
        self.vit.patch_embed.strict_img_size = False
        self.prefix = arch.prefix

    @classmethod
    def from_checkpoint(cls, checkpoint, interpolation: Interpolation = "auto") -> Backbone:
        """The eval-mode network of a ``checkpoints.Checkpoint``, weights loaded strictly.

        Built on the meta device and handed the file's tensors (as the float32, contiguous
        parameters a copy would make): no throw-away initialisation and no second copy of the
        weights, which cost about a second at ViT-B. The checkpoint's tensors become the
        parameters, so they are shared, not copied. A DINOv3 checkpoint gets ``store.dinov3.Dinov3Backbone``.
        """
        if checkpoint.arch.family == "dinov3":
            from .dinov3 import Dinov3Backbone

            return Dinov3Backbone.from_checkpoint(checkpoint, interpolation)
        with torch.device("meta"):
            model = cls(checkpoint.arch, interpolation, init=False)
        shapes = model.vit.state_dict()
        state = {k: v.to(shapes[k].dtype).contiguous() if k in shapes else v for k, v in checkpoint.backbone.items()}
        model.vit.load_state_dict(state, strict=True, assign=True)
        return model.eval()

    def grid_of(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of patches a ``height`` × ``width`` view gives."""
        return height // self.arch.patch, width // self.arch.patch

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch embedding, class and register tokens, position table: (B, prefix + N, D)."""
        images, rows, cols = whole_patches(images, self.arch.patch)
        x = self.vit.patch_embed(images)
        table = interpolate_pos_embed(self.vit.pos_embed, (rows, cols), self.arch.pos_prefix, self.interpolation)
        if self.arch.pos_prefix:  # DINO: the class token has its own row of the table
            x = torch.cat([self.vit.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            return x + table
        x = x + table  # SelfPatch (no class token), or DINOv2 with registers (no_embed_class)
        front = [t.expand(x.shape[0], -1, -1) for t in (self.vit.cls_token, self.vit.reg_token) if t is not None]
        return torch.cat([*front, x], dim=1) if front else x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Last-block patch tokens (B, N, D), class and register tokens dropped, no final norm."""
        return self.vit.blocks(self.embed(images))[:, self.prefix :]

    @torch.inference_mode()
    def capture(self, images: torch.Tensor, taps: Taps) -> Capture:
        """One forward pass keeping what ``taps`` asks (``store.taps``): hooks on the blocks, each
        registered for this pass and always removed; the explicit softmax only where maps are asked
        (elsewhere timm's fused kernel runs, forming no T x T matrix)."""
        blocks = list(self.vit.blocks)
        out = Capture(grid=self.grid_of(*images.shape[-2:]))
        watched = {"last": blocks[-1:], "all": blocks, "none": []}[taps.maps]
        read_qkv = set(range(len(blocks))) if taps.stats else set(taps.qkv_blocks)
        handles, fused = [], [(b.attn, b.attn.fused_attn) for b in watched]
        heads, cls, registers = self.arch.heads, self.arch.class_token, self.arch.registers

        def on_output(index: int):
            def hook(module, args, output):
                if "tokens" in taps.facets:
                    out.sequences[("tokens", index)] = output
                if "normed" in taps.facets:
                    out.sequences[("normed", index)] = self.vit.norm(output)  # an Identity without a final norm

            return hook

        def on_qkv(index: int, attn: nn.Module):
            def hook(module, args, output):
                b, n, _ = output.shape
                q, k, v = output.reshape(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
                out.keep(taps, index, attn.q_norm(q), attn.k_norm(k), v, class_token=cls, registers=registers)

            return hook

        def on_softmax(module, args, output):
            out.maps.append(args[0])

        try:
            for index in taps.output_blocks:
                handles.append(blocks[index].register_forward_hook(on_output(index)))
            for index in sorted(read_qkv):
                handles.append(blocks[index].attn.qkv.register_forward_hook(on_qkv(index, blocks[index].attn)))
            for block in watched:
                block.attn.fused_attn = False  # the fused kernel never forms the softmax matrix
                handles.append(block.attn.attn_drop.register_forward_hook(on_softmax))
            x = self.embed(images)
            if x.shape[0] * x.shape[1] < LONG_FORWARD_TOKENS:
                self.vit.blocks(x)
            else:  # one very large image: the blocks one by one (as nn.Sequential runs them), each a step of its own line
                with within(f"forward pass: {x.shape[1]:,} tokens", len(blocks)) as advance:
                    for block in blocks:
                        x = block(x)
                        advance(1)
        finally:
            for handle in handles:
                handle.remove()
            for module, was in fused:
                module.fused_attn = was
        return out

    def readout(self, images: torch.Tensor, keys: bool = True, attention: AttentionMode = "last") -> Readout:
        """One forward pass: tokens, keys and attention of the last block, from the same pass."""
        return last_block(self, images, keys, attention)


# ----------------------------------------------------------------------------------------------
# frames of any shape (DAVIS label propagation): rectangular grids, features after the final norm


@torch.inference_mode()
def normed_patch_tokens(model: Backbone, frames: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) → (B, rows·cols, D): last-block patch tokens after the final norm when the
    network has one (DINO's ``get_intermediate_layers(n=1)``), class and register tokens dropped.

    The same embedding as every view (``Backbone.embed``: the network's own position-table rule,
    register tokens in place); a side that is not a multiple of the patch (480 px at /14) leaves
    its last pixels unused, as DINO's ``visualize_attention.py`` crops. A DINOv3 network runs its own
    (RoPE) forward.
    """
    if hasattr(model, "normed_patch_tokens"):
        return model.normed_patch_tokens(frames)
    x = model.vit.norm(model.vit.blocks(model.embed(frames)))  # the norm is an Identity without one
    return x[:, model.prefix :]


# ----------------------------------------------------------------------------------------------
# one network per process: the blocks a worker runs (propagate's sequences, NAVI's pairs) share it

_loaded: dict[tuple[str, str, str, str], Backbone] = {}


def loaded(checkpoint: str, sha256: str, network: str, device: str, **load: Any) -> Backbone:
    """The backbone of ``checkpoint`` on ``device``, loaded once per process (``load``: more keywords of
    ``load_checkpoint``, as a store's manifest names them); its sha256 must be the client's (a worker
    reading another file at that path is an integrity failure, not a number)."""
    from ..infra.errors import IntegrityError, ProbeError, worker_name
    from .checkpoints import load_checkpoint

    key = (checkpoint, sha256, network, device)
    if key not in _loaded:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ProbeError(worker_name(), "has no CUDA device, which this run computes on", "use --device cpu, or workers with a GPU")
        ck = load_checkpoint(checkpoint, network=network, **load)
        if ck.sha256 != sha256:
            raise IntegrityError(worker_name(), f"reads another checkpoint at {checkpoint} than the client", "leave the checkpoint in place while the run lasts")
        _loaded[key] = Backbone.from_checkpoint(ck).to(torch.device(device))
    return _loaded[key]


def remember(checkpoint: str, sha256: str, network: str, device: str, model: Backbone) -> None:
    """Hand ``loaded`` a backbone this process has built already (the client's own)."""
    _loaded[(checkpoint, sha256, network, device)] = model


def forget() -> None:
    """Drop every backbone ``loaded`` holds (a run's end: its memory goes back)."""
    _loaded.clear()
