"""``probe entropy`` from the attention statistics (``probe extract --attention stats``) gives what it
gives from the explicit maps: at the 224 view against a store of float32 maps, and at a non-square
own size against the maps of each image's own forward, image by image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cli_runs import probe_main
from PIL import Image

import probe_toolkit as probe
from probe_toolkit.analyses.entropy import row_statistics
from probe_toolkit.demo.samples import TINY_DINOV2_REG, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import cache, images
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import Settings, extract
from probe_toolkit.store.taps import Taps

NAMES = ("patch_entropy", "patch_effective", "distance", "cls_entropy", "cls_effective")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    rng = np.random.default_rng(3)
    (root / "img").mkdir()
    for name, (w, h) in {"a.png": (100, 72), "b.png": (64, 90), "c.png": (130, 80)}.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / "img" / name)
    ckpt = write_checkpoint(root / "reg.pth", "dinov2-reg-backbone", TINY_DINOV2_REG, seed=2)
    maps = extract(ckpt, root / "img", settings=Settings(views=(224,), attention="all", dtype="float32"), store=root / "maps.zarr", quiet=True).store
    stats = extract(ckpt, root / "img", settings=Settings(views=(224, "native_crop"), attention="stats", dtype="float32"), store=root / "stats.zarr", quiet=True).store
    return root, ckpt, maps, stats


def test_statistics_give_the_maps_summaries(stores):
    _, _, maps, stats = stores
    explicit = probe.run("entropy", [maps], boot=100).report.results[str(maps)]
    streamed = probe.run("entropy", [stats], boot=100).report.results[str(stats)]
    for name in (*NAMES, *(f"block_{n}" for n in NAMES), "set_patch_share", "set_block_patch_share", "summary_mean"):
        np.testing.assert_allclose(
            np.asarray(streamed[name].values if hasattr(streamed[name], "values") else streamed[name]),
            np.asarray(explicit[name].values if hasattr(explicit[name], "values") else explicit[name]),
            rtol=2e-5,
            atol=2e-5,
            err_msg=name,
        )
    assert "attention statistics" in streamed.attrs["source"] and streamed.attrs["n_keys"] == explicit.attrs["n_keys"]


def test_own_size_statistics_equal_each_images_own_maps(stores):
    root, ckpt, _, stats = stores
    result = probe.run("entropy", [stats], view="native_crop", boot=100).report.results[str(stats)]
    model = Backbone.from_checkpoint(load_checkpoint(ckpt))
    ds = cache.open_store(stats)
    arch = model.arch
    for i, image in enumerate(ds.image.values):
        pixels = images.native(images.load_image(root / "img" / str(image)), arch.patch, "native_crop")[None]
        cap = model.capture(pixels, Taps(maps="all"))
        want = row_statistics(np.stack([m.numpy() for m in cap.maps], axis=1)[0], True, arch.registers, cap.grid)
        for name in ("patch_entropy", "patch_effective", "distance", "cls_entropy"):
            got = np.asarray(result[f"block_{name}"].values if hasattr(result[f"block_{name}"], "values") else result[f"block_{name}"])[i]
            np.testing.assert_allclose(got, want[name], rtol=2e-5, atol=2e-5, err_msg=f"{image} {name}")
    assert result.attrs["grid"] == "per image" and result.attrs["n_keys"] == -1


def test_statistics_refuse_a_followed_patch_and_the_cli_reads_any_view(stores, capsys):
    _, _, _, stats = stores
    with pytest.raises(ProbeError, match="statistics, not its maps: patch=3 follows one token's row") as refused:
        probe.run("entropy", [stats], patch=3, boot=100)
    assert "--patch" not in str(refused.value) and "drop patch, or" in str(refused.value)  # the Python caller's keyword
    code, printed = probe_main(["entropy", str(stats), "--patch", "3", "--boot", "100", "-q"], capsys)
    assert code == 2 and "--patch 3 follows one token's row" in printed.err and "drop --patch, or" in printed.err, printed.err
    code, printed = probe_main(["entropy", str(stats), "--view", "native-crop", "--boot", "100", "-q"], capsys)
    assert code == 0, printed.err
    code, printed = probe_main(["entropy", str(stats), "--view", "square@64", "--boot", "100", "-q"], capsys)
    assert code != 0 and "attention_square@64" in printed.err


def test_statistics_run_in_memory_linear_in_the_tokens():
    """A 2048 px view's statistics at ViT-S/16's shape: the tile of queries keeps the float64 scores
    near ``attention_stats.TILE_BYTES`` (the explicit maps of one block would be 6 GiB)."""
    from probe_toolkit.store import attention_stats

    tokens = (2048 // 16) ** 2 + 1
    tile = attention_stats.query_tile(1, 6, tokens)
    assert 8 * 6 * tile * tokens <= attention_stats.TILE_BYTES < 6 * tokens * tokens * 4
    q = torch.randn(1, 2, 4 * 5 + 1, 8)
    one = attention_stats.statistics(q, q.clone(), class_token=True, registers=0, grid=(4, 5), budget=8 * 2 * 21 * 3)  # three queries a tile
    assert one["entropy"].shape == (1, 2, 21) and one["distance"].shape == (1, 2, 21) and one["topk"].shape == (1, 2, 21, 3)


def test_a_followed_patch_on_statistics_prints_the_extraction_that_serves_it(stores, capsys, tmp_path):
    """The refusal's extraction is the whole command (checkpoint, images, settings, this store):
    pasted, it adds the 224 maps as a later part (``attention_224.p1``), and the rerun follows the
    patch with the numbers of a store extracted with the maps from the start."""
    import shlex
    import shutil

    _, _, maps, stats = stores
    copy = shutil.copytree(stats, tmp_path / "stats.zarr")
    code, printed = probe_main(["entropy", str(copy), "--patch", "3", "--boot", "100", "-q"], capsys)
    fix = printed.err.split("`")[1]
    assert code == 2 and len(printed.err.strip().splitlines()) == 1 and "CKPT" not in fix and fix.endswith(f"--attention last --store {copy}"), printed.err
    code, printed = probe_main([*shlex.split(fix)[1:], "-q"], capsys)
    assert code == 0, printed.err
    followed = probe.run("entropy", [copy], patch=3, boot=100).report.results[str(copy)]
    explicit = probe.run("entropy", [maps], patch=3, boot=100).report.results[str(maps)]
    assert "attention statistics" not in followed.attrs.get("source", "")
    for name in ("patch_entropy", "distance", "cls_entropy", "detail_effective", "detail_weight", "detail_key"):  # the followed patch's row
        np.testing.assert_allclose(np.asarray(followed[name]), np.asarray(explicit[name]), rtol=1e-6, atol=1e-6, err_msg=name)
