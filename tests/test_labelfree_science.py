"""The label-free measures against their formulas, written out here in float64 (independent of probe's code paths):
RankMe (Garrido et al. 2023) from an SVD, LiDAR as RADIO's ssl_metrics.py computes it, linear CKA (Kornblith et al.
2019) from centred Gram matrices, the unbiased minibatch CKA (Nguyen et al. 2021) from Song et al.'s HSIC₁, the
overclustering matching against scipy's linear_sum_assignment and a loop over clusters, and the position probe on
tokens that encode their position linearly (error ≈ 0) or not at all (error ≈ chance)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from probe_toolkit.analyses import overcluster, position, rank, similarity


def rankme_by_svd(z: np.ndarray, eps: float = 1e-7) -> float:
    s = np.linalg.svd(np.asarray(z, np.float64), compute_uv=False)
    p = s / np.sum(np.abs(s)) + eps
    return float(np.exp(-np.sum(p * np.log(p))))


def test_rankme_from_the_streamed_qr_is_the_svd_formula():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(900, 24)) @ np.diag(np.linspace(3, 0.01, 24)) + 0.5  # not centred, as the paper's Z
    spectrum = rank.Spectrum(24)
    for part in np.array_split(z.astype(np.float32), 7):
        spectrum.add(part)
    assert spectrum.rows == 900
    assert spectrum.rankme() == pytest.approx(rankme_by_svd(z.astype(np.float32)), rel=1e-12)
    few = rank.Spectrum(24)  # fewer rows than channels, a rank-deficient Z: no noise from squaring
    few.add(z[:3])
    few.add(z[3:6])
    assert len(few.singular_values()) == 6 and few.rankme() == pytest.approx(rankme_by_svd(z[:6]), rel=1e-12)
    assert rank.rankme(np.ones(16)) == pytest.approx(16.0, rel=1e-5)  # equal singular values: D
    assert rank.rankme(np.r_[1.0, np.zeros(15)]) == pytest.approx(1.0, abs=1e-4)  # one direction: 1 (up to ε)


def test_rankme_radio_form_drops_zeros_and_puts_eps_in_the_denominator():
    s = np.array([4.0, 2.0, 1.0, 0.0])
    p = s[:3] / (s.sum() + 1e-7)
    assert rank.rankme(s, form="radio") == pytest.approx(float(np.exp(-np.sum(p * np.log(p)))), rel=1e-14)
    assert abs(rank.rankme(s) - rank.rankme(s, form="radio")) < 4 * 1e-7 * abs(np.log(1e-7)) + 1e-12


def test_sample_rows_are_nested_and_seeded():
    rows = rank.sample_rows(3000, seed=3)
    assert sorted(rows) == [256, 512, 1024, 2560]
    assert set(rows[256]) <= set(rows[512]) <= set(rows[2560])
    np.testing.assert_array_equal(rows[512], rank.sample_rows(3000, seed=3)[512])


def lidar_written_out(e: np.ndarray, delta: float = 1e-8) -> float:
    """RADIO ssl_metrics.py calc_lidar / calc_lidar_from_cov / smooth_rank, step by step in float64."""
    n, v, d = e.shape
    mu_x = e.mean(axis=1)
    mu_zc = mu_x - mu_x.mean(axis=0, keepdims=True)
    cov_b = mu_zc.T @ mu_zc / (n - 1)
    ex = (e - mu_x[:, None]).reshape(n * v, d)
    cov_w = ex.T @ ex / (n * v - 1) + delta * np.eye(d)
    w, vec = np.linalg.eigh(cov_w)
    rs = vec @ np.diag(np.maximum(w, delta) ** -0.5) @ vec.T
    eig = np.linalg.eigh(rs @ cov_b @ rs + delta * np.eye(d))[0]
    eig = eig[eig > 0]
    p = eig / (eig.sum() + 1e-7)
    return float(np.exp(-np.sum(p * np.log(p))))


def test_lidar_as_radio_computes_it():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(60, 1, 12)) * np.linspace(2, 0.1, 12)
    e = centres + 0.3 * rng.normal(size=(60, 3, 12))
    views = rank.Views(12)
    views.add(e[:25])
    views.add(e[25:])
    assert views.lidar() == pytest.approx(lidar_written_out(e), rel=1e-9)
    assert rank.lidar(e) == pytest.approx(lidar_written_out(e), rel=1e-9)


def cka_written_out(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al. 2019: HSIC of centred linear Grams, normalised."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, g = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    return float(np.sum(k * g) / np.sqrt(np.sum(k * k) * np.sum(g * g)))


def test_linear_cka_streamed_equals_the_gram_formula():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 10)) + 40.0  # large means: the shift must keep the centring exact
    y = x @ rng.normal(size=(10, 7)) + 0.5 * rng.normal(size=(300, 7)) - 25.0
    z = rng.normal(size=(300, 5))
    moments = similarity.FeatureMoments((10, 7, 5))
    for a in range(0, 300, 64):
        moments.add([x[a : a + 64], y[a : a + 64], z[a : a + 64]])
    got = moments.cka()
    assert got[0, 1] == pytest.approx(cka_written_out(x, y), rel=1e-10)
    assert got[0, 2] == pytest.approx(cka_written_out(x, z), rel=1e-10)
    assert got[1, 2] == pytest.approx(cka_written_out(y, z), rel=1e-10)
    np.testing.assert_allclose(np.diag(got), 1.0, rtol=1e-12)
    grams = similarity.ExampleGrams()
    for s in (x, y, z):
        grams.add(s.reshape(300, 2, -1) if s.shape[1] % 2 == 0 else s)  # examples flattened
    np.testing.assert_allclose(grams.cka(), got, rtol=1e-9)
    rotated = x @ np.linalg.qr(rng.normal(size=(10, 10)))[0] * 3.0  # invariant to rotation and isotropic scale
    moments2 = similarity.FeatureMoments((10, 10))
    moments2.add([x, rotated])
    assert moments2.cka()[0, 1] == pytest.approx(1.0, rel=1e-10)


def hsic1_written_out(k: np.ndarray, g: np.ndarray) -> float:
    """Song et al. 2012, as Nguyen et al. 2021 Eq. 3 writes it."""
    n = len(k)
    k, g = k.copy(), g.copy()
    np.fill_diagonal(k, 0)
    np.fill_diagonal(g, 0)
    one = np.ones(n)
    return float((np.trace(k @ g) + (one @ k @ one) * (one @ g @ one) / ((n - 1) * (n - 2)) - 2 / (n - 2) * (one @ k @ g @ one)) / (n * (n - 3)))


def test_unbiased_minibatch_cka_is_its_definition():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 8)) + 3.0
    y = np.tanh(x @ rng.normal(size=(8, 6))) + 0.2 * rng.normal(size=(96, 6))
    batches = similarity.minibatch_order(96, 16, epochs=2, seed=7)
    assert len(batches) == 12 and all(len(b) == 16 for b in batches)
    mb = similarity.Minibatches(2)
    xy = kk = ll = 0.0
    for b in batches:
        mb.add([x[b], y[b]])
        k, g = x[b] @ x[b].T, y[b] @ y[b].T
        xy += hsic1_written_out(k, g)
        kk += hsic1_written_out(k, k)
        ll += hsic1_written_out(g, g)
    assert mb.cka()[0, 1] == pytest.approx(xy / np.sqrt(kk * ll), rel=1e-9)
    n = 16  # the U-centred inner product is n(n-3)·HSIC₁
    u_k, u_l = similarity.u_centred(x[batches[0]]), similarity.u_centred(y[batches[0]])
    k, g = x[batches[0]] @ x[batches[0]].T, y[batches[0]] @ y[batches[0]].T
    assert np.sum(u_k * u_l) == pytest.approx(n * (n - 3) * hsic1_written_out(k, g), rel=1e-9)
    assert len(similarity.minibatch_order(100, 16, 1, 0)) == 6  # the partial batch is dropped


def test_independent_noise_has_minibatch_cka_near_zero_where_full_cka_is_not():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(512, 200)), rng.normal(size=(512, 200))  # few examples, many channels
    full = similarity.FeatureMoments((200, 200))
    full.add([x, y])
    mb = similarity.Minibatches(2)
    for b in similarity.minibatch_order(512, 64, 1, 0):
        mb.add([x[b], y[b]])
    assert full.cka()[0, 1] > 0.2  # biased upwards when n is not ≫ D
    assert abs(mb.cka()[0, 1]) < 0.05


def many_to_one_written_out(gt: np.ndarray, pred: np.ndarray, k: int, classes: int) -> float:
    """NeCo PredsmIoU._original_match and compute_miou, pixel by pixel."""
    to_class = {}
    for c2 in range(k):
        best, score = None, None
        for c1 in range(classes):
            tp = np.sum((gt == c1) & (pred == c2))
            fp = np.sum((gt != c1) & (pred == c2))
            s = tp / max(tp + fp, 1e-8)
            if best is None or s > score:
                best, score = c1, s
        to_class[c2] = best
    remapped = np.array([to_class[p] for p in pred])
    return float(np.mean([np.sum((gt == c) & (remapped == c)) / max(np.sum((gt == c) | (remapped == c)), 1e-8) for c in range(classes)]))


def hungarian_written_out(gt: np.ndarray, pred: np.ndarray, classes: int) -> float:
    iou = np.array([[np.sum((gt == c1) & (pred == c2)) / max(np.sum((gt == c1) | (pred == c2)), 1e-8) for c2 in range(classes)] for c1 in range(classes)])
    rows, cols = linear_sum_assignment(1 - iou)
    remapped = np.zeros_like(pred)
    for r, c in zip(rows, cols):
        remapped[pred == c] = r
    return float(np.mean([np.sum((gt == c) & (remapped == c)) / max(np.sum((gt == c) | (remapped == c)), 1e-8) for c in range(classes)]))


def test_overclustering_matching_against_the_reference_written_out():
    rng = np.random.default_rng(6)
    gt = rng.integers(0, 5, size=(3, 20, 20))
    gt[0, :2] = 255  # ignored pixels
    pred = (gt * 3 + rng.integers(0, 3, size=gt.shape)) % 12
    pred[rng.random(gt.shape) < 0.2] = rng.integers(0, 12)
    keep = gt != 255
    conf = overcluster.confusion(gt, pred, 5, 12)
    assert conf.sum() == keep.sum()
    assert overcluster.match(conf).miou == pytest.approx(many_to_one_written_out(gt[keep], pred[keep], 12, 5), rel=1e-12)
    square = rng.permutation(5)[np.clip(gt, 0, 4)]
    square[rng.random(gt.shape) < 0.3] = rng.integers(0, 5)
    conf5 = overcluster.confusion(gt, square, 5, 5)
    matched = overcluster.match(conf5)
    assert matched.matching == "hungarian"
    assert matched.miou == pytest.approx(hungarian_written_out(gt[keep], square[keep], 5), rel=1e-12)


def test_nearest_upsampling_is_torch_nearest():
    import torch

    maps = np.arange(2 * 7 * 7).reshape(2, 7, 7)
    want = torch.nn.functional.interpolate(torch.as_tensor(maps[:, None]).float(), size=(100, 100), mode="nearest")[:, 0].long().numpy()
    np.testing.assert_array_equal(overcluster.nearest(maps, 100), want)
    big = np.arange(512 * 512).reshape(1, 512, 512) % 251
    want = torch.nn.functional.interpolate(torch.as_tensor(big[:, None]).float(), size=(100, 100), mode="nearest")[:, 0].long().numpy()
    np.testing.assert_array_equal(overcluster.nearest(big, 100), want)


def test_standardise_is_scikit_learns_scaler():
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(8)
    x = (rng.normal(size=(500, 6)) * [1, 2, 3, 0, 5, 6] + 10).astype(np.float32)
    np.testing.assert_allclose(overcluster.standardise(x), StandardScaler().fit_transform(x.astype(np.float64)), rtol=1e-5, atol=1e-5)


def _batches(tokens: np.ndarray, size: int = 32):
    return lambda epoch: (tokens[a : a + size] for a in range(0, len(tokens), size))


def test_position_probe_reads_a_linear_code_and_fails_on_noise():
    g, d = 6, 16
    rng = np.random.default_rng(9)
    t = position.targets(g, g)
    assert t[0].tolist() == [-1, -1] and t[-1].tolist() == [1, 1] and t[1].tolist() == [-1, -0.6000000238418579]
    basis = np.linalg.qr(rng.normal(size=(d, 3)))[0].T  # orthonormal rows: every token has one norm, so normalising keeps the code linear
    encoded = np.concatenate([t, np.sqrt(3.0 - (t.astype(np.float64) ** 2).sum(axis=1, keepdims=True))], axis=1) @ basis
    train = np.repeat(encoded[None], 256, axis=0)
    held = np.repeat(encoded[None], 16, axis=0)
    fit = position.train_probe(_batches(train), [held], d, g, g, epochs=20, lr=1e-2)
    assert fit.l1 < 0.01 and fit.loss < fit.l1  # position is a linear function of the normalised tokens: error ≈ 0
    noise = rng.normal(size=(80, g * g, d))
    chance = position.chance_l1(g, g)
    assert chance == pytest.approx(g / (2 * (g - 1)))  # even G: G / (2(G − 1)) = 0.6 at 6
    blind = position.train_probe(_batches(noise[:64]), [noise[64:]], d, g, g, epochs=5)
    assert blind.l1 == pytest.approx(chance, abs=0.06)  # a probe of tokens that carry no position is at chance level
    again = position.train_probe(_batches(noise[:64]), [noise[64:]], d, g, g, epochs=5)
    assert again.l1 == blind.l1  # seeded: the same bits


def test_position_split_is_seeded_and_disjoint():
    ids = [f"{i}.jpg" for i in range(50)]
    train, held = position.split(ids, 0.2, 0)
    assert len(held) == 10 and not set(train) & set(held) and len(train) + len(held) == 50
    np.testing.assert_array_equal(held, position.split(ids, 0.2, 0)[1])
