"""The decoder against planted partitions and TokenCut's dense procedure (a separate code path)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.ndimage
import scipy.sparse.linalg
from decoder_scenes import planted_keys, region

from probe_toolkit.analyses import decoder, decoder_cut, decoder_graph, decoder_masks
from probe_toolkit.analyses.decoder import decode, decode_image
from probe_toolkit.analyses.decoder_settings import Settings


@pytest.mark.parametrize("grid", [12, 30])  # dense path (N ≤ 256) and ARPACK path
@pytest.mark.parametrize("preset", ["centred", "tokencut"])
def test_planted_two_region_partition_is_found(grid, preset):
    obj = (grid // 4, grid // 2 + 1, grid // 3, grid // 3 + grid // 4)
    keys = planted_keys(grid, [obj], channels=24, noise=0.01, seed=grid)
    out = decode_image(keys, Settings.from_preset(preset))
    assert out.masks.shape == (1, grid * grid)
    np.testing.assert_array_equal(out.masks[0], region(grid, [obj])[0])
    assert not out.degenerate
    assert 0.0 < out.score[0] <= 1.0
    assert out.solver == ["dense" if grid * grid <= decoder_cut.DENSE_BELOW else "arpack"]


def _structured(rng, grid: int, channels: int = 64) -> np.ndarray:
    """A disc on a background, both noisy (the CPU-baseline setup, smaller)."""
    yy, xx = np.mgrid[:grid, :grid]
    r = rng.uniform(0.15, 0.35) * grid
    disc = ((yy - rng.uniform(0.3, 0.7) * grid) ** 2 + (xx - rng.uniform(0.3, 0.7) * grid) ** 2 < r * r).reshape(-1)
    means = rng.standard_normal((2, channels))
    return (means[disc.astype(int)] + rng.uniform(1.0, 2.5) * rng.standard_normal((grid * grid, channels))).astype(np.float16)


@pytest.mark.parametrize("kind", ["random", "structured"])
def test_masks_equal_the_dense_generalized_reference_unless_flagged(kind):
    rng = np.random.default_rng(7 if kind == "random" else 8)
    compared = flagged = 0
    for i in range(12):
        grid = (10, 16, 30 if kind == "random" else 24)[i % 3]  # N ≤ 256: dense path; above: ARPACK
        keys = rng.standard_normal((grid * grid, 12)).astype(np.float16) if kind == "random" else _structured(rng, grid)
        for center in (True, False):
            tau = (0.2, 0.1, 0.3)[i % 3]
            out = decode_image(keys, Settings.from_preset("centred", center=center, tau=tau))
            if out.degenerate:
                flagged += 1
                continue
            compared += 1
            np.testing.assert_array_equal(out.masks[0], decoder.tokencut_dense(keys, tau, 1e-5, center), err_msg=f"image {i} center {center}")
    assert compared >= 20 and flagged <= 4


def test_the_graph_is_decided_in_float64_even_next_to_tau():
    rng = np.random.default_rng(3)
    base = rng.standard_normal(32)
    base /= np.linalg.norm(base)
    ortho = rng.standard_normal(32)
    ortho -= (ortho @ base) * base
    ortho /= np.linalg.norm(ortho)
    tau = 0.2
    keys = []
    for delta in (-3e-9, -1e-12, 1e-12, 3e-9, 0.05, -0.05):  # cosines with `base` straddling τ by a hair
        c = tau + delta
        keys.append(c * base + np.sqrt(1 - c * c) * ortho)
    keys = np.array([base, *keys, *rng.standard_normal((9, 32))])
    cos = decoder_graph.cosines(keys, center=False, shared=True)
    exact = (cos.unit @ cos.unit.T) > tau
    np.testing.assert_array_equal(decoder_graph.adjacency(cos, tau), exact)
    np.testing.assert_array_equal(decoder_graph.adjacency(decoder_graph.cosines(keys, center=False), tau), exact)  # row blocks of products
    assert not np.array_equal(cos.approx > tau, exact)  # float32 alone would get some wrong


def test_negating_the_eigenvector_changes_nothing(monkeypatch):
    grid = 16
    corner_blocks = [(0, 3, 0, 3), (0, 3, 13, 16), (13, 16, 0, 3)]  # ≥ 3 corners on the seed's side
    # one small cluster (one key for the three corner blocks) on a large background
    corner_keys = planted_keys(grid, [(0, 3, 0, 3)], seed=3)
    blocks = region(grid, corner_blocks).any(axis=0)
    corner_keys[blocks] = corner_keys[0]
    cases = [
        (planted_keys(grid, [(4, 10, 5, 12)], seed=1), "centred"),
        (planted_keys(grid, [(2, 7, 2, 7), (9, 14, 8, 14)], seed=2), "maskcut"),
        (corner_keys, "maskcut"),
    ]
    plain = [decode_image(k, Settings.from_preset(p)) for k, p in cases]
    real = decoder_cut.normalized_cut

    def negated(*args, **kwargs):
        cut = real(*args, **kwargs)
        return decoder_cut.Cut(x=-cut.x, lambda2=cut.lambda2, lambda3=cut.lambda3, lambda3_low=cut.lambda3_low, residual=cut.residual, solver=cut.solver)

    monkeypatch.setattr(decoder, "normalized_cut", negated)
    for (k, p), before in zip(cases, plain):
        after = decode_image(k, Settings.from_preset(p))
        np.testing.assert_array_equal(after.masks, before.masks)
        np.testing.assert_allclose(after.score, before.score)
    # the corner case really exercised the corner rule: the first mask is the big background
    assert plain[2].masks[0].sum() == grid * grid - blocks.sum()


def test_foreground_rules_and_the_corner_rule_by_hand():
    grid = 4
    x = np.zeros(16)
    x[[0, 3, 12]] = [0.9, 0.5, 0.4]  # three corners high, peak at patch 0
    x[[5, 6, 9, 10]] = -0.3  # the centre low; its most negative entry is patch 10
    x[10] = -0.35
    side, seed, reversed_ = decoder_masks.foreground(x, grid, "tokencut")
    assert (seed, reversed_) == (0, False) and side[[0, 3, 12]].all()
    side, seed, reversed_ = decoder_masks.foreground(x, grid, "maskcut")
    assert (seed, reversed_) == (10, True)
    np.testing.assert_array_equal(side, ~(x > x.mean()))


def test_only_the_four_connected_component_holding_the_seed_is_kept():
    grid = 5
    side = np.zeros((grid, grid), dtype=bool)
    side[0:2, 0:2] = True  # the seed's blob
    side[2, 2] = True  # touches the blob only diagonally
    side[4, 0:3] = True  # a separate blob
    mask = decoder_masks.component(side.reshape(-1), seed=0, grid=grid).reshape(grid, grid)
    expected = np.zeros_like(side)
    expected[0:2, 0:2] = True
    np.testing.assert_array_equal(mask, expected)


def test_maskcut_loop_finds_two_separated_objects_and_stops():
    grid = 20
    objects = [(2, 8, 2, 9), (11, 18, 10, 17)]
    keys = planted_keys(grid, objects, channels=24, noise=0.1, seed=5)
    for preset in ("maskcut", "centred"):
        out = decode_image(keys, Settings.from_preset(preset, masks=4))
        truth = region(grid, objects)
        found = {tuple(np.flatnonzero(m)) for m in out.masks[:2]}
        assert found == {tuple(np.flatnonzero(t)) for t in truth}, preset
        assert not (out.masks.sum(axis=0) > 1).any()  # masks never overlap
        assert out.stop in decoder.STOPS and out.cuts <= 4
    # one mask asked: the loop stops on count after one cut
    one = decode_image(keys, Settings.from_preset("maskcut", masks=1))
    assert one.stop == "count" and one.cuts == 1 and one.masks.shape[0] == 1


def test_a_graph_without_structure_is_flagged_degenerate():
    # 384-d Gaussian keys: no cosine reaches 0.2, every edge is ε, the spectrum is flat
    keys = np.random.default_rng(0).standard_normal((144, 384))
    out = decode_image(keys, Settings())
    assert out.degenerate


def test_solver_failures_fall_back_to_the_dense_solver(monkeypatch):
    grid = 20
    keys = planted_keys(grid, [(3, 9, 4, 12)], seed=9)
    before = decode_image(keys, Settings())
    assert before.solver == ["lanczos"]  # certified before machine precision: the run stopped early
    monkeypatch.setattr(decoder_cut, "PRECISE", 0.0)  # no early stop: Lanczos to machine precision, ARPACK settles
    settled = decode_image(keys, Settings())

    def refuse(*args, **kwargs):
        raise scipy.sparse.linalg.ArpackNoConvergence("no", np.zeros(0), np.zeros((grid * grid, 0)))

    monkeypatch.setattr(scipy.sparse.linalg, "eigsh", refuse)
    after = decode_image(keys, Settings())

    def unsettled(*args, **kwargs):
        raise decoder_cut._Unsettled

    monkeypatch.setattr(decoder_cut, "_lanczos", unsettled)
    lost = decode_image(keys, Settings())
    assert settled.solver == ["arpack"] and after.solver == ["dense"] and lost.solver == ["dense"]
    for out in (settled, after, lost):
        np.testing.assert_array_equal(out.masks, before.masks)
        np.testing.assert_allclose(out.lambda2, before.lambda2, rtol=1e-8)


def test_batches_pad_to_the_mask_count_and_scores_rank_images():
    grid = 12
    keys = np.stack([planted_keys(grid, [(2, 6, 2, 6)], noise=n, seed=s) for s, n in enumerate((0.05, 0.6, 1.2))])
    out = decode(keys, Settings.from_preset("maskcut", masks=2))
    assert out.masks.shape == (3, 2, grid * grid) and out.score.shape == (3, 2)
    assert np.isnan(out.score[out.n_masks == 1, 1]).all()
    first = out.score[:, 0]
    assert len(set(np.round(first, 12))) == 3  # distinct: AP does not depend on input order


def test_settings_are_validated_and_presets_fill_defaults():
    assert Settings.from_preset("maskcut").tau == 0.15 and Settings.from_preset("maskcut").masks == 3
    assert Settings.from_preset("tokencut").center is False and Settings.from_preset("centred").center is True
    assert Settings.from_preset("centred", tau=None, masks=2).masks == 2
    from probe_toolkit.infra.errors import ProbeError

    for bad in (dict(tau=1.5), dict(eps=0.0), dict(masks=0)):
        with pytest.raises(ProbeError):
            Settings.from_preset("centred", **bad)
    with pytest.raises(ProbeError):
        Settings.from_preset("nosuch")
