"""The store's views and grids: native (padded as TokenCut/LOST), the 480 filter, /8 grids, growth,
integrity at the boundary and in the values.

The native reference below pads and cuts patches with plain numpy loops and interpolates the
position table with explicit cubic matrices in float64; only timm's blocks are shared (they are
held to the equations in test_backbone).
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
import zarr
from PIL import Image
from test_backbone import cubic_matrix, layer_norm

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import grids, images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.cache import open_store, require
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.describe import describe_store
from probe_toolkit.store.extract import Settings, extract


class Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture()
def probe(monkeypatch, capsys):
    """The CLI's entry point run in this process (a subprocess costs seconds of imports each)."""
    from probe_toolkit.cli import main

    def run(*args: str) -> Ran:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["probe", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


SIZES = {"wide.png": (70, 40), "tall.png": (33, 64), "one.png": (16, 16), "exact.png": (48, 32)}  # width, height


@pytest.fixture(scope="module")
def odd_sizes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(4)
    for name, (w, h) in SIZES.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / name)
    return folder


def reference_native(backbone: Backbone, picture: Image.Image, patch: int):
    """Tokens and keys of the zero-padded image (float64), and its (rows, cols)."""
    x = (np.asarray(picture, dtype=np.float64) / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    h, w = x.shape[:2]
    rows, cols = math.ceil(h / patch), math.ceil(w / patch)
    padded = np.zeros((rows * patch, cols * patch, 3))
    padded[:h, :w] = x
    sd = {k: v.double() for k, v in backbone.vit.state_dict().items()}
    weight = sd["patch_embed.proj.weight"].numpy()  # (D, 3, p, p)
    d = weight.shape[0]
    z = np.zeros((rows * cols, d))
    for r in range(rows):
        for c in range(cols):
            piece = padded[r * patch : (r + 1) * patch, c * patch : (c + 1) * patch].transpose(2, 0, 1)
            z[r * cols + c] = np.tensordot(weight, piece, axes=3) + sd["patch_embed.proj.bias"].numpy()
    pos = sd["pos_embed"][0].numpy()
    prefix = pos.shape[0] - TINY.pos_grid**2
    g0 = TINY.pos_grid
    table = pos[prefix:].reshape(g0, g0, d)
    if (rows, cols) != (g0, g0):
        table = np.einsum("ij,jkc,lk->ilc", cubic_matrix(g0, rows, (rows + 0.1) / g0), table, cubic_matrix(g0, cols, (cols + 0.1) / g0))
    z = z + table.reshape(rows * cols, d)
    if prefix:
        z = np.concatenate([sd["cls_token"][0].numpy() + pos[:prefix], z])
    tokens = torch.from_numpy(z)[None]
    blocks = copy.deepcopy(backbone.vit.blocks).double()
    with torch.no_grad():
        before_last = blocks[:-1](tokens)
        last = blocks[-1]
        normed = layer_norm(before_last, last.norm1.weight, last.norm1.bias)
        keys = (normed @ last.attn.qkv.weight.T + last.attn.qkv.bias)[..., d : 2 * d]
        out = blocks(tokens)
    return out[0, prefix:].numpy(), keys[0, prefix:].numpy(), (rows, cols)


def test_native_view_equals_the_padded_forward(tmp_path, tiny_checkpoints, odd_sizes):
    report = extract(
        tiny_checkpoints["dino-backbone"], odd_sizes, settings=Settings(views=("native",), dtype="float32", chunk=3), store=tmp_path / "n.zarr", batch_size=2, quiet=True
    )
    assert report.done == 4
    ds = open_store(report.store, arrays="keys_native")
    m = ds.attrs["manifest"]
    assert m["views"] == ["native"] and m["per_view"]["native"]["patches"] == 15 and "attention_native" not in ds
    assert ds.keys_native.shape == (4, 15, 128) and ds.tokens_native.dims == ("image", "patch_native", "channel")
    rows, cols = grids.view_grid(ds, "native")
    ids = list(ds.image.values)
    expected = {name: (math.ceil(h / 16), math.ceil(w / 16)) for name, (w, h) in SIZES.items()}
    assert {i: (int(r), int(c)) for i, r, c in zip(ids, rows, cols)} == expected == {"wide.png": (3, 5), "tall.png": (4, 3), "one.png": (1, 1), "exact.png": (2, 3)}
    backbone = Backbone.from_checkpoint(load_checkpoint(tiny_checkpoints["dino-backbone"]))
    keys = require(ds, "keys_native").values
    tokens = require(ds, "tokens_native").values
    for k, name in enumerate(ids):
        ref_tokens, ref_keys, grid = reference_native(backbone, images.load_image(odd_sizes / name), 16)
        n = grid[0] * grid[1]
        assert grids.image_patches(keys[k], *grid).shape == (*grid, 128)
        assert np.abs(keys[k, :n] - ref_keys).max() < 1e-4, name
        assert np.abs(tokens[k, :n] - ref_tokens).max() < 1e-4, name
        assert np.isnan(keys[k, n:]).all()  # padding nothing may read
    # row-major: the patch at (r, c) of a wide image is entry r * cols + c
    assert grids.valid_mask(rows, cols, 15).sum() == 15 + 12 + 1 + 6


def test_native_image_smaller_than_a_patch(probe, tmp_path, tiny_checkpoints, odd_sizes):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("wide.png", "tall.png"):
        (folder / name).write_bytes((odd_sizes / name).read_bytes())
    Image.new("RGB", (40, 9)).save(folder / "strip.png")
    ckpt = str(tiny_checkpoints["dino-backbone"])
    store = tmp_path / "s.zarr"
    run = probe("extract", ckpt, "--images", str(folder), "--views", "native", "--store", str(store), "-q")
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0
    assert "strip.png" in run.stderr and "smaller than one 16-px patch" in run.stderr and "Traceback" not in run.stderr
    assert not store.exists()
    run = probe("extract", ckpt, "--images", str(folder), "--views", "224,native", "--store", str(store), "-q", "--on-error", "skip")
    assert run.returncode == 0, run.stderr
    assert "strip.png" in run.stderr
    full = open_store(store, done_only=False)
    strip = list(full.image.values).index("strip.png")
    assert full.failed_native.values[strip] and not full.failed_224.values[strip] and full.done_native.values.all()
    assert "strip.png" in open_store(store, arrays="tokens_224").image.values
    assert "strip.png" not in open_store(store, arrays="keys_native").image.values


def test_lanczos_480_changes_pixels_and_says_so(probe, tmp_path, tiny_checkpoints, photos):
    photo = images.load_image(photos / "chelsea.jpg")
    bicubic, lanczos = (np.asarray(images.view(photo, 480, r), dtype=np.int16) for r in ("bicubic", "lanczos"))
    assert np.array_equal(lanczos, np.asarray(photo.resize((480, 480), Image.Resampling.LANCZOS)))
    assert np.abs(bicubic - lanczos).max() >= 5 and (bicubic != lanczos).mean() > 0.1
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "chelsea.jpg").write_bytes((photos / "chelsea.jpg").read_bytes())
    run = probe(
        "extract",
        str(tiny_checkpoints["dino-backbone"]),
        "--images",
        str(folder),
        "--views",
        "480",
        "--resample",
        "lanczos",
        "--dtype",
        "float32",
        "--store",
        str(tmp_path / "l.zarr"),
        "-q",
    )
    assert run.returncode == 0, run.stderr
    ds = open_store(tmp_path / "l.zarr")
    m = ds.attrs["manifest"]
    assert m["per_view"]["480"]["resample"] == "lanczos" and "lanczos" in m["view_geometry"]["480"]
    backbone = Backbone.from_checkpoint(load_checkpoint(tiny_checkpoints["dino-backbone"]))
    pixels = images.normalise(photo.resize((480, 480), Image.Resampling.LANCZOS))[None]
    assert np.abs(ds.keys_480.values[0] - backbone.readout(pixels, keys=True, attention="none").keys[0].numpy()).max() < 1e-4
    assert any(k == "view 480" and "resample lanczos" in v for k, v in describe_store(tmp_path / "l.zarr"))
    bad = probe("extract", str(tiny_checkpoints["dino-backbone"]), "--images", str(folder), "--views", "224", "--resample", "lanczos")
    assert bad.returncode == 2 and "--resample" in bad.stderr


def test_grids_follow_the_patch_size(tmp_path, photos):
    arch8 = replace(TINY, patch=8, pos_grid=28, width=64, heads=2, mlp_hidden=128, depth=1)
    ckpt = write_checkpoint(tmp_path / "s8.pth", "dino-backbone", arch8, seed=3)
    folder = tmp_path / "two"
    folder.mkdir()
    for name in ("chelsea.jpg", "coffee.jpg"):
        (folder / name).write_bytes((photos / name).read_bytes())
    report = extract(ckpt, folder, settings=Settings(views=(224, 96), attention="none"), store=tmp_path / "s8.zarr", quiet=True)
    ds = open_store(report.store)
    assert ds.tokens_224.shape == (2, 784, 64) and ds.tokens_96.shape == (2, 144, 64)
    assert grids.fixed_grid(ds, "224") == (28, 28) and grids.fixed_grid(ds, "96") == (12, 12)
    assert ds.attrs["manifest"]["per_view"]["224"]["rows"] == 28
    rows = dict(describe_store(report.store))
    assert rows["view 224"].startswith("28x28 patches at /8")


def test_numeric_options_are_checked_at_the_boundary(probe, tmp_path, tiny_checkpoints, odd_sizes):
    ckpt = str(tiny_checkpoints["dino-backbone"])
    for option, value in (("--batch-size", "-4"), ("--batch-size", "0"), ("--chunk", "0"), ("--limit", "0"), ("--limit", "-3"), ("--heads", "0"), ("--shard", "2/2")):
        store = tmp_path / f"{option}{value}.zarr"
        run = probe("extract", ckpt, "--images", str(odd_sizes), "--views", "224", "--store", str(store), "-q", option, value)
        assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "Traceback" not in run.stderr, (option, value, run.stderr)
        assert (option if option != "--shard" else "shard") in run.stderr, run.stderr
        assert not store.exists()
    for views in ("224,999", "natve"):
        run = probe("extract", ckpt, "--images", str(odd_sizes), "--views", views, "-q")
        assert run.returncode == 2 and "--views" in run.stderr and "Traceback" not in run.stderr


def test_limit_is_at_most_n_and_says_so(probe, tmp_path, tiny_checkpoints, odd_sizes):
    store = tmp_path / "l.zarr"
    run = probe("extract", str(tiny_checkpoints["dino-backbone"]), "--images", str(odd_sizes), "--views", "224", "--store", str(store), "-q", "--limit", "3")
    assert run.returncode == 0, run.stderr
    assert "3/4 images extracted in views 224 (3 written now, 0 skipped now)" in run.stdout and "--limit 3: 1 images of this shard left" in run.stdout
    assert open_store(store).sizes["image"] == 3


def test_non_finite_values_are_never_marked_done(tmp_path, odd_sizes):
    sd = torch.load(write_checkpoint(tmp_path / "ok.pth", "dino-backbone", TINY, seed=1), weights_only=True)
    sd["patch_embed.proj.bias"] = sd["patch_embed.proj.bias"] + 1e5  # float16 overflows past 65504
    torch.save(sd, tmp_path / "big.pth")
    with pytest.raises(ProbeError, match=r"exact.png: gives non-finite values in the 224 view.*--on-error skip"):
        extract(tmp_path / "big.pth", odd_sizes, settings=Settings(views=(224,)), store=tmp_path / "a.zarr", quiet=True)
    report = extract(tmp_path / "big.pth", odd_sizes, settings=Settings(views=(224,)), store=tmp_path / "a.zarr", on_error="skip", quiet=True)
    assert report.written == 0 and len(report.skipped) == 4 and all("non-finite" in line for line in report.skipped)
    full = open_store(report.store, done_only=False)
    assert full.failed.values.all() and open_store(report.store).sizes["image"] == 0
    fine = extract(tmp_path / "big.pth", odd_sizes, settings=Settings(views=(224,), dtype="float32"), store=tmp_path / "b.zarr", quiet=True)
    assert fine.written == 4


def test_a_failed_first_run_leaves_nothing_that_blocks_the_fix(tmp_path, tiny_checkpoints, odd_sizes):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "a-broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    for name in ("wide.png", "tall.png"):
        (folder / name).write_bytes((odd_sizes / name).read_bytes())
    store = tmp_path / "s.zarr"
    with pytest.raises(ProbeError, match="a-broken.jpg"):
        extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=2), store=store, quiet=True)
    report = extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(480,), chunk=4), store=store, on_error="skip", quiet=True)
    assert report.written == 2
    m = open_store(store).attrs["manifest"]
    assert m["views"] == [480] and m["chunk"] == 4
    assert zarr.open_group(store, mode="r")["keys_480"].chunks[0] == 4


def test_progress_advances_per_image(tmp_path, monkeypatch, tiny_checkpoints, odd_sizes):
    from contextlib import contextmanager

    import probe_toolkit.store.extract as extraction

    steps = []

    class Recorder:
        def add_task(self, description, total):
            steps.append(("total", total))
            return 0

        def advance(self, task, amount):
            steps.append(("advance", amount))

    @contextmanager
    def fake_bar(unit, quiet):
        yield Recorder()

    monkeypatch.setattr(extraction, "bar", fake_bar)
    extract(tiny_checkpoints["dino-backbone"], odd_sizes, settings=Settings(views=(224, 480), chunk=4), store=tmp_path / "p.zarr", batch_size=1, quiet=True)
    moves = [amount for kind, amount in steps if kind == "advance" and amount]
    assert steps[0] == ("total", 4) and moves[0] == pytest.approx(0.5)  # one image, one of its two views
    assert sum(moves) == pytest.approx(4) and len(moves) == 8


EVAL_SIZES = ((640, 480), (333, 500), (257, 256), (500, 375), (200, 300))  # width, height; 200 px: the short side grows


def extracted(probe, ckpt, folder, views: str, store, *options) -> tuple:
    """``probe extract`` of ``folder`` in ``views`` into ``store``, which must succeed: (store, manifest)."""
    run = probe("extract", ckpt, "--images", folder, "--views", views, "--store", store, "-q", *options)
    assert run.returncode == 0, run.stderr
    ds = open_store(store)
    return ds, ds.attrs["manifest"]


def dino_eval_transform():
    """facebookresearch/dino eval_knn.py's val transform, built with torchvision itself."""
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(256, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )


def test_eval224_view_is_torchvisions_resize_256_centre_crop_224():
    transform = dino_eval_transform()
    rng = np.random.default_rng(7)
    g = images.geometry(640, 480, "eval224")
    assert g.resized == (341, 256) and g.box == (58, 16, 282, 240)  # int(256 * 640 / 480) = 341; round(58.5) = 58
    for w, h in EVAL_SIZES:
        photo = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        ours = images.normalise(images.view(photo, "eval224"))
        assert ours.shape == (3, 224, 224) and torch.equal(ours, transform(photo)), (w, h)  # bit for bit
        assert not torch.equal(ours, images.normalise(images.view(photo, 224)))  # another crop than the 224 view
    assert images.fixed_grid("eval224", 16) == (14, 14) and images.fixed_grid("eval224", 8) == (28, 28)
    assert images.view_name("EVAL224") == "eval224" and images.manifest_view("eval224") == "eval224"


def test_eval224_store_holds_the_forward_of_dinos_transform(probe, tmp_path, tiny_checkpoints):
    folder = tmp_path / "odd"
    folder.mkdir()
    rng = np.random.default_rng(8)
    for w, h in EVAL_SIZES[:4]:
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{w}x{h}.png")
    ckpt, store = tiny_checkpoints["dino-full"], tmp_path / "e.zarr"
    ds, m = extracted(probe, ckpt, folder, "224,eval224", store, "--batch-size", "4")
    assert m["views"] == [224, "eval224"] and m["per_view"]["eval224"]["arrays"] == ["cls_tokens_eval224", "tokens_eval224"]
    assert (m["per_view"]["eval224"]["rows"], m["per_view"]["eval224"]["cols"]) == (14, 14) and "eval_knn.py" in m["view_geometry"]["eval224"]
    assert not [a for a in ds.data_vars if a.endswith("_eval224") and a.startswith(("keys", "attention", "cls_keys"))]
    assert ds.tokens_eval224.dtype == np.float16 and ds.tokens_eval224.shape == (4, 196, 128)
    transform = dino_eval_transform()
    ids = list(ds.image.values)
    pixels = torch.stack([transform(images.load_image(folder / i)) for i in ids])
    backbone = Backbone.from_checkpoint(load_checkpoint(ckpt))
    with torch.no_grad():
        out = backbone.readout(pixels, keys=False, attention="none")
    expected, expected_cls = out.tokens.to(torch.float16).numpy(), out.cls_token.to(torch.float16).numpy()
    assert np.array_equal(ds.tokens_eval224.values, expected) and np.array_equal(ds.cls_tokens_eval224.values, expected_cls)
    assert np.abs(ds.tokens_224.values.astype(np.float32) - expected.astype(np.float32)).max() > 0.01  # the 224 view is another image
    info = probe("info", store)
    assert info.returncode == 0 and "eval224" in info.stdout
    assert dict(describe_store(store))["view eval224"].startswith("14x14 patches at /16")


# ----------------------------------------------------------------------------------------------
# native_crop: each image at its own size, cut at the right and bottom to whole patches, as
# lukemelas/deep-spectral-segmentation extract/extract.py does (ToTensor + Normalize, then
# images[:, :, :H_patch * P, :W_patch * P])

CROP_SIZES = ((333, 500), (257, 256), (200, 300), (64, 48))  # width, height


def dsm_cut(photo: Image.Image, patch: int) -> torch.Tensor:
    """DSM's pixels, built with torchvision itself: ToTensor + ImageNet Normalize, then the top-left whole patches."""
    from torchvision import transforms

    x = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])(photo)
    h, w = x.shape[1:]
    return x[:, : h // patch * patch, : w // patch * patch]


@pytest.mark.parametrize("patch", [16, 8])
def test_native_crop_view_is_torchvisions_tensor_cut_to_whole_patches(patch):
    rng = np.random.default_rng(11)
    for w, h in CROP_SIZES:
        photo = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        ours = images.native(photo, patch, "native_crop")
        assert images.native_grid(w, h, patch, "native_crop") == (h // patch, w // patch)
        assert ours.shape == (3, h // patch * patch, w // patch * patch) and torch.equal(ours, dsm_cut(photo, patch)), (w, h, patch)  # bit for bit
        padded = images.native(photo, patch)  # the same pixels where both have them; native adds zeros instead
        assert torch.equal(padded[:, : ours.shape[1], : ours.shape[2]], ours)
        assert padded.shape[1:] == (math.ceil(h / patch) * patch, math.ceil(w / patch) * patch)
    assert images.native_grid(333, 500, 16, "native_crop") == (31, 20) and images.native_grid(333, 500, 16) == (32, 21)
    assert images.view_name("Native_Crop") == "native_crop" and images.OWN_SIZE == ("native", "native_crop", "native_resized")
    assert images.view_name("native-crop") == "native_crop"


def assert_own_size_store_is_the_forward(ds, view, ckpt, folder, pixels, expected):
    """The view's arrays, each image's grid (``expected``: name -> (rows, cols)), and its keys,
    tokens and class key equal, float16 bit for bit, to the backbone's forward on ``pixels(photo)``
    (each image forwarded alone: its grid is its own shape); the patch dimension's padding NaN."""
    assert sorted(a for a in ds.data_vars if a.endswith(f"_{view}")) == sorted(
        f"{kind}_{view}" for kind in ("cls_keys", "cls_tokens", "done", "failed", "grid_cols", "grid_rows", "keys", "tokens")
    )
    rows, cols = grids.view_grid(ds, view)
    ids = list(ds.image.values)
    assert {i: (int(r), int(c)) for i, r, c in zip(ids, rows, cols)} == expected
    backbone = Backbone.from_checkpoint(load_checkpoint(ckpt))
    keys, tokens, cls_keys = (require(ds, f"{kind}_{view}").values for kind in ("keys", "tokens", "cls_keys"))
    for k, name in enumerate(ids):
        n = expected[name][0] * expected[name][1]
        with torch.no_grad():
            out = backbone.readout(pixels(images.load_image(folder / name))[None], keys=True, attention="none")
        assert np.array_equal(keys[k, :n], out.keys[0].to(torch.float16).numpy()), name
        assert np.array_equal(tokens[k, :n], out.tokens[0].to(torch.float16).numpy()), name
        assert np.array_equal(cls_keys[k], out.cls_key[0].to(torch.float16).numpy()), name
        assert np.isnan(keys[k, n:]).all() and np.isnan(tokens[k, n:]).all()
    return ids, keys


def test_native_crop_store_holds_the_forward_of_the_cut_image(probe, tmp_path, tiny_checkpoints, odd_sizes):
    ckpt, store = tiny_checkpoints["dino-full"], tmp_path / "c.zarr"
    ds, m = extracted(probe, ckpt, odd_sizes, "native,native_crop", store)
    assert m["views"] == ["native", "native_crop"] and m["per_view"]["native_crop"]["patches"] == 8
    assert "extract/extract.py" in m["view_geometry"]["native_crop"] and m["per_view"]["native_crop"]["resample"] == "none"
    expected = {name: (h // 16, w // 16) for name, (w, h) in SIZES.items()}
    assert expected == {"wide.png": (2, 4), "tall.png": (4, 2), "one.png": (1, 1), "exact.png": (2, 3)}
    ids, keys = assert_own_size_store_is_the_forward(ds, "native_crop", ckpt, odd_sizes, lambda photo: dsm_cut(photo, 16), expected)
    native_keys = require(ds, "keys_native").values
    exact, wide = ids.index("exact.png"), ids.index("wide.png")
    assert np.array_equal(keys[exact, :6], native_keys[exact, :6])  # 48 x 32: a multiple of the patch, nothing to pad or cut
    assert not np.array_equal(keys[wide, :8], native_keys[wide, :8])  # 70 x 40: another image, another position table
    info = probe("info", store)
    assert info.returncode == 0 and "view native_crop" in info.stdout
    line = dict(describe_store(store))["view native_crop"]
    assert line.startswith("per-image grids 1x1 to ") and "(patch dimension 8) at /16; 4/4 done" in line


def test_native_crop_image_smaller_than_a_patch(probe, tmp_path, tiny_checkpoints, odd_sizes):
    """9 px high is no whole 16-px patch: native_crop has no grid for it, said in one line, or
    recorded as failed in that view alone with --on-error skip (its 224 view is kept)."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "wide.png").write_bytes((odd_sizes / "wide.png").read_bytes())
    Image.new("RGB", (40, 9)).save(folder / "strip.png")
    ckpt, store = str(tiny_checkpoints["dino-backbone"]), tmp_path / "s.zarr"
    run = probe("extract", ckpt, "--images", folder, "--views", "native_crop", "--store", store, "-q")
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "Traceback" not in run.stderr
    assert "strip.png: is 40x9 px, smaller than one 16-px patch, so its native_crop view has no patch" in run.stderr and "--on-error skip" in run.stderr
    assert not store.exists()
    run = probe("extract", ckpt, "--images", folder, "--views", "224,native_crop", "--store", store, "-q", "--on-error", "skip")
    assert run.returncode == 0, run.stderr
    assert "strip.png" in run.stderr
    full = open_store(store, done_only=False)
    strip = list(full.image.values).index("strip.png")
    assert full.failed_native_crop.values[strip] and not full.failed_224.values[strip] and full.done_native_crop.values.all()
    assert (int(full.grid_rows_native_crop.values[strip]), int(full.grid_cols_native_crop.values[strip])) == (0, 0)
    assert list(open_store(store, arrays="keys_native_crop").image.values) == ["wide.png"]
    assert "strip.png" in open_store(store, arrays="tokens_224").image.values


# ----------------------------------------------------------------------------------------------
# native_resized: the whole image resized with PIL LANCZOS to round(w/p)*p x round(h/p)*p, then
# ToTensor + Normalize, as TokenCut's unsupervised_saliency_detection/utils.py resize_pil and
# get_saliency.py read it (Python's round: halves to even)

RESIZED_SIZES = ((333, 500), (257, 256), (200, 300), (40, 24), (264, 280), (23, 9))  # width, height


def tokencut_resized(photo: Image.Image, patch: int) -> torch.Tensor:
    """TokenCut's saliency pixels, built with PIL and torchvision themselves."""
    from torchvision import transforms

    w, h = photo.size
    resized = photo.resize((int(round(w / patch)) * patch, int(round(h / patch)) * patch), Image.LANCZOS)
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])(resized)


@pytest.mark.parametrize("patch", [16, 8])
def test_native_resized_view_is_tokencuts_lanczos_resize_then_torchvision(patch):
    rng = np.random.default_rng(12)
    sizes = RESIZED_SIZES if patch == 16 else RESIZED_SIZES[:2]
    for w, h in sizes:
        photo = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        ours = images.native(photo, patch, "native_resized")
        assert images.native_grid(w, h, patch, "native_resized") == (round(h / patch), round(w / patch))
        assert ours.shape == (3, round(h / patch) * patch, round(w / patch) * patch)
        assert torch.equal(ours, tokencut_resized(photo, patch)), (w, h, patch)  # bit for bit
    # the grids, halves to even as Python's round: 24/16 = 1.5 -> 2, 40/16 = 2.5 -> 2, 264/16 = 16.5 -> 16, 280/16 = 17.5 -> 18
    assert images.native_grid(40, 24, 16, "native_resized") == (2, 2)
    assert images.native_grid(264, 280, 16, "native_resized") == (18, 16)
    assert images.native_grid(333, 500, 16, "native_resized") == (31, 21)  # native: 32 x 21, native_crop: 31 x 20
    assert images.native_grid(257, 256, 16, "native_resized") == (16, 16) and images.native_grid(257, 256, 8, "native_resized") == (32, 32)
    assert images.native_grid(23, 7, 16, "native_resized") == (1, 1)  # round(7/16) = 0: at least one patch a side
    assert images.native(Image.new("RGB", (23, 7)), 16, "native_resized").shape == (3, 16, 16)
    assert images.view_name("native-resized") == "native_resized"


def test_native_resized_store_holds_the_forward_of_the_resized_image(probe, tmp_path, tiny_checkpoints, odd_sizes):
    ckpt, store = tiny_checkpoints["dino-full"], tmp_path / "r.zarr"
    ds, m = extracted(probe, ckpt, odd_sizes, "native-resized", store)
    assert m["views"] == ["native_resized"] and m["per_view"]["native_resized"]["patches"] == 8
    assert "resize_pil" in m["view_geometry"]["native_resized"] and m["per_view"]["native_resized"]["resample"] == "lanczos"
    expected = {name: (round(h / 16), round(w / 16)) for name, (w, h) in SIZES.items()}
    # wide 70 x 40: 2.5 rows -> 2 (native pads to 3); tall 33 x 64: 2.06 cols -> 2 (native 3)
    assert expected == {"wide.png": (2, 4), "tall.png": (4, 2), "one.png": (1, 1), "exact.png": (2, 3)}
    assert_own_size_store_is_the_forward(ds, "native_resized", ckpt, odd_sizes, lambda photo: tokencut_resized(photo, 16), expected)
    line = dict(describe_store(store))["view native_resized"]
    assert line.startswith("per-image grids 1x1 to ") and "4/4 done" in line


def test_native_resized_takes_an_image_smaller_than_a_patch_as_one_patch(probe, tmp_path, tiny_checkpoints):
    """40 x 9 px has no whole 16-px patch (native, native_crop refuse it); resized it is
    round(9/16) = 1 row by round(40/16) = 2 columns, as TokenCut's resize_pil makes it."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("RGB", (40, 9), (200, 30, 60)).save(folder / "strip.png")
    store = tmp_path / "s.zarr"
    run = probe("extract", tiny_checkpoints["dino-backbone"], "--images", folder, "--views", "native_resized", "--store", store, "-q")
    assert run.returncode == 0, run.stderr
    ds = open_store(store)
    assert (int(ds.grid_rows_native_resized.values[0]), int(ds.grid_cols_native_resized.values[0])) == (1, 2)
