"""probe extract on DINOv3: one tiny network in each of its three file layouts gives one store, bit for bit.

The arrays are those of every network (tokens, keys, attention, class token); the 4 storage tokens
go to ``registers_*`` as DINOv2's registers do, never among the patches; the manifest records that
no position table is interpolated (RoPE: every view's grid is native) and DINOv3's LayerNorm eps.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from probe_toolkit.demo.samples import TINY_DINOV3, write_checkpoint
from probe_toolkit.store import images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.cache import open_store
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.dinov3_layouts import LAYOUTS
from probe_toolkit.store.extract import Settings, extract

SUFFIX = {"dinov3-official": "pth", "dinov3-timm": "pth", "dinov3-hf": "safetensors"}


def _arrays(path):
    group = zarr.open_group(path, mode="r")
    return {name: group[name][:] for name in group.array_keys()}


@pytest.fixture(scope="module")
def dinov3_stores(tmp_path_factory, image_dir):
    folder = tmp_path_factory.mktemp("dinov3")
    settings = Settings(views=(224, 480), dtype="float32")
    out = {}
    for layout in LAYOUTS:
        path = write_checkpoint(folder / f"{layout}.{SUFFIX[layout]}", layout, TINY_DINOV3, seed=5)
        out[layout] = (path, extract(path, image_dir, settings=settings, store=folder / f"{layout}.zarr", quiet=True).store)
    return out


def test_the_three_layouts_give_bit_identical_stores(dinov3_stores):
    stores = {layout: _arrays(store) for layout, (_, store) in dinov3_stores.items()}
    first = stores["dinov3-official"]
    for layout, arrays in stores.items():
        assert sorted(arrays) == sorted(first), layout
        for name, values in arrays.items():
            assert np.array_equal(values, first[name], equal_nan=True), (layout, name)


def test_dinov3_store_arrays_and_manifest(dinov3_stores, image_dir):
    path, store = dinov3_stores["dinov3-hf"]
    ds = open_store(store)
    n = len(images.list_images(image_dir))
    assert ds.tokens_224.shape == (n, 196, 128) and ds.keys_480.shape == (n, 900, 128)
    assert ds.attention_224.shape == (n, 2, 201, 201) and ds.registers_224.shape == (n, 4, 128)
    assert ds.cls_tokens_224.shape == (n, 128)
    m = ds.attrs["manifest"]
    assert m["checkpoint"]["format"] == "dinov3-hf" and m["interpolation"] == "none"
    assert m["attention_prefix"] == 5 and m["registers"] == 4 and m["arch"]["family"] == "dinov3"
    assert m["readout"]["layernorm_eps"] == 1e-5 and m["final_norm"]["eps"] == 1e-5
    # the store holds the readout of the same image
    backbone = Backbone.from_checkpoint(load_checkpoint(path))
    ref = images.list_images(image_dir)[2]
    v = images.views(images.load_image(ref.path), (224, 480))
    out = backbone.readout(v[480][None], keys=True, attention="none")
    row = ds.sel(image=ref.id)
    assert np.array_equal(row.keys_480.values, out.keys[0].numpy())
    assert np.array_equal(row.registers_480.values, out.registers[0].numpy())
    out224 = backbone.readout(v[224][None], keys=False, attention="last")
    assert np.array_equal(row.attention_224.values, out224.attention[0].numpy())
    assert np.array_equal(row.tokens_224.values, out224.tokens[0].numpy())
    assert np.array_equal(row.cls_tokens_224.values, out224.cls_token[0].numpy())


def test_an_interpolation_rule_is_refused_in_one_line(dinov3_stores, image_dir, tmp_path):
    from probe_toolkit.infra.errors import ProbeError

    path, _ = dinov3_stores["dinov3-official"]
    with pytest.raises(ProbeError, match="no position table"):
        extract(path, image_dir, settings=Settings(views=(224,), interpolation="dino"), store=tmp_path / "x.zarr", quiet=True)


def test_keys_after_rope_are_stored_beside_the_keys_before(dinov3_stores, image_dir):
    """``keys_rope_<view>``: the patch keys rotated as the network's attention uses them (RoPE from its
    definition, written out in tests/test_dinov3.py), beside ``keys_<view>`` before RoPE; the class key
    is not rotated, so it is stored once."""
    import torch
    from test_dinov3 import rotate

    _, store = dinov3_stores["dinov3-official"]
    ds = open_store(store)
    n = len(images.list_images(image_dir))
    assert ds.keys_rope_480.shape == (n, 900, 128) and "cls_keys_rope_480" not in ds
    assert "keys_rope_224" not in ds  # the 224 view holds tokens and attention, no keys
    assert "keys_rope_480" in ds.attrs["manifest"]["per_view"]["480"]["arrays"]
    heads = 2
    plain = torch.as_tensor(ds.keys_480.values, dtype=torch.float64)
    split = plain.reshape(n, 900, heads, 64).transpose(1, 2)
    rotated = rotate(split, 30, 30).transpose(1, 2).reshape(n, 900, 128)
    stored = torch.as_tensor(ds.keys_rope_480.values, dtype=torch.float64)
    assert float((stored - rotated).abs().max() / rotated.abs().max()) < 1e-5
    assert float((stored - plain).abs().max()) > 1e-2  # the rotation moves them
