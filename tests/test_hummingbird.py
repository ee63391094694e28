"""Hummingbird: exact retrieval, label transfer, upsampling, mIoU and the bounded bank, each
against a plain re-implementation written here (loops and float64, not the module's helpers)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from probe_toolkit.analyses import hummingbird as hb


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _exhaustive(queries, bank, k):
    """float64 cosines, stable argsort of their negatives (equal cosines: lower row first)."""
    sim = _unit(queries) @ _unit(bank).T
    order = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(sim, order, 1)


@pytest.mark.parametrize("dim", [12, 96])
def test_nearest_equals_exhaustive_search_whatever_the_block(dim):
    rng = np.random.default_rng(dim)
    bank = rng.standard_normal((301, dim)).astype(np.float32)
    queries = rng.standard_normal((37, dim)).astype(np.float32)
    want, cos = _exhaustive(queries, bank, 30)
    results = [hb.nearest(queries, hb.normalise(bank), 30, block) for block in (1, 7, 64, 300, 301, 10_000)]
    for similarity, index in results:
        assert np.array_equal(index, want)
        np.testing.assert_allclose(similarity, cos, atol=1e-6)
    for similarity, index in results[1:]:
        assert np.array_equal(index, results[0][1]) and np.array_equal(similarity, results[0][0])


def test_equal_cosines_go_to_the_lower_bank_row_also_at_the_cut():
    # rows 2, 5, 6, 9 are the same direction: every query sees them tie
    rng = np.random.default_rng(1)
    bank = rng.standard_normal((12, 6)).astype(np.float32)
    for r in (5, 6, 9):
        bank[r] = bank[2] * (1 + r)  # other norms, the same unit row
    bank = hb.normalise(bank)
    for r in (5, 6, 9):
        bank[r] = bank[2]
    queries = np.vstack([bank[2] * 3, rng.standard_normal((4, 6))]).astype(np.float32)
    for k in (1, 2, 3, 5):
        for block in (1, 2, 5, 12):
            _, index = hb.nearest(queries, bank, k, block)
            assert list(index[0, :4]) == [2, 5, 6, 9][:k]
            want, _ = _exhaustive(queries[1:], bank.astype(np.float64), k)
            assert np.array_equal(index[1:], want)


def _plain_transfer(similarity, neighbour, labels, temperature):
    out = np.zeros((similarity.shape[0], labels.shape[1]))
    for q in range(similarity.shape[0]):
        e = [math.exp(float(s) / temperature) for s in similarity[q]]
        total = sum(e)
        for j, n in enumerate(neighbour[q]):
            out[q] += e[j] / total * labels[n]
    return out


def _plain_bilinear(grid, h, w):
    """torch's F.interpolate(bilinear, align_corners=False), pixel by pixel."""
    gh, gw, c = grid.shape
    out = np.zeros((c, h, w))
    for i in range(h):
        sy = max((i + 0.5) * gh / h - 0.5, 0.0)
        y0 = min(int(math.floor(sy)), gh - 1)
        y1, ly = min(y0 + 1, gh - 1), sy - y0
        for j in range(w):
            sx = max((j + 0.5) * gw / w - 0.5, 0.0)
            x0 = min(int(math.floor(sx)), gw - 1)
            x1, lx = min(x0 + 1, gw - 1), sx - x0
            out[:, i, j] = (1 - ly) * ((1 - lx) * grid[y0, x0] + lx * grid[y0, x1]) + ly * ((1 - lx) * grid[y1, x0] + lx * grid[y1, x1])
    return out


def test_label_transfer_and_upsampling_equal_a_plain_version():
    rng = np.random.default_rng(2)
    labels = rng.dirichlet(np.ones(4), size=50).astype(np.float32)
    bank = hb.normalise(rng.standard_normal((50, 8)))
    queries = rng.standard_normal((9, 8)).astype(np.float32)
    similarity, neighbour = hb.nearest(queries, bank, 5)
    soft = hb.transfer(similarity, neighbour, labels, 0.02)
    plain = _plain_transfer(similarity.astype(np.float64), neighbour, labels.astype(np.float64), 0.02)
    np.testing.assert_allclose(soft, plain, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(soft.sum(1), 1, atol=1e-5)

    grid = plain.reshape(3, 3, 4)
    for h, w in ((48, 48), (7, 11), (3, 3)):
        np.testing.assert_allclose(hb.upsample(grid, (h, w)), _plain_bilinear(grid, h, w), atol=1e-5)
        assert np.array_equal(hb.predict(soft, (3, 3), (h, w)), _plain_bilinear(soft.astype(np.float64).reshape(3, 3, 4), h, w).argmax(0))


def _plain_miou(truths, predictions, n, ignore=255):
    tp, fp, fn = [0] * n, [0] * n, [0] * n
    for t, p in zip(truths, predictions):
        for a, b in zip(np.ravel(t), np.ravel(p)):
            if a == ignore:
                continue
            if a == b:
                tp[a] += 1
            else:
                fn[a] += 1
                fp[b] += 1
    return [tp[c] / (tp[c] + fp[c] + fn[c]) if tp[c] + fp[c] + fn[c] else 0.0 for c in range(n)]


def _plain_hungarian_miou(truths, predictions, n, ignore=255):
    """Brute force over every permutation: the mapping of largest summed IoU (the assignment)."""
    best = -1.0
    for perm in itertools.permutations(range(n)):
        ious = _plain_miou(truths, [np.asarray(perm)[p] for p in predictions], n, ignore)
        best = max(best, sum(ious) / n)
    return best


def test_miou_over_images_equals_a_plain_count_with_absent_classes_as_zero():
    rng = np.random.default_rng(3)
    n = 5
    truths = [rng.integers(0, 4, (6, 7)) for _ in range(3)]  # class 4 never true
    for t in truths:
        t[rng.random(t.shape) < 0.2] = 255
    predictions = [np.where(rng.random(t.shape) < 0.6, np.where(t == 255, 0, t), rng.integers(0, 4, t.shape)) for t in truths]
    total = sum(hb.confusion(t, p, n) for t, p in zip(truths, predictions))
    result = hb.miou(total)
    want = _plain_miou(truths, predictions, n)
    np.testing.assert_allclose(result.iou, want)
    assert result.iou[4] == 0 and result.miou == pytest.approx(sum(want) / n)
    assert result.pixels == sum(int((t != 255).sum()) for t in truths)

    # swapped predictions: the identity score drops, the reference's matching undoes the swap
    swap = np.array([1, 0, 2, 3, 4])
    swapped = [swap[p] for p in predictions]
    score = hb.miou(sum(hb.confusion(t, p, n) for t, p in zip(truths, swapped)))
    assert score.miou < result.miou
    assert score.miou_hungarian == pytest.approx(_plain_hungarian_miou(truths, swapped, n))
    assert score.miou_hungarian == pytest.approx(result.miou_hungarian)
    assert list(score.matching[:2]) == [1, 0]


def test_patch_distributions_map_ignore_to_background():
    y = np.zeros((4, 4), np.uint8)
    y[:2, :2] = 3
    y[0, 0] = 255
    y[2:, 2:] = 1
    d = hb.patch_distributions(y, 2, 4)
    assert d.shape == (4, 4)
    np.testing.assert_allclose(d[0], [0.25, 0, 0, 0.75])
    np.testing.assert_allclose(d[3], [0, 1, 0, 0])
    np.testing.assert_allclose(d[1], [1, 0, 0, 0])
    with pytest.raises(ValueError, match="outside 0..3"):
        hb.patch_distributions(np.full((4, 4), 7), 2, 4)


def _plain_sample(distribution, n, draws):
    presence = distribution > 0
    freq = [sum(presence[p][c] for p in range(len(presence))) for c in range(presence.shape[1])]
    scores, d = [], iter(draws)
    for p in range(len(presence)):
        s = float(sum(freq[c] for c in range(presence.shape[1]) if presence[p][c]))
        scores.append(s * float(next(d)) if presence[p].any() else 1e6)
    return sorted(range(len(scores)), key=lambda p: (scores[p], p))[:n]


def test_bounded_bank_follows_the_reference_rule_and_its_seed():
    rng = np.random.default_rng(4)
    views, grid, ps, c = 5, 4, 2, 6
    maps = []
    for _ in range(views):
        y = rng.integers(0, 3, (grid * ps, grid * ps))
        y[:ps, :ps] = 5  # one patch of a rare class per view
        y[rng.random(y.shape) < 0.1] = 255
        maps.append(y)
    features = rng.standard_normal((views, grid * grid, 8)).astype(np.float32)
    settings = hb.Evaluation(memory_size=23, seed=7, input_size=grid * ps, patch_size=ps, n_classes=c)
    bank = hb.build_bank(features, maps, settings)
    assert bank.per_view == 23 // 5 == 4
    assert bank.features.shape == (20, 8) and bank.labels.shape == (20, c)
    assert np.array_equal(np.bincount(bank.view), [4] * views)

    # the rule, with the same draws: one generator seeded 7, one draw per non-empty patch, view by view
    draws = np.random.default_rng(7)
    for v in range(views):
        d = hb.patch_distributions(maps[v], ps, c)
        u = draws.random(int((d > 0).any(1).sum()), dtype=np.float32)
        assert list(bank.patch[bank.view == v]) == _plain_sample(d, 4, u)
        np.testing.assert_array_equal(bank.labels[bank.view == v], d[bank.patch[bank.view == v]])
    np.testing.assert_allclose(bank.features, _unit(features[bank.view, bank.patch]), atol=1e-6)

    again = hb.build_bank(features, maps, settings)
    assert np.array_equal(again.patch, bank.patch) and np.array_equal(again.features, bank.features)
    other = hb.build_bank(features, maps, hb.Evaluation(memory_size=23, seed=8, input_size=8, patch_size=2, n_classes=c))
    assert not np.array_equal(other.patch, bank.patch)

    whole = hb.build_bank(features, maps, hb.Evaluation(input_size=8, patch_size=2, n_classes=c))
    assert whole.per_view is None and len(whole.patch) == views * grid * grid
    assert list(whole.patch[:16]) == list(range(16))


def test_rare_class_patches_are_favoured():
    # one class fills 15 patches, another a single patch: its score is 1 (times u), theirs 15 or 16 (times u)
    y = np.zeros((8, 8), np.int64)
    y[6:, 6:] = 2
    d = hb.patch_distributions(y, 2, 3)
    picks = [hb.sample_patches(d, 1, np.random.default_rng(s))[0] for s in range(200)]
    assert np.mean(np.asarray(picks) == 15) > 0.5  # P(u15 < 15 u) is about 1 - 1/30


def test_patches_per_view_and_published_sizes():
    assert hb.PUBLISHED_MEMORY_SIZES == (102_400, 1_024_000, 10_240_000)
    assert hb.patches_per_view(1024 * 10**4, 10582 * 2) == 483
    assert hb.patches_per_view(10, 20) == 1
    settings = hb.Evaluation(memory_size=3, input_size=4, patch_size=2, n_classes=2)
    with pytest.raises(ValueError, match="memory_size must be at least the number of train views"):
        hb.build_bank(np.ones((4, 4, 2)), [np.zeros((4, 4))] * 4, settings)
    with pytest.raises(ValueError, match="5 patches per view asked"):
        hb.build_bank(np.ones((1, 4, 2)), [np.zeros((4, 4))], hb.Evaluation(memory_size=5, input_size=4, patch_size=2, n_classes=2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, "k must be a positive integer, got 0"),
        ({"k": 2.5}, "k must be a positive integer, got 2.5"),
        ({"temperature": 0}, "temperature must be > 0, got 0"),
        ({"temperature": float("nan")}, "temperature must be > 0"),
        ({"memory_size": 0}, "memory_size must be a positive integer, got 0"),
        ({"augmentation_epochs": -1}, "augmentation_epochs must be a positive integer"),
        ({"seed": -3}, "seed must be a non-negative integer, got -3"),
        ({"input_size": 500}, "input_size must be a multiple of patch_size"),
        ({"patch_size": 0}, "patch_size must be a positive integer"),
        ({"ignore_index": 3}, "ignore_index must be an integer outside 0..20"),
        ({"matching": "greedy"}, "matching must be one of identity, hungarian"),
    ],
)
def test_settings_name_the_bad_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        hb.Evaluation(**kwargs)


def test_defaults_are_the_references():
    s = hb.Evaluation()
    assert (s.k, s.temperature, s.memory_size, s.ignore_index, s.n_classes, s.input_size, s.patch_size, s.grid, s.seed) == (30, 0.02, None, 255, 21, 512, 16, 32, 123)


def test_resize_nearest_is_torchs_legacy_rule():
    y = np.arange(12).reshape(3, 4)
    out = hb.resize_nearest(y, (6, 2))
    want = [[y[int(i * 3 / 6), int(j * 4 / 2)] for j in range(2)] for i in range(6)]
    assert out.tolist() == want


def test_segment_end_to_end_recovers_a_separable_scene():
    # two classes whose patches have distinct directions: transfer must label each region right
    rng = np.random.default_rng(5)
    s = hb.Evaluation(k=3, input_size=8, patch_size=2, n_classes=3)
    truth = np.zeros((8, 8), np.int64)
    truth[:, 4:] = 1
    proto = np.eye(4, dtype=np.float32)[:2] * 5

    def feats(y):
        labels = y[::2, ::2].ravel()
        return proto[labels] + rng.standard_normal((16, 4)).astype(np.float32) * 0.1

    bank = hb.build_bank(np.stack([feats(truth), feats(truth)]), [truth, truth], s)
    pred = hb.segment(feats(truth), bank, s, (8, 8))
    assert np.array_equal(pred, truth)
    assert hb.miou(hb.confusion(truth, pred, 3)).iou.tolist() == [1.0, 1.0, 0.0]


def test_bank_rows_from_an_iterator_are_the_banks_rows():
    rng = np.random.default_rng(6)
    maps = [rng.integers(0, 4, (8, 8)) for _ in range(3)]
    s = hb.Evaluation(memory_size=10, seed=1, input_size=8, patch_size=2, n_classes=4)
    rows = hb.bank_rows(iter(maps), 3, 4, s)
    bank = hb.build_bank(rng.standard_normal((3, 16, 5)), maps, s)
    assert rows.per_view == 3 and np.array_equal(rows.view, bank.view) and np.array_equal(rows.patch, bank.patch)
    assert np.array_equal(rows.labels, bank.labels)
    with pytest.raises(ValueError, match="2 label maps for 3 views"):
        hb.bank_rows(iter(maps[:2]), 3, 4, s)
    with pytest.raises(ValueError, match="does not tile a 4x4 patch grid"):
        hb.bank_rows([np.zeros((8, 6))], 1, 4, s)


def test_upsampling_and_label_resizing_agree_with_torch():
    torch = pytest.importorskip("torch")
    tvf = pytest.importorskip("torchvision.transforms.functional")
    from torchvision.transforms import InterpolationMode

    rng = np.random.default_rng(7)
    grid = rng.random((4, 4, 5)).astype(np.float32)
    for size in ((64, 64), (13, 9)):
        want = torch.nn.functional.interpolate(torch.from_numpy(grid).permute(2, 0, 1)[None], size=size, mode="bilinear")[0].numpy()
        np.testing.assert_allclose(hb.upsample(grid, size), want, atol=1e-6)
    labels = rng.integers(0, 21, (37, 50)).astype(np.uint8)
    for size in ((64, 64), (20, 31)):
        want = tvf.resize(torch.from_numpy(labels)[None], list(size), interpolation=InterpolationMode.NEAREST)[0].numpy()
        assert np.array_equal(hb.resize_nearest(labels, size), want)


def test_views_must_be_whole_augmentation_epochs():
    s = hb.Evaluation(augmentation_epochs=2, input_size=4, patch_size=2, n_classes=2)
    with pytest.raises(ValueError, match="3 train views are not 2 augmentation epochs"):
        hb.bank_rows([np.zeros((4, 4))] * 3, 3, 2, s)
    assert len(hb.bank_rows([np.zeros((4, 4))] * 4, 4, 2, s).patch) == 16


def test_answers_do_not_depend_on_how_queries_are_batched():
    rng = np.random.default_rng(8)
    bank = hb.normalise(rng.standard_normal((500, 64)))
    queries = rng.standard_normal((70, 64)).astype(np.float32)
    whole = hb.nearest(queries, bank, 30, 128)
    parts = [hb.nearest(queries[a : a + b], bank, 30, 128) for a, b in ((0, 1), (1, 16), (17, 53))]
    assert np.array_equal(np.concatenate([p[1] for p in parts]), whole[1])
    assert np.array_equal(np.concatenate([p[0] for p in parts]), whole[0])
