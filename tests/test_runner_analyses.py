"""The runner (infra/runner.py) behind ``probe attention-masks``, ``probe knn``, ``probe propagate``
and DSM's colour term: every saved array and JSON number is the same bits at one and two local
processes and on a real local dask cluster (and in two shards of ``propagate``); bad placements,
a cluster whose workers lack the store or the DAVIS folder, a PNG changed before the last shard
scores and Ctrl-C are one line with the right status, and the rerun works."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_runs import probe_main
from PIL import Image
from test_knn import class_folders  # noqa: F401  (fixture: a tiny network's store over train/ and val/ class folders)
from test_propagate import video  # noqa: F401  (fixture: a two-sequence DAVIS folder and a tiny checkpoint)
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.infra import cluster as cluster_side
from probe_toolkit.infra import runner
from probe_toolkit.results import records
from probe_toolkit.store import cache


def _saved(store: Path, name: str) -> dict[str, np.ndarray]:
    ds = records.load(store, name).load()
    return {k: ds[k].values for k in [*ds.data_vars, *ds.coords]}


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


def _numbers(summary: dict) -> dict:
    """A JSON summary without its ledger entries (each run reads the labels again: a new entry)."""
    return {k: v for k, v in summary.items() if k != "ledger"}


def _run(args: list, capsys) -> None:
    code, printed = probe_main(args, capsys)
    assert code == 0, printed.err


def _one_line(args: list, capsys, code: int, says: str) -> None:
    got, printed = probe_main(args, capsys)
    err = printed.err.strip()
    assert got == code and says in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as running:
        yield running.scheduler_address


# ----------------------------------------------------------------------------------------------
# probe attention-masks


def test_attention_masks_same_bits_at_one_two_workers_and_on_a_cluster(tiny_stores, tmp_path, capsys, cluster):
    store = tiny_stores["selfpatch"]  # SelfPatch's aggregation head: a torch forward over each block
    got = {}
    for place in (["--workers", "1"], ["--workers", "2"], ["--dask-address", cluster]):
        out = tmp_path / f"{place[-1].replace('/', '_')}.json"
        _run(["attention-masks", str(store), "--json", str(out), "-q", *place], capsys)
        got[place[-1]] = (_saved(store, "attention_masks"), json.loads(out.read_text()))
    one = got["1"]
    assert one[0]["mask"].shape[0] == 7 and 0 < one[0]["mask"].mean() < 1  # two blocks of the store's chunk of 4
    for other in ("2", cluster):
        _same(one[0], got[other][0])
        assert _numbers(one[1]) == _numbers(got[other][1])


def test_attention_mask_shards_assemble_the_one_process_result(tiny_stores, tmp_path, capsys):
    store = tmp_path / "copy.zarr"
    shutil.copytree(tiny_stores["dino"], store)
    _run(["attention-masks", store, "--workers", "1", "-q"], capsys)
    whole = _saved(store, "attention_masks")
    shutil.rmtree(store / "results" / "attention_masks")
    for i in (2, 0, 1):  # 7 images in chunks of 4: shard 0 has none; the last to finish assembles
        code, printed = probe_main(["attention-masks", store, "--workers", "1", "--shard", f"{i}/3"], capsys)
        assert code == 0, printed.err
        assert (records.load(store, "attention_masks") is not None) == (i == 1)
        assert ("waiting for shards" in printed.out) == (i != 1)
    assert records.load(store, "attention_masks-part-1-of-3").sizes["image"] == 4
    _same(whole, _saved(store, "attention_masks"))


# ----------------------------------------------------------------------------------------------
# probe knn


@pytest.fixture(scope="module")
def knn_panels(class_folders, tmp_path_factory):
    root, store = class_folders
    c = tmp_path_factory.mktemp("knn-cache")
    for name, split in (("tr", "train"), ("va", "val")):
        r = CliRunner().invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", str(c)])
        assert r.exit_code == 0, r.output
    return store, c


def test_knn_same_bits_at_one_two_workers_and_on_a_cluster(knn_panels, tmp_path, capsys, cluster, monkeypatch):
    from probe_toolkit.analyses import knn

    store, c = knn_panels
    monkeypatch.setattr(knn, "TEST_BLOCK", 2)  # 6 val images: 3 blocks of rows
    monkeypatch.setattr(knn, "TRAIN_BLOCK", 5)  # 12 train images: the bank in 3 blocks
    got = {}
    for place in (["--workers", "1"], ["--workers", "2"], ["--dask-address", cluster]):
        out = tmp_path / f"{place[-1].replace('/', '_')}.json"
        _run(["knn", str(store), "--train", "tr", "--val", "va", "--k", "1,3,12", "--cache", str(c), "--json", str(out), "-q", *place], capsys)
        got[place[-1]] = (_saved(store, "knn"), json.loads(out.read_text()))
        assert not list((store / "results").glob(".knn-bank*"))  # the bank file goes with the run
    one = got["1"]
    assert one[1]["top1"][0] > 0.5 and one[0]["similarity"].shape == (6, 5)
    for other in ("2", cluster):
        _same(one[0], got[other][0])
        assert _numbers(one[1]) == _numbers(got[other][1])
    # the same numbers as the one-process classifier on the same features
    from probe_toolkit.commands.knn import reader

    ds = cache.open_store(store)
    saved = records.load(store, "knn")
    train_ids, val_ids = list(saved.train_image.values), list(saved.image.values)
    from probe_toolkit.store import parts

    norm = parts.final_norm(cache.manifest(ds), store)
    labels = np.array([["blue", "green", "red"].index(i.split("/")[1]) for i in train_ids])
    plain = knn.classify(
        reader(ds, train_ids, "cls-normed", norm, "224"),
        12,
        labels,
        reader(ds, val_ids, "cls-normed", norm, "224"),
        6,
        saved.label.values,
        3,
        ks=(1, 3, 12),
        temperature=0.07,
        test_block=2,
        train_block=5,
    )
    np.testing.assert_array_equal(plain.predictions, one[0]["prediction"])
    np.testing.assert_array_equal(plain.top1, saved.top1.values)


def test_knn_shards_assemble_the_one_process_result(knn_panels, tmp_path, capsys, monkeypatch):
    from probe_toolkit.analyses import knn

    store, c = knn_panels
    monkeypatch.setattr(knn, "TEST_BLOCK", 4)  # 6 val rows: shards of 4 and 2 rows, and an empty one
    args = ["knn", str(store), "--train", "tr", "--val", "va", "--k", "1,3", "--cache", str(c), "--workers", "1", "-q"]
    _run(args, capsys)
    whole = _saved(store, "knn")
    shutil.rmtree(store / "results" / "knn")
    for i in (0, 2, 1):
        code, printed = probe_main([*args, "--shard", f"{i}/3"], capsys)
        assert code == 0, printed.err
        assert ("waiting for shards" in printed.out) == (i != 1)
        assert (records.load(store, "knn") is not None) == (i == 1)
    assert records.load(store, "knn-part-2-of-3").sizes["image"] == 2
    _same(whole, _saved(store, "knn"))


# ----------------------------------------------------------------------------------------------
# probe decode --preset dsm --color-lambda (the photographs read block by block)


def test_dsm_colour_term_same_bits_at_one_two_workers_on_a_cluster_and_in_shards(tmp_path, capsys, cluster):
    from decoder_scenes import Scene, photo_store

    from probe_toolkit.analyses.dsm import dsm, knn_color_affinity

    grid = 8
    scenes = [Scene("a.png", 64, 64, [(3, 9, 4, 12)]), Scene("b.png", 48, 80, [(2, 7, 2, 7)]), Scene("c.png", 40, 40, [(1, 5, 1, 5)])]
    store, photos, keys = photo_store(tmp_path, scenes, grid)
    got = {}
    for place in (["--workers", "1"], ["--workers", "2"], ["--dask-address", cluster]):
        _run(["decode", str(store), "--preset", "dsm", "--color-lambda", "10", "--cache", str(tmp_path / "c"), "-q", *place], capsys)
        got[place[-1]] = (_saved(store, "decoder"), (store / "results" / "decoder-masks.json").read_text())
    shutil.rmtree(store / "results")
    code, printed = probe_main(["decode", str(store), "--preset", "dsm", "--color-lambda", "10", "--cache", str(tmp_path / "c"), "--shard", "0/2"], capsys)
    assert code == 0 and "waiting for shards [1]" in printed.out and not (store / "results" / "decoder").exists()
    assert records.load(store, "decoder-part-0-of-2")["masks"].shape[0] == 2  # the first chunk of two images
    _run(["decode", str(store), "--preset", "dsm", "--color-lambda", "10", "--cache", str(tmp_path / "c"), "-q", "--shard", "1/2"], capsys)
    got["shards"] = (_saved(store, "decoder"), (store / "results" / "decoder-masks.json").read_text())
    for other in ("2", cluster, "shards"):
        _same(got["1"][0], got[other][0])
        assert got["1"][1] == got[other][1]
    for i, s in enumerate(scenes):  # DSM's own rule on the photograph, computed here
        small = np.asarray(Image.fromarray(photos[s.name]).resize((grid, grid), Image.BILINEAR), dtype=np.float64) / 255
        assert np.array_equal(got["1"][0]["masks"][i, 0], dsm(keys[i], (grid, grid), color=knn_color_affinity(small), color_lambda=10.0).mask)


# ----------------------------------------------------------------------------------------------
# probe propagate (one sequence per task, spawned workers)


def _propagated(video, out: Path, json_path: Path, capsys, *place: str) -> tuple[dict[str, bytes], dict]:
    """Run ``probe propagate`` (two sequences, 4 and 3 frames) into ``out``: (every file's bytes
    but the shards' notes, the JSON summary without ledger, time and folder)."""
    root, checkpoint = video
    _run(
        [
            "propagate",
            str(checkpoint),
            "--davis",
            str(root / "DAVIS"),
            "--out",
            str(out),
            "--cache",
            str(out.parent / "c"),
            "--n-last-frames",
            "2",
            "--json",
            str(json_path),
            "-q",
            *place,
        ],
        capsys,
    )
    # the manifest names its own folder
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and ".shards" not in p.parts and p.name != ".probe-output.json")
    summary = _numbers(json.loads(json_path.read_text()))
    return {str(f): (out / f).read_bytes() for f in files}, {k: v for k, v in summary.items() if k not in ("seconds", "out")}


def test_propagate_same_bits_at_one_and_two_workers_and_on_a_cluster(video, tmp_path, capsys, cluster):
    got = {
        place[-1]: _propagated(video, tmp_path / f"out{i}", tmp_path / f"p{i}.json", capsys, *place)
        for i, place in enumerate((["--workers", "1"], ["--workers", "2"], ["--dask-address", cluster]))
    }
    one = got["1"]
    assert len(one[0]) == 4 + 3 + 2 + 2  # both sequences' PNGs and soft.npy, the two tables
    assert 0 < one[1]["global"]["J&F-Mean"] <= 1
    for other in ("2", cluster):
        assert got[other] == one


def test_propagate_shards_score_what_every_shard_wrote(video, tmp_path, capsys):
    """Two shards (one sequence each) give the one-process files and numbers; the first waits for
    the second; a PNG changed behind the scorer's back is one line (exit 1), and the shard's
    rerun, which writes it again, scores."""
    whole = _propagated(video, tmp_path / "one" / "out", tmp_path / "one.json", capsys, "--workers", "1")
    out = tmp_path / "two" / "out"
    code, printed = probe_main(
        [
            "propagate",
            str(video[1]),
            "--davis",
            str(video[0] / "DAVIS"),
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "two" / "c"),
            "--n-last-frames",
            "2",
            "--shard",
            "0/2",
            "--workers",
            "1",
        ],
        capsys,
    )
    assert code == 0 and "waiting for shards [1]" in printed.out
    assert not list(out.glob("*.csv"))
    first = sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))[0]
    png = sorted(first.glob("*.png"))[-1]
    good = png.read_bytes()
    labels = np.asarray(Image.open(png)).copy()
    labels[0, 0] = 1 - labels[0, 0]
    Image.fromarray(labels, mode="P").save(png)
    _one_line(
        [
            "propagate",
            video[1],
            "--davis",
            video[0] / "DAVIS",
            "--out",
            out,
            "--cache",
            tmp_path / "two" / "c",
            "--n-last-frames",
            "2",
            "--shard",
            "1/2",
            "--workers",
            "1",
            "-q",
        ],
        capsys,
        1,
        "does not hold the PNGs this run wrote",
    )
    assert not list(out.glob("*.csv"))
    got = _propagated(video, out, tmp_path / "two.json", capsys, "--shard", "0/2", "--workers", "1")
    assert png.read_bytes() == good
    assert got == whole


# ----------------------------------------------------------------------------------------------
# bad input


def test_workers_zero_is_one_line_for_every_command(tiny_stores, knn_panels, video, tmp_path, capsys):
    root, checkpoint = video
    store, c = knn_panels
    for args in (
        ["attention-masks", tiny_stores["dino"], "-q"],
        ["knn", store, "--train", "tr", "--val", "va", "--k", "1", "--cache", c, "-q"],
        ["propagate", checkpoint, "--davis", root / "DAVIS", "--out", tmp_path / "o", "--cache", tmp_path / "c", "-q"],
    ):
        _one_line([*args, "--workers", "0"], capsys, 2, "--workers must be an integer ≥ 1 (got 0)")
    assert not (tmp_path / "o").exists()


def test_a_cluster_whose_workers_lack_the_davis_folder_is_one_line(video, tmp_path, capsys, cluster, monkeypatch):
    """The client reads the first frames; its workers then find no frames at that path."""
    from probe_toolkit.commands import propagate

    root, checkpoint = video
    davis = tmp_path / "DAVIS"
    shutil.copytree(root / "DAVIS", davis)
    real = propagate.map_blocks

    def elsewhere(*args, **kwargs):
        davis.rename(davis.with_name("hidden"))
        return real(*args, **kwargs)

    monkeypatch.setattr(propagate, "map_blocks", elsewhere)
    _one_line(
        ["propagate", checkpoint, "--davis", davis, "--out", tmp_path / "o", "--cache", tmp_path / "c", "--dask-address", cluster, "-q"],
        capsys,
        1,
        "give every worker the DAVIS folder",
    )


def test_a_cluster_whose_workers_lack_the_store_is_one_line_and_the_rerun_works(tiny_stores, tmp_path, capsys, cluster, monkeypatch):
    """The client opens the store; its workers then find nothing at that path (another machine)."""
    store = tmp_path / "copy.zarr"
    shutil.copytree(tiny_stores["dino"], store)
    hidden = store.with_name("hidden.zarr")
    real = cluster_side.connect

    def connect(address):
        store.rename(hidden)
        return real(address)

    monkeypatch.setattr(cluster_side, "connect", connect)
    try:
        _one_line(["attention-masks", store, "--dask-address", cluster, "-q"], capsys, 1, "cannot read the store")
    finally:
        hidden.rename(store)
    monkeypatch.setattr(cluster_side, "connect", real)
    _run(["attention-masks", store, "--dask-address", cluster, "-q"], capsys)
    assert records.load(store, "attention_masks")["mask"].shape[0] == 7


def test_ctrl_c_midway_is_130_and_the_rerun_gives_the_same_masks(tiny_stores, tmp_path, capsys, monkeypatch):
    store = tmp_path / "copy.zarr"
    shutil.copytree(tiny_stores["dino"], store)
    shutil.rmtree(store / "results" / "attention_masks", ignore_errors=True)  # the shared store may hold an earlier run's
    real = runner._bounded

    def interrupted(*args, **kwargs):
        for n, item in enumerate(real(*args, **kwargs)):
            if n == 1:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(runner, "_bounded", interrupted)
    got, printed = probe_main(["attention-masks", store, "--workers", "2", "-q"], capsys)
    assert got == 130 and "rerun" in printed.err
    assert records.load(store, "attention_masks") is None  # nothing half-written
    monkeypatch.setattr(runner, "_bounded", real)
    _run(["attention-masks", store, "--workers", "1", "-q"], capsys)
    from probe_toolkit.analyses import attention_masks as am

    values = cache.open_store(store)["attention_224"].values
    assert np.array_equal(_saved(store, "attention_masks")["mask"], am.mass_masks(am.class_rows(values), 0.6).astype(np.uint8))
