"""The readout against an independent forward written from the course's equations, and the views.

The reference below shares no code with timm or probe_toolkit.store.backbone: patches are cut with
``unfold``, LayerNorm, softmax, exact GELU and bicubic interpolation are written out.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from probe_toolkit.store.backbone import Backbone, build_vit, interpolate_pos_embed
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.images import normalise, view


def cubic_matrix(n_in: int, n_out: int, scale: float, a: float = -0.75) -> np.ndarray:
    """PyTorch's bicubic (align_corners=False) as a matrix: src = (dst + 0.5) / scale - 0.5, clamped taps."""
    m = np.zeros((n_out, n_in))
    for dst in range(n_out):
        src = (dst + 0.5) / scale - 0.5
        x0 = math.floor(src)
        t = src - x0
        weights = [
            ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
        ]
        for offset, w in zip((-1, 0, 1, 2), weights):
            m[dst, min(max(x0 + offset, 0), n_in - 1)] += w
    return m


def reference_pos(pos: torch.Tensor, grid: int, prefix: int) -> torch.Tensor:
    table = pos[0, prefix:].double().numpy()
    g0 = int(round(math.sqrt(table.shape[0])))
    if grid == g0:
        return pos.double()
    m = cubic_matrix(g0, grid, (grid + 0.1) / g0)
    cube = table.reshape(g0, g0, -1)
    out = np.einsum("ij,jkc,lk->ilc", m, cube, m).reshape(grid * grid, -1)
    return torch.cat([pos[0, :prefix].double(), torch.from_numpy(out)])[None]


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-6) * w + b


def reference_forward(sd: dict, heads: int, images: torch.Tensor):
    """Tokens, last-block keys and attention, in float64, from the course's equations."""
    sd = {k: v.double() for k, v in sd.items()}
    x = images.double()
    b, _, s, _ = x.shape
    p = sd["patch_embed.proj.weight"].shape[-1]
    d = sd["patch_embed.proj.weight"].shape[0]
    g = s // p
    patches = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(b, g * g, 3 * p * p)
    z = patches @ sd["patch_embed.proj.weight"].reshape(d, -1).T + sd["patch_embed.proj.bias"]
    prefix = int("cls_token" in sd)
    if prefix:
        z = torch.cat([sd["cls_token"].expand(b, 1, d), z], dim=1)
    z = z + reference_pos(sd["pos_embed"], g, prefix)
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    hd = d // heads
    for i in range(depth):
        w = lambda name, i=i: sd[f"blocks.{i}.{name}"]  # noqa: E731
        h = layer_norm(z, w("norm1.weight"), w("norm1.bias"))
        qkv = (h @ w("attn.qkv.weight").T + w("attn.qkv.bias")).reshape(b, -1, 3, heads, hd)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # (b, heads, T, hd)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        scores = scores - scores.max(-1, keepdim=True).values
        attention = scores.exp() / scores.exp().sum(-1, keepdim=True)
        out = (attention @ v).transpose(1, 2).reshape(b, -1, d)
        z = z + out @ w("attn.proj.weight").T + w("attn.proj.bias")
        h = layer_norm(z, w("norm2.weight"), w("norm2.bias"))
        h = h @ w("mlp.fc1.weight").T + w("mlp.fc1.bias")
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
        z = z + h @ w("mlp.fc2.weight").T + w("mlp.fc2.bias")
    keys = qkv[:, :, 1].reshape(b, -1, d)
    return z, keys, attention


@pytest.mark.parametrize("layout", ["dino-full", "selfpatch-full"])
@pytest.mark.parametrize("size", [224, 480])
def test_readout_equals_the_equations(tiny_checkpoints, layout, size):
    checkpoint = load_checkpoint(tiny_checkpoints[layout])
    backbone = Backbone.from_checkpoint(checkpoint)
    torch.manual_seed(size)
    images = torch.randn(2, 3, size, size)
    out = backbone.readout(images, keys=True, attention="last")
    tokens, keys, attention = reference_forward(checkpoint.backbone, checkpoint.arch.heads, images)
    p = int(checkpoint.arch.class_token)
    n = (size // 16) ** 2
    assert out.tokens.shape == (2, n, 128) and out.keys.shape == (2, n, 128)
    assert out.attention.shape == (2, 2, n + p, n + p)
    assert (out.tokens.double() - tokens[:, p:]).abs().max() < 1e-5
    assert (out.keys.double() - keys[:, p:]).abs().max() < 1e-5
    assert (out.attention.double() - attention).abs().max() < 1e-5
    if p:
        assert (out.cls_token.double() - tokens[:, 0]).abs().max() < 1e-5
        assert (out.cls_key.double() - keys[:, 0]).abs().max() < 1e-5
    else:
        assert out.cls_token is None and out.cls_key is None
    # hooks are removed and timm's fused attention restored after the pass
    last = backbone.vit.blocks[-1].attn
    assert not last.qkv._forward_hooks and not last.attn_drop._forward_hooks and last.fused_attn


@pytest.mark.parametrize("grid", [6, 30, 60])
def test_pos_interpolation_is_dinos_formula(grid):
    torch.manual_seed(0)
    pos = torch.randn(1, 197, 8)
    ours = interpolate_pos_embed(pos, grid, prefix=1, method="dino")
    assert ours.shape == (1, 1 + grid * grid, 8)
    assert (ours.double() - reference_pos(pos, grid, 1)).abs().max() < 1e-5
    assert interpolate_pos_embed(pos, 14, prefix=1) is pos  # untouched at the trained grid
    timm_way = interpolate_pos_embed(pos, grid, prefix=1, method="timm")
    assert (timm_way - ours).abs().max() > 1e-3  # the two formulas differ away from 14x14


def test_views_geometry():
    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8))
    v224 = view(photo, 224)
    expected = photo.resize((298, 224), Image.Resampling.BICUBIC).crop((37, 0, 261, 224))
    assert v224.size == (224, 224) and np.array_equal(np.asarray(v224), np.asarray(expected))
    portrait = photo.transpose(Image.Transpose.ROTATE_90)  # 480 wide, 640 high
    expected = portrait.resize((224, 298), Image.Resampling.BICUBIC).crop((0, 37, 224, 261))
    assert np.array_equal(np.asarray(view(portrait, 224)), np.asarray(expected))
    assert view(photo, 480).size == (480, 480)
    expected96 = photo.resize((128, 96), Image.Resampling.BICUBIC).crop((16, 0, 112, 96))
    assert np.array_equal(np.asarray(view(photo, 96)), np.asarray(expected96))
    tensor = normalise(v224)
    assert tensor.shape == (3, 224, 224)
    red = np.asarray(v224, dtype=np.float32)[..., 0] / 255
    assert np.allclose(tensor[0].numpy(), (red - 0.485) / 0.229, atol=1e-6)


def test_patch_r_c_is_number_14r_plus_c(tiny_checkpoints):
    backbone = Backbone.from_checkpoint(load_checkpoint(tiny_checkpoints["selfpatch-full"]))
    blank = torch.zeros(1, 3, 224, 224)
    marked = blank.clone()
    r, c = 2, 6
    marked[..., 16 * r : 16 * (r + 1), 16 * c : 16 * (c + 1)] = 1.0
    with torch.no_grad():
        diff = (backbone.vit.patch_embed(marked) - backbone.vit.patch_embed(blank)).abs().sum(-1)[0]
    assert diff.nonzero().flatten().tolist() == [14 * r + c] == [34]


def test_from_checkpoint_equals_a_network_loaded_by_copy(tmp_path):
    """The meta-device build with the file's tensors assigned is the network a plain build and a
    copying ``load_state_dict`` give, bit for bit, and a float16 file still gives float32 parameters."""
    from probe_toolkit.demo.samples import TINY, make_checkpoint
    from probe_toolkit.store.checkpoint_files import save_state

    half = {k: v.half() for k, v in make_checkpoint("dino-backbone", TINY, 4).items()}
    checkpoint = load_checkpoint(save_state(half, tmp_path / "half.pth"))
    model = Backbone.from_checkpoint(checkpoint)
    plain = build_vit(checkpoint.arch, init=False)
    plain.load_state_dict(checkpoint.backbone, strict=True)
    assert {p.dtype for p in model.parameters()} == {torch.float32} and all(p.is_contiguous() for p in model.parameters())
    for name, value in plain.state_dict().items():
        assert torch.equal(model.vit.state_dict()[name], value), name
    images = torch.randn(2, 3, 224, 224)
    plain.patch_embed.strict_img_size = False
    with torch.inference_mode():
        expected = plain.blocks(plain._pos_embed(plain.patch_embed(images)))
    assert torch.equal(model.readout(images, keys=False, attention="none").tokens, expected[:, 1:])
