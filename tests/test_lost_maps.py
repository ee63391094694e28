"""LOST's degree and seed expansion are stored beside its masks (``results/decoder``: ``degree``,
``expansion``), so the report can draw them; each is checked against LOST's definition written
out here (valeoai/LOST ``object_discovery.py``: the raw keys' dot products A, the degree
d_i = #{j ≠ i : A_ij > 0}, the seed argmin d with ties to the lowest index, the k = 100 patches
of least degree, those positively linked to the seed, M_j = Σ A_pj over them)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from probe_toolkit import run
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract


def lost_by_hand(keys: np.ndarray, k: int = 100) -> tuple[np.ndarray, int, np.ndarray]:
    keys = np.asarray(keys, dtype=np.float64)
    n = len(keys)
    a = keys @ keys.T
    degree = np.array([sum(1 for j in range(n) if j != i and a[i, j] > 0) for i in range(n)], dtype=np.float64)
    seed = min(range(n), key=lambda i: (degree[i], i))
    least = sorted(range(n), key=lambda i: (degree[i], i))[:k]
    chosen = [p for p in least if a[seed, p] > 0]
    return degree, seed, sum(a[p] for p in chosen)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_checkpoints, image_dir):
    root = tmp_path_factory.mktemp("lost")
    return extract(tiny_checkpoints["dino-full"], image_dir, settings=Settings(views=(480,), attention="none", chunk=2),
                   store=root / "s.zarr", quiet=True, batch_size=2).store


@pytest.mark.parametrize("workers", [1, 2])
def test_lost_stores_its_degree_and_seed_expansion(store, workers):
    run("decode", store, preset="lost", view="480", workers=workers)
    ds = records.load(store, "decoder")
    keys = np.asarray(zarr.open_group(str(store), mode="r")["keys_480"][:], dtype=np.float64)
    assert ds["degree"].shape == ds["expansion"].shape == keys.shape[:2]
    for i, image_keys in enumerate(keys):
        degree, seed, expansion = lost_by_hand(image_keys)
        assert np.array_equal(ds["degree"].values[i], degree)
        assert int(ds["seed"].values[i]) == seed
        np.testing.assert_allclose(ds["expansion"].values[i], expansion, rtol=1e-5, atol=1e-5 * np.abs(expansion).max())
        assert ds["masks"].values[i, 0, seed] == (expansion[seed] > 0)  # the seed's component holds the seed


def test_other_rules_store_no_lost_maps(store):
    run("decode", store, preset="tokencut", view="480", workers=1)
    ds = records.load(store, "decoder")
    assert "degree" not in ds and "expansion" not in ds


def test_the_report_draws_losts_degree_map_and_seed(store, tmp_path):
    from probe_toolkit.report.build import write_report

    run("decode", store, preset="lost", view="480", workers=1)
    out = tmp_path / "report"
    write_report([store], out=out, cache_dir=tmp_path / "cache")
    text = (out / "report.md").read_text()
    assert "LOST's degree" in text and "the patch of least degree" in text


def test_streaming_lost_stores_the_same_maps(store, tiny_checkpoints, image_dir, tmp_path):
    """decode on a checkpoint and a folder (keys never written) keeps the same degree and expansion."""
    run("decode", store, preset="lost", view="480", workers=1)
    saved = records.load(store, "decoder")
    streamed = run("decode-stream", tiny_checkpoints["dino-full"], images=image_dir, preset="lost", view="480", chunk=2, batch_size=2,
                   cache_dir=tmp_path / "cache", workers=2)
    ds = records.load(streamed.report.store, "decoder")
    for name in ("degree", "expansion", "seed", "masks"):
        assert np.array_equal(ds[name].values, saved[name].values, equal_nan=True), name
