"""Streaming (``probe decode CKPT --images DIR``, commands/stream.py): keys in memory only, the
same masks as extract-then-decode bit for bit, resumable by chunk after an interruption, and
shards that fill one masks store."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from cli_runs import probe_main

import probe_toolkit as probe
from probe_toolkit.analyses.decoder_blocks import ARRAYS
from probe_toolkit.cli import main
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.placement import Placement
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings as ExtractSettings
from probe_toolkit.store.extract import extract

SETTINGS = {"preset": "maskcut", "masks": 2}  # the decoder's settings, as probe.run takes them


def run_decode(store, decoder: dict, **keywords):
    return probe.run("decode", store, **decoder, **keywords).report


def run_stream(checkpoint, images, decoder: dict, **keywords):
    return probe.run("decode-stream", None, checkpoint=checkpoint, images=images, **decoder, **keywords).report


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_checkpoints, image_dir):
    """Extract-then-decode: the keys go through the store, then ``probe decode``'s pipeline."""
    root = tmp_path_factory.mktemp("stream-ref")
    store = extract(
        tiny_checkpoints["dino-full"], image_dir, settings=ExtractSettings(views=(480,), attention="none", chunk=2), cache_dir=root, quiet=True, batch_size=2
    ).store
    report = run_decode(store, SETTINGS, cache_dir=root, placement=Placement(workers=1))
    return records.load(store, "decoder"), json.loads(report.masks_file.read_text())


def _same_as_reference(stream_store, reference):
    saved, results = reference
    streamed = records.load(stream_store, "decoder")
    assert list(streamed["image"].values) == list(saved["image"].values)
    for name in ARRAYS:
        if name not in saved:  # LOST's degree and expansion: saved for LOST only
            assert name not in streamed, name
            continue
        a, b = saved[name].values, streamed[name].values
        assert a.dtype == b.dtype, name
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    assert json.loads(records.results_path(stream_store, "decoder-masks.json").read_text()) == results
    assert saved["n_masks"].sum() >= 7


def test_streaming_equals_extract_then_decode_and_resumes(tmp_path, tiny_checkpoints, image_dir, reference, capsys):
    ckpt = tiny_checkpoints["dino-full"]
    kwargs = dict(chunk=2, batch_size=2, cache_dir=tmp_path)  # the default masks store, which the CLI finds too
    # shard 1 of 2 runs to its end, shard 0 is interrupted after one chunk: nothing is assembled yet
    second = run_stream(ckpt, image_dir, SETTINGS, placement=Placement(shard="1/2", workers=2), **kwargs)
    assert second.written == 3 and second.masks_file is None
    first = run_stream(ckpt, image_dir, SETTINGS, placement=Placement(shard="0/2", workers=1), stop_after=1, **kwargs)
    assert first.written == 2 and first.done == 5 and first.masks_file is None
    store = first.store
    assert store.name == "teacher-masks-480.zarr" and not records.results_path(store, "decoder").exists()
    # the rerun (the CLI, every core) does only the missing chunk and assembles the results
    old = sys.argv
    sys.argv = [
        "probe",
        "decode",
        str(ckpt),
        "--images",
        str(image_dir),
        "--preset",
        "maskcut",
        "--masks",
        "2",
        "--chunk",
        "2",
        "--batch-size",
        "2",
        "--shard",
        "0/2",
        "--cache",
        str(tmp_path),
        "-q",
        "--json",
        str(tmp_path / "s.json"),
    ]
    try:
        main()
    finally:
        sys.argv = old
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["written"] == 2 and summary["done"] == 7 and summary["masks_file"]
    _same_as_reference(store, reference)


def test_streaming_in_one_run_and_other_settings_are_refused(tmp_path, tiny_checkpoints, image_dir, reference):
    ckpt = tiny_checkpoints["dino-full"]
    store = tmp_path / "masks.zarr"
    report = run_stream(ckpt, image_dir, SETTINGS, chunk=2, batch_size=2, store=store, placement=Placement(workers=1))
    assert report.done == 7 and report.masks_file is not None
    _same_as_reference(store, reference)
    with pytest.raises(ProbeError, match="another decoder"):
        run_stream(ckpt, image_dir, {**SETTINGS, "tau": 0.3}, chunk=2, batch_size=2, store=store)


def test_streaming_decodes_on_a_dask_cluster_the_same_bits(tmp_path, tiny_checkpoints, image_dir, reference, capsys):
    """The forward pass runs here, each chunk's keys are decoded on the cluster's workers. Both
    placements at once are refused before any work, in the caller's spelling: keywords from Python,
    flags from the command line."""
    distributed = pytest.importorskip("distributed")
    ckpt = tiny_checkpoints["dino-full"]
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
        with pytest.raises(ProbeError, match="workers and dask_address were both given; drop workers"):
            run_stream(ckpt, image_dir, SETTINGS, chunk=2, batch_size=2, store=tmp_path / "no.zarr", workers=2, dask_address=cluster.scheduler_address)
        assert not (tmp_path / "no.zarr").exists()  # refused before the masks store is made
        code, out = probe_main(
            ["decode", ckpt, "--images", image_dir, "--workers", "2", "--dask-address", cluster.scheduler_address, "--cache", tmp_path / "cli", "-q"], capsys
        )
        assert code == 2 and "--workers and --dask-address were both given; drop --workers" in out.err, out.err
        assert not (tmp_path / "cli").exists()
        report = run_stream(ckpt, image_dir, SETTINGS, chunk=2, batch_size=2, store=tmp_path / "masks.zarr", placement=Placement(dask_address=cluster.scheduler_address))
    assert report.done == 7 and report.masks_file is not None
    _same_as_reference(tmp_path / "masks.zarr", reference)


@pytest.mark.parametrize("view", ["native", "native_crop"])
def test_streaming_an_own_size_view_equals_extract_then_decode(tmp_path, tiny_checkpoints, image_dir, view):
    """Each image on its own grid (read from its header, as extraction reads it): the masks store
    keeps every image's grid, and its arrays and masks JSON equal extract-then-decode's."""
    ckpt = tiny_checkpoints["dino-full"]
    settings = {"preset": "tokencut"}
    store = extract(ckpt, image_dir, settings=ExtractSettings(views=(view,), attention="none", chunk=2), cache_dir=tmp_path / "ref", quiet=True, batch_size=2).store
    ref = run_decode(store, settings, view=view, cache_dir=tmp_path / "ref", placement=Placement(workers=1))
    saved = records.load(store, "decoder")
    assert len(set(zip(saved["grid_rows"].values, saved["grid_cols"].values))) > 1  # the images' grids differ
    report = run_stream(ckpt, image_dir, settings, view=view, chunk=2, batch_size=2, cache_dir=tmp_path, placement=Placement(workers=2))
    assert report.done == 7 and report.store.name == f"teacher-masks-{view}.zarr"
    streamed = records.load(report.store, "decoder")
    for name in [*ARRAYS, "grid_rows", "grid_cols"]:
        if name not in saved:  # LOST's degree and expansion: saved for LOST only
            assert name not in streamed, name
            continue
        a, b = saved[name].values, streamed[name].values
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    assert streamed.attrs["view"] == view and streamed.attrs["patch_size"] == 16
    assert json.loads(report.masks_file.read_text()) == json.loads(ref.masks_file.read_text())


def test_streaming_dsm_with_its_colour_term_equals_extract_then_decode(tmp_path, tiny_checkpoints, image_dir):
    """Each block reads its images' files from the streamed folder (a store's image_source)."""
    ckpt = tiny_checkpoints["dino-full"]
    settings = {"preset": "dsm", "color_lambda": 10.0}
    store = extract(ckpt, image_dir, settings=ExtractSettings(views=(480,), attention="none", chunk=2), cache_dir=tmp_path / "ref", quiet=True, batch_size=2).store
    ref = run_decode(store, settings, cache_dir=tmp_path / "ref", placement=Placement(workers=1))
    saved = records.load(store, "decoder").load()
    plain = run_decode(store, {"preset": "dsm"}, out=tmp_path / "plain.json", cache_dir=tmp_path / "ref", placement=Placement(workers=1))
    assert json.loads(plain.masks_file.read_text()) != json.loads(ref.masks_file.read_text())  # the colour term moves masks here
    # a run that finished nothing with other settings does not block this one
    assert run_stream(ckpt, image_dir, {"preset": "dsm"}, chunk=2, store=tmp_path / "m.zarr", stop_after=0).done == 0
    report = run_stream(ckpt, image_dir, settings, chunk=2, batch_size=2, store=tmp_path / "m.zarr", placement=Placement(workers=2))
    assert report.done == 7
    streamed = records.load(report.store, "decoder")
    for name in ARRAYS:
        if name not in saved:  # LOST's degree and expansion: saved for LOST only
            assert name not in streamed, name
            continue
        a, b = saved[name].values, streamed[name].values
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    assert json.loads(report.masks_file.read_text()) == json.loads(ref.masks_file.read_text())


def test_a_store_scoring_option_given_with_images_is_refused_not_dropped(tmp_path, tiny_checkpoints, image_dir, capsys):
    """``probe decode CKPT --images DIR`` writes its masks to the stream's store: ``--out``,
    ``--allow-partial``, ``--unseal``, ``--panel`` and ``--refine`` would each be ignored there, so
    each is one line before any image is read, and nothing is written (a user's file named by
    ``--out`` least of all)."""
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    for extra, said in (
        (["--out", mine], "--out does not apply to --images: the masks go to the stream's store"),
        (["--allow-partial"], "--allow-partial does not apply to --images"),
        (["--unseal", "why"], "--unseal does not apply to --images"),
        (["--panel", "p"], "--images streams without --panel"),
    ):
        code, printed = probe_main(["decode", tiny_checkpoints["dino-full"], "--images", image_dir, *extra, "--cache", tmp_path / "c", "-q"], capsys)
        assert code == 2 and said in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err
    assert mine.read_text() == "mine" and not (tmp_path / "c").exists()
    code, printed = probe_main(["decode", tmp_path / "any.zarr", "--chunk", "4", "--batch-size", "2", "-q"], capsys)  # and the stream's own, without it
    assert code == 2 and printed.err.strip() == "error: --batch-size, --chunk apply with --images (streaming) alone; drop --batch-size --chunk", printed.err
