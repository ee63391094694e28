"""Hummingbird's per-image arithmetic, bit for bit: the prediction (bilinear upsampling, argmax) and
the search's screening steps against plain versions written here, one pixel, one class, one row
at a time in the same float32 operations, on small arrays full of ties."""

from __future__ import annotations

import numpy as np
import pytest

from probe_toolkit.analyses import hummingbird as hb
from probe_toolkit.analyses import search


def _axis(n_in, n_out):
    """torch's bilinear source positions along one axis (align_corners False), in float32."""
    out = []
    for i in range(n_out):
        src = max((np.float32(i) + np.float32(0.5)) * np.float32(n_in / n_out) - np.float32(0.5), np.float32(0))
        lo = min(int(np.floor(src)), n_in - 1)
        out.append((lo, min(lo + 1, n_in - 1), np.float32(src - np.float32(lo))))
    return out


def _plain_predict(soft, grid, size):
    """Pixel by pixel: along the width in each of the two source rows, then between them (float32
    operations as torch orders them); the first class of the largest score."""
    s = np.asarray(soft, np.float32).reshape(grid[0], grid[1], -1)
    one = np.float32(1)
    label = np.zeros(size, np.int64)
    for i, (y0, y1, wy) in enumerate(_axis(grid[0], size[0])):
        for j, (x0, x1, wx) in enumerate(_axis(grid[1], size[1])):
            best = None
            for c in range(s.shape[2]):
                top = (one - wx) * s[y0, x0, c] + wx * s[y0, x1, c]
                bottom = (one - wx) * s[y1, x0, c] + wx * s[y1, x1, c]
                value = (one - wy) * top + wy * bottom
                if best is None or value > best:
                    best, label[i, j] = value, c
    return label


def _tied_scores(rng, cells, classes):
    """Scores from a few values: equal classes in a cell, equal cells side by side."""
    return (rng.integers(0, 3, (cells, classes)) / np.float32(4)).astype(np.float32)


def test_predict_is_the_plain_upsampling_and_argmax_bit_for_bit():
    rng = np.random.default_rng(0)
    for trial in range(40):
        grid = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        size = (int(rng.integers(1, 24)), int(rng.integers(1, 24)))  # up and down, odd ratios
        classes = int(rng.integers(1, 6))
        soft = _tied_scores(rng, grid[0] * grid[1], classes) if trial % 2 else rng.dirichlet(np.ones(classes), grid[0] * grid[1]).astype(np.float32)
        want = _plain_predict(soft, grid, size)
        got = hb.predict(soft, grid, size)
        assert got.dtype == np.int64 and np.array_equal(got, want), (grid, size, classes)
        up = hb.upsample(soft.reshape(*grid, classes), size)
        assert np.array_equal(up.argmax(0), want)


def test_predict_takes_the_first_class_on_a_tie_and_the_first_nan_as_argmax_does():
    soft = np.zeros((4, 3), np.float32)
    assert np.array_equal(hb.predict(soft, (2, 2), (5, 5)), np.zeros((5, 5)))  # every class equal: class 0
    soft[:, 1:] = 0.5
    assert np.array_equal(hb.predict(soft, (2, 2), (5, 5)), np.ones((5, 5)))  # classes 1 and 2 equal: 1
    soft[3, 2] = np.nan
    want = hb.upsample(soft.reshape(2, 2, 3), (5, 5)).argmax(0)
    assert np.array_equal(hb.predict(soft, (2, 2), (5, 5)), want) and (want == 2).any()


def _plain_candidates(sim, offset, k, floor, margin):
    """Row by row: the values at or above the floor (before it, within the margin of the row's own
    k-th largest; a row with more than k above the floor: those within the margin of its own k-th too)."""
    rows = []
    for i, row in enumerate(sim):
        own = search._below(np.sort(row)[::-1][k - 1 : k], margin[i : i + 1])[0]
        if floor is None:
            cut = own if len(row) > k else -np.inf
        else:
            cut = max(own, floor[i]) if (row >= floor[i]).sum() > k else floor[i]
        cols = [c for c in range(len(row)) if row[c] >= cut]
        rows.append(sorted(search.keys(row[cols], offset + np.asarray(cols, np.int64))))
    return rows


@pytest.mark.parametrize("floor_kind", ["none", "low", "high"])
def test_block_candidates_are_the_plain_rows_with_ties_and_crowded_rows(floor_kind):
    rng = np.random.default_rng(3)
    k = 4
    sim = (rng.integers(-4, 5, (30, 23)) / np.float32(8)).astype(np.float32)  # few values: ties at every rank
    sim[::3, :12] = 0.5  # rows with more than k equal values above any floor (crowded)
    margin = np.where(np.arange(30) % 2, 1e-6, 0.0)
    floor = {"none": None, "low": np.full(30, -0.3, np.float32), "high": np.full(30, 0.45, np.float32)}[floor_kind]
    got = search.block_candidates(sim, 1000, k, floor, margin)
    mask = np.empty(sim.shape, bool)
    assert np.array_equal(search.block_candidates(sim, 1000, k, floor, margin, mask), got)  # a reused mask changes nothing
    for i, want in enumerate(_plain_candidates(sim, 1000, k, floor, margin)):
        assert sorted(got[i][got[i] != search.EMPTY].tolist()) == [int(x) for x in want], i


def _reference(queries, bank, k):
    cos = (np.asarray(queries, np.float64) @ np.asarray(bank, np.float64).T).astype(np.float32)
    order = np.lexsort((np.broadcast_to(np.arange(cos.shape[1]), cos.shape), -cos.astype(np.float64)), axis=1)[:, :k]
    return np.take_along_axis(cos, order, 1) + np.float32(0), order


def _unit(x):
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.float32(1e-12))


def test_the_search_in_many_small_parts_is_the_full_matrix_sort(monkeypatch):
    """Each block multiplied a part at a time (the first part's k-th sets the floor; a part of
    equal rows crowds it): parts of a few rows give the reference's neighbours and cosines."""
    monkeypatch.setattr(search, "FIRST_COLUMNS", 8)
    monkeypatch.setattr(search, "MIN_COLUMNS", 5)
    monkeypatch.setattr(search, "SCREEN_VALUES", 64)
    rng = np.random.default_rng(9)
    bank = np.round(rng.normal(size=(700, 4)) * 2) / 2
    bank[np.abs(bank).sum(1) == 0, 0] = 1.0
    bank[300:420] = bank[5]  # a run of equal rows, crossing parts and blocks
    queries = np.round(rng.normal(size=(13, 4)) * 2) / 2
    queries[np.abs(queries).sum(1) == 0, 0] = 1.0
    queries[0] = bank[5]
    bank, queries = _unit(bank), _unit(queries)
    for k in (1, 3, 30, 150):
        want = _reference(queries, bank, k)
        for width in (64, 700, 9):
            got = search.running_topk(queries, lambda width=width: ((a, bank[a : a + width]) for a in range(0, len(bank), width)), k)
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0]), (k, width)


def test_a_label_view_is_resized_by_the_plain_nearest_rule():
    """``store.hbird_views.resize_nearest`` (every label view) pixel by pixel: source = floor(dst ·
    (in / out in float32)), clamped; the label's dtype kept."""
    from probe_toolkit.store.hbird_views import resize_nearest

    rng = np.random.default_rng(4)
    for _ in range(20):
        y = rng.integers(0, 256, (int(rng.integers(1, 30)), int(rng.integers(1, 30)))).astype(np.uint8)
        size = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
        src = [[min(int(np.floor(np.float32(i) * (np.float32(n_in) / np.float32(n_out)))), n_in - 1) for i in range(n_out)] for n_in, n_out in zip(y.shape, size)]
        want = np.array([[y[r, c] for c in src[1]] for r in src[0]], np.uint8)
        got = resize_nearest(y, size)
        assert got.dtype == np.uint8 and np.array_equal(got, want), (y.shape, size)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.uint64, np.float32])
def test_patch_distributions_are_the_plain_shares_in_any_label_dtype(dtype):
    """Each patch's share of each class, counted pixel by pixel (255 counted as class 0)."""
    rng = np.random.default_rng(6)
    y = rng.choice([0, 1, 3, 255], size=(12, 8)).astype(dtype)
    y[:4, :4] = 2
    got = hb.patch_distributions(y, 4, 5)
    want = np.zeros((6, 5))
    for i in range(12):
        for j in range(8):
            want[(i // 4) * 2 + j // 4, 0 if y[i, j] == 255 else int(y[i, j])] += 1
    assert got.dtype == np.float32 and np.array_equal(got, (want / 16).astype(np.float32))


def test_the_parts_are_never_wider_than_the_callers_blocks():
    """Blocks narrower than a part (a small ``--work-memory``): the reused product and mask arrays
    are a block's, not a part's, so memory stays what the caller's block allows."""
    import tracemalloc

    rng = np.random.default_rng(1)
    queries, bank = _unit(rng.normal(size=(400, 8))), _unit(rng.normal(size=(3000, 8)))
    want = _reference(queries, bank, 5)
    tracemalloc.start()
    got = search.running_topk(queries, lambda: ((a, bank[a : a + 64]) for a in range(0, len(bank), 64)), 5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])
    assert peak < 400 * search.MIN_COLUMNS * 4 / 2, peak  # a part's float32 products alone would be twice this
