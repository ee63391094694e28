"""DINOv3 ViTs as timm builds them, and their readout: tokens, q and k before and after RoPE, attention.

No hand-written ViT: the network is timm's ``Eva`` as registered for DINOv3 (``timm/models/eva.py``,
``vit_small_patch16_dinov3_qkvb`` and its SwiGLU / bias-free siblings) with the width, depth, heads
and feed-forward width of the checkpoint: LayerNorm eps 1e-5, LayerScale, 4 storage tokens as
``reg_token``, axial RoPE (base 100, coordinates ``2(i + 0.5)/n - 1`` per axis, rotate-half, patch
tokens only), no position table. That is DINOv3's own forward (facebookresearch/dinov3
``dinov3/models/vision_transformer.py``, ``layers/rope_position_encoding.py``,
``layers/attention.py``); the RoPE periods are the checkpoint's (``rope.periods`` of a backbone
read by ``store.checkpoints``), so a released file's bfloat16-rounded periods are used as released.

Any multiple of the patch is a native input size (RoPE is computed per grid, nothing is
interpolated); a side that is not a multiple uses its largest multiple from the top-left corner,
as DINOv3's strided patch convolution does.

The readout is timm's own ``forward_features``, with hooks that keep the last block's input to
the attention (and the RoPE table it is given) and the tokens before and after the final norm.
timm attends through ``F.scaled_dot_product_attention``, which forms no matrix, so q and k are
recomputed from that same input with the block's own weights, rotated by timm's own
``apply_rot_embed_cat``, and the attention is formed explicitly as softmax(q kᵀ / √d) over all
1 + 4 + N tokens. The network's outputs are not touched by any of this.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .architectures import Arch
from .readout import Readout, last_block, whole_patches
from .taps import Capture, Taps

# timm's registered DINOv3 models by (feed-forward, qkv bias); every shape is overridden from the Arch
TIMM_MODELS = {
    ("mlp", True): "vit_small_patch16_dinov3_qkvb",
    ("mlp", False): "vit_small_patch16_dinov3",
    ("swiglu", True): "vit_small_plus_patch16_dinov3_qkvb",
    ("swiglu", False): "vit_small_plus_patch16_dinov3",
}
PERIODS_KEY = "rope.periods"  # a backbone entry beside the state dict: timm keeps the periods as a non-persistent buffer


def timm_model_name(arch: Arch) -> str:
    return TIMM_MODELS[(arch.ffn, arch.qkv_bias)]


class _FillsSkippedOnMeta(TorchFunctionMode):
    """Skips the in-place fills of timm's initialisers (``trunc_normal_``, ``zeros_``, ...) on meta
    tensors. A meta tensor holds no values, so they change nothing, but ``Eva`` has no option to
    leave them out, and on the meta device each goes through torch's Python reference kernels:
    most of the cost of building the network whose shapes a checkpoint is checked against, and then
    assigned. Only value fills are named (an op that could change a shape or a flag still runs).
    Torch function modes are per thread."""

    FILLS = frozenset({"uniform_", "normal_", "erfinv_", "mul_", "add_", "div_", "clamp_", "zero_", "fill_"})
    FILLS |= {"trunc_normal_", "zeros_", "ones_", "constant_", "kaiming_uniform_", "xavier_uniform_"}  # torch.nn.init's

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        filled = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes its tensor by keyword
        if getattr(func, "__name__", "") in self.FILLS and isinstance(filled, torch.Tensor) and filled.is_meta:
            return filled
        return func(*args, **kwargs)


def build_dinov3(arch: Arch, device: str | torch.device | None = None, init: bool = True) -> nn.Module:
    """timm's DINOv3 ``Eva`` for ``arch``. On the meta device timm's initialisation is skipped
    (``_FillsSkippedOnMeta``); elsewhere it runs, whatever ``init`` says, as timm builds it."""
    import timm

    if arch.family != "dinov3":
        raise ValueError(f"arch family {arch.family!r} is not dinov3")
    extra = {"swiglu_align_to": 1} if arch.ffn == "swiglu" else {}  # mlp_hidden is already DINOv3's aligned width
    with _FillsSkippedOnMeta() if device is not None and torch.device(device).type == "meta" else contextlib.nullcontext():
        model = timm.create_model(
            timm_model_name(arch),
            pretrained=False,
            patch_size=arch.patch,
            embed_dim=arch.width,
            depth=arch.depth,
            num_heads=arch.heads,
            mlp_ratio=(arch.mlp_hidden + 0.5) / arch.width,  # timm takes int(width * ratio) = mlp_hidden
            num_reg_tokens=arch.registers,
            num_classes=0,
            global_pool="token",
            device=device,
            **extra,
        )
    first = model.blocks[0].mlp
    hidden = (first.fc1_g if arch.ffn == "swiglu" else first.fc1).out_features
    if hidden != arch.mlp_hidden:
        raise AssertionError(f"timm built a feed-forward of {hidden}, not {arch.mlp_hidden}")
    return model


def _materialise_buffers(model: nn.Module) -> None:
    """Non-persistent buffers left on the meta device (timm's zero key bias, the RoPE periods) are
    made real and filled by the modules' own ``init_non_persistent_buffers``."""
    for module in model.modules():
        meta = [name for name, buf in module._buffers.items() if buf is not None and buf.is_meta]
        for name in meta:
            buf = module._buffers[name]
            module._buffers[name] = torch.empty(buf.shape, dtype=buf.dtype, device="cpu")
        if meta and hasattr(module, "init_non_persistent_buffers"):
            module.init_non_persistent_buffers()


@dataclass
class Sequence:
    """Whole-sequence arrays of the last block, token order [class, storage 1..R, patches], heads concatenated."""

    normed: torch.Tensor  # (B, T, D) after the final norm
    queries: torch.Tensor  # (B, T, D) q = W_q LN1(z) + b_q, before RoPE
    keys: torch.Tensor  # (B, T, D) k = W_k LN1(z) (the key bias is masked to zero), before RoPE
    queries_rope: torch.Tensor  # (B, T, D) after RoPE (the prefix is not rotated)
    keys_rope: torch.Tensor  # (B, T, D)


class Dinov3Backbone(nn.Module):
    """A DINOv3 checkpoint's network with ``store.backbone.Backbone``'s face (``forward``, ``readout``)."""

    interpolation = "none"  # RoPE: every grid is native

    def __init__(self, arch: Arch, init: bool = True, device: str | torch.device | None = None):
        super().__init__()
        self.arch = arch
        self.vit = build_dinov3(arch, device=device, init=init)
        self.prefix = arch.prefix

    @classmethod
    def from_checkpoint(cls, checkpoint, interpolation: str = "auto") -> Dinov3Backbone:
        """Eval-mode network, the checkpoint's tensors assigned strictly (float32, contiguous), its periods set."""
        if interpolation not in ("auto", "none"):
            from ..infra.errors import ProbeError

            raise ProbeError(checkpoint.path, f"is a DINOv3 network (RoPE), which has no position table for --interp {interpolation}", "omit --interp")
        model = cls(checkpoint.arch, init=False, device="meta")
        shapes = model.vit.state_dict()
        state = {k: v for k, v in checkpoint.backbone.items() if k != PERIODS_KEY}
        state = {k: v.to(shapes[k].dtype).contiguous() if k in shapes else v for k, v in state.items()}
        model.vit.load_state_dict(state, strict=True, assign=True)
        _materialise_buffers(model.vit)
        periods = checkpoint.backbone[PERIODS_KEY]
        if periods.shape != model.vit.rope.periods.shape:
            raise ValueError(f"rope.periods has shape {tuple(periods.shape)}, not {tuple(model.vit.rope.periods.shape)}")
        model.vit.rope.periods.copy_(periods.float())
        return model.eval()

    def grid_of(self, height: int, width: int) -> tuple[int, int]:
        return height // self.arch.patch, width // self.arch.patch

    def _crop(self, images: torch.Tensor) -> torch.Tensor:
        return whole_patches(images, self.arch.patch)[0]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Last-block patch tokens (B, N, D), class and storage tokens dropped, no final norm."""
        last = self.arch.depth - 1
        return self.capture(images, Taps(blocks=(last,), facets=("tokens",))).sequences[("tokens", last)][:, self.prefix :]

    @torch.inference_mode()
    def normed_patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """(B, N, D) patch tokens after the final norm (DINOv3's ``x_norm_patchtokens``)."""
        return self.vit.forward_features(self._crop(images))[:, self.prefix :]

    def capture(self, images: torch.Tensor, taps: Taps) -> Capture:
        """One pass of timm's ``forward_features`` keeping what ``taps`` asks (``store.taps``): hooks
        on the blocks' outputs and on their attention's input (with its RoPE table), from which q, k
        and v are recomputed with the block's own weights and the maps formed explicitly; the
        network's outputs are not touched, and every hook is removed after the pass."""
        with torch.inference_mode():
            images = self._crop(images)
            blocks = list(self.vit.blocks)
            out = Capture(grid=self.grid_of(*images.shape[-2:]))
            maps_at = {"last": {len(blocks) - 1}, "all": set(range(len(blocks))), "none": set()}[taps.maps]
            read_attention = set(taps.qkv_blocks) | maps_at | (set(range(len(blocks))) if taps.stats else set())
            registers = self.arch.registers
            handles = []

            def on_output(index: int):
                def hook(module, args, output):
                    if "tokens" in taps.facets:
                        out.sequences[("tokens", index)] = output
                    if "normed" in taps.facets:
                        out.sequences[("normed", index)] = self.vit.norm(output)

                return hook

            def on_attention(index: int):
                def hook(module, args, kwargs):
                    q, k, v, q_rope, k_rope = self.queries_keys(module, args[0], kwargs.get("rope"))
                    out.keep(taps, index, q, k, v, class_token=True, registers=registers, q_rope=q_rope, k_rope=k_rope)
                    if index in maps_at:
                        out.maps.append(self.explicit_attention(q_rope, k_rope))

                return hook

            try:
                for index in taps.output_blocks:
                    handles.append(blocks[index].register_forward_hook(on_output(index)))
                for index in sorted(read_attention):
                    handles.append(blocks[index].attn.register_forward_pre_hook(on_attention(index), with_kwargs=True))
                self.vit.forward_features(images)
            finally:
                for handle in handles:
                    handle.remove()
            return out

    @staticmethod
    def queries_keys(attn: nn.Module, x: torch.Tensor, rope: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """q, k, v, then q and k after RoPE, (B, heads, T, d), from an ``EvaAttention``'s input, as its forward computes them."""
        from timm.layers.pos_embed_sincos import apply_rot_embed_cat

        b, t, _ = x.shape
        bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias)) if attn.q_bias is not None else None
        qkv = F.linear(x, weight=attn.qkv.weight, bias=bias)
        q, k, v = qkv.reshape(b, t, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is None:
            return q, k, v, q, k
        n = attn.num_prefix_tokens
        half = getattr(attn, "rotate_half", False)
        q_rope = torch.cat([q[:, :, :n], apply_rot_embed_cat(q[:, :, n:], rope, half=half)], dim=2).type_as(q)
        k_rope = torch.cat([k[:, :, :n], apply_rot_embed_cat(k[:, :, n:], rope, half=half)], dim=2).type_as(k)
        return q, k, v, q_rope, k_rope

    @staticmethod
    def explicit_attention(q_rope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
        """softmax(q kᵀ / √d) over every token, (B, heads, T, T)."""
        scores = q_rope @ k_rope.transpose(-2, -1) / math.sqrt(q_rope.shape[-1])
        return scores.softmax(dim=-1)

    def readout(self, images: torch.Tensor, keys: bool = True, attention: str = "last") -> Readout:
        """One pass of timm's forward: tokens before and after the final norm, last-block q and k
        before and after RoPE, explicit attention; patch arrays exclude the 1 + 4 prefix tokens."""
        return last_block(self, images, keys, attention)
