"""Every released ViT layout: files made here from random weights load, and the readout equals a
plain-torch forward written below from the file's own tensors (DINOv2's names, its position-table
class row, LayerScale and register tokens), at every view.

The reference shares no code with timm or probe_toolkit.store.backbone: patches are cut with
``unfold``, blocks written out in float64, and both position-table rules built as matrices
(DINO's +0.1 scale-factor bicubic; the antialiased size-based bicubic of DINOv2's register
models, written as Pillow's separable filter with a = -0.5).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_backbone import cubic_matrix, layer_norm

from probe_toolkit.demo.samples import TINY_B8, TINY_DINOV2, TINY_DINOV2_REG, TINY_P8, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.architectures import RELEASED
from probe_toolkit.store.backbone import Backbone, build_vit, normed_patch_tokens
from probe_toolkit.store.checkpoint_files import read_file
from probe_toolkit.store.checkpoints import load_checkpoint, parameter_count

CASES = {
    "s8-backbone": ("dino-backbone", TINY_P8),
    "s8-full": ("dino-full", TINY_P8),
    "b16-full": ("dino-full", replace(TINY_B8, patch=16, pos_grid=14)),
    "b8-backbone": ("dino-backbone", TINY_B8),
    "b8-full": ("dino-full-wrapped", TINY_B8),
    "selfpatch-s8": ("selfpatch-full", TINY_P8),
    "selfpatch-b8": ("selfpatch-backbone", TINY_B8),
    "dinov2": ("dinov2-backbone", TINY_DINOV2),
    "dinov2-reg": ("dinov2-reg-backbone", TINY_DINOV2_REG),
}
FORMATS = {"dino-full-wrapped": "dino-full"}


def antialias_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Antialiased bicubic resize of n_in samples to n_out (Pillow's filter, a = -0.5), as a matrix."""

    def cubic(x: float, a: float = -0.5) -> float:
        x = abs(x)
        if x < 1:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0

    scale = n_in / n_out
    stretch = max(scale, 1.0)
    support = 2.0 * stretch
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        centre = scale * (i + 0.5)
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n_in)
        w = np.array([cubic((j - centre + 0.5) / stretch) for j in range(lo, hi)])
        m[i, lo:hi] = w / w.sum()
    return m


def file_backbone(path) -> dict[str, torch.Tensor]:
    """The backbone tensors exactly as the file holds them (teacher, prefixes cut here by hand)."""
    obj = read_file(path)
    obj = obj.get("model", obj)
    if "teacher" in obj:
        return {k[len("backbone.") :]: v for k, v in obj["teacher"].items() if k.startswith("backbone.")}
    return dict(obj)


def plain_forward(sd: dict[str, torch.Tensor], heads: int, images: torch.Tensor, rule: str):
    """Tokens (patches), class token, registers, last-block keys and attention, float64."""
    sd = {k: v.double() for k, v in sd.items()}
    weight = sd["patch_embed.proj.weight"]
    d, p = weight.shape[0], weight.shape[-1]
    b, _, height, width = images.shape
    rows, cols = height // p, width // p
    x = images.double()[..., : rows * p, : cols * p]
    patches = x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(b, rows * cols, -1)
    z = patches @ weight.reshape(d, -1).T + sd["patch_embed.proj.bias"]
    cls = "cls_token" in sd
    pos = sd["pos_embed"][0]
    table = pos[int(cls) :]
    g0 = math.isqrt(table.shape[0])
    if (rows, cols) != (g0, g0):
        if rule == "dino":
            mr, mc = cubic_matrix(g0, rows, (rows + 0.1) / g0), cubic_matrix(g0, cols, (cols + 0.1) / g0)
        else:
            mr, mc = antialias_matrix(g0, rows), antialias_matrix(g0, cols)
        cube = table.numpy().reshape(g0, g0, d)
        table = torch.from_numpy(np.einsum("ij,jkc,lk->ilc", mr, cube, mc).reshape(rows * cols, d))
    z = z + table
    front = []
    if cls:
        front.append((sd["cls_token"][0, 0] + pos[0]).expand(b, 1, d))
    n_reg = 0
    if "register_tokens" in sd:  # DINOv2: registers after the class token, no position row
        n_reg = sd["register_tokens"].shape[1]
        front.append(sd["register_tokens"].expand(b, -1, -1))
    z = torch.cat([*front, z], dim=1)
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    hd = d // heads
    for i in range(depth):
        w = lambda name, i=i: sd[f"blocks.{i}.{name}"]  # noqa: E731
        scale1 = sd.get(f"blocks.{i}.ls1.gamma", torch.ones(d, dtype=torch.float64))
        scale2 = sd.get(f"blocks.{i}.ls2.gamma", torch.ones(d, dtype=torch.float64))
        h = layer_norm(z, w("norm1.weight"), w("norm1.bias"))
        qkv = (h @ w("attn.qkv.weight").T + w("attn.qkv.bias")).reshape(b, -1, 3, heads, hd)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        z = z + scale1 * ((attention @ v).transpose(1, 2).reshape(b, -1, d) @ w("attn.proj.weight").T + w("attn.proj.bias"))
        h = layer_norm(z, w("norm2.weight"), w("norm2.bias")) @ w("mlp.fc1.weight").T + w("mlp.fc1.bias")
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
        z = z + scale2 * (h @ w("mlp.fc2.weight").T + w("mlp.fc2.bias"))
    keys = qkv[:, :, 1].reshape(b, -1, d)
    c, s = int(cls), int(cls) + n_reg
    return {
        "tokens": z[:, s:],
        "keys": keys[:, s:],
        "attention": attention,
        "cls_token": z[:, 0] if cls else None,
        "cls_key": keys[:, 0] if cls else None,
        "registers": z[:, c:s] if n_reg else None,
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archs")
    return {name: write_checkpoint(folder / f"{name}.pth", layout, arch, seed=i) for i, (name, (layout, arch)) in enumerate(CASES.items())}


@pytest.mark.parametrize("name", list(CASES))
def test_layout_loads_and_readout_equals_plain_forward(files, name):
    layout, arch = CASES[name]
    checkpoint = load_checkpoint(files[name])
    assert checkpoint.format == FORMATS.get(layout, layout)
    got = checkpoint.arch
    assert (got.width, got.heads, got.patch, got.pos_grid, got.registers, got.layerscale) == (
        arch.width,
        arch.heads,
        arch.patch,
        arch.pos_grid,
        arch.registers,
        arch.layerscale,
    )
    assert got.class_token == (not layout.startswith("selfpatch"))
    if layout.startswith("dinov2"):
        assert set(checkpoint.heads) == {"mask_token"}  # every key of the file is used or named
    backbone = Backbone.from_checkpoint(checkpoint)
    rule = "dinov2-reg" if arch.registers else "dino"
    assert backbone.interpolation == rule
    sd = file_backbone(files[name])
    for size in (224, 480, 96):
        torch.manual_seed(size)
        images = torch.randn(1, 3, size, size)
        out = backbone.readout(images, keys=True, attention="last")
        ref = plain_forward(sd, got.heads, images, rule)
        g = size // arch.patch
        assert out.grid == (g, g) and out.tokens.shape == (1, g * g, arch.width)
        assert out.attention.shape[-1] == got.prefix + g * g  # every token, class and registers first
        for field in ("tokens", "keys", "attention", "cls_token", "cls_key", "registers"):
            mine, theirs = getattr(out, field), ref[field]
            if theirs is None:
                assert mine is None, field
            else:
                assert (mine.double() - theirs).abs().max() < 1e-5, (name, size, field)


@pytest.mark.parametrize("name", list(CASES))
def test_video_features_equal_plain_forward_on_rectangular_frames(files, name):
    """Label propagation's features (after the final norm) on a frame whose sides are no multiple
    of the patch: the network's own position rule and registers, the last pixels unused."""
    _, arch = CASES[name]
    checkpoint = load_checkpoint(files[name])
    backbone = Backbone.from_checkpoint(checkpoint)
    sd = file_backbone(files[name])
    torch.manual_seed(7)
    frames = torch.randn(2, 3, 61, 90)  # 4 × 6 patches at /14, 3 × 5 at /16, 7 × 11 at /8
    got = normed_patch_tokens(backbone, frames)
    rows, cols = 61 // arch.patch, 90 // arch.patch
    ref = plain_forward(sd, arch.heads, frames, "dinov2-reg" if arch.registers else "dino")["tokens"]
    if "norm.weight" in sd:
        ref = layer_norm(ref, sd["norm.weight"].double(), sd["norm.bias"].double())
    assert got.shape == (2, rows * cols, arch.width)
    assert (got.double() - ref).abs().max() < 1e-5, name


def test_registers_matter_and_rules_differ(files):
    """A wrong rule or dropped registers would be visible: the reference tells them apart."""
    sd = file_backbone(files["dinov2-reg"])
    images = torch.randn(1, 3, 224, 224)
    right = plain_forward(sd, 2, images, "dinov2-reg")["tokens"]
    wrong_rule = plain_forward(sd, 2, images, "dino")["tokens"]
    no_registers = plain_forward({k: v for k, v in sd.items() if k != "register_tokens"}, 2, images, "dinov2-reg")["tokens"]
    assert (right - wrong_rule).abs().max() > 1e-3
    assert (right - no_registers).abs().max() > 1e-4  # ten times the tolerance above


def test_strict_loading_lists_stray_and_missing_keys(tmp_path, files):
    sd = file_backbone(files["dinov2-reg"])
    stray = dict(sd, extra_thing=torch.zeros(3))
    torch.save(stray, tmp_path / "stray.pth")
    with pytest.raises(ProbeError, match="unexpected \\['extra_thing'\\]"):
        load_checkpoint(tmp_path / "stray.pth")
    missing = {k: v for k, v in sd.items() if k != "blocks.1.ls2.gamma"}
    torch.save(missing, tmp_path / "missing.pth")
    with pytest.raises(ProbeError, match="missing \\['blocks.1.ls2.gamma'\\]"):
        load_checkpoint(tmp_path / "missing.pth")
    with pytest.raises(ProbeError, match="register tokens"):
        load_checkpoint(files["dinov2-reg"], convert=True)


def block_params(d: int, layerscale: bool) -> int:
    # norm1, qkv, proj, norm2, fc1 (4d), fc2, and two LayerScale vectors in DINOv2
    return 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d) + (2 * d if layerscale else 0)


@pytest.mark.parametrize("name", list(RELEASED))
def test_released_sizes_parameter_counts(name):
    """The released files' parameter counts, from the layout's arithmetic (ViT-S/16: 21,665,664)."""
    arch = RELEASED[name]
    d, p = arch.width, arch.patch
    expected = (d * 3 * p * p + d) + d * (1 + arch.pos_grid**2) + d + 12 * block_params(d, arch.layerscale) + 2 * d
    expected += arch.registers * d + (d if arch.layerscale else 0)  # register tokens, DINOv2's mask_token
    state = build_vit(arch, device="meta").state_dict()
    # timm's model lacks the file's mask_token and, with registers, the table's class row (folded)
    assert parameter_count(state) + (d if arch.layerscale else 0) + (d if arch.registers else 0) == expected
    if name == "vit-s16":
        assert expected == 21_665_664


def readme_networks() -> dict[str, list[str]]:
    """The documentation's "Supported networks" (docs/checkpoints.md): network → (layouts, tensors,
    parameters, 224 px grid, 480 px grid)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    section = text.split("## Supported networks", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ") and not line.startswith("| network")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_readme_lists_every_released_layout_with_its_count():
    """Every released size in the README's table, with the tensors and parameters of its file counted
    from timm's model (built on the meta device) plus what the file holds beside it."""
    table = readme_networks()
    expected = {}
    for name, arch in RELEASED.items():
        d, p = arch.width, arch.patch
        state = build_vit(arch, device="meta").state_dict()
        # DINOv2 files add mask_token; with registers the file's position table keeps the class row timm folds away
        tensors = len(state) + (1 if arch.layerscale else 0)
        params = parameter_count(state) + (d if arch.layerscale else 0) + (d if arch.registers else 0)
        size = {384: "S", 768: "B"}[d]
        grids = [f"{224 // p} × {224 // p}", f"{480 // p} × {480 // p}"]
        if arch.layerscale:
            expected[f"DINOv2 ViT-{size}/{p}" + (", 4 registers" if arch.registers else "")] = (name, tensors, params, grids)
        else:  # SelfPatch's backbone has no class token (nor its position row) and no final norm
            expected[f"DINO ViT-{size}/{p}"] = (name, tensors, params, grids)
            expected[f"SelfPatch-style ViT-{size}/{p}"] = (None, tensors - 3, params - 4 * d, grids)
    assert set(table) == set(expected)
    for label, (name, tensors, params, grids) in expected.items():
        layouts, shown_tensors, shown_params, *shown_grids = table[label]
        assert name is None or f"(`{name}`)" in layouts, label
        assert (int(shown_tensors), int(shown_params.replace(",", "")), shown_grids) == (tensors, params, grids), label
    assert table["DINO ViT-S/16"][2] == "21,665,664" and table["DINOv2 ViT-B/14, 4 registers"][2] == "86,583,552"
