"""The runner (infra/runner.py): ``probe decode`` and ``probe decode-sweep`` give bit-identical
results in this process, on two local processes, and on a real local dask cluster; bad
placements are one line and exit 2."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from decoder_scenes import Scene, make_store, planted_keys
from test_decode_cli import _main

from probe_toolkit.analyses.decoder import decode_image
from probe_toolkit.analyses.decoder_blocks import ARRAYS, decode_block
from probe_toolkit.analyses.decoder_settings import Settings
from probe_toolkit.commands.decode_keys import decode_keys, open_keys
from probe_toolkit.infra import runner
from probe_toolkit.infra.runner import Where, map_images
from probe_toolkit.results import records

GRID = 20  # N = 400: the ARPACK path, not the small-graph dense one


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Seven images (chunks of 2, a ragged end) of noisy planted objects."""
    rng = np.random.default_rng(0)
    scenes, keys = [], []
    for i in range(7):
        r, c = rng.integers(2, 10, size=2)
        objects = [(int(r), int(r) + 6, int(c), int(c) + 7)] + ([(14, 18, 12, 19)] if i % 2 else [])
        scenes.append(Scene(f"img{i}.png", 80, 120, objects))
        keys.append(planted_keys(GRID, objects, channels=32, noise=0.6, seed=i))
    return make_store(tmp_path_factory.mktemp("runner") / "store.zarr", scenes, np.stack(keys))


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f"), name


def _arrays(decoded) -> dict:
    return {name: getattr(decoded, name) for name in ARRAYS}


def test_one_and_two_workers_equal_a_plain_loop(store):
    settings = Settings.from_preset("maskcut", masks=2)
    src = open_keys(store)
    plain = [decode_image(k, settings) for k in src.keys.values]  # the serial loop, no runner
    one = _arrays(decode_keys(src.keys, settings, where=Where(workers=1)))
    two = _arrays(decode_keys(src.keys, settings, where=Where(workers=2)))
    _same(one, two)
    for i, result in enumerate(plain):
        m = result.masks.shape[0]
        assert one["n_masks"][i] == m and np.array_equal(one["masks"][i, :m], result.masks)
        assert np.array_equal(one["lambda2"][i, :m], result.lambda2) and one["degenerate"][i] == result.degenerate
    assert one["n_masks"].sum() >= 8  # the loop found second masks: the comparison is not of empty arrays


def test_a_real_local_dask_cluster_gives_the_same_bits(store):
    distributed = pytest.importorskip("distributed")
    settings = Settings.from_preset("centred")
    src = open_keys(store)
    here = _arrays(decode_keys(src.keys, settings, where=Where(workers=1)))
    fn = partial(decode_block, settings=settings)
    handed: list[tuple[int, int, dict]] = []
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        there = _arrays(decode_keys(src.keys, settings, where=Where(client=client)))
        # blocks handed over one by one, in order, none kept (how probe decode saves as it goes: cluster.in_order)
        kept = map_images(fn, {"keys": src.keys}, where=Where(client=client), block=2, each=lambda a, b, part: handed.append((a, b, part)), keep=False)
    _same(here, there)
    assert kept == {} and [(a, b) for a, b, _ in handed] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    _same(here, {name: np.concatenate([part[name] for _, _, part in handed]) for name in here})


def test_shards_cover_every_image_once_in_whole_blocks():
    for n_images, block, shards in ((7, 2, 3), (16, 16, 4), (100, 16, 7), (3, 4, 5)):
        ranges = [runner.shard_range(n_images, block, (i, shards)) for i in range(shards)]
        covered = np.concatenate([np.arange(a, b) for a, b in ranges])
        assert np.array_equal(covered, np.arange(n_images))
        assert all(a % block == 0 for a, b in ranges if b > a)


def test_workers_read_a_store_growing_another_view(store, tmp_path):
    """Adding a view clears the store's own ``done`` (an image is done when every view is); the
    workers, which read their blocks themselves, judge the keys' view by its flags, as
    ``open_store`` does, so two workers decode what one does."""
    import shutil

    import zarr

    grown = tmp_path / "grown.zarr"
    shutil.copytree(store, grown)
    group = zarr.open_group(grown, mode="r+", use_consolidated=False)
    assert bool(np.asarray(group["done_480"][:]).all())
    group["done"][:] = np.zeros(7, dtype=bool)
    settings = Settings.from_preset("tokencut")
    src = open_keys(grown)
    assert len(src.image_ids) == 7
    _same(_arrays(decode_keys(src.keys, settings, where=Where(workers=1))), _arrays(decode_keys(src.keys, settings, where=Where(workers=2))))


def test_masks_json_encoded_block_by_block_is_the_whole_sets(store, tmp_path):
    """``probe decode`` encodes each block's masks as it arrives: the JSON at 1 and 2 workers is
    the one ``coco_results`` writes for the whole decode at once."""
    import json

    import probe_toolkit as probe
    from probe_toolkit.labels.masks import coco_results

    settings = Settings.from_preset("maskcut", masks=2)
    texts = {}
    for workers in (1, 2):
        out = tmp_path / f"masks{workers}.json"
        probe.run("decode", store, preset="maskcut", masks=2, workers=workers, out=out, cache_dir=tmp_path)
        texts[workers] = out.read_text()
    src = open_keys(store)
    whole = coco_results(decode_keys(src.keys, settings), src.image_ids, src.heights, src.widths)
    assert texts[1] == texts[2] and json.loads(texts[1]) == json.loads(json.dumps(whole))
    assert len(whole) >= 8 and sorted({r["image_id"] for r in whole}) == list(range(7))


def test_tapered_blocks_end_small_and_cover_every_image_once():
    for n_images, block, workers in ((384, 16, 2), (7, 1, 2), (100, 8, 3), (5, 2, 1), (9, 4, 2)):
        ranges = runner.tapered(runner.blocks(n_images, block), workers)
        assert np.array_equal(np.concatenate([np.arange(a, b) for a, b in ranges]), np.arange(n_images)) and all(b > a for a, b in ranges)
    ranges = runner.tapered(runner.blocks(384, 16), 2)
    assert ranges[:22] == runner.blocks(352, 16) and ranges[22:] == [(352, 360), (360, 368), (368, 376), (376, 384)]


def test_a_shard_computes_its_images_only(store):
    settings = Settings.from_preset("tokencut")
    src = open_keys(store)
    full = map_images(partial(decode_block, settings=settings), {"keys": src.keys})
    a, b = runner.shard_range(7, 2, (1, 3))
    part = map_images(partial(decode_block, settings=settings), {"keys": src.keys}, image_range=(a, b), where=Where(workers=2))
    _same(part, {k: v[a:b] for k, v in full.items()})


@pytest.mark.parametrize(
    "args, says",
    [
        (["--workers", "0"], "--workers must be an integer ≥ 1 (got 0)"),
        (["--workers", "-3"], "--workers must be an integer ≥ 1 (got -3)"),
        (["--backend", "jax"], "--backend must be one of scipy, torch (got jax)"),
        (["--device", "cuda"], "--backend torch"),
        (["--workers", "2", "--dask-address", "tcp://127.0.0.1:1"], "--dask-address"),
    ],
)
def test_bad_placements_are_one_line_and_exit_2(store, tmp_path, capsys, args, says):
    code, err = _main(["decode", str(store), "-q", "--cache", str(tmp_path), *args], capsys)
    assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_workers_are_refused_before_the_progress_bar(store, tmp_path):
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "probe_toolkit", "decode", str(store), "--cache", str(tmp_path), "--workers", "0"], capture_output=True, text=True, cwd=tmp_path
    )  # no -q: a started decode draws its progress to stderr
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "--workers must be an integer ≥ 1 (got 0)" in lines[0]


def test_cuda_absent_is_one_line(store, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    code, err = _main(["decode", str(store), "-q", "--cache", str(tmp_path), "--backend", "torch", "--device", "cuda"], capsys)
    assert code == 2 and "--device cuda is not available here: torch sees no CUDA GPU" in err and len(err.strip().splitlines()) == 1
    assert err.rstrip().endswith("; use --device cpu (or run on a machine with a GPU)"), err  # the flag and its value as typed


def test_probe_decode_backend_torch_equals_scipy_where_certified(store, tmp_path, capsys):

    masks = {}
    for backend in ("scipy", "torch"):
        code, err = _main(
            [
                "decode",
                str(store),
                "-q",
                "--cache",
                str(tmp_path),
                "--preset",
                "tokencut",
                "--backend",
                backend,
                "--workers",
                "1",
                "--out",
                str(tmp_path / f"{backend}.json"),
            ],
            capsys,
        )
        assert code == 0, err
        masks[backend] = records.load(store, "decoder").load()
    a, b = masks["scipy"], masks["torch"]
    ok = ~a["degenerate"].values & ~b["degenerate"].values
    assert ok.sum() >= 5
    np.testing.assert_array_equal(a["masks"].values[ok], b["masks"].values[ok])
    np.testing.assert_array_equal(a["n_masks"].values[ok], b["n_masks"].values[ok])


def test_shards_of_probe_decode_assemble_the_one_process_result(store, tmp_path, capsys):

    code, err = _main(["decode", str(store), "-q", "--cache", str(tmp_path), "--preset", "maskcut", "--workers", "1"], capsys)
    assert code == 0, err
    whole = records.load(store, "decoder").load()
    masks = (store / "results" / "decoder-masks.json").read_text()
    (store / "results" / "decoder-masks.json").unlink()
    for i in (2, 0, 1):  # the last shard to finish assembles
        code, err = _main(["decode", str(store), "-q", "--cache", str(tmp_path), "--preset", "maskcut", "--workers", "1", "--shard", f"{i}/3"], capsys)
        assert code == 0, err
        assert (store / "results" / "decoder-masks.json").exists() == (i == 1)
    assert records.load(store, "decoder-part-0-of-3").sizes["image"] == 2  # whole chunks of 2
    again = records.load(store, "decoder").load()
    for name in whole.data_vars:
        assert np.array_equal(whole[name].values, again[name].values, equal_nan=whole[name].dtype.kind == "f"), name
    assert (store / "results" / "decoder-masks.json").read_text() == masks


def test_bad_input_in_a_worker_comes_back_as_the_same_one_line_error():
    import pickle

    from probe_toolkit.infra.errors import ProbeError

    error = pickle.loads(pickle.dumps(ProbeError("store.zarr", "keys hold NaN", "re-extract")))
    assert error.line() == "store.zarr: keys hold NaN; re-extract"
    bad = {"keys": np.full((4, GRID * GRID, 8), np.nan, dtype=np.float32)}
    with pytest.raises(ProbeError, match="NaN"):
        runner.map_blocks(partial(decode_block, settings=Settings()), lambda a, b: {k: v[a:b] for k, v in bad.items()}, [(0, 2), (2, 4)], workers=2)


def _long_dot(values: np.ndarray, *, weights: np.ndarray) -> dict[str, np.ndarray]:
    """A task whose one matmul has a long inner dimension: MKL splits it between threads."""
    import torch

    return {"dot": (torch.from_numpy(values) @ torch.from_numpy(weights)).numpy()}


def test_every_task_computes_under_one_thread_at_any_worker_count():
    """--workers 1 computes in this process, which runs torch on 2 threads (conftest); the
    runner sets one thread per task there as on a worker, so the bits are the same, and this
    process's threads are restored after (a later two-thread product is unchanged)."""
    import torch

    rng = np.random.default_rng(0)
    values = rng.standard_normal((8, 100_000)).astype(np.float32)
    weights = rng.standard_normal((100_000, 2)).astype(np.float32)
    fn = partial(_long_dot, weights=weights)
    ranges = [(0, 4), (4, 8)]
    threads = torch.get_num_threads()
    two_before = fn(values)["dot"]
    torch.set_num_threads(1)
    one_thread = np.concatenate([fn(values[a:b])["dot"] for a, b in ranges])  # the plain reference: one thread, block by block
    torch.set_num_threads(threads)
    read = lambda a, b: {"values": values[a:b]}  # noqa: E731
    here = runner.map_blocks(fn, read, ranges, workers=1)["dot"]
    assert torch.get_num_threads() == threads
    assert np.array_equal(fn(values)["dot"], two_before)  # this process's own threads, as before the run
    there = runner.map_blocks(fn, read, ranges, workers=2)["dot"]
    assert np.array_equal(here, one_thread) and np.array_equal(there, one_thread)
    if threads < 2 or np.array_equal(np.concatenate([fn(values[a:b])["dot"] for a, b in ranges]), one_thread):
        pytest.skip("this machine's BLAS does not split the product between threads: the identity shows nothing here")


def test_two_shared_arrays_of_a_run_stay_mapped_and_go_with_their_files(tmp_path, monkeypatch):
    """A worker using a run's two shared arrays in turn (Hummingbird's memory and its labels) maps
    and hashes each once, not once per block; a finished run's files are let go."""
    import hashlib

    from probe_toolkit.infra import shared as shared_module

    first, second = np.arange(12.0).reshape(3, 4), np.ones((5, 2), np.float32)
    with shared_module.shared(first, tmp_path, "a") as a, shared_module.shared(second, tmp_path, "b") as b:
        shared_module._shared.clear()  # as in a fresh worker process: nothing mapped, checked or known (the writer
        shared_module._verified.clear()  # marks its own files checked, so a worker in this process would not hash them)
        shared_module._paths.clear()
        hashed = []
        real = hashlib.file_digest
        monkeypatch.setattr(hashlib, "file_digest", lambda handle, name: hashed.append(handle.name) or real(handle, name))
        for _ in range(3):  # blocks, each reading both
            assert np.array_equal(a.value(), first) and np.array_equal(b.value(), second)
        assert sorted(hashed) == sorted([a.path, b.path])  # each file hashed once
    assert not shared_module._shared and not list(tmp_path.iterdir())  # both files and arrays gone with the run


def test_a_worker_finds_each_image_by_its_id_as_a_dict_of_ids_would():
    """A worker keeps the store's ids as sorted numpy strings (``cluster._Ids``), not a dict of
    Python strings that grows several times their bytes: the positions a dict gives (a repeated
    id: its last position), every missing id named, and an id longer than the stored ones not cut
    to match one."""
    from probe_toolkit.infra.cluster import _Ids

    rng = np.random.default_rng(0)
    stored = np.asarray([f"s{i:03d}" for i in rng.permutation(300)] + ["s007"], dtype=object)
    known = {str(v): i for i, v in enumerate(stored)}
    asked = ["s007", "s250", "s0070", "zz", "s000", "s299", ""]
    positions, missing = _Ids(stored).positions(asked)
    assert positions.tolist() == [known[i] for i in asked if i in known] and missing == ["s0070", "zz", ""]
    assert _Ids(stored).positions([])[0].size == 0 and _Ids(stored[:0]).positions(["s001"])[1] == ["s001"]
