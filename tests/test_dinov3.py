"""DINOv3: the three layouts load strictly into one timm network, and the readout equals the equations.

The reference forward below shares no code with timm or probe_toolkit: it reads the official
layout's own keys (facebookresearch/dinov3 ``vision_transformer.py``), applies ``bias_mask`` to the
qkv bias as ``LinearKMaskedBias`` does, and writes RoPE out from its definition (base 100, periods
100**(2j/(d/2)), coordinates 2(i + 0.5)/n - 1 per axis, the first d/4 angles from the row, the next
d/4 from the column, rotate-half pairs (x_j, x_{j+d/2}), patch tokens only), in float64.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from probe_toolkit.demo.samples import TINY_DINOV3, TINY_DINOV3_SWIGLU, make_checkpoint, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import dinov3_layouts
from probe_toolkit.store.architectures import DINOV3_RELEASED
from probe_toolkit.store.backbone import Backbone, build_vit
from probe_toolkit.store.checkpoint_arch import check_backbone
from probe_toolkit.store.checkpoint_layouts import read_dinov3
from probe_toolkit.store.checkpoints import load_checkpoint

SUFFIX = {"dinov3-official": "pth", "dinov3-timm": "pth", "dinov3-hf": "safetensors"}


def _write(tmp_path, layout, arch=TINY_DINOV3, seed=1):
    return write_checkpoint(tmp_path / f"{layout}.{SUFFIX[layout]}", layout, arch, seed)


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rotate(x, rows, cols, base=100.0):
    """RoPE from its definition on (B, heads, rows*cols, d) patch vectors."""
    d = x.shape[-1]
    j = torch.arange(d // 4, dtype=torch.float64)
    periods = base ** (2 * j / (d // 2))
    y = 2 * (torch.arange(rows, dtype=torch.float64) + 0.5) / rows - 1
    z = 2 * (torch.arange(cols, dtype=torch.float64) + 0.5) / cols - 1
    yy, zz = torch.meshgrid(y, z, indexing="ij")
    theta = torch.cat([2 * math.pi * yy.reshape(-1, 1) / periods, 2 * math.pi * zz.reshape(-1, 1) / periods], dim=1)  # (N, d/2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def reference_forward(sd: dict, heads: int, images: torch.Tensor):
    """Pre-norm tokens, normed tokens, last-block q/k before and after RoPE and attention (float64)."""
    sd = {k: v.double() for k, v in sd.items()}
    x = images.double()
    bsz, _, height, width = x.shape
    w_patch = sd["patch_embed.proj.weight"]
    d, p = w_patch.shape[0], w_patch.shape[-1]
    rows, cols = height // p, width // p
    x = x[..., : rows * p, : cols * p]
    patches = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(bsz, rows * cols, -1)
    z = patches @ w_patch.reshape(d, -1).T + sd["patch_embed.proj.bias"]
    prefix = 1 + sd["storage_tokens"].shape[1]
    z = torch.cat([sd["cls_token"].expand(bsz, 1, d), sd["storage_tokens"].expand(bsz, -1, d), z], dim=1)
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    hd = d // heads
    for i in range(depth):
        w = lambda name, i=i: sd[f"blocks.{i}.{name}"]  # noqa: E731
        h = layer_norm(z, w("norm1.weight"), w("norm1.bias"))
        bias = w("attn.qkv.bias") * w("attn.qkv.bias_mask")
        qkv = (h @ w("attn.qkv.weight").T + bias).reshape(bsz, -1, 3, heads, hd)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
        qr = torch.cat([q[:, :, :prefix], rotate(q[:, :, prefix:], rows, cols)], dim=2)
        kr = torch.cat([k[:, :, :prefix], rotate(k[:, :, prefix:], rows, cols)], dim=2)
        scores = qr @ kr.transpose(-1, -2) / math.sqrt(hd)
        attention = torch.softmax(scores, dim=-1)
        out = (attention @ v).transpose(1, 2).reshape(bsz, -1, d)
        z = z + w("ls1.gamma") * (out @ w("attn.proj.weight").T + w("attn.proj.bias"))
        h = layer_norm(z, w("norm2.weight"), w("norm2.bias"))
        if f"blocks.{i}.mlp.w1.weight" in sd:
            h = torch.nn.functional.silu(h @ w("mlp.w1.weight").T + w("mlp.w1.bias")) * (h @ w("mlp.w2.weight").T + w("mlp.w2.bias"))
            h = h @ w("mlp.w3.weight").T + w("mlp.w3.bias")
        else:
            h = h @ w("mlp.fc1.weight").T + w("mlp.fc1.bias")
            h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
            h = h @ w("mlp.fc2.weight").T + w("mlp.fc2.bias")
        z = z + w("ls2.gamma") * h
    flat = lambda t: t.transpose(1, 2).reshape(bsz, -1, d)  # noqa: E731
    return {
        "prenorm": z,
        "normed": layer_norm(z, sd["norm.weight"], sd["norm.bias"]),
        "q": flat(q),
        "k": flat(k),
        "q_rope": flat(qr),
        "k_rope": flat(kr),
        "attention": attention,
    }


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


AGREEMENT: dict[str, float] = {}


@pytest.mark.parametrize("arch", [TINY_DINOV3, TINY_DINOV3_SWIGLU], ids=["mlp", "swiglu"])
@pytest.mark.parametrize("size", [(224, 224), (480, 480), (224, 320), (230, 250)], ids=["224", "480", "224x320", "230x250"])
def test_readout_equals_the_equations(tmp_path, arch, size):
    path = _write(tmp_path, "dinov3-official", arch)
    raw = make_checkpoint("dinov3-official", arch, seed=1)
    k_third = raw["blocks.1.attn.qkv.bias"][arch.width : 2 * arch.width]
    assert k_third.abs().min() > 0  # the file's key bias is not zero: only the mask removes it
    model = Backbone.from_checkpoint(load_checkpoint(path))
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
    out = model.readout(images, keys=True, attention="last")
    ref = reference_forward(raw, arch.heads, images)
    rows, cols = size[0] // 16, size[1] // 16
    t = 5 + rows * cols
    assert out.grid == (rows, cols) and out.tokens.shape == (2, rows * cols, 128) and out.attention.shape == (2, 2, t, t)
    seq = out.sequence
    errors = {
        "tokens": rel(out.tokens, ref["prenorm"][:, 5:]),
        "cls": rel(out.cls_token, ref["prenorm"][:, 0]),
        "storage": rel(out.registers, ref["prenorm"][:, 1:5]),
        "normed": rel(seq.normed, ref["normed"]),
        "q": rel(seq.queries, ref["q"]),
        "k": rel(seq.keys, ref["k"]),
        "q_rope": rel(seq.queries_rope, ref["q_rope"]),
        "k_rope": rel(seq.keys_rope, ref["k_rope"]),
        "keys": rel(out.keys, ref["k"][:, 5:]),
        "cls_key": rel(out.cls_key, ref["k"][:, 0]),
        "attention": rel(out.attention, ref["attention"]),
    }
    AGREEMENT[f"{arch.ffn} {size}"] = max(errors.values())
    print(f"DINOv3 readout vs equations, {arch.ffn} {size}: max relative error {max(errors.values()):.2e}", errors)
    assert max(errors.values()) < 1e-5, errors
    assert torch.equal(seq.queries_rope[:, :5], seq.queries[:, :5]) and not torch.equal(seq.keys_rope[:, 5:], seq.keys[:, 5:])
    # timm's own forward of the same network gives the same normed tokens, bit for bit
    with torch.inference_mode():
        crop = images[..., : rows * 16, : cols * 16]
        assert torch.equal(model.vit.forward_features(crop), seq.normed)
        assert torch.equal(model(images), out.tokens)
    assert not model.vit.norm._forward_hooks and not model.vit.blocks[-1].attn._forward_pre_hooks


@pytest.mark.parametrize("arch", [TINY_DINOV3, TINY_DINOV3_SWIGLU], ids=["mlp", "swiglu"])
def test_three_layouts_give_bit_identical_outputs(tmp_path, arch):
    images = torch.randn(1, 3, 224, 320, generator=torch.Generator().manual_seed(7))
    outs = {}
    for layout in dinov3_layouts.LAYOUTS:
        checkpoint = load_checkpoint(_write(tmp_path, layout, arch))
        assert checkpoint.format == layout and checkpoint.arch == arch
        outs[layout] = Backbone.from_checkpoint(checkpoint).readout(images)
    first = outs["dinov3-official"]
    for layout, out in outs.items():
        for name in ("tokens", "keys", "cls_token", "cls_key", "registers", "attention"):
            assert torch.equal(getattr(out, name), getattr(first, name)), (layout, name)
        assert torch.equal(out.sequence.normed, first.sequence.normed)


@pytest.mark.parametrize("source", dinov3_layouts.LAYOUTS)
@pytest.mark.parametrize("target", dinov3_layouts.LAYOUTS)
def test_conversion_keeps_the_outputs(tmp_path, source, target):
    from probe_toolkit.demo.samples import save_safetensors
    from probe_toolkit.store.checkpoint_files import save_state

    converted = dinov3_layouts.convert(make_checkpoint(source, TINY_DINOV3, seed=2), target, head_dim=64)
    assert dinov3_layouts.detect(converted) == target
    path = tmp_path / f"c.{SUFFIX[target]}"
    (save_safetensors if target == "dinov3-hf" else save_state)(converted, path)
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    a = Backbone.from_checkpoint(load_checkpoint(path)).readout(images)
    b = Backbone.from_checkpoint(load_checkpoint(_write(tmp_path, source, seed=2))).readout(images)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.attention, b.attention)


def test_released_periods_are_used_and_not_silently_dropped(tmp_path):
    """bfloat16-rounded periods (as in the released files) are the network's; converting them to a
    layout that has no place for them is refused unless asked."""
    state = make_checkpoint("dinov3-official", TINY_DINOV3, seed=1)
    state["rope_embed.periods"] = state["rope_embed.periods"].to(torch.bfloat16).float()
    from probe_toolkit.store.checkpoint_files import save_state

    model = Backbone.from_checkpoint(load_checkpoint(save_state(state, tmp_path / "bf16.pth")))
    assert torch.equal(model.vit.rope.periods, state["rope_embed.periods"])
    with pytest.raises(dinov3_layouts.LayoutError, match="periods differ"):
        dinov3_layouts.convert(state, "dinov3-hf", head_dim=64)
    assert "rope.periods" not in dinov3_layouts.convert(state, "dinov3-timm", head_dim=64, keep_periods=True)


def test_key_bias_must_be_masked(tmp_path):
    from probe_toolkit.store.checkpoint_files import save_state

    state = make_checkpoint("dinov3-official", TINY_DINOV3, seed=1)
    state["blocks.0.attn.qkv.bias_mask"][128:256] = 1.0  # the mask no longer zeros the key bias
    with pytest.raises(ProbeError, match="blocks.0.attn.qkv.bias.*key bias"):
        load_checkpoint(save_state(state, tmp_path / "k.pth"))


@pytest.mark.parametrize("layout", dinov3_layouts.LAYOUTS)
def test_missing_and_unexpected_keys_are_listed(tmp_path, layout):
    from probe_toolkit.demo.samples import save_safetensors
    from probe_toolkit.store.checkpoint_files import save_state

    state = make_checkpoint(layout, TINY_DINOV3, seed=1)
    drop = {"dinov3-official": "blocks.1.ls2.gamma", "dinov3-timm": "blocks.1.gamma_2", "dinov3-hf": "layer.1.layer_scale2.lambda1"}[layout]
    del state[drop]
    state["blocks.1.extra.weight"] = torch.zeros(3)
    path = tmp_path / f"bad.{SUFFIX[layout]}"
    (save_safetensors if layout == "dinov3-hf" else save_state)(state, path)
    with pytest.raises(ProbeError) as error:
        load_checkpoint(path)
    assert "blocks.1.gamma_2" in str(error.value) and "blocks.1.extra.weight" in str(error.value)


def test_safetensors_is_read_without_pickle(tmp_path, monkeypatch):
    path = _write(tmp_path, "dinov3-hf")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load on a safetensors file"))
    assert load_checkpoint(path).format == "dinov3-hf"
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ProbeError):
        load_checkpoint(cut)


@pytest.mark.parametrize("name", list(DINOV3_RELEASED))
def test_released_sizes_load_as_every_layout(name):
    """ViT-S/16 to 7B/16 on the meta device: every layout's keys read back to the network's, strictly."""
    arch = DINOV3_RELEASED[name]
    backbone = {k: v for k, v in build_vit(arch, device="meta").state_dict().items()}
    backbone["rope.periods"] = dinov3_layouts.rope_periods(arch.width // arch.heads)
    if arch.qkv_bias:
        for k in [k for k in backbone if k.endswith("q_bias")]:
            backbone[k] = torch.zeros(arch.width)
            backbone[k.replace("q_bias", "v_bias")] = torch.zeros(arch.width)
    head_dim = arch.width // arch.heads
    files = {
        "dinov3-official": dinov3_layouts.to_official(backbone),
        "dinov3-timm": dinov3_layouts.to_timm(backbone, head_dim),
        "dinov3-hf": dinov3_layouts.to_hf(backbone, head_dim),
    }
    from pathlib import Path

    for layout, state in files.items():
        assert dinov3_layouts.detect(state) == layout
        read, _, found = read_dinov3(state, layout, Path(f"{name}.file"), None)
        assert found == arch, (layout, found)
        check_backbone(read, found, Path(f"{name}.file"))
    millions = sum(v.numel() for k, v in backbone.items() if k != "rope.periods") / 1e6
    # the sizes the DINOv3 README and model card give (S/16 21 M, S+/16 29 M, B/16 86 M, L/16 300 M,
    # H+/16 840 M, 7B/16 6,716 M); L+/16 is not listed there
    expected = {"vit-s16-dinov3": 21, "vit-s16plus-dinov3": 29, "vit-b16-dinov3": 86, "vit-l16-dinov3": 300, "vit-h16plus-dinov3": 840, "vit-7b16-dinov3": 6716}.get(name)
    if expected:
        assert abs(millions - expected) / expected < 0.03, millions


def test_timm_periods_equal_the_formula(tmp_path):
    """timm computes the same float32 periods as DINOv3's formula, and its key bias is a zero buffer."""
    model = Backbone.from_checkpoint(load_checkpoint(write_checkpoint(tmp_path / "t.pth", "dinov3-timm", TINY_DINOV3, 0)))
    assert torch.equal(model.vit.rope.periods, dinov3_layouts.rope_periods(64))
    assert model.vit.blocks[0].attn.k_bias.abs().max() == 0


def test_heads_of_a_file_without_periods(tmp_path):
    """An official file says its head width by its periods; a transformers file by the config.json
    save_pretrained writes beside it; else --heads, else the released sizes (width / 64 here)."""
    import json

    arch = replace(TINY_DINOV3, heads=4)  # head width 32
    official = load_checkpoint(_write(tmp_path, "dinov3-official", arch))
    assert official.arch.heads == 4
    folder = tmp_path / "hf"
    folder.mkdir()
    path = write_checkpoint(folder / "model.safetensors", "dinov3-hf", arch, 1)
    assert load_checkpoint(path).arch.heads == 2
    assert load_checkpoint(path, heads=4).arch.heads == 4
    (folder / "config.json").write_text(json.dumps({"model_type": "dinov3_vit", "num_attention_heads": 4}))
    hf = load_checkpoint(path)
    assert hf.arch == arch
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    a, b = (Backbone.from_checkpoint(c).readout(images) for c in (official, hf))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.attention, b.attention)
    with pytest.raises(ProbeError, match="heads"):
        load_checkpoint(_write(tmp_path, "dinov3-official", arch), heads=2)


@pytest.mark.parametrize("arch", [TINY_DINOV3, TINY_DINOV3_SWIGLU, DINOV3_RELEASED["vit-s16-dinov3"]], ids=["mlp", "swiglu", "s16"])
def test_a_meta_build_is_timms_network_without_its_fills(arch, monkeypatch):
    """On the meta device timm's initialisation is skipped (store.dinov3._FillsSkippedOnMeta): the
    same parameters, buffers, shapes, dtypes and flags as timm's own build, and no fill run."""
    import contextlib

    from torch.overrides import TorchFunctionMode

    from probe_toolkit.store import dinov3

    fills = []

    class Fills(TorchFunctionMode):  # the fills that reach torch under a build
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("uniform_", "erfinv_", "clamp_", "zero_", "fill_", "zeros_", "constant_"):
                fills.append(func.__name__)
            return func(*args, **(kwargs or {}))

    def described(model):
        tensors = [*model.named_parameters(), *model.named_buffers()]
        return [(n, tuple(t.shape), t.dtype, t.device.type, t.requires_grad) for n, t in tensors]

    with Fills():
        skipped = dinov3.build_dinov3(arch, device="meta")
    assert fills == []
    monkeypatch.setattr(dinov3, "_FillsSkippedOnMeta", contextlib.nullcontext)  # timm's own build, every fill run
    with Fills():
        timms = dinov3.build_dinov3(arch, device="meta")
    assert len(fills) >= 5 * arch.depth  # timm's initialisation, which the skipped build leaves out
    assert described(skipped) == described(timms)
    assert list(skipped.state_dict()) == list(timms.state_dict())
