"""The selection rules against the course's structural facts and plain reimplementations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe_toolkit.analyses import selection
from probe_toolkit.infra.errors import ProbeError

LIBRARIES = ("numpy", "torch")  # every rule runs on both: neighbours on numpy, training on torch


def given(array, library: str):
    """A test input in the library under test."""
    array = np.asarray(array)
    return array if library == "numpy" else torch.from_numpy(array)


def plain(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def selfpatch_local_index(n_patches: int, k_size: int = 3) -> np.ndarray:
    """SelfPatch's `get_local_index`, transcribed loop for loop: per anchor a row and a column
    indicator with offsets taken modulo the side, their outer product flattened row-major, the
    centre cleared, and `nonzero()` (ascending flat indices)."""
    side = int(np.sqrt(n_patches))
    rows = []
    for i in range(n_patches):
        ix, iy = i // side, i % side
        wx = np.zeros(side)
        wy = np.zeros(side)
        wx[ix] = 1
        wy[iy] = 1
        for j in range(1, k_size // 2 + 1):
            wx[(ix + j) % side] = 1
            wx[(ix - j) % side] = 1
            wy[(iy + j) % side] = 1
            wy[(iy - j) % side] = 1
        weight = (wy[None, :] * wx[:, None]).reshape(-1)
        weight[i] = 0
        rows.append(np.nonzero(weight)[0])
    return np.stack(rows)


def plain_window(grid: int, anchor: int) -> list[int]:
    """The in-bounds cells of the 3×3 window, no wrap."""
    r, c = divmod(anchor, grid)
    return sorted((r + dr) * grid + c + dc for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0) and 0 <= r + dr < grid and 0 <= c + dc < grid)


# ----------------------------------------------------------------------------------------------
# the window


def test_window_course_anchors():
    table = selection.window(14)
    assert table.index.shape == (196, 8) and table.index.dtype == np.int64
    on_torch = selection.window(14, device="cpu")
    assert on_torch.index.dtype == torch.int64 and np.array_equal(on_torch.index.numpy(), table.index)
    assert table.index[0].tolist() == [1, 13, 14, 15, 27, 182, 183, 195]
    assert table.index[15].tolist() == [0, 1, 2, 14, 16, 28, 29, 30]
    assert bool(table.valid.all())


@pytest.mark.parametrize("grid", [3, 4, 6, 7, 14, 16])
def test_window_is_selfpatch_get_local_index(grid):
    assert np.array_equal(selection.window(grid).index, selfpatch_local_index(grid * grid))


def test_wrapped_links_course_counts():
    at14, at6 = selection.window(14), selection.window(6)
    assert int(at14.wrapped.sum()) == 164 and at14.wrapped.size == 1568
    assert round(100 * 164 / 1568, 1) == 10.5
    assert int(at6.wrapped.sum()) == 68 and at6.wrapped.size == 288
    assert round(100 * 68 / 288, 1) == 23.6
    for grid in range(3, 31):
        assert int(selection.window(grid).wrapped.sum()) == 12 * grid - 4


def test_wrapped_links_are_those_missing_from_the_plain_window():
    grid = 9
    table = selection.window(grid)
    for anchor in range(grid * grid):
        plain = set(plain_window(grid, anchor))
        for index, wrapped in zip(table.index[anchor].tolist(), table.wrapped[anchor].tolist()):
            assert wrapped == (index not in plain)


def test_window_without_wrap_pads_and_masks():
    grid = 14
    table = selection.window(grid, wrap=False)
    assert table.index.shape == (196, 8)
    assert table.index[0].tolist() == [1, 14, 15, -1, -1, -1, -1, -1]
    assert table.valid[0].tolist() == [True] * 3 + [False] * 5
    assert table.index[15].tolist() == [0, 1, 2, 14, 16, 28, 29, 30]
    for anchor in range(196):
        n = len(plain_window(grid, anchor))
        assert table.index[anchor, :n].tolist() == plain_window(grid, anchor)
        assert (table.index[anchor, n:] == -1).all() and int(table.valid[anchor].sum()) == n
    # 4(G-1)(2G-1) in-bounds links: exactly the links of the wrapped table that do not wrap
    assert int(table.valid.sum()) == 4 * 13 * 27 == 1568 - 164
    assert not bool(table.wrapped.any())


def test_window_refuses_tiny_grids():
    with pytest.raises(ProbeError):
        selection.window(2)


# ----------------------------------------------------------------------------------------------
# window-topk


def plain_window_topk(tokens: np.ndarray, grid: int, k: int, wrap: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per crop, per anchor: float64 cosines to the candidates, stable descending order."""
    b, n, _ = tokens.shape
    positions = np.full((b, n, k), -1)
    indices = np.full((b, n, k), -1)
    table = selfpatch_local_index(n)
    for crop in range(b):
        unit = tokens[crop] / np.linalg.norm(tokens[crop], axis=1, keepdims=True)
        for anchor in range(n):
            cands = list(table[anchor]) if wrap else plain_window(grid, anchor)
            cos = np.array([unit[anchor] @ unit[j] for j in cands])
            order = np.argsort(-cos, kind="stable")[:k]
            positions[crop, anchor, : len(order)] = order
            indices[crop, anchor, : len(order)] = np.array(cands)[order]
    return positions, indices


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("grid,wrap", [(14, True), (6, True), (6, False)])
def test_window_topk_matches_a_plain_loop(grid, wrap, library):
    rng = np.random.default_rng(grid)
    tokens = rng.standard_normal((3, grid * grid, 32)).astype(np.float32)
    chosen = selection.window_topk(given(tokens, library), grid, k=4, wrap=wrap)
    positions, indices = plain_window_topk(tokens, grid, 4, wrap)
    assert chosen.position.shape == chosen.index.shape == chosen.valid.shape == (3, grid * grid, 4)
    assert np.array_equal(plain(chosen.index), indices)
    valid = plain(chosen.valid)
    assert np.array_equal(plain(chosen.position), positions)
    assert np.array_equal(valid, indices >= 0)


def test_window_topk_ties_go_to_the_lower_position():
    tokens = torch.ones(2, 36, 5)  # every cosine is 1: a total tie
    chosen = selection.window_topk(tokens, 6, k=4)
    assert (chosen.position == torch.tensor([0, 1, 2, 3])).all()
    assert chosen.index[0, 0].tolist() == selection.window(6).index[0, :4].tolist()
    # a partial tie: candidates 1 and 6 of anchor 0 equal and best, 5 next
    tokens = torch.zeros(1, 36, 3)
    tokens[..., 2] = 1.0
    tokens[0, 0] = torch.tensor([1.0, 0.0, 0.0])
    tokens[0, 1] = tokens[0, 6] = torch.tensor([1.0, 0.0, 0.0])
    tokens[0, 5] = torch.tensor([1.0, 0.0, 0.5])
    chosen = selection.window_topk(tokens, 6, k=3)
    assert chosen.index[0, 0].tolist() == [1, 6, 5]


def test_window_topk_accepts_numpy_and_keeps_padding_invalid():
    tokens = np.random.default_rng(0).standard_normal((1, 36, 8)).astype(np.float16)
    chosen = selection.window_topk(tokens, 6, k=4, wrap=False)
    assert chosen.valid[0, 0].tolist() == [True, True, True, False]  # a corner has 3 candidates
    assert chosen.index[0, 0, 3] == -1


# ----------------------------------------------------------------------------------------------
# window-threshold


def test_window_threshold_fixed_theta_matches_a_plain_loop():
    rng = np.random.default_rng(1)
    tokens = rng.standard_normal((2, 36, 16)).astype(np.float32)
    keep = selection.window_threshold(tokens, 6, theta=0.1)
    table = selfpatch_local_index(36)
    for crop in range(2):
        unit = tokens[crop] / np.linalg.norm(tokens[crop], axis=1, keepdims=True)
        for anchor in range(36):
            expected = [float(unit[anchor] @ unit[j]) >= 0.1 for j in table[anchor]]
            assert keep[crop, anchor].tolist() == expected


@pytest.mark.parametrize("library", LIBRARIES)
def test_window_threshold_modes(library):
    rng = np.random.default_rng(2)
    t14 = given(rng.standard_normal((2, 196, 16)).astype(np.float32), library)
    t6 = given(rng.standard_normal((3, 36, 16)).astype(np.float32), library)
    c14 = plain(selection.window_cosine(t14, 14))
    c6 = plain(selection.window_cosine(t6, 6))
    # crop quantile: each crop its own
    keep = selection.window_threshold(t14, 14, mode="crop-quantile", q=0.75)
    for crop in range(2):
        theta = np.quantile(c14[crop].ravel(), 0.75)
        assert np.array_equal(plain(keep[crop]), c14[crop] >= theta)
    # batch median over both crop sizes at once (the selector study's one median per step)
    theta14, theta6 = selection.window_theta([given(c14, library), given(c6, library)], "batch-median")
    median = np.median(np.concatenate([c14.ravel(), c6.ravel()]))
    assert theta14.shape == (2,) and theta6.shape == (3,)
    assert np.allclose(plain(theta14), median) and np.allclose(plain(theta6), median)
    keep6 = selection.window_threshold(t6, 6, theta=theta6)
    assert np.array_equal(plain(keep6), c6 >= median)
    # batch median within one call; padding (no wrap) is never kept nor counted
    keep = selection.window_threshold(t14, 14, mode="batch-median", wrap=False)
    valid = selection.window(14, wrap=False).valid
    cosines = plain(selection.window_cosine(t14, 14, wrap=False))
    theta = np.median(cosines[:, valid])
    assert np.array_equal(plain(keep), (cosines >= theta) & valid)
    keep = selection.window_threshold(t14, 14, mode="crop-quantile", q=0.3, wrap=False)
    for crop in range(2):
        theta = np.quantile(cosines[crop][valid], 0.3)
        assert np.array_equal(plain(keep[crop]), (cosines[crop] >= theta) & valid)
    with pytest.raises(ProbeError):
        selection.window_threshold(t14, 14, mode="median")


@pytest.mark.parametrize("library", LIBRARIES)
def test_quantile_is_numpys_linear_method(library):
    values = np.random.default_rng(3).standard_normal((4, 101))
    values[1, :40] = 0.25  # a repeated order statistic
    for q in (0.0, 0.2, 0.5, 0.93, 1.0):
        assert np.allclose(plain(selection.quantile(given(values, library), q)), np.quantile(values, q, axis=-1))


# ----------------------------------------------------------------------------------------------
# contrastive

HAND = np.array(
    [
        [1.0, 0.9, 0.1, 0.5, 0.1],
        [0.9, 1.0, 0.2, 0.3, 0.0],
        [0.1, 0.2, 1.0, 0.8, 0.4],
        [0.5, 0.3, 0.8, 1.0, 0.6],
        [0.1, 0.0, 0.4, 0.6, 1.0],
    ],
    dtype=np.float32,
)


def test_contrastive_on_a_hand_made_similarity_matrix():
    # pairs i<j sorted: 0, .1, .1, .2, .3, .4, .5, .6, .8, .9 -> 20th percentile at 1.8 = 0.1
    rule = selection.contrastive(similarity=torch.from_numpy(HAND)[None], k=2, max_negatives=3)
    assert np.isclose(float(rule.theta[0]), 0.1)
    assert rule.positive[0].tolist() == [[1, 3], [0, 3], [3, 4], [2, 4], [3, 2]]
    assert bool(rule.positive_valid.all())
    assert rule.negative[0].tolist() == [[2, 4, -1], [4, -1, -1], [0, -1, -1], [-1, -1, -1], [1, 0, -1]]
    assert rule.negative_valid[0].sum(-1).tolist() == [2, 1, 1, 0, 2]
    # k = 3: anchor 0's third positive is a tie of 2 and 4 at 0.1, which goes to 2; 4 remains a
    # negative, 2 does not (never a positive)
    rule = selection.contrastive(similarity=torch.from_numpy(HAND)[None], k=3, max_negatives=3)
    assert rule.positive[0, 0].tolist() == [1, 3, 2]
    assert rule.negative[0, 0].tolist() == [4, -1, -1]


def plain_contrastive(tokens: np.ndarray, k: int, q: float, m: int):
    """Per crop, per anchor: float64 cosines; positives by a stable descending sort of the others;
    θ from the i<j pairs; negatives by a stable ascending sort of what is left."""
    b, n, _ = tokens.shape
    positives = np.full((b, n, k), -1)
    negatives = np.full((b, n, m), -1)
    thetas = np.zeros(b)
    for crop in range(b):
        unit = tokens[crop] / np.linalg.norm(tokens[crop], axis=1, keepdims=True)
        sim = unit @ unit.T
        theta = np.quantile(sim[np.triu_indices(n, 1)], q)
        thetas[crop] = theta
        for anchor in range(n):
            others = [j for j in range(n) if j != anchor]
            order = sorted(others, key=lambda j: -sim[anchor, j])  # sorted() is stable
            positives[crop, anchor] = order[:k]
            pool = [j for j in others if j not in order[:k] and sim[anchor, j] <= theta]
            pool = sorted(pool, key=lambda j: sim[anchor, j])[:m]
            negatives[crop, anchor, : len(pool)] = pool
    return positives, negatives, thetas


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("n", [36, 196])
def test_contrastive_matches_a_plain_loop(n, library):
    rng = np.random.default_rng(n)
    tokens = rng.standard_normal((2, n, 24))
    rule = selection.contrastive(given(tokens.astype(np.float32), library), k=4, negative_quantile=0.2, max_negatives=48)
    positives, negatives, thetas = plain_contrastive(tokens, 4, 0.2, 48)
    assert rule.positive.shape == (2, n, 4) and rule.negative.shape == (2, n, 48)
    assert np.array_equal(plain(rule.positive), positives)
    assert np.array_equal(plain(rule.negative), negatives)
    assert np.array_equal(plain(rule.negative_valid), negatives >= 0)
    assert np.allclose(plain(rule.theta), thetas, atol=1e-5)
    # the cap binds at 196 patches (about 39 of 195 lie below the 20th percentile) but never
    # beyond 48, and no negative is the anchor or one of its positives
    negative, positive = plain(rule.negative), plain(rule.positive)
    assert int(plain(rule.negative_valid).sum(-1).max()) <= 48
    assert not (negative == np.arange(n)[None, :, None]).any()
    assert not (negative[..., :, None] == positive[..., None, :]).any()


def test_selection_runs_without_grad_on_a_batch():
    tokens = torch.randn(2, 196, 16, requires_grad=True)
    rule = selection.contrastive(tokens)
    assert not rule.theta.requires_grad
    assert selection.cosine(tokens).shape == (2, 196, 196)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as inside a mixed-precision training step
        assert selection.cosine(tokens).dtype == torch.float32


def test_tie_order_is_exact_on_the_fast_path_and_the_fallback():
    """Values with many ties (and ±0.0, ±inf) ranked like numpy's stable argsort."""
    rng = np.random.default_rng(4)
    values = np.round(rng.standard_normal((3, 40, 60)) * 2) / 2  # 0.5 steps: ties everywhere
    values[0, 0, :5] = [-0.0, 0.0, -0.0, 0.0, -0.0]
    values[1, 1, 7] = np.inf
    values[2, 2, 9] = -np.inf
    distinct = rng.permutation(60)[None, None, :].repeat(40, 1).astype(np.float64)  # no ties
    for array, library in [(a, lib) for a in (values, distinct) for lib in LIBRARIES]:
        given_values = given(array.astype(np.float32), library)
        for n in (1, 8, 48):
            largest = plain(selection._largest(given_values, n))
            smallest = plain(selection._smallest(given_values, n))
            assert np.array_equal(largest, np.argsort(-array.astype(np.float32), axis=-1, kind="stable")[..., :n])
            assert np.array_equal(smallest, np.argsort(array.astype(np.float32), axis=-1, kind="stable")[..., :n])


# ----------------------------------------------------------------------------------------------
# one rule, two libraries


@pytest.mark.parametrize("grid,wrap", [(6, True), (6, False), (14, True), ((3, 5), True), ((3, 5), False)])
def test_numpy_and_torch_select_the_same_sets(grid, wrap):
    """Written once: on the same similarities (rounded to eighths, so ties everywhere) every rule's
    numpy result is its torch result, bit for bit, so ``probe neighbours`` (numpy) measures the
    very sets training (torch) uses."""
    rows, cols = grid if isinstance(grid, tuple) else (grid, grid)
    n = rows * cols
    tokens = np.random.default_rng(n).standard_normal((3, n, 8)).astype(np.float32)
    unit = tokens / np.linalg.norm(tokens, axis=-1, keepdims=True)
    sim = (np.round(unit @ unit.transpose(0, 2, 1) * 8) / 8).astype(np.float32)
    found = {}
    for library in LIBRARIES:
        s = given(sim, library)
        cosines = selection.window_cosine(None, grid, wrap, similarity=s)
        found[library] = [
            cosines,
            *selection.window_topk(None, grid, 3, wrap, similarity=s),
            selection.window_threshold(None, grid, mode="crop-quantile", q=0.3, wrap=wrap, similarity=s),
            selection.window_threshold(None, grid, theta=0.25, wrap=wrap, similarity=s),
            selection.window_theta(cosines, "batch-median"),
            selection.most_similar(s, 8),
            *selection.contrastive(similarity=s, k=4, negative_quantile=0.2, max_negatives=48),
        ]
    assert len(found["numpy"]) == 13
    for ours, theirs in zip(found["numpy"], found["torch"]):
        assert isinstance(ours, np.ndarray) and isinstance(theirs, torch.Tensor)
        assert ours.dtype == theirs.numpy().dtype and np.array_equal(ours, theirs.numpy())
    # the cosine itself: float32 either way, to rounding
    numpy_cos, torch_cos = selection.cosine(tokens), selection.cosine(torch.from_numpy(tokens))
    assert numpy_cos.dtype == np.float32 and np.allclose(numpy_cos, torch_cos.numpy(), atol=1e-6)
