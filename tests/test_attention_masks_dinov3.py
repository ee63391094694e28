"""``probe attention-masks`` on a DINOv3 store: the class token's row over the patches, each of the
4 storage tokens' rows kept apart, and where every prefix token looks, against plain loops here."""

from __future__ import annotations

import numpy as np
import pytest

import probe_toolkit as probe
from probe_toolkit.demo.samples import TINY_DINOV3, write_checkpoint
from probe_toolkit.report import write_report
from probe_toolkit.results import records
from probe_toolkit.store.cache import open_store
from probe_toolkit.store.extract import Settings, extract


def plain_mask(row: np.ndarray, mass: float = 0.6) -> np.ndarray:
    """visualize_attention.py's rule, one row: sort ascending, cumulative share above 1 − mass kept, unsorted."""
    row = np.asarray(row, np.float64) / np.sum(row)
    order = sorted(range(len(row)), key=lambda i: (row[i], i))
    keep = np.zeros(len(row), bool)
    total = 0.0
    for i in order:
        total += row[i]
        keep[i] = total > 1 - mass
    return keep


@pytest.fixture(scope="module")
def dinov3_store(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("am3")
    checkpoint = write_checkpoint(root / "v3.pth", "dinov3-timm", TINY_DINOV3, seed=8)
    return root, extract(checkpoint, photos, settings=Settings(views=("224",), dtype="float32", chunk=4), store=root / "s.zarr", quiet=True, batch_size=4).store


def test_storage_tokens_are_kept_apart_and_the_report_says_where_each_looks(dinov3_store):
    root, store = dinov3_store
    run = probe.run("attention-masks", store, workers=1)
    saved = records.load(store, "attention_masks")
    attention = open_store(store).attention_224.values.astype(np.float64)  # (image, head, 201, 201): class, 4 storage, 196 patches
    n, heads = attention.shape[:2]
    assert saved.mask.shape == (n, heads, 196) and saved.storage_mask.shape == (n, 4, heads, 196)
    assert list(saved.token.values) == ["class", "storage 1", "storage 2", "storage 3", "storage 4"] and list(saved.key.values)[-1] == "patches"
    for i in range(n):
        for h in range(heads):
            np.testing.assert_array_equal(saved.mask.values[i, h], plain_mask(attention[i, h, 0, 5:]))
            for r in range(4):
                np.testing.assert_array_equal(saved.storage_mask.values[i, r, h], plain_mask(attention[i, h, 1 + r, 5:]))
    mass = saved.prefix_mass.values
    np.testing.assert_allclose(mass[..., :5], attention[:, :, :5, :5], atol=1e-6)
    np.testing.assert_allclose(mass[..., 5], attention[:, :, :5, 5:].sum(-1), atol=1e-6)
    np.testing.assert_allclose(mass.sum(-1), 1.0, atol=1e-5)
    looks = run.report.looks
    assert looks == saved.attrs["looks"] and looks["token"][0] == "class"
    np.testing.assert_allclose(looks["on_class"], attention[:, :, :5, 0].mean((0, 1)), atol=1e-6)
    np.testing.assert_allclose(looks["on_storage"], attention[:, :, :5, 1:5].sum(-1).mean((0, 1)), atol=1e-6)
    np.testing.assert_allclose(looks["on_patches"], attention[:, :, :5, 5:].sum(-1).mean((0, 1)), atol=1e-6)
    every = np.concatenate([saved.mask.values[:, None], saved.storage_mask.values], axis=1)
    np.testing.assert_allclose(looks["mask_share"], every.mean((0, 2, 3)))
    text = write_report([store], root / "report", patch=0, formats="png").markdown.read_text(encoding="utf-8")
    assert "where the class token and each storage token look" in text and "storage 4" in text
