"""Window-neighbour statistics: known answers, a plain per-image loop, bounded memory, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from analysis_stores import make_store
from threadpoolctl import threadpool_limits

from probe_toolkit.analyses import neighbours as nb
from probe_toolkit.analyses.stats import Bootstrap, bootstrap_mean
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.runner import Where, per_image
from probe_toolkit.results import records
from probe_toolkit.store.cache import open_store, require

# ----------------------------------------------------------------------------------------------
# an independent reimplementation: image by image, anchor by anchor, float64


def ring(grid: int, anchor: int, wrap: bool) -> list[int]:
    """The window's candidates in ascending order (the course's definition, from coordinates)."""
    r, c = divmod(anchor, grid)
    cells = set()
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if (dr, dc) == (0, 0):
                continue
            rr, cc = r + dr, c + dc
            if wrap:
                cells.add((rr % grid) * grid + cc % grid)
            elif 0 <= rr < grid and 0 <= cc < grid:
                cells.add(rr * grid + cc)
    return sorted(cells)


def steps(grid: int, i: int, j: int, metric: str, torus: bool) -> float:
    dr, dc = abs(i // grid - j // grid), abs(i % grid - j % grid)
    if torus:
        dr, dc = min(dr, grid - dr), min(dc, grid - dc)
    return float(max(dr, dc)) if metric == "chebyshev" else math.hypot(dr, dc)


def plain_statistics(tokens: np.ndarray, grid: int, k=4, top=8, wrap=True, metric="chebyshev", q=0.2, m=48) -> dict[str, np.ndarray]:
    n = grid * grid
    names = list(nb.STATISTICS) + ["top_in_window_count", "negative_count"]
    out = {name: [] for name in names}
    for image in tokens.astype(np.float64):
        unit = image / np.linalg.norm(image, axis=1, keepdims=True)
        sim = unit @ unit.T
        theta = np.quantile(sim[np.triu_indices(n, 1)], q)
        acc = {name: [] for name in names}
        pos_cos, oth_cos, pos_wrap = [], [], []
        for a in range(n):
            cands = ring(grid, a, wrap)
            plain = ring(grid, a, False)
            order = sorted((j for j in range(n) if j != a), key=lambda j: -sim[a, j])
            inside = [j in cands for j in order[:top]]
            acc["top_in_window_count"].append(sum(inside))
            acc["top_in_window"].extend(inside)
            acc["top_distance"].extend(steps(grid, a, j, metric, wrap) for j in order[:top])
            acc["topk_in_window"].extend(j in cands for j in order[:k])
            ranked = sorted(range(len(cands)), key=lambda p: -sim[a, cands[p]])
            chosen = [cands[p] for p in ranked[:k]]
            pos_cos.extend(sim[a, j] for j in chosen)
            oth_cos.extend(sim[a, cands[p]] for p in ranked[k:])
            pos_wrap.extend(j not in plain for j in chosen)
            acc["contrastive_in_window"].extend(j in cands for j in order[:k])
            acc["contrastive_distance"].extend(steps(grid, a, j, metric, wrap) for j in order[:k])
            negatives = [j for j in order[k:] if sim[a, j] <= theta]
            acc["negative_count"].append(min(len(negatives), m))
        for name in ("top_in_window", "top_distance", "topk_in_window", "contrastive_in_window", "contrastive_distance"):
            out[name].append(np.mean(acc[name]))
        out["positive_cosine"].append(np.mean(pos_cos))
        out["other_cosine"].append(np.mean(oth_cos))
        out["wrapped_positive_share"].append(np.mean(pos_wrap))
        out["negative_count_mean"].append(np.mean(acc["negative_count"]))
        out["negative_theta"].append(theta)
        out["top_in_window_count"].append(acc["top_in_window_count"])
        out["negative_count"].append(acc["negative_count"])
    return {name: np.array(values) for name, values in out.items()}


@pytest.mark.parametrize(
    "grid,settings",
    [
        (14, {}),
        (14, {"wrap": False, "metric": "euclidean"}),
        (6, {"k": 3, "top": 5}),
        (6, {"wrap": False}),
    ],
)
def test_image_statistics_match_a_plain_loop(grid, settings):
    rng = np.random.default_rng(grid)
    tokens = rng.standard_normal((3, grid * grid, 32)).astype(np.float16)
    found = nb.image_statistics(torch.from_numpy(tokens), grid, **settings)
    plain = plain_statistics(tokens, grid, **settings)
    for name, expected in plain.items():
        assert found[name].shape == expected.shape, name
        assert np.allclose(found[name], expected, atol=1e-5), name


# ----------------------------------------------------------------------------------------------
# known answers


def block_tokens(grid: int, images: int = 2) -> np.ndarray:
    """Equal tokens within 2 × 2 blocks of the grid, orthogonal between blocks."""
    side = grid // 2
    tokens = np.zeros((images, grid * grid, side * side), dtype=np.float16)
    for p in range(grid * grid):
        r, c = divmod(p, grid)
        tokens[:, p, (r // 2) * side + c // 2] = 1.0
    return tokens


@pytest.mark.parametrize("grid", [14, 6])
def test_two_by_two_blocks(grid):
    tokens = torch.from_numpy(block_tokens(grid))
    # an anchor's 3 block partners (cosine 1) are its 3 most similar patches, all in its window
    found = nb.image_statistics(tokens, grid, k=3, top=3)
    assert np.all(found["top_in_window"] == 1.0) and np.all(found["topk_in_window"] == 1.0)
    assert np.all(found["top_distance"] == 1.0)
    assert np.all(found["top_in_window_count"] == 3)
    assert np.allclose(nb.image_statistics(tokens, grid, k=3, top=3, metric="euclidean")["top_distance"], (2 + math.sqrt(2)) / 3)
    # the contrastive rule with k = 3 takes exactly the partners
    assert np.all(found["contrastive_in_window"] == 1.0) and np.all(found["contrastive_distance"] == 1.0)
    # SelfPatch's k = 4 keeps the 3 partners and one candidate of cosine 0: (3 + 0) / 4
    found = nb.image_statistics(tokens, grid, k=4, top=8)
    assert np.allclose(found["positive_cosine"], 0.75) and np.allclose(found["other_cosine"], 0.0)
    # partners never wrap, so at most one positive in 4 does
    assert np.all(found["wrapped_positive_share"] <= 0.25)
    # pairwise cosines: 6 of each block's pairs are 1, the rest 0, so θ = 0 and every other
    # non-positive patch is a negative; capped at 48 at grid 14, 36 − 1 − 4 = 31 at grid 6
    assert np.all(found["negative_theta"] == 0.0)
    assert np.all(found["negative_count"] == min(48, grid * grid - 5))


def test_structure_counts():
    assert nb.structure(14, True) == {"links": 1568, "wrapped_links": 164, "wrapped_share": 164 / 1568}
    assert nb.structure(6, True)["wrapped_links"] == 68
    assert nb.structure(14, False)["wrapped_links"] == 0 and nb.structure(14, False)["links"] == 1404


def test_bootstrap_interval():
    values = np.random.default_rng(0).normal(size=(200, 2))
    first = bootstrap_mean(values, n_boot=500, seed=7)
    again = bootstrap_mean(values, n_boot=500, seed=7)
    assert np.array_equal(first.low, again.low) and np.array_equal(first.high, again.high)
    assert np.all(first.low < first.mean) and np.all(first.mean < first.high)
    # about ±1.96 standard errors
    se = values.std(axis=0, ddof=1) / math.sqrt(200)
    assert np.allclose(first.high - first.low, 2 * 1.96 * se, rtol=0.2)
    constant = bootstrap_mean(np.full((5, 1), 0.25))
    assert constant.low[0] == constant.high[0] == 0.25


# ----------------------------------------------------------------------------------------------
# over a store


@pytest.fixture
def token_store(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {
        "tokens_224": rng.standard_normal((9, 196, 24)).astype(np.float16),
        "tokens_96": rng.standard_normal((9, 36, 24)).astype(np.float16),
    }
    failed = np.zeros(9, dtype=bool)
    failed[4] = True  # a failed image is never read
    path = make_store(tmp_path / "ckpt-00000000" / "teacher.zarr", arrays, chunk=4, failed=failed)
    return path, arrays, failed


def test_store_statistics_and_summary(token_store):
    path, arrays, failed = token_store
    ds = open_store(path)
    result = nb.neighbours(require(ds, "tokens_224"), 14, boot=Bootstrap(200, 3))
    kept = arrays["tokens_224"][~failed]
    plain = plain_statistics(kept, 14)
    assert result.sizes["image"] == 8 and "img00004.jpg" not in list(result.image.values)
    for name in nb.STATISTICS:
        assert np.allclose(result[name].values, plain[name], atol=1e-5), name
    assert np.array_equal(result["negative_count"].values, plain["negative_count"])
    index = list(result.statistic.values).index("top_in_window")
    assert np.isclose(result.summary_mean.values[index], plain["top_in_window"].mean())
    assert result.summary_low.values[index] <= result.summary_mean.values[index] <= result.summary_high.values[index]
    assert int(result.negative_count_histogram.values.sum()) == 8 * 196
    assert np.allclose(result.anchor_top_in_window.values, plain["top_in_window_count"].mean(0) / 8)
    assert int(result.wrapped_links.values) == 164 and result.attrs["distance"].startswith("chebyshev (torus)")
    # the same numbers with other chunking and on a dask.distributed client
    again = nb.neighbours(require(ds, "tokens_224"), 14, boot=Bootstrap(200, 3), run_blocks=per_image(block=3))
    assert np.array_equal(again.summary_high.values, result.summary_high.values)
    one, two = (nb.neighbours(require(ds, "tokens_224"), 14, boot=Bootstrap(200, 3), run_blocks=per_image(Where(workers=w), block=2)) for w in (1, 2))
    for name in (*nb.STATISTICS, "negative_count", "top_in_window_count", "summary_mean", "summary_high"):
        assert np.array_equal(one[name].values, two[name].values, equal_nan=True), name
    from distributed import Client

    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        remote = nb.neighbours(require(ds, "tokens_224"), 14, boot=Bootstrap(200, 3), run_blocks=per_image(Where(client=client)))
    assert np.array_equal(remote.top_in_window.values, result.top_in_window.values)


def test_grid_picks_its_array_and_names_the_flag(token_store, tmp_path):
    path, arrays, failed = token_store
    ds = open_store(path)
    result = nb.neighbours(require(ds, nb.view_array(96)), 6, boot=Bootstrap(50))
    assert int(result.wrapped_links.values) == 68 and result.attrs["array"] == "tokens_96"
    with pytest.raises(ProbeError):
        nb.neighbours(require(ds, "tokens_224"), 6)
    with pytest.raises(ProbeError):
        nb.view_array(480)
    only224 = make_store(tmp_path / "other" / "teacher.zarr", {"tokens_224": arrays["tokens_224"]})

    with pytest.raises(ProbeError, match="--views 96"):
        require(open_store(only224), nb.view_array(96))


def test_larger_than_a_memory_cap_runs_in_chunks(tmp_path):
    """The tokens are 3 × the cap; the peak of traced (numpy) memory stays under the cap."""
    rng = np.random.default_rng(6)
    tokens = rng.standard_normal((256, 196, 384)).astype(np.float16)
    path = make_store(tmp_path / "big" / "teacher.zarr", {"tokens_224": tokens}, chunk=4)
    size = tokens.nbytes  # 38.5 MB
    first = nb.image_statistics(torch.from_numpy(tokens[:2]), 14)
    del tokens
    cap = size // 3
    ds = open_store(path)
    tracemalloc.start()
    try:
        result = nb.neighbours(require(ds, "tokens_224"), 14, boot=Bootstrap(100), run_blocks=per_image(Where(workers=2)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < cap, f"peak {peak / 1e6:.1f} MB over the cap {cap / 1e6:.1f} MB (store {size / 1e6:.1f} MB)"
    assert result.sizes["image"] == 256
    assert np.allclose(result.top_in_window.values[:2], first["top_in_window"])


# ----------------------------------------------------------------------------------------------
# the command


def test_cli_neighbours_whole_window_leaves_no_other_candidates(token_store, tmp_path):
    """--k 8 takes the whole window: the cosine of the candidates left out is undefined, printed
    "–" and written as JSON null (strict JSON, no NaN), and the positives' cosine is every
    window candidate's mean."""
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    path, arrays, failed = token_store
    out = tmp_path / "k8.json"
    run = CliRunner().invoke(app, ["neighbours", str(path), "--k", "8", "--json", str(out), "--boot", "100", "-q"], env={"COLUMNS": "200"})
    assert run.exit_code == 0, run.output
    row = next(line for line in run.output.splitlines() if "other window candidates" in line)
    assert "–" in row and "nan" not in row.lower()

    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON")

    summary = json.loads(out.read_text(), parse_constant=refuse)["stores"][str(path)]["summary"]
    assert summary["other_cosine"] == {"mean": None, "low": None, "high": None}
    kept = arrays["tokens_224"][~failed].astype(np.float64)
    unit = kept / np.linalg.norm(kept, axis=-1, keepdims=True)
    sim = unit @ unit.transpose(0, 2, 1)
    g = 14  # every anchor's 8 torus neighbours, written out independently of analyses.selection
    rows, cols = np.divmod(np.arange(g * g), g)
    window = [((rows + dr) % g) * g + (cols + dc) % g for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0)]
    expected = np.mean([sim[:, np.arange(g * g), w].mean() for w in window])
    assert summary["positive_cosine"]["mean"] == pytest.approx(expected, abs=1e-3)


def test_cli_neighbours_side_by_side(token_store, tmp_path):
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    path, arrays, _ = token_store
    other = make_store(tmp_path / "second-11111111" / "teacher.zarr", {"tokens_224": block_tokens(14, 3)}, chunk=2)
    out = tmp_path / "n.json"
    run = CliRunner().invoke(app, ["neighbours", str(path), str(other), "--grid", "14", "--json", str(out), "--boot", "100", "-q"], env={"COLUMNS": "200"})
    assert run.exit_code == 0, run.output
    assert "ckpt-00000000" in run.output and "second-11111111" in run.output  # one column per store
    assert "164 / 1568 (10.5 %)" in run.output and "chebyshev (torus)" in run.output
    payload = json.loads(out.read_text())
    blocks = payload["stores"][str(other)]
    assert blocks["summary"]["positive_cosine"]["mean"] == pytest.approx(0.75)
    assert blocks["arrays"]["wrapped_links"]["values"] == 164
    saved = records.load(path, "neighbours_g14")
    assert saved.attrs["command"] == "probe neighbours" and saved.attrs["k"] == 4
    assert saved.top_in_window.dims == ("image",)

    from distributed import LocalCluster

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
        args = ["neighbours", str(path), "--grid", "6", "--no-wrap", "--distance", "euclidean", "--boot", "100", "-q"]
        run = CliRunner().invoke(app, args + ["--dask-address", cluster.scheduler_address])
    assert run.exit_code == 0, run.output
    saved = records.load(path, "neighbours_g6_nowrap")
    assert saved.attrs["distance"].startswith("euclidean (plain grid)") and int(saved.wrapped_links) == 0


def test_cli_missing_array_is_one_line_and_exit_2(tmp_path):
    rng = np.random.default_rng(0)
    path = make_store(tmp_path / "x" / "teacher.zarr", {"tokens_224": rng.standard_normal((2, 196, 8)).astype(np.float16)})
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", "from probe_toolkit.cli import main; main()", "neighbours", str(path), "--view", "96", "-q"],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 2
    assert "has no array tokens_96" in run.stderr and "--views 96" in run.stderr
    assert "Traceback" not in run.stderr


def test_extracted_stores(tiny_stores):
    """Stores written by `probe extract` from tiny checkpoints, at both grids."""
    for store in tiny_stores.values():
        ds = open_store(store)
        for grid, view in ((14, 224), (6, 96)):
            tokens = require(ds, nb.view_array(view))
            result = nb.neighbours(tokens, grid, boot=Bootstrap(50))
            # the command computes each block on one BLAS thread (infra.runner.task_threads); on
            # some CPUs (an AMD EPYC here) OpenBLAS's float32 products on two threads differ in
            # the last bit, so the direct call runs as the command's blocks do
            with threadpool_limits(limits=1):
                direct = nb.image_statistics(torch.from_numpy(tokens.values), grid)
            plain = plain_statistics(tokens.values, grid)
            for name in nb.STATISTICS:
                assert np.array_equal(result[name].values, direct[name]), (store, grid, name)
                # a random tiny network's tokens are nearly parallel: cosines a few 1e-7 apart
                # rank differently in float32 and float64, so allow a few of the 1,568 links
                assert np.allclose(result[name].values, plain[name], atol=5e-3), (store, grid, name)


def test_cli_refuses_a_growing_store_unless_partial(tmp_path):
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    rng = np.random.default_rng(1)
    path = make_store(tmp_path / "growing" / "teacher.zarr", {"tokens_224": rng.standard_normal((8, 196, 8)).astype(np.float16)}, chunk=4, chunks_written=1)
    run = CliRunner().invoke(app, ["neighbours", str(path), "-q", "--boot", "100"])
    assert isinstance(run.exception, ProbeError) and "incomplete: 4/8" in str(run.exception)
    run = CliRunner().invoke(app, ["neighbours", str(path), "-q", "--boot", "100", "--partial"])
    assert run.exit_code == 0, run.output
    saved = records.load(path, "neighbours_g14")
    assert saved.sizes["image"] == 4 and saved.attrs["images_read"] == 4 and saved.attrs["store_manifest"]["n_images"] == 8


def test_grid_is_read_from_any_blocks_tokens(tmp_path, capsys):
    """A store extracted with ``--blocks 0`` alone holds ``tokens_b0_224`` and no ``tokens_224``: ``--grid 14``
    still finds its 224 view (every block has the view's grid), and the run at block 0 gives the numbers of
    ``--view 224`` at block 0."""
    from cli_runs import probe_main

    from probe_toolkit.commands.neighbours import held_grids
    from probe_toolkit.demo.samples import TINY, sample_photos, write_checkpoint
    from probe_toolkit.store.extract import Settings, extract

    checkpoint = write_checkpoint(tmp_path / "dino.pth", "dino-full", TINY, seed=1)
    store = extract(checkpoint, sample_photos(), settings=Settings(views=("224", "96"), blocks=(0,), chunk=4), store=tmp_path / "b0.zarr", quiet=True).store
    assert held_grids(store) == {"224": 14, "96": 6}
    saved = []
    for chosen in (["--grid", "14"], ["--view", "224"]):
        code, printed = probe_main(["neighbours", store, *chosen, "--block", "0", "--boot", "100", "-q"], capsys)
        assert code == 0 and printed.out.rstrip().endswith("read at block 0 (0-based, as probe extract --blocks counts)"), printed.err
        saved.append(records.load(store, "neighbours_g14"))
    for name in saved[0].data_vars:
        np.testing.assert_array_equal(saved[0][name].values, saved[1][name].values, err_msg=name)
    assert saved[0].attrs["record"]["selection"]["block"] == 0


def test_a_store_of_keys_alone_names_the_extraction_of_its_tokens(tiny_checkpoints, image_dir, tmp_path, capsys):
    """``--grid`` on a store holding no token array (``--for decode``: keys alone): the line's
    extraction writes the 224 tokens into that store; pasted, the rerun measures them."""
    import shlex

    from cli_runs import probe_main

    keys = tmp_path / "keys.zarr"
    code, printed = probe_main(["extract", tiny_checkpoints["dino-full"], "--images", image_dir, "--for", "decode", "--store", keys, "-q"], capsys)
    assert code == 0, printed.err
    code, printed = probe_main(["neighbours", keys, "--grid", "14", "--boot", "100", "-q"], capsys)
    fix = printed.err.split("`")[1]
    assert code == 2 and "holds no token array" in printed.err and fix.endswith(f"--views 224 --chunk 16 --dtype float16 --interp dino --attention none --store {keys}")
    code, printed = probe_main([*shlex.split(fix)[1:], "-q"], capsys)
    assert code == 0, printed.err
    code, printed = probe_main(["neighbours", keys, "--grid", "14", "--boot", "100", "-q"], capsys)
    assert code == 0 and records.runs(keys, "neighbours_g14"), printed.err
