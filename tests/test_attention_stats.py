"""``--attention stats`` equals the explicit maps' statistics to 1e-5: per query entropy, mean
attention distance, top-k mass, the class token's and each register's row, on tiny DINO,
DINOv2-reg and DINOv3 networks, at a square view and a non-square own size, whatever the tile."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe_toolkit.analyses.entropy import row_statistics
from probe_toolkit.demo.samples import TINY, TINY_DINOV2_REG, TINY_DINOV3, write_checkpoint
from probe_toolkit.store import attention_stats
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.taps import Taps

NETWORKS = {"dino": ("dino-full", TINY), "dinov2-reg": ("dinov2-reg-backbone", TINY_DINOV2_REG), "dinov3": ("dinov3-official", TINY_DINOV3)}


@pytest.fixture(scope="module")
def networks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stats")
    return {name: Backbone.from_checkpoint(load_checkpoint(write_checkpoint(folder / f"{name}.pth", layout, arch, seed=3))) for name, (layout, arch) in NETWORKS.items()}


def explicit(maps: np.ndarray, prefix: int, grid: tuple[int, int]) -> dict[str, np.ndarray]:
    """The statistics of explicit float32 maps (B, heads, T, T), written out in float64: −Σ a ln a,
    Σ a‖u_i − u_j‖ / Σ a over patch keys, the sums of the k largest weights."""
    a = maps.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
    rows, cols = grid
    yx = np.stack(np.divmod(np.arange(rows * cols), cols), axis=1).astype(np.float64)
    apart = np.sqrt(((yx[:, None] - yx[None]) ** 2).sum(-1))
    patches = a[..., prefix:, prefix:]
    distance = np.full(a.shape[:-1], np.nan)
    distance[..., prefix:] = (patches * apart).sum(-1) / patches.sum(-1)
    ranked = -np.sort(-a, axis=-1)
    mass = np.stack([ranked[..., :k].sum(-1) for k in attention_stats.TOPK], axis=-1)
    return {"entropy": entropy, "distance": distance, "topk": mass}


@pytest.mark.parametrize("name", list(NETWORKS))
@pytest.mark.parametrize("size", [(64, 64), (48, 80)])  # a square view and a non-square own size (3 x 5 patches at /16)
def test_statistics_equal_the_explicit_maps(networks, name, size):
    model = networks[name]
    arch = model.arch
    patch = arch.patch
    images = torch.randn(2, 3, size[0] // 16 * patch, size[1] // 16 * patch, generator=torch.Generator().manual_seed(1))
    cap = model.capture(images, Taps(maps="all", stats=True))
    grid, prefix = cap.grid, arch.prefix
    assert len(cap.maps) == arch.depth and all(len(v) == arch.depth for v in cap.stats.values())
    for block, maps in enumerate(cap.maps):
        maps = maps.numpy()
        want = explicit(maps, prefix, grid)
        got = {k: v[block].numpy() for k, v in cap.stats.items()}
        for stat in ("entropy", "distance", "topk"):
            np.testing.assert_allclose(got[stat], want[stat], atol=1e-5, rtol=0, err_msg=f"{name} block {block} {stat}")
        np.testing.assert_allclose(got["cls"], maps[:, :, 0], atol=1e-6)
        if arch.registers:
            np.testing.assert_allclose(got["storage"], maps[:, :, 1:prefix], atol=1e-6)
        else:
            assert "storage" not in got
        # what probe entropy summarises, from the stats as from the explicit maps (analyses.entropy)
        summary = row_statistics(maps, True, arch.registers, grid)
        np.testing.assert_allclose(got["entropy"][..., prefix:].mean(-1), summary["patch_entropy"], atol=1e-5)
        np.testing.assert_allclose(np.exp(got["entropy"][..., prefix:]).mean(-1), summary["patch_effective"], rtol=1e-5)
        np.testing.assert_allclose(got["distance"][..., prefix:].mean(-1), summary["distance"], atol=1e-5)
        np.testing.assert_allclose(got["entropy"][..., 0], summary["cls_entropy"], atol=1e-5)


def test_tiles_change_no_statistic(networks):
    model = networks["dinov2-reg"]
    images = torch.randn(1, 3, 56, 70, generator=torch.Generator().manual_seed(2))
    whole = model.capture(images, Taps(stats=True)).stats
    q = torch.randn(1, 2, 25, 8, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    k = torch.randn(1, 2, 25, 8, dtype=torch.float32, generator=torch.Generator().manual_seed(1))
    one = attention_stats.statistics(q, k, class_token=True, registers=4, grid=(4, 5), budget=1)  # a query per tile
    every = attention_stats.statistics(q, k, class_token=True, registers=4, grid=(4, 5))
    for name in one:
        torch.testing.assert_close(one[name], every[name], rtol=0, atol=1e-6, equal_nan=True)
    assert attention_stats.query_tile(1, 6, 16_384 + 1) < 200 and set(whole) == {"entropy", "distance", "topk", "cls", "storage"}
