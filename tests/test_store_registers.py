"""A register model's store holds its register tokens in every view (``registers_224``, ``_96``,
``_480``, ``_native``), each equal to an independent plain forward (tests/test_archs.py's
float64 reference, which shares no code with timm or the backbone) of that view's pixels; the
float16 store is the float32 readout rounded by numpy, bit for bit; and a store whose 480 view
was written before it held registers resumes with the layout it was made with.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import synthetic_scene
from test_archs import file_backbone, plain_forward

from probe_toolkit.demo.samples import TINY_DINOV2_REG, write_checkpoint
from probe_toolkit.store import cache, images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import Settings, extract

VIEWS = ("96", "224", "480", "native")
SIZES = {"a.png": (150, 100), "b.png": (120, 130)}  # native grids 8 x 11 and 10 x 9 at /14


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("registers")
    (root / "photos").mkdir()
    for i, (name, size) in enumerate(SIZES.items()):
        synthetic_scene(root / "photos" / name, size, [(10, 10, 60, 60)], seed=i)
    checkpoint = write_checkpoint(root / "reg.pth", "dinov2-reg-backbone", TINY_DINOV2_REG, seed=3)
    return root, checkpoint


def pixels(path, view: str, patch: int) -> torch.Tensor:
    picture = images.load_image(path)
    return (images.native(picture, patch) if view == "native" else images.views(picture, (int(view),))[int(view)])[None]


def test_every_view_stores_its_registers_as_a_plain_forward_gives_them(setup):
    root, checkpoint = setup
    store = root / "f32.zarr"
    extract(checkpoint, root / "photos", settings=Settings(views=VIEWS, dtype="float32", chunk=2), store=store, batch_size=2, quiet=True)
    ds = cache.open_store(store)
    meta = cache.manifest(ds)
    sd = file_backbone(checkpoint)
    arch = TINY_DINOV2_REG
    for view in VIEWS:
        assert f"registers_{view}" in meta["per_view"][view]["arrays"]
        assert ds[f"registers_{view}"].dims == ("image", "register", "channel")
        for ref in images.list_images(root / "photos"):
            ref_out = plain_forward(sd, arch.heads, pixels(ref.path, view, arch.patch), "dinov2-reg")
            stored = ds[f"registers_{view}"].sel(image=ref.id).values
            assert stored.shape == (arch.registers, arch.width)
            assert np.abs(stored - ref_out["registers"][0].numpy()).max() < 1e-5, (view, ref.id)
            if view == "480":  # the patch keys hold no register: they equal the reference's patch keys
                assert np.abs(ds["keys_480"].sel(image=ref.id).values - ref_out["keys"][0].numpy()).max() < 1e-5
                assert np.abs(ds["cls_keys_480"].sel(image=ref.id).values - ref_out["cls_key"][0].numpy()).max() < 1e-5
    # the registers differ from view to view (a copy of one view's would pass the shape checks)
    first = images.list_images(root / "photos")[0].id
    assert np.abs(ds["registers_480"].sel(image=first).values - ds["registers_224"].sel(image=first).values).max() > 1e-3


def test_float16_store_is_the_readout_rounded_by_numpy(setup):
    root, checkpoint = setup
    store = root / "f16.zarr"
    extract(checkpoint, root / "photos", settings=Settings(views=("224", "480"), chunk=2), store=store, batch_size=1, quiet=True)
    ds = cache.open_store(store)
    backbone = Backbone.from_checkpoint(load_checkpoint(checkpoint))
    for ref in images.list_images(root / "photos"):
        for view in ("224", "480"):
            out = backbone.readout(pixels(ref.path, view, 14), keys=True, attention="last")
            fields = (
                {"tokens": out.tokens, "attention": out.attention, "cls_tokens": out.cls_token, "registers": out.registers}
                if view == "224"
                else {"keys": out.keys, "cls_keys": out.cls_key, "registers": out.registers}
            )
            for kind, value in fields.items():
                expected = value[0].numpy().astype(np.float16)
                stored = ds[f"{kind}_{view}"].sel(image=ref.id).values
                assert stored.dtype == np.float16 and np.array_equal(stored.view(np.uint16), expected.view(np.uint16)), (kind, view)


def test_a_480_view_written_without_registers_resumes_as_it_was(setup):
    root, checkpoint = setup
    store = root / "old.zarr"
    settings = Settings(views=("480",), chunk=1)
    extract(checkpoint, root / "photos", settings=settings, store=store, limit=1, quiet=True)
    import zarr

    group = zarr.open_group(store, mode="r+", use_consolidated=False)
    del group["registers_480"]  # as a store written before the 480 view held its registers (its metadata never listed them)
    zarr.consolidate_metadata(str(store))
    report = extract(checkpoint, root / "photos", settings=settings, store=store, quiet=True)
    assert report.done == 2
    ds = cache.open_store(store)
    assert "registers_480" not in ds and ds["keys_480"].shape[0] == 2
    assert np.isfinite(ds["keys_480"].values).all()


def test_normalise_is_the_plain_float32_arithmetic_for_every_value():
    """The look-up table holds every uint8 value of every channel: an image holding them all, normalised
    plainly here ((v / 255 - mean) / std in float32, channel by channel), matches bit for bit."""
    from PIL import Image

    v = np.stack(np.meshgrid(np.arange(256), np.arange(256), indexing="ij"), -1).astype(np.uint8)
    pixels = np.concatenate([v, 255 - v[..., :1]], -1)  # every value in every channel
    got = images.normalise(Image.fromarray(pixels, "RGB")).numpy()
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    for c in range(3):
        plain = (pixels[..., c].astype(np.float32) / np.float32(255.0) - mean[c]) / std[c]
        assert plain.dtype == np.float32 and np.array_equal(got[c].view(np.int32), plain.view(np.int32)), c
