"""Row entropy, e^H and mean attention distance: course facts, hand cases, a plain loop, a store."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import torch
from analysis_stores import make_store, softmax

from probe_toolkit.analyses import entropy as ent
from probe_toolkit.analyses.stats import Bootstrap
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.runner import Where, per_image
from probe_toolkit.results import records
from probe_toolkit.store.cache import open_store


def test_uniform_rows_give_ln_n_and_n():
    for n in (196, 197, 36):
        row = torch.full((n,), 1.0 / n)
        assert math.isclose(float(ent.row_entropy(row)), math.log(n), rel_tol=1e-5)
        assert math.isclose(float(ent.effective_number(row)), n, rel_tol=1e-4)
    assert round(math.log(196), 3) == 5.278  # the course's figure


def test_one_hot_rows_give_zero_and_one():
    row = torch.zeros(196)
    row[34] = 1.0
    assert float(ent.row_entropy(row)) == 0.0
    assert float(ent.effective_number(row)) == 1.0


def test_hand_computed_row():
    # H = 0.5 ln 2 + 2 · 0.25 ln 4 = 1.5 ln 2; e^H = 2^1.5; the zero contributes nothing
    row = np.array([0.5, 0.25, 0.25, 0.0], dtype=np.float32)
    assert math.isclose(float(ent.row_entropy(row)), 1.5 * math.log(2), rel_tol=1e-6)
    assert math.isclose(float(ent.effective_number(row)), 2**1.5, rel_tol=1e-6)
    assert ent.row_entropy(torch.zeros(3, 4)).dtype == np.float32  # numpy out, whether torch or numpy came in


def test_float16_rows_through_the_table_match_float64():
    rng = np.random.default_rng(9)
    rows = softmax(4 * rng.standard_normal((3, 5, 197))).astype(np.float16)
    rows[0, 0, :50] = 0.0
    wide = rows.astype(np.float64)
    expected = -np.where(wide > 0, wide * np.log(np.where(wide > 0, wide, 1.0)), 0.0).sum(-1)
    for given in (rows, torch.from_numpy(rows), rows[0, 0]):
        found = ent.row_entropy(given)
        assert found.dtype == np.float32
        assert np.allclose(found, expected if given.ndim == 3 else expected[0, 0], rtol=1e-6, atol=1e-6)
    assert np.allclose(ent.row_entropy(rows.astype(np.float32)), expected, rtol=1e-5)


def pairwise(grid: int) -> np.ndarray:
    d = np.zeros((grid * grid, grid * grid))
    for i in range(grid * grid):
        for j in range(grid * grid):
            d[i, j] = math.hypot(i // grid - j // grid, i % grid - j % grid)
    return d


def test_attention_distance_reference_heads():
    grid = 6
    n = grid * grid
    # a head looking only at its own patch: 0
    assert ent.attention_distance(torch.eye(n)[None], class_token=False).item() == 0.0
    # a uniform head: the mean pairwise distance of the grid (the textbook's reference value)
    uniform = torch.full((1, n, n), 1.0 / n)
    assert math.isclose(ent.attention_distance(uniform, False).item(), pairwise(grid).mean(), rel_tol=1e-5)
    # every query on its right-hand neighbour where it has one, else on itself: (G-1)/G
    right = torch.zeros(1, n, n)
    for i in range(n):
        right[0, i, i + 1 if i % grid < grid - 1 else i] = 1.0
    assert math.isclose(ent.attention_distance(right, False).item(), (grid - 1) / grid, rel_tol=1e-6)
    # the class token is excluded as query and key and the patch part renormalised
    with_cls = torch.zeros(1, n + 1, n + 1)
    with_cls[0, :, 0] = 0.5
    with_cls[0, :, 1:] = 0.5 / n
    assert math.isclose(ent.attention_distance(with_cls, True).item(), pairwise(grid).mean(), rel_tol=1e-5)


def plain_distance(rows: np.ndarray, prefix: int, n_rows: int, n_cols: int) -> np.ndarray:
    """Mean attention distance per head by loops in float64 on an n_rows × n_cols grid (patch i at
    row i // n_cols, column i % n_cols): each patch row renormalised over the patch keys."""
    heads = rows.shape[0]
    out = np.zeros(heads)
    n = n_rows * n_cols
    for h in range(heads):
        total = 0.0
        for i in range(n):
            row = [float(rows[h, prefix + i, prefix + j]) for j in range(n)]
            mass = sum(row)
            total += sum(w * math.hypot(i // n_cols - j // n_cols, i % n_cols - j % n_cols) for j, w in enumerate(row)) / mass
        out[h] = total / n
    return out


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (2, 7)])
def test_attention_distance_on_a_rectangular_grid(shape):
    """A native view's rows × cols grid, with a class token and two registers in front."""
    n_rows, n_cols = shape
    prefix, heads = 3, 2
    t = prefix + n_rows * n_cols
    rows = softmax(np.random.default_rng(n_rows).normal(0, 2, (1, heads, t, t)))
    found = ent.attention_distance(torch.from_numpy(rows), class_token=True, registers=2, grid=shape)
    assert np.allclose(found[0], plain_distance(rows[0], prefix, n_rows, n_cols), rtol=1e-5)
    # a square read of the same rows would be another number: the grid matters
    transposed = ent.attention_distance(torch.from_numpy(rows), class_token=True, registers=2, grid=(n_cols, n_rows))
    assert not np.allclose(transposed, found, rtol=1e-3)
    # through the store-level analysis, with the grid in the attributes
    import xarray as xr

    da = xr.DataArray(rows.astype(np.float32), dims=("image", "head", "query", "key"), name="attention_native")
    saved = ent.entropy(da, class_token=True, registers=2, grid=shape, boot=Bootstrap(10))
    assert np.allclose(saved["distance"].values[0], plain_distance(rows[0], prefix, n_rows, n_cols), rtol=1e-5)
    assert (saved.attrs["grid_rows"], saved.attrs["grid_cols"], saved.attrs["grid"]) == (n_rows, n_cols, [n_rows, n_cols])
    with pytest.raises(ProbeError, match="not the 4 × 4 grid"):
        ent.entropy(da, class_token=True, registers=2, grid=(4, 4), boot=Bootstrap(10))


def test_row_statistics_keep_the_class_token_apart():
    # 1 class token + 4 patches (2 × 2 grid); patch rows are full rows over all 5 keys
    a = torch.zeros(1, 1, 5, 5)
    a[0, 0, 0] = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2])  # the class token's row: uniform
    a[0, 0, 1:, 0] = 0.5  # each patch row: half on the class token, half on itself
    for p in range(4):
        a[0, 0, 1 + p, 1 + p] = 0.5
    found = ent.row_statistics(a, class_token=True)
    assert math.isclose(found["cls_entropy"].item(), math.log(5), rel_tol=1e-6)
    assert math.isclose(found["patch_entropy"].item(), math.log(2), rel_tol=1e-6)  # CLS column counted
    assert math.isclose(found["patch_effective"].item(), 2.0, rel_tol=1e-6)
    assert found["distance"].item() == 0.0  # renormalised over patches: all on itself


def test_patch_detail_top_weights_and_class_key():
    a = torch.zeros(1, 2, 5, 5)
    a[0, 0, 3] = torch.tensor([0.4, 0.1, 0.2, 0.2, 0.1])  # patch 2 in head 0: CLS first, then a tie 1/2
    a[0, 1, 3] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])
    found = ent.patch_detail(a, patch=2, class_token=True, top=3)
    assert found["detail_key"][0, 0].tolist() == [-1, 1, 2]
    assert np.allclose(found["detail_weight"][0, 0], [0.4, 0.2, 0.2])
    assert found["detail_key"][0, 1, 0] == 2 and float(found["detail_effective"][0, 1]) == 1.0
    with pytest.raises(ProbeError):
        ent.patch_detail(a, patch=4, class_token=True)


def plain_entropy_loop(attention: np.ndarray, class_token: bool) -> dict[str, np.ndarray]:
    """Image by image, head by head, row by row, in float64."""
    images, heads, t, _ = attention.shape
    start = int(class_token)
    grid = int(round(math.sqrt(t - start)))
    dist = pairwise(grid)
    out = {name: np.zeros((images, heads)) for name in ("patch_entropy", "patch_effective", "distance", "cls_entropy")}
    for i in range(images):
        for h in range(heads):
            hs, es, ds = [], [], []
            for q in range(t):
                row = attention[i, h, q].astype(np.float64)
                nz = row[row > 0]
                H = -(nz * np.log(nz)).sum()
                if class_token and q == 0:
                    out["cls_entropy"][i, h] = H
                    continue
                hs.append(H)
                es.append(math.exp(H))
                patches = row[start:]
                ds.append((patches * dist[q - start]).sum() / patches.sum())
            out["patch_entropy"][i, h] = np.mean(hs)
            out["patch_effective"][i, h] = np.mean(es)
            out["distance"][i, h] = np.mean(ds)
    return out


@pytest.fixture
def attention_store(tmp_path):
    rng = np.random.default_rng(0)
    attention = softmax(3 * rng.standard_normal((10, 3, 37, 37))).astype(np.float16)
    attention[0, 0, 5] = 0.0
    attention[0, 0, 5, 7] = 1.0  # a one-hot row, zeros included
    blocks = softmax(2 * rng.standard_normal((10, 4, 3, 37, 37))).astype(np.float16)
    blocks[:, -1] = attention
    path = make_store(tmp_path / "ck" / "teacher.zarr", {"attention_224": attention, "attention_blocks_224": blocks}, chunk=4, class_token=True)
    return path, attention, blocks


def test_store_entropy_matches_a_plain_loop(attention_store):
    path, attention, blocks = attention_store
    ds = open_store(path)
    result = ent.entropy(ds["attention_224"], class_token=True, blocks=ds["attention_blocks_224"], patch=7, boot=Bootstrap(200))
    plain = plain_entropy_loop(attention, class_token=True)
    for name, expected in plain.items():
        assert np.allclose(result[name].values, expected, rtol=1e-4, atol=1e-5), name
    assert result["patch_entropy"].dims == ("image", "head")
    assert list(result.image.values) == [f"img{i:05d}.jpg" for i in range(10)]
    # the last of the stored blocks is the last block
    assert np.allclose(result["block_patch_effective"].values[:, -1], result["patch_effective"].values)
    assert result["block_distance"].dims == ("image", "block", "head")
    assert np.allclose(result["detail_block_effective"].values[:, -1], result["detail_effective"].values)
    # set level: means over images, shares over T = 37 keys, a bootstrap interval around the mean
    assert np.allclose(result["set_patch_effective"].values, plain["patch_effective"].mean(0), rtol=1e-4)
    assert np.allclose(result["set_patch_share"].values, plain["patch_effective"].mean(0) / 37, rtol=1e-4)
    summary = {s: i for i, s in enumerate(result.statistic.values)}
    mean = result.summary_mean.values[summary["patch_share"]]
    assert np.isclose(mean, plain["patch_effective"].mean() / 37, rtol=1e-4)
    assert result.summary_low.values[summary["patch_share"]] <= mean <= result.summary_high.values[summary["patch_share"]]
    assert result.attrs["n_keys"] == 37 and result.attrs["grid"] == 6


def test_entropy_without_class_token():
    rng = np.random.default_rng(1)
    attention = softmax(rng.standard_normal((3, 2, 36, 36))).astype(np.float32)
    import xarray as xr

    da = xr.DataArray(attention, dims=("image", "head", "query", "key"), name="attention_224")
    result = ent.entropy(da, class_token=False, boot=Bootstrap(50))
    plain = plain_entropy_loop(attention, class_token=False)
    assert np.allclose(result["patch_entropy"].values, plain["patch_entropy"], rtol=1e-5)
    assert "cls_entropy" not in result and "cls_share" not in list(result.statistic.values)


def test_larger_than_a_memory_cap_runs_in_chunks(tmp_path):
    """The attention array is 3 × the cap; the peak of traced (numpy) memory stays under the cap.

    Chunks of 4 images (1.9 MB) on 2 threads need about 11 MB; loading the array would need 60 MB.
    """
    rng = np.random.default_rng(2)
    images, chunk = 128, 4
    logits = rng.standard_normal((images, 6, 197, 197)).astype(np.float32)
    attention = softmax(logits).astype(np.float16)
    del logits
    path = make_store(tmp_path / "big" / "teacher.zarr", {"attention_224": attention}, chunk=chunk, class_token=True)
    size = attention.nbytes  # 59.6 MB
    expected = plain_entropy_loop(attention[:2], class_token=True)["patch_effective"]
    del attention
    cap = size // 3
    ds = open_store(path)
    tracemalloc.start()
    try:
        result = ent.entropy(ds["attention_224"], class_token=True, boot=Bootstrap(100), run_blocks=per_image(Where(workers=2)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < cap, f"peak {peak / 1e6:.1f} MB over the cap {cap / 1e6:.1f} MB (store {size / 1e6:.1f} MB)"
    assert result.sizes["image"] == images
    assert np.allclose(result["patch_effective"].values[:2], expected, rtol=1e-4)


def test_cli_entropy(attention_store, tmp_path):
    import json

    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    path, _, _ = attention_store
    out = tmp_path / "entropy.json"
    run = CliRunner().invoke(app, ["entropy", str(path), "--patch", "7", "--image", "img00002.jpg", "--json", str(out), "--boot", "100", "-q"])
    assert run.exit_code == 0, run.output
    assert "patch 7 of img00002.jpg" in run.output and "through the blocks" in run.output
    payload = json.loads(out.read_text())["stores"][str(path)]
    saved = records.load(path, "entropy")
    assert np.isclose(payload["summary"]["patch_effective"]["mean"], float(saved.summary_mean.values[1]))
    assert payload["arrays"]["detail_effective"]["image"] == "img00002.jpg"
    assert saved.attrs["command"] == "probe entropy" and saved.attrs["patch"] == 7
    assert saved.attrs["store_manifest"]["network"] == "teacher"


def test_extracted_stores(tiny_stores):
    """Stores written by `probe extract` from tiny checkpoints: with and without a class token."""
    dino = open_store(tiny_stores["dino"])
    result = ent.entropy(dino["attention_224"], class_token=True, blocks=dino["attention_blocks_224"], patch=34, boot=Bootstrap(50))
    assert result.attrs["n_keys"] == 197 and "cls_effective" in result
    assert result.sizes["block"] == 2 and result.sizes["head"] == 2
    plain = plain_entropy_loop(dino["attention_224"].values, class_token=True)
    assert np.allclose(result["patch_effective"].values, plain["patch_effective"], rtol=1e-4)
    assert np.allclose(result["block_patch_effective"].values[:, -1], result["patch_effective"].values, rtol=1e-5)
    selfpatch = open_store(tiny_stores["selfpatch"])
    result = ent.entropy(selfpatch["attention_224"], class_token=False, boot=Bootstrap(50))
    assert result.attrs["n_keys"] == 196 and "cls_effective" not in result
    assert np.all((result["patch_effective"].values >= 1) & (result["patch_effective"].values <= 196))


def test_numpy_arithmetic_agrees_with_torch_reductions(attention_store):
    """The entropy arithmetic moved from torch to numpy (so ``probe entropy`` imports no torch): the
    torch formulas it replaced, written here, give the same keys and weights bit for bit and every
    mean to float32 precision (numpy's pairwise sums and torch's vectorised ones may round the last bits apart)."""
    path, attention, _ = attention_store
    a = torch.from_numpy(attention.astype(np.float32))
    table = torch.from_numpy(np.take(ent._float16_terms(), attention.view(np.uint16)).sum(-1, dtype=np.float32))  # H per row, as before
    start, grid = 1, 6
    centres = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij"), -1).reshape(-1, 2).double()
    distance = torch.cdist(centres, centres).float()
    patches = a[..., start:, start:]
    expected = {
        "patch_entropy": table[..., start:].mean(-1),
        "patch_effective": torch.exp(table[..., start:]).mean(-1),
        "cls_effective": torch.exp(table[..., 0]),
        "distance": ((patches * distance).sum(-1) / patches.sum(-1)).mean(-1),
    }
    result = ent.entropy(open_store(path)["attention_224"], class_token=True, patch=7, boot=Bootstrap(10))
    for name, value in expected.items():
        found = result[name].values
        assert found.dtype == np.float32, name
        assert np.allclose(found, value.numpy(), rtol=2e-6, atol=0), name
    order = torch.sort(a[..., start + 7, :], dim=-1, descending=True, stable=True)
    assert np.array_equal(result["detail_weight"].values, order.values[..., :5].numpy())
    assert np.array_equal(result["detail_key"].values, np.where(order.indices[..., :5].numpy() < 1, -1, order.indices[..., :5].numpy() - 1))


def test_followed_row_names_class_and_register_keys():
    """A followed row's largest weights name their keys: patches by index, -1 the class token, -2 a register."""
    import xarray as xr

    from probe_toolkit.results.summaries import _weights

    ds = xr.Dataset({"detail_key": (("image", "head", "rank"), np.array([[[-1, -2, 5]]])), "detail_weight": (("image", "head", "rank"), np.array([[[0.5, 0.3, 0.2]]]))})
    assert _weights(ds, "detail_", (0, 0)) == "cls:0.500  reg:0.300  5:0.200"
