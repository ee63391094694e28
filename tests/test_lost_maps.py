"""LOST's degree and seed expansion are stored beside its masks (``results/decoder``: ``degree``,
``expansion``), so the report can draw them; each is checked against LOST's definition written
out here (valeoai/LOST ``object_discovery.py``: the raw keys' dot products A, the degree
d_i = #{j ≠ i : A_ij > 0}, the patches ranked by ``torch.argsort(-d, descending=True)`` as
``patch_scoring`` ranks them, ties as torch's CPU sort leaves them (or, with ``ties="lowest-index"``,
by patch index), the seed first, the k = 100 first patches, those positively linked to the seed,
M_j = Σ A_pj over them). ``analyses/argsort.py``'s order is checked against ``torch.argsort`` itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr

from probe_toolkit import run
from probe_toolkit.analyses.argsort import argsort
from probe_toolkit.analyses.lost import lost
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract


def lost_by_hand(keys: np.ndarray, k: int = 100, ties: str = "argsort") -> tuple[np.ndarray, int, np.ndarray]:
    keys = np.asarray(keys, dtype=np.float64)
    n = len(keys)
    a = keys @ keys.T
    degree = np.array([sum(1 for j in range(n) if j != i and a[i, j] > 0) for i in range(n)], dtype=np.float64)
    if ties == "argsort":  # patch_scoring: A cloned, diagonal zeroed, negatives clamped, cent = -Σ(A > 0), torch.argsort(cent, descending=True)
        scored = torch.from_numpy(a).clone()
        scored.fill_diagonal_(0)
        scored[scored < 0] = 0
        cent = -torch.sum(scored > 0, dim=1).type(torch.float32)
        order = torch.argsort(cent, descending=True).tolist()
    else:
        order = sorted(range(n), key=lambda i: (degree[i], i))
    seed = order[0]
    chosen = [p for p in order[:k] if a[seed, p] > 0]
    return degree, seed, sum(a[p] for p in chosen)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_checkpoints, image_dir):
    root = tmp_path_factory.mktemp("lost")
    return extract(
        tiny_checkpoints["dino-full"], image_dir, settings=Settings(views=(480,), attention="none", chunk=2), store=root / "s.zarr", quiet=True, batch_size=2
    ).store


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


def test_the_lowest_index_rule_stays_an_option(store):
    run("decode", store, preset="lost", view="480", workers=1, ties="lowest-index")
    ds = records.load(store, "decoder")
    assert ds.attrs["settings"]["ties"] == "lowest-index" and ds.attrs["settings_source"] == "preset lost"
    keys = np.asarray(zarr.open_group(str(store), mode="r")["keys_480"][:], dtype=np.float64)
    for i, image_keys in enumerate(keys):
        degree, seed, expansion = lost_by_hand(image_keys, ties="lowest-index")
        assert int(ds["seed"].values[i]) == seed
        np.testing.assert_allclose(ds["expansion"].values[i], expansion, rtol=1e-5, atol=1e-5 * np.abs(expansion).max())


def _killer(n: int) -> np.ndarray:
    """Keys that drive libstdc++'s introsort into its heapsort fallback (McIlroy's adversary, run
    against ``analyses.argsort``'s comparisons): values fixed lazily, the pivot candidate last."""
    from probe_toolkit.analyses import argsort as module

    gas, val, state = n, [n] * n, {"solid": 0, "candidate": 0}

    class Key:
        def __init__(self, i):
            self.i = i

        def __lt__(self, other):
            x, y = self.i, other.i
            if val[x] == gas and val[y] == gas:
                frozen = x if x == state["candidate"] else y
                val[frozen], state["solid"] = state["solid"], state["solid"] + 1
            if val[x] == gas:
                state["candidate"] = x
            elif val[y] == gas:
                state["candidate"] = y
            return val[x] < val[y]

    key, index = [Key(i) for i in range(n)], list(range(n))
    module._introsort(key, index, 0, n, 2 * (n.bit_length() - 1))
    return np.asarray(val)


def test_argsort_is_torchs_cpu_argsort_ties_included(monkeypatch):
    """Degree-like keys (many equal values) at the sizes LOST sorts (a 480 view at /16: 900 patches;
    own-size VOC images: a few hundred to a few thousand), sorted, reversed, constant, and keys that
    reach the heapsort fallback: the order of ``torch.argsort(-d, descending=True)`` element for element."""
    from probe_toolkit.analyses import argsort as module

    rng = np.random.default_rng(0)
    cases = [rng.integers(0, hi, n) for n in (1, 2, 15, 16, 17, 33, 100, 900, 1200, 2700) for hi in (2, 7, max(2, n // 3))]
    cases += [np.sort(rng.integers(0, 40, 500)), np.sort(rng.integers(0, 40, 500))[::-1].copy(), np.zeros(300, np.int64), np.arange(64)[::-1].copy()]
    heaps = []
    monkeypatch.setattr(module, "_heapsort", lambda *a, f=module._heapsort: (heaps.append(1), f(*a)))
    cases += [_killer(n) for n in (64, 500)]
    assert len(heaps) == 2  # the adversary did reach the fallback
    ties = 0
    for degree in cases:
        want = torch.argsort(-torch.from_numpy(np.asarray(degree)).float(), descending=True).numpy()
        assert np.array_equal(argsort(degree), want), len(degree)
        ties += not np.array_equal(want, np.argsort(degree, kind="stable"))
    assert len(heaps) == 4 and ties > 10  # the fallback replayed on the frozen keys; most cases order their ties otherwise than by index


def test_lost_follows_torchs_order_where_it_is_not_the_lowest_index():
    """An image whose lowest degree is shared: LOST's argsort and the lowest-index rule pick other seeds."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        keys = rng.normal(size=(12 * 14, 8))
        keys[:, 0] += 0.3
        ours = lost(keys, (12, 14), ties="argsort")
        degree, seed, expansion = lost_by_hand(keys)
        assert ours.seed == seed and np.allclose(ours.expansion, expansion)
        if lost(keys, (12, 14), ties="lowest-index").seed != seed:
            return
    raise AssertionError("no image among 200 where the two rules part")


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
    streamed = run(
        "decode-stream", tiny_checkpoints["dino-full"], images=image_dir, preset="lost", view="480", chunk=2, batch_size=2, cache_dir=tmp_path / "cache", workers=2
    )
    ds = records.load(streamed.report.store, "decoder")
    for name in ("degree", "expansion", "seed", "masks"):
        assert np.array_equal(ds[name].values, saved[name].values, equal_nan=True), name
