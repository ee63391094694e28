"""``probe extract --blocks --facets``: every stored block and facet equals a plain forward written
here (hooks on the blocks for their inputs and outputs; LayerNorm, the qkv split and DINOv3's RoPE
from their definitions, in float64), on tiny DINO, DINOv2-reg and DINOv3 networks, at a fixed view
and at a non-square own size, to 1e-5 in float32. Blocks are counted as DINOv2's and DINOv3's
``get_intermediate_layers`` count them: 0-based indices, ``n=N`` the last N."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from test_dinov3 import layer_norm, rotate

from probe_toolkit.demo.samples import TINY, TINY_DINOV2_REG, TINY_DINOV3, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import cache, images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import Settings, extract
from probe_toolkit.store.extract_plan import resolve_blocks

DEPTH = 3
NETWORKS = {  # layout, arch, the fixed view (a multiple of the patch)
    "dino": ("dino-full", replace(TINY, depth=DEPTH), "square@64"),
    "dinov2-reg": ("dinov2-reg-backbone", replace(TINY_DINOV2_REG, depth=DEPTH), "square@56"),
    "dinov3": ("dinov3-official", replace(TINY_DINOV3, depth=DEPTH), "square@64"),
}
FACETS = ("tokens", "normed", "q", "k", "v")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(4)
    for name, (w, h) in {"wide.png": (100, 72), "tall.png": (64, 90)}.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(out / name)
    return out


def plain_forward(model: Backbone, pixels: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every block's input and output (B, T, D), by hooks on timm's blocks."""
    ins, outs = [], []

    def hook(module, args, output) -> None:
        ins.append(args[0].double())
        outs.append(output.double())

    handles = [b.register_forward_hook(hook) for b in model.vit.blocks]
    try:
        with torch.inference_mode():
            if model.arch.family == "dinov3":
                model.vit.forward_features(pixels)
            else:
                model.vit.blocks(model.embed(pixels))
    finally:
        for h in handles:
            h.remove()
    return ins, outs


def expected(model: Backbone, pixels: torch.Tensor) -> dict[tuple[str, int], torch.Tensor]:
    """(kind, block) → the whole sequence (B, T, D) in float64, from the equations."""
    arch, vit = model.arch, model.vit
    eps = 1e-5 if arch.family == "dinov3" else 1e-6
    heads, d, p = arch.heads, arch.width, arch.prefix
    rows, cols = pixels.shape[-2] // arch.patch, pixels.shape[-1] // arch.patch
    ins, outs = plain_forward(model, pixels)
    out = {}
    for b, (x_in, x_out) in enumerate(zip(ins, outs)):
        block = vit.blocks[b]
        w = lambda t: t.detach().double()  # noqa: E731
        out[("tokens", b)] = x_out
        out[("normed", b)] = layer_norm(x_out, w(vit.norm.weight), w(vit.norm.bias), eps)
        h = layer_norm(x_in, w(block.norm1.weight), w(block.norm1.bias), eps)
        attn = block.attn
        bias = torch.cat([w(attn.q_bias), torch.zeros(d, dtype=torch.float64), w(attn.v_bias)]) if arch.family == "dinov3" else w(attn.qkv.bias)
        qkv = (h @ w(attn.qkv.weight).T + bias).reshape(h.shape[0], -1, 3, heads, d // heads)
        for j, kind in enumerate(("queries", "keys", "values")):
            out[(kind, b)] = qkv[:, :, j].reshape(h.shape[0], -1, d)
            if arch.family == "dinov3" and kind != "values":
                per_head = qkv[:, :, j].transpose(1, 2)
                rotated = torch.cat([per_head[:, :, :p], rotate(per_head[:, :, p:], rows, cols)], dim=2)
                out[(f"{kind}_rope", b)] = rotated.transpose(1, 2).reshape(h.shape[0], -1, d)
    return out


def pixels_of(view: str, picture: Image.Image, patch: int) -> torch.Tensor:
    return (images.native(picture, patch, view) if view in images.OWN_SIZE else images.fixed_pixels(picture, view, "bicubic", "x", patch))[None]


@pytest.mark.parametrize("name", list(NETWORKS))
def test_every_block_and_facet_equals_the_plain_forward(tmp_path, folder, name):
    layout, arch, fixed = NETWORKS[name]
    path = write_checkpoint(tmp_path / f"{name}.pth", layout, arch, seed=7)
    settings = Settings(views=(fixed, "native_crop"), blocks="all", facets=FACETS, dtype="float32", attention="none")
    store = extract(path, folder, settings=settings, store=tmp_path / "s.zarr", quiet=True).store
    ds = cache.open_store(store)
    model = Backbone.from_checkpoint(load_checkpoint(path))
    p, c = arch.prefix, int(arch.class_token)
    kinds = ["tokens", "normed", "queries", "keys", "values"] + (["queries_rope", "keys_rope"] if arch.family == "dinov3" else [])
    for view in (fixed, "native_crop"):
        rows, cols = (ds[f"grid_rows_{images.view_name(view)}"].values, ds[f"grid_cols_{images.view_name(view)}"].values)
        for i, image in enumerate(ds.image.values):
            picture = images.load_image(folder / str(image))
            want = expected(model, pixels_of(images.view_name(view), picture, arch.patch))
            n = int(rows[i] * cols[i])
            for (kind, block), sequence in want.items():
                if kind not in kinds:
                    continue
                name_ = images.view_name(view)
                stored = cache.require(ds, f"{kind}_{name_}", block=block)
                assert stored.attrs["block"] == block
                got = stored.values[i][:n]
                scale = float(sequence.abs().max())
                assert np.abs(got - sequence[0, p:].numpy()).max() <= 1e-5 * scale, (name, view, kind, block)
                if kind.endswith("_rope"):
                    continue  # the prefix is not rotated: its rows are the plain facet's
                cls = cache.require(ds, f"cls_{kind}_{name_}", block=block).values[i]
                assert np.abs(cls - sequence[0, 0].numpy()).max() <= 1e-5 * scale, (name, view, kind, block)
                if arch.registers:
                    registers = "registers" if kind == "tokens" else f"registers_{kind}"
                    got = cache.require(ds, f"{registers}_{name_}", block=block).values[i]
                    assert np.abs(got - sequence[0, c:p].numpy()).max() <= 1e-5 * scale, (name, view, kind, block)
    assert ds.attrs["manifest"]["per_view"][images.view_name(fixed)]["blocks"] == list(range(DEPTH))
    assert "tokens_b0_native_crop" in ds and "tokens_native_crop" in ds and "tokens_b2_native_crop" not in ds  # the last block's names as ever


def test_blocks_are_counted_as_get_intermediate_layers_counts_them(tmp_path, folder):
    assert resolve_blocks("all", 12) == tuple(range(12)) and resolve_blocks("last4", 12) == (8, 9, 10, 11)  # n=4: range(12 - 4, 12)
    assert resolve_blocks("3,7,11", 12) == (3, 7, 11) and resolve_blocks((11, 3), 12) == (3, 11) and resolve_blocks("last", 12) is None
    assert resolve_blocks("11", 12) is None and resolve_blocks("last1", 12) is None  # the last block alone: the names every store has
    for bad, said in (("12", "the network has 12 blocks, 0..11"), ("last13", "has 12 blocks"), ("-1", "distinct 0-based"), ("3,3", "distinct"), ("x", "last<N>")):
        with pytest.raises(ProbeError, match=said):
            resolve_blocks(bad, 12)
    with pytest.raises(ProbeError, match=r"--blocks 0,9: the network has 2 blocks, 0..1; use e.g. --blocks 0 \(0-based.*\), last2, all or last"):
        resolve_blocks("0,9", 2)  # the example is one this network has
    with pytest.raises(ProbeError, match="--facets w is not one of tokens, normed, q, k, v"):
        Settings(views=(224,), facets=("w",))
    path = write_checkpoint(tmp_path / "sp.pth", "selfpatch-backbone", TINY, seed=1)
    with pytest.raises(ProbeError, match="no final norm"):
        extract(path, folder, settings=Settings(views=(224,), facets=("normed",)), store=tmp_path / "n.zarr", quiet=True)
    with pytest.raises(ProbeError, match=r"view square@100: 100 px is not a multiple of the network's 16-px patch; use square@96 or square@112"):
        extract(path, folder, settings=Settings(views=("square@100",)), store=tmp_path / "m.zarr", quiet=True)
    assert not (tmp_path / "n.zarr").exists() and not (tmp_path / "m.zarr").exists()
