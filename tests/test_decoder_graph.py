"""The decoder's stored graph (A, or its complement Ā when A is over half full) and its Lanczos
eigensolve, held against a plain dense float64 construction written here (a different code path)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.ndimage

from probe_toolkit.analyses import decoder, decoder_cut, decoder_graph, decoder_masks
from probe_toolkit.analyses.decoder import decode_image
from probe_toolkit.analyses.decoder_settings import Settings


def _keys(grid: int, common: float, seed: int, noise: float = 0.29) -> np.ndarray:
    """A square object on a background (orthogonal unit means) with noise near τ = 0.2, and a
    shared component of weight ``common`` (0.5 puts most cosines above τ: A over half full)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:grid, :grid]
    inside = ((yy >= grid // 4) & (yy < 3 * grid // 4) & (xx >= grid // 5) & (xx < grid // 2 + 2)).reshape(-1)
    means = np.linalg.qr(rng.standard_normal((48, 3)))[0].T
    return common * means[2] + means[inside.astype(int)] + noise * rng.standard_normal((grid * grid, 48))


def _plain_w(keys: np.ndarray, tau: float, eps: float, painted: np.ndarray | None = None) -> np.ndarray:
    """W in float64, loops over nothing clever: zeroed keys for painted patches, then cos > τ."""
    k = np.array(keys, dtype=np.float64)
    if painted is not None:
        k[painted] = 0.0
    norm = np.linalg.norm(k, axis=1)
    unit = np.zeros_like(k)
    unit[norm > 0] = k[norm > 0] / norm[norm > 0, None]
    cos = unit @ unit.T
    return np.where(cos > tau, 1.0, eps)


def _plain_fiedler(w: np.ndarray) -> tuple[np.ndarray, float, float]:
    d = np.diag(w.sum(axis=1))
    values, vectors = scipy.linalg.eigh(d - w, d, subset_by_index=[1, 2])
    return vectors[:, 0], float(values[0]), float(values[1])


@pytest.mark.parametrize("common, complement", [(0.0, False), (0.9, True)])
def test_the_stored_graph_is_the_dense_float64_graph(common, complement):
    keys = _keys(18, common, seed=1)
    tau, eps = 0.2, 1e-5
    graph = decoder_graph.key_graph(decoder_graph.cosines(keys, center=False), tau, eps)
    w = _plain_w(keys, tau, eps)
    assert graph.complement is complement
    np.testing.assert_array_equal(graph.dense(), w)
    np.testing.assert_allclose(graph.degree, w.sum(axis=1), rtol=1e-13)
    v = np.random.default_rng(2).standard_normal((w.shape[0], 3))
    np.testing.assert_allclose(graph.matvec(v), w @ v, rtol=1e-11, atol=1e-11)
    scale, top, apply = decoder_cut._normalized(graph)
    normal = w / np.sqrt(np.outer(w.sum(axis=1), w.sum(axis=1)))
    np.testing.assert_allclose(apply(v[:, 0]), normal @ v[:, 0], rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(normal @ top, top, atol=1e-12)  # D^½1 is 𝒩's top eigenvector


def test_painted_patches_are_cut_from_the_complement_graph():
    keys = _keys(16, 0.9, seed=3)
    painted = np.zeros(keys.shape[0], dtype=bool)
    painted[[0, 5, 17, 100, 200]] = True
    for tau in (0.2, -0.1):  # a negative τ joins a painted patch (cosine 0) to everything
        graph = decoder_graph.key_graph(decoder_graph.cosines(keys, center=False), tau, 1e-5, painted)
        assert graph.complement
        np.testing.assert_array_equal(graph.dense(), _plain_w(keys, tau, 1e-5, painted))


@pytest.mark.parametrize("common", [0.0, 0.9])  # sparse A, and Ā stored
@pytest.mark.parametrize("grid", [20, 24])  # above DENSE_BELOW: the Lanczos/ARPACK path
def test_the_fiedler_vector_and_mask_equal_a_plain_dense_solve(common, grid):
    keys = _keys(grid, common, seed=grid)
    settings = Settings.from_preset("tokencut")
    w = _plain_w(keys, settings.tau, settings.eps)
    graph = decoder_graph.key_graph(decoder_graph.cosines(keys, center=False), settings.tau, settings.eps)
    assert graph.complement is (common > 0)
    cut = decoder_cut.normalized_cut(graph)
    assert cut.solver == "arpack"
    x, lam2, lam3 = _plain_fiedler(w)
    x = x / np.sqrt((x * w.sum(axis=1)) @ x)  # xᵀDx = 1, as the decoder's x
    sign = np.sign(x @ cut.x)
    np.testing.assert_allclose(sign * cut.x, x, atol=1e-9 * np.abs(x).max())
    assert cut.lambda2 == pytest.approx(lam2, rel=1e-10)
    assert cut.lambda3_low <= lam3 + 1e-12 and cut.lambda3 >= lam3 - 1e-12  # θ3 ≤ μ3: λ3 from above, its bound below
    assert cut.lambda3 - lam3 <= 0.25 * (lam3 - lam2) + 1e-12
    out = decode_image(keys, settings)
    assert not out.degenerate
    # TokenCut's post-processing by hand on the plain vector: mean threshold, argmax |x| side, its component
    seed = int(np.argmax(np.abs(x)))
    side = x > x.mean()
    if not side[seed]:
        side = ~side
    labels, _ = scipy.ndimage.label(side.reshape(grid, grid))
    np.testing.assert_array_equal(out.masks[0], labels.reshape(-1) == labels.reshape(-1)[seed])


@pytest.mark.parametrize("preset, common", [("centred", 0.0), ("tokencut", 0.9)])  # Ā stored in the second
def test_a_cut_certified_early_is_within_its_bound_of_a_plain_dense_solve(preset, common):
    """The run stops once the mask is certified (residual far above machine precision): the
    Fiedler vector is then within ``Cut.error`` of the dense one, λ2 within 1e-8, the mask its."""
    grid = 24
    keys = _keys(grid, common, seed=5)
    settings = Settings.from_preset(preset)
    graph = decoder_graph.key_graph(decoder_graph.cosines(keys, center=settings.center), settings.tau, settings.eps)
    scale = 1.0 / np.sqrt(graph.degree)
    checked: list[float] = []

    def enough(cut):
        checked.append(cut.residual)
        return decoder_masks.certified_cut(cut, scale, (grid, grid), settings)[-1]

    cut = decoder_cut.normalized_cut(graph, enough=enough)
    assert cut.solver == "lanczos"  # stopped by the certificate, ARPACK never ran
    if preset == "centred":  # a clustered spectrum: certified long before machine precision
        assert cut.residual > 1e-10
    assert checked[-1] == cut.residual  # the certificate saw the measured residual it returns
    k = np.array(keys, dtype=np.float64)
    if settings.center:
        k -= k.mean(axis=0)
    w = _plain_w(k, settings.tau, settings.eps)
    x, lam2, _ = _plain_fiedler(w)
    x = x / np.sqrt((x * w.sum(axis=1)) @ x)
    x *= np.sign(x @ cut.x)
    bound = cut.error(scale)
    assert (np.abs(cut.x - x) <= bound).all()
    if preset == "centred":
        assert np.abs(cut.x - x).max() > 1e-3 * bound.max()  # the bound is not vacuous
    assert cut.lambda2 == pytest.approx(lam2, rel=1e-8)
    out = decode_image(keys, settings)
    assert out.solver == ["lanczos"] and not out.degenerate
    np.testing.assert_array_equal(out.masks[0], decoder.tokencut_dense(keys, settings.tau, settings.eps, settings.center))


def test_the_start_vector_leaning_on_the_degrees_still_finds_a_fiedler_vector_orthogonal_to_them():
    """Lanczos starts from a random vector plus the degree vector. In a mirror-image scene
    (left half one mean, right half another, the same noise mirrored) the degrees are mirror-
    symmetric and the Fiedler vector, left against right, antisymmetric: orthogonal to them.
    The random half of the start still finds it: the vector and mask of a plain dense solve."""
    grid, channels = 20, 24
    rng = np.random.default_rng(4)
    noise = np.zeros((grid, grid // 2, channels))
    noise[..., 2:] = 0.45 * rng.standard_normal((grid, grid // 2, channels - 2))  # orthogonal to both means
    left = noise.copy()
    left[..., 0] += 1.0
    right = noise[:, ::-1].copy()
    right[..., 1] += 1.0
    keys = np.concatenate([left, right], axis=1).reshape(grid * grid, channels)
    settings = Settings.from_preset("tokencut")
    graph = decoder_graph.key_graph(decoder_graph.cosines(keys, center=False), settings.tau, settings.eps)
    degree = graph.degree.reshape(grid, grid)
    np.testing.assert_array_equal(degree, degree[:, ::-1])  # mirror-symmetric degrees
    w = _plain_w(keys, settings.tau, settings.eps)
    x, _, _ = _plain_fiedler(w)
    y = x * np.sqrt(w.sum(axis=1))  # the eigenvector of 𝒩 that Lanczos looks for
    top = np.sqrt(w.sum(axis=1))
    top /= np.linalg.norm(top)
    lean = graph.degree - top * (top @ graph.degree)
    assert abs(lean @ y) <= 1e-9 * np.linalg.norm(lean) * np.linalg.norm(y)  # the degree half adds nothing along y
    x = x / np.sqrt((x * w.sum(axis=1)) @ x)
    scale = 1.0 / np.sqrt(graph.degree)
    for enough in (None, lambda c: decoder_masks.certified_cut(c, scale, (grid, grid), settings)[-1]):
        cut = decoder_cut.normalized_cut(graph, enough=enough)
        np.testing.assert_allclose(np.sign(x @ cut.x) * cut.x, x, atol=1e-9 * np.abs(x).max())
    side = (x > x.mean()).reshape(grid, grid)
    left, right = side[:, : grid // 2], side[:, grid // 2 :]
    assert (left.all() and not right.any()) or (right.all() and not left.any())  # left against right
    # mirrored patches tie in |x|, so the orientation is not decided: flagged, never guessed
    assert decode_image(keys, settings).degenerate
