"""probe extract: the store's layout, its values, resume, shards, refusals and bad images."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
import zarr

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.results import records
from probe_toolkit.store import images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.cache import open_store, require
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import Settings, extract


def test_store_layout_and_manifest(tiny_stores, image_dir):
    ds = xr.open_zarr(tiny_stores["dino"], consolidated=False)
    ids = [r.id for r in images.list_images(image_dir)]
    assert list(ds.image.values) == ids == sorted(ids)
    assert ds.tokens_224.dims == ("image", "patch_224", "channel") and ds.tokens_224.shape == (7, 196, 128)
    assert ds.keys_480.shape == (7, 900, 128) and ds.tokens_96.shape == (7, 36, 128)
    assert ds.attention_224.dims == ("image", "head", "query", "key") and ds.attention_224.shape == (7, 2, 197, 197)
    assert ds.attention_blocks_224.shape == (7, 2, 2, 197, 197)
    assert ds.cls_tokens_224.shape == (7, 128) and ds.cls_keys_480.shape == (7, 128)
    assert ds.tokens_224.dtype == np.float16 and bool(ds.done.all())
    assert np.allclose(ds.attention_224.values.astype(np.float32).sum(-1), 1, atol=2e-2)
    m = ds.attrs["manifest"]
    for field in ("toolkit_version", "git_revision", "checkpoint", "network", "arch", "views", "interpolation", "dtype", "image_list_sha256", "libraries", "date"):
        assert field in m
    assert m["checkpoint"]["format"] == "dino-full" and m["network"] == "teacher" and m["views"] == [96, 224, 480]
    assert tiny_stores["dino"].name == "teacher.zarr" and tiny_stores["dino"].parent.name.startswith("dino-full-")
    sp = open_store(tiny_stores["selfpatch"])
    assert "cls_tokens_224" not in sp and sp.attention_224.shape == (7, 2, 196, 196)
    assert require(sp, "tokens_224").dims == ("image", "patch", "channel")
    assert (ds.image_height.values[ids.index("scenes/one.png")], ds.image_width.values[ids.index("scenes/one.png")]) == (480, 640)


def test_store_values_are_the_readout(tiny_stores, tiny_checkpoints, image_dir):
    ds = open_store(tiny_stores["dino"])
    backbone = Backbone.from_checkpoint(load_checkpoint(tiny_checkpoints["dino-full"]))
    ref = images.list_images(image_dir)[1]
    picture = images.load_image(ref.path)
    v = images.views(picture, (224, 480))
    out224 = backbone.readout(v[224][None], keys=False, attention="last")
    out480 = backbone.readout(v[480][None], keys=True, attention="none")
    row = ds.sel(image=ref.id)
    assert np.allclose(row.tokens_224.values.astype(np.float32), out224.tokens[0].numpy(), atol=1e-2, rtol=1e-3)
    assert np.allclose(row.keys_480.values.astype(np.float32), out480.keys[0].numpy(), atol=1e-2, rtol=1e-3)
    assert np.allclose(row.attention_224.values.astype(np.float32), out224.attention[0].numpy(), atol=1e-3)


def _arrays(path):
    group = zarr.open_group(path, mode="r")
    return {name: group[name][:] for name in group.array_keys()}


def test_resume_after_interruption_gives_the_same_store(tmp_path, tiny_checkpoints, image_dir):
    settings = Settings(views=(224, 480), chunk=2)
    whole = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "whole.zarr", quiet=True).store
    part = tmp_path / "part.zarr"
    first = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=part, limit=3, quiet=True)
    assert first.done == 3 and first.written == 3 and first.left == 4  # at most N, cut inside a chunk
    assert open_store(part).sizes["image"] == 3 and open_store(part, done_only=False).sizes["image"] == 7
    again = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=part, quiet=True)
    assert again.written == 4 and again.done == 7
    a, b = _arrays(whole), _arrays(part)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f"), name


def test_shards_fill_one_store(tmp_path, tiny_checkpoints, image_dir):
    settings = Settings(views=(224,), chunk=2)
    path = tmp_path / "sharded.zarr"
    for i in range(3):
        extract(tiny_checkpoints["selfpatch-backbone"], image_dir, settings=settings, store=path, shard=f"{i}/3", quiet=True)
    whole = extract(tiny_checkpoints["selfpatch-backbone"], image_dir, settings=settings, store=tmp_path / "w.zarr", quiet=True).store
    assert np.array_equal(_arrays(path)["tokens_224"], _arrays(whole)["tokens_224"])


def test_a_store_grows_and_other_settings_are_refused(tmp_path, tiny_checkpoints, image_dir):
    path = tmp_path / "s.zarr"
    extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,)), store=path, quiet=True)
    before = _arrays(path)
    grown = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224, 480)), store=path, quiet=True)
    assert grown.written == 7 and grown.done == 7
    after = _arrays(path)
    for name in ("tokens_224", "attention_224", "cls_tokens_224", "done_224", "grid_rows_224"):
        assert np.array_equal(before[name], after[name], equal_nan=True), name  # untouched
    whole = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224, 480)), store=tmp_path / "w.zarr", quiet=True).store
    assert np.array_equal(after["keys_480"], _arrays(whole)["keys_480"])
    m = open_store(path).attrs["manifest"]
    assert m["views"] == [224, 480] and m["per_view"]["480"]["resample"] == "bicubic" and m["grown"][0]["views"] == ["480"]
    assert after["done_480"].all() and after["done"].all()
    # what a view lacks (every block's maps) grows it by a part of its own; what it held is untouched
    extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,), attention="all"), store=path, quiet=True)
    parted = _arrays(path)
    assert parted["done_224.p1"].all() and parted["done"].all() and np.array_equal(parted["tokens_224"], before["tokens_224"], equal_nan=True)
    assert open_store(path).attrs["manifest"]["per_view"]["224"]["parts"][0]["arrays"] == ["attention_blocks_224.p1"]
    fresh = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,), attention="all"), store=tmp_path / "a.zarr", quiet=True)
    assert np.array_equal(parted["attention_blocks_224.p1"], _arrays(fresh.store)["attention_blocks_224"])
    with pytest.raises(ProbeError, match="480 view with other settings.*resample"):
        extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(480,), resample="lanczos"), store=path, quiet=True)
    with pytest.raises(ProbeError, match="dtype differ"):
        extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,), dtype="float32"), store=path, quiet=True)
    with pytest.raises(ProbeError, match="checkpoint"):
        extract(tiny_checkpoints["dino-full"], image_dir, settings=Settings(views=(224,)), store=path, quiet=True)
    assert np.array_equal(_arrays(path)["tokens_224"], before["tokens_224"], equal_nan=True)


def test_corrupt_image_fails_or_is_skipped(tmp_path, tiny_checkpoints, photos):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("chelsea.jpg", "coffee.jpg"):
        (folder / name).write_bytes((photos / name).read_bytes())
    (folder / "broken.jpg").write_bytes((photos / "rocket.jpg").read_bytes()[:300])
    with pytest.raises(ProbeError, match="broken.jpg.*--on-error skip"):
        extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,)), store=tmp_path / "a.zarr", quiet=True)
    report = extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,)), store=tmp_path / "b.zarr", on_error="skip", quiet=True)
    assert report.written == 2 and len(report.skipped) == 1 and "broken.jpg" in report.skipped[0]
    full = open_store(report.store, done_only=False)
    assert full.failed.values.tolist() == [True, False, False]
    assert list(open_store(report.store).image.values) == ["chelsea.jpg", "coffee.jpg"]


def test_cli_extract_and_one_line_errors(tmp_path, tiny_checkpoints, photos):
    probe = [sys.executable, "-m", "probe_toolkit"]
    run = subprocess.run(
        [*probe, "extract", str(tiny_checkpoints["selfpatch-full"]), "--images", str(photos), "--views", "224", "--cache", str(tmp_path), "-q"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "7/7 images extracted" in run.stdout
    bad = subprocess.run([*probe, "extract", str(tmp_path / "missing.pth"), "--images", str(photos)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "missing.pth: no such checkpoint file" in bad.stderr


def test_a_store_with_results_grows_without_zarrs_warning(tmp_path, tiny_checkpoints, photos):
    """``results/`` sits beside the arrays as a plain folder; zarr's own listing warns about it
    ("not recognized as a component of a Zarr hierarchy"), which a user growing a store saw."""
    from probe_toolkit.store import cache

    probe = [sys.executable, "-m", "probe_toolkit"]
    store = tmp_path / "s.zarr"
    first = subprocess.run(
        [*probe, "extract", str(tiny_checkpoints["dino-full"]), "--images", str(photos), "--views", "224", "--store", str(store), "-q"], capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    records.save(store, "entropy", xr.Dataset({"h": ("image", np.zeros(7))}), {})
    grown = subprocess.run(
        [*probe, "extract", str(tiny_checkpoints["dino-full"]), "--images", str(photos), "--views", "96", "--store", str(store), "-q"], capture_output=True, text=True
    )
    assert grown.returncode == 0 and "7/7 images extracted" in grown.stdout
    assert "Warning" not in grown.stderr and "not recognized" not in grown.stderr, grown.stderr
    assert cache.array_names(zarr.open_group(store, mode="r", use_consolidated=False)) == sorted(
        a for a in zarr.open_group(store, mode="r", use_consolidated=False).array_keys()
    )


def test_convert_on_the_fly(tmp_path, tiny_checkpoints, photos):
    report = extract(tiny_checkpoints["dino-full"], photos, settings=Settings(views=(224,)), convert=True, cache_dir=tmp_path, quiet=True)
    assert report.store.name == "teacher-converted.zarr"
    ds = open_store(report.store)
    assert "cls_tokens_224" not in ds and ds.attention_224.shape[-1] == 196
    assert ds.attrs["manifest"]["arch"]["class_token"] is False and ds.attrs["manifest"]["checkpoint"]["converted"] is True
