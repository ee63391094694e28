"""The exact search shared by k-NN and Hummingbird (``analyses.search`` in numpy, ``search_torch``
in torch): each answer against a plain full-matrix reference written here (every cosine as the
float32 rounding of a float64 product, then one stable sort by (-cosine, row)), whatever the
blocks, with ties, near-ties finer than a float32 product can tell apart, banks read from a
file, and memory that does not grow with the bank."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from probe_toolkit.analyses import search
from probe_toolkit.infra.shared import shared, shared_blocks

torch = pytest.importorskip("torch")
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]  # the GPU path where one is visible


def unit(x):
    """Rows over their float32 norms, as the search's callers normalise them (float32 arithmetic)."""
    x = np.asarray(x, np.float32)
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.float32(1e-12))).astype(np.float32)


def reference(queries, bank, k):
    """Every cosine of normalised rows at once (float64 product, rounded to float32), a stable
    sort of each row by (-cosine, row): (cosines, rows) of the k first."""
    cos = (np.asarray(queries, np.float64) @ np.asarray(bank, np.float64).T).astype(np.float32)
    rows = np.broadcast_to(np.arange(cos.shape[1]), cos.shape)
    order = np.lexsort((rows, -cos.astype(np.float64)), axis=1)[:, :k]
    return np.take_along_axis(cos, order, 1), order


def blocks_of(bank, width):
    return lambda: ((a, bank[a : a + width]) for a in range(0, len(bank), width))


def clustered(n, centres, rng, spread=2.0):
    labels = rng.integers(0, len(centres), n)
    return (centres[labels] + spread * rng.normal(size=(n, centres.shape[1]))).astype(np.float32), labels


@pytest.mark.parametrize("order", ["shuffled", "by class", "runs of equal rows"])
def test_the_search_is_a_full_matrix_sort_whatever_the_blocks(order):
    """Late blocks enter through the few values near each row's running k-th; a row whose own
    class fills a late block (a class-sorted set) through its own k-th; runs of equal rows tie
    across block edges. Screened (float32) or not, every block width gives the reference's answer."""
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(12, 24))
    train, labels = clustered(9000, centres, rng)
    if order == "by class":
        train = train[np.argsort(labels, kind="stable")]
    if order == "runs of equal rows":
        train = np.repeat(train[:900], 10, axis=0)
    queries, _ = clustered(40, centres, rng)
    bank, q = unit(train), unit(queries)
    want = reference(q, bank, 200)
    for screen in (True, False):
        for width in (1000, 199, 200, 201, 7, 9000, 20000):
            got = search.running_topk(q, blocks_of(bank, width), 200, screen)
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0]), (screen, width)


def test_near_ties_finer_than_a_float32_product_are_settled_in_float64():
    """Bank rows that differ from one direction by a few float32 steps: their cosines with a query
    differ by less than a float32 product's rounding, so the float32 screen alone ranks them
    otherwise than the float64 products; the search keeps them all as candidates and ranks them
    by the float64 products (the reference), also with a k-th place among them."""
    rng = np.random.default_rng(3)
    dim = 384
    base = unit(rng.normal(size=(1, dim)))[0]
    bank = unit(base + 3e-7 * rng.normal(size=(3000, dim)).astype(np.float32))
    bank[1000:1010] = bank[17]  # equal rows too
    queries = unit(base + 0.05 * rng.normal(size=(16, dim)).astype(np.float32))
    for k in (1, 30, 200):
        want = reference(queries, bank, k)
        screened = queries @ bank.T  # float32 products in BLAS
        plain = np.lexsort((np.broadcast_to(np.arange(len(bank)), screened.shape), -screened), axis=1)[:, :k]
        assert not np.array_equal(plain, want[1])  # float32 alone would rank otherwise: the data tests the slack
        for width in (1000, 64):
            got = search.running_topk(queries, blocks_of(bank, width), k)
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0]), (k, width)


def test_ties_at_every_rank_go_to_the_lower_row():
    """Cosines rounded to a few values tie everywhere, also across the k-th place, and blocks of
    every width (narrower than k, wider, one row) meet them; -0.0 ranks as 0.0."""
    rng = np.random.default_rng(11)
    for trial in range(12):
        n, dim = int(rng.integers(50, 1500)), int(rng.integers(2, 5))
        train = np.round(rng.normal(size=(n, dim)) * 2) / 2
        train[np.abs(train).sum(1) == 0, 0] = 1.0
        if trial % 3 == 0:
            train = np.repeat(train[: n // 10 + 1], 10, axis=0)[:n]  # runs of identical rows
        test = np.round(rng.normal(size=(17, dim)) * 2) / 2
        test[np.abs(test).sum(1) == 0, 0] = -1.0
        test[0] = 0.0
        test[0, 0] = 1.0
        train[:5, 0] = 0.0  # with test[0] = e_0: cosines of exactly ±0.0 beside positive ones
        train[:5, 1:] = np.where(train[:5, 1:] == 0, 1.0, train[:5, 1:])
        train[:3] = -train[:3]
        k, width = int(rng.integers(1, min(n, 300) + 1)), int(rng.choice([1, 7, 64, 400]))
        want = reference(unit(test), unit(train), k)
        got = search.running_topk(unit(test), blocks_of(unit(train), width), k)
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0] + np.float32(0))


def test_keys_order_cosines_then_rows_and_decode_exactly():
    values = np.array([-1.0, -0.5, -0.0, 0.0, 1e-30, 0.25, 0.25, 1.0, -np.inf], np.float32)
    index = np.array([3, 1, 7, 2, 5, 9, 4, 0, 6])
    order = np.argsort(search.keys(values, index))
    assert index[order].tolist() == [0, 4, 9, 5, 2, 7, 1, 3, 6]  # larger cosine first; equal ones (0.25; ±0.0) by row
    back, where = search.unkey(search.keys(values, index))
    np.testing.assert_array_equal(back, values + np.float32(0))  # -0.0 comes back as 0.0
    np.testing.assert_array_equal(where, index)


def test_a_bank_that_is_not_normalised_is_refused():
    rng = np.random.default_rng(0)
    bank = unit(rng.normal(size=(500, 8)))
    bank[300] *= 1.01
    with pytest.raises(ValueError, match="rows 256..500 are not normalised"):
        search.running_topk(unit(rng.normal(size=(3, 8))), blocks_of(bank, 256), 5)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_and_numpy_give_the_same_neighbours_and_cosines(device, tmp_path):
    """The torch search (float64 products, int64 keys) and the numpy one (float32 screen, float64
    settling) on clustered rows, near-ties and equal rows: the same rows and the same cosines,
    bit for bit, from an array or from a ``Shared`` file written in blocks, at any block."""
    from probe_toolkit.analyses import search_torch

    rng = np.random.default_rng(7)
    dim = 48
    centres = rng.normal(size=(6, dim))
    train, _ = clustered(2500, centres, rng)
    bank = unit(train)
    bank[2000:2100] = unit(bank[5] + 2e-7 * rng.normal(size=(100, dim)).astype(np.float32))
    bank[[40, 333, 1650]] = bank[12]
    queries, _ = clustered(60, centres, rng)
    queries[3] = bank[12]
    queries[4] = bank[5]
    want = reference(unit(queries), bank, 50)
    numpy_answer = search.nearest(queries, bank, 50, 512)
    assert all(np.array_equal(x, y) for x, y in zip(numpy_answer, want))
    assert numpy_answer[1][3, :4].tolist() == [12, 40, 333, 1650]
    with shared_blocks((bank[a : a + 700] for a in range(0, len(bank), 700)), bank.shape, np.float32, tmp_path, "bank") as handle:
        assert all(np.array_equal(x, y) for x, y in zip(search.nearest(queries, handle, 50, 300), want))
        on = search_torch.on_device(handle, device)
        for block in (7, 49, 2500, 5000):
            got = search_torch.nearest(unit(queries), on, 50, block, device)
            assert all(np.array_equal(x, y) for x, y in zip(got, want)), block
    assert not list(tmp_path.iterdir())  # the file goes with the run


def test_shared_files_read_back_rows_and_check_their_digest(tmp_path):
    from probe_toolkit.infra import shared as shared_module
    from probe_toolkit.infra.errors import IntegrityError

    rng = np.random.default_rng(1)
    array = rng.normal(size=(1000, 6)).astype(np.float32)
    with shared(array, tmp_path, "whole") as whole, shared_blocks(iter([array[:333], array[333:]]), array.shape, np.float32, tmp_path, "parts") as parts:
        assert whole.sha256 == parts.sha256 and whole.shape == (1000, 6)
        assert np.array_equal(np.load(parts.path), array) and np.array_equal(parts.rows(990, 1000), array[990:])
        shared_module._verified.discard(parts.sha256)  # a worker that has not checked the file yet
        with open(parts.path, "r+b") as handle:
            handle.seek(-4, 2)
            handle.write(b"\0\0\0\0")
        with pytest.raises(IntegrityError, match="another file"):
            parts.rows(0, 1)
    with pytest.raises(ValueError, match="2 rows written for an array of 3"), shared_blocks(iter([array[:2]]), (3, 6), np.float32, tmp_path, "short"):
        pass
    assert not list(tmp_path.iterdir())


def test_peak_memory_does_not_grow_with_the_bank(tmp_path):
    """The bank streamed from a file block by block: the search's peak allocation (numpy's, as
    tracemalloc sees it) is the same for a bank of 8,192 rows and one of 65,536."""
    rng = np.random.default_rng(2)
    dim = 64
    queries = unit(rng.normal(size=(256, dim)))
    peaks = []
    for n in (8192, 65536):
        gen = np.random.default_rng(n)
        with shared_blocks((unit(gen.normal(size=(4096, dim))) for _ in range(n // 4096)), (n, dim), np.float32, tmp_path, "bank") as handle:
            tracemalloc.start()
            search.nearest(queries, handle, 100, 4096)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    assert peaks[1] < 1.15 * peaks[0], peaks


def test_a_bank_of_equal_rows_keeps_k_candidates_not_the_bank(tmp_path):
    """A collapsed network gives every image the same features, so every cosine ties: the search
    keeps each query's k best as it goes (the k lowest rows), and its peak allocation is the same
    for 8,192 equal rows as for 65,536 (the running list once held every one of them)."""
    rng = np.random.default_rng(4)
    dim = 64
    row = unit(rng.normal(size=(1, dim)))
    queries = unit(rng.normal(size=(256, dim)))
    want = reference(search.normalise(queries), np.repeat(row, 100, axis=0), 100)  # nearest normalises its queries
    peaks = []
    for n in (8192, 65536):
        with shared_blocks((np.repeat(row, 4096, axis=0) for _ in range(n // 4096)), (n, dim), np.float32, tmp_path, "bank") as handle:
            tracemalloc.start()
            got = search.nearest(queries, handle, 100, 4096)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])
    assert peaks[1] < 1.15 * peaks[0], peaks
