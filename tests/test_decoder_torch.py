"""The torch backend (analyses/decoder_torch.py) on the CPU: where both backends certify a mask,
the masks are the scipy path's, and TokenCut's dense generalized solve (a separate code path)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_scenes import planted_keys
from test_decoder import _structured

from probe_toolkit.analyses import decoder, decoder_cut
from probe_toolkit.analyses.decoder import decode_image
from probe_toolkit.analyses.decoder_settings import Settings
from probe_toolkit.analyses.decoder_torch import decode_batch


@pytest.mark.parametrize("grid", [12, 18])  # batched dense eigh, and batched LOBPCG (forced above N = 256)
@pytest.mark.parametrize("preset, masks", [("centred", 1), ("tokencut", 1), ("maskcut", 3)])
def test_certified_masks_equal_the_scipy_path(grid, preset, masks):
    rng = np.random.default_rng(grid + masks)
    keys = np.stack([_structured(rng, grid) for _ in range(5)] + [rng.standard_normal((grid * grid, 64)).astype(np.float16)])
    settings = Settings.from_preset(preset, masks=masks)
    ours = decode_batch(keys, settings, dense_up_to=256)
    compared = 0
    for k, theirs in zip(keys, ours):
        ref = decode_image(k, settings)
        if ref.degenerate or theirs.degenerate:
            continue
        compared += 1
        assert theirs.stop == ref.stop and theirs.masks.shape == ref.masks.shape
        np.testing.assert_array_equal(theirs.masks, ref.masks)
        np.testing.assert_allclose(theirs.lambda2, ref.lambda2, rtol=1e-7, atol=1e-12)
        if masks == 1:
            np.testing.assert_array_equal(theirs.masks[0], decoder.tokencut_dense(k, settings.tau, settings.eps, settings.center))
    assert compared >= 4
    assert {s for r in ours for s in r.solver} == ({"dense"} if grid * grid <= decoder_cut.DENSE_BELOW else {"lobpcg"})


def test_planted_objects_are_found_in_one_batch():
    objects = [[(2, 9, 3, 12)], [(10, 18, 10, 18)], [(0, 6, 0, 20)]]
    keys = np.stack([planted_keys(20, o, channels=24, noise=0.02, seed=i) for i, o in enumerate(objects)])
    out = decode_batch(keys, Settings.from_preset("tokencut"))
    for o, result in zip(objects, out):
        r0, r1, c0, c1 = o[0]
        truth = np.zeros((20, 20), bool)
        truth[r0:r1, c0:c1] = True
        assert not result.degenerate
        np.testing.assert_array_equal(result.masks[0], truth.reshape(-1))


def test_a_cosine_on_tau_in_float64_is_flagged():
    """Two keys whose float64 cosine is τ exactly: another summation order could link them or not."""
    rng = np.random.default_rng(1)
    keys = rng.standard_normal((36, 8))
    keys[0] = [1, 0, 0, 0, 0, 0, 0, 0]
    keys[1] = [0.25, np.sqrt(1 - 0.0625), 0, 0, 0, 0, 0, 0]
    assert float(keys[0] @ keys[1] / np.linalg.norm(keys[1])) == 0.25
    out = decode_batch(keys[None], Settings.from_preset("tokencut", tau=0.25))
    assert out[0].degenerate


def test_bad_keys_are_one_line():
    from probe_toolkit.infra.errors import ProbeError

    with pytest.raises(ProbeError, match="NaN"):
        decode_batch(np.full((1, 16, 4), np.nan), Settings())
    with pytest.raises(ProbeError, match="not \\(image"):
        decode_batch(np.zeros((16, 4)), Settings())


@pytest.mark.parametrize("preset, ties", [("lost", "argsort"), ("lost", "lowest-index"), ("dsm", "argsort")])
@pytest.mark.parametrize("grid", [(12, 12), (9, 14)])
def test_lost_and_dsm_batched_equal_the_scipy_path(preset, ties, grid):
    """Every preset runs batched on torch: LOST (its dot products, degrees and expansion on the
    device, its order of equal degrees and its component on the CPU) and DSM (its affinity and a
    batched eigh on the device) give the scipy path's masks, seeds and degrees, and close
    eigenvalues, on a square and an own-size grid, centred or not; nothing flagged here."""
    from probe_toolkit.analyses.decoder_blocks import decode_block

    rng = np.random.default_rng(sum(grid))
    rows, cols = grid
    keys = np.stack([_structured(rng, max(grid))[: rows * cols] for _ in range(5)] + [rng.standard_normal((rows * cols, 64)).astype(np.float16)])
    for center in (False, True):
        settings = Settings.from_preset(preset, center=center, **({"ties": ties} if preset == "lost" else {}))
        grids = None if rows == cols else (np.full(len(keys), rows), np.full(len(keys), cols))
        scipy_arrays = decode_block(keys, settings=settings, **({} if grids is None else {"rows": grids[0], "cols": grids[1]}))
        torch_arrays = decode_block(keys, settings=settings, backend="torch", **({} if grids is None else {"rows": grids[0], "cols": grids[1]}))
        for name in ("masks", "seed", "degree", "stop", "cuts", "degenerate"):
            a, b = scipy_arrays[name], torch_arrays[name]
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), (name, center)
        for name in ("lambda2", "lambda3", "score", "expansion"):
            np.testing.assert_allclose(torch_arrays[name], scipy_arrays[name], rtol=1e-9, atol=1e-9, equal_nan=True)
        assert not torch_arrays["degenerate"].any()


def test_lost_flags_a_dot_product_too_close_to_zero_to_sign():
    """Two keys orthogonal up to float64's rounding: their sign decides a degree, which another
    summation order could decide otherwise, so the torch path flags the image."""
    import torch

    from probe_toolkit.analyses.decoder_single_torch import decode_single_batch

    rng = np.random.default_rng(0)
    keys = rng.standard_normal((1, 16, 8))
    keys[0, 1] = keys[0, 0][[1, 0, 3, 2, 5, 4, 7, 6]] * np.array([1, -1, 1, -1, 1, -1, 1, -1])  # exactly orthogonal to key 0
    found = decode_single_batch(keys, Settings.from_preset("lost"), torch.device("cpu"), (4, 4))
    assert found[0].degenerate
