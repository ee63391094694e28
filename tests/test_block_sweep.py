"""Every protocol reads any stored block: ``--block B`` and ``block=`` read that block's arrays,
``--blocks 3,7,11`` writes one record per block, each naming its block; a block the store lacks is
one line before any label is read; the report draws each protocol's number against the block."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cli_runs import probe_main
from test_knn import brute_force, colour_folders
from typer.testing import CliRunner

import probe_toolkit as probe
from probe_toolkit.cli import app
from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import ledger
from probe_toolkit.results import records
from probe_toolkit.store import cache
from probe_toolkit.store.extract import Settings, extract

DEPTH = 3


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    colour_folders(root / "data")
    ckpt = write_checkpoint(root / "dino.pth", "dino-full", replace(TINY, depth=DEPTH), seed=0)
    store = extract(
        ckpt, root / "data", settings=Settings(views=(224,), attention="all", blocks="all", facets=("tokens", "normed"), chunk=8), store=root / "s.zarr", quiet=True
    ).store
    last = extract(ckpt, root / "data", settings=Settings(views=(224,), attention="none", chunk=8), store=root / "last.zarr", quiet=True).store
    cache_dir = root / "cache"
    for name, split in (("tr", "train"), ("va", "val")):
        added = CliRunner().invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", str(cache_dir)])
        assert added.exit_code == 0, added.output
    return root, store, last, cache_dir


@pytest.fixture(scope="module")
def knn_sweep(swept):
    """``probe knn --blocks 0,1,2`` on the store: (exit status, stderr)."""
    import subprocess
    import sys

    root, store, _, c = swept
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "probe_toolkit",
            "knn",
            str(store),
            "--train",
            "tr",
            "--val",
            "va",
            "--k",
            "1,3",
            "--blocks",
            "0,1,2",
            "--cache",
            str(c),
            "--feature",
            "cls",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    return done.returncode, done.stderr


def test_a_sweep_writes_one_record_per_block_each_naming_its_block(swept, knn_sweep):
    root, store, _, c = swept
    code, err = knn_sweep
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("block ")] == ["block 0", "block 1", "block 2"]
    found = [r for r in records.runs(store, "knn") if r.meta["settings"]["ks"] == [1, 3]]
    assert [r.meta["selection"]["block"] for r in found] == [0, 1, 2]
    ds = cache.open_store(store)
    for record in found:
        block = record.meta["selection"]["block"]
        saved = records.load(store, "knn", record.run_id)
        train_ids, val_ids = [str(i) for i in saved.train_image.values], [str(i) for i in saved.image.values]
        features = cache.require(ds, "cls_tokens_224", block=block)
        train, val = features.sel(image=train_ids).values.astype(np.float64), features.sel(image=val_ids).values.astype(np.float64)
        labels = np.array([saved["class"].values.tolist().index(i.split("/")[1]) for i in train_ids])
        for j, k in enumerate((1, 3)):
            preds, _ = brute_force(train, labels, val, 3, k, 0.07)
            np.testing.assert_array_equal(saved.prediction.values[j], preds)
    # the Python API: block= reads that block, the record says so
    run = probe.run("knn", store, train="tr", val="va", ks=(1,), feature="cls", cache_dir=c, block=-2)
    assert run.records[0].meta["selection"]["block"] == 1
    assert records.load(store, "knn", run.run_id).prediction.values[0].tolist() == records.load(store, "knn", found[1].run_id).prediction.values[0].tolist()
    runs = probe.sweep("entropy", [store], blocks=[0, 2], boot=100)
    whole = probe.run("entropy", [store], boot=100).report.results[str(store)]
    for run, block in zip(runs, (0, 2)):
        one = run.report.results[str(store)]
        np.testing.assert_allclose(np.asarray(one["patch_entropy"]), np.asarray(whole["block_patch_entropy"])[:, block], rtol=1e-6)
        assert run.records[0].meta["selection"]["block"] == block


def test_a_block_the_store_lacks_is_one_line_before_any_label(swept, capsys):
    root, store, last, c = swept
    before = len(ledger.entries(c))
    code, printed = probe_main(["knn", str(last), "--train", "tr", "--val", "va", "--block", "0", "--cache", str(c)], capsys)
    assert code == 2 and "holds none of what knn reads" in printed.err and "--blocks 0" in printed.err
    code, printed = probe_main(["knn", str(store), "--train", "tr", "--val", "va", "--blocks", "0,7", "--cache", str(c)], capsys)
    assert code == 2 and "block 7 is not one of 0..2" in printed.err
    with pytest.raises(ProbeError, match="reads a checkpoint, not a store's blocks"):
        probe.run("propagate", root / "dino.pth", davis=root, out=root / "davis-out", block=1)
    assert len(ledger.entries(c)) == before  # no label was read


def test_the_report_draws_each_protocols_number_by_block(swept, knn_sweep, tmp_path, capsys):
    _, store, _, c = swept
    code, printed = probe_main(["report", str(store), "--out", str(tmp_path / "r"), "--cache", str(c)], capsys)
    assert code == 0, printed.err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "k-NN top-1 (%), k = 1, by block (0-based)" in md and "patch rows' entropy (nats)" in md
    for block in (0, 1, 2):  # in per cent, as knn's own table and probe table print it, each block's own record
        record = next(r for r in reversed(records.runs(store, "knn")) if r.meta["selection"]["block"] == block)
        top1 = float(records.load(store, "knn", record.run_id).top1.values[0])
        assert f"| {block} | {100 * top1:.2f} |" in md
    assert records.runs(store, "knn")[0].meta["selection"] == {"block": 0, "facet": None}


def test_entropy_at_a_block_reads_every_blocks_statistics_and_the_refusal_prints_the_extraction_that_serves_it(swept, tmp_path, capsys):
    """``probe entropy --block B`` on a store of attention statistics (``--attention stats``: every
    block) reads block B from them, also beside the last block's maps; a store with neither is
    refused with the whole ``probe extract`` that adds them, which works when pasted."""
    import shlex
    import shutil

    root, _, last, c = swept
    stats = extract(root / "dino.pth", root / "data", settings=Settings(views=(224,), attention="stats", chunk=8), store=tmp_path / "stats.zarr", quiet=True).store
    at = {b: probe.run("entropy", [stats], boot=100, block=b).report.results[str(stats)] for b in (0, DEPTH - 1)}
    whole = probe.run("entropy", [stats], boot=100).report.results[str(stats)]
    np.testing.assert_array_equal(np.asarray(at[DEPTH - 1]["patch_entropy"]), np.asarray(whole["patch_entropy"]))  # the last block, asked or not
    assert at[0].attrs["block"] == 0 and not np.array_equal(np.asarray(at[0]["patch_entropy"]), np.asarray(whole["patch_entropy"]))
    copy = tmp_path / "last.zarr"
    shutil.copytree(last, copy)  # the 224 view without attention
    code, printed = probe_main(["entropy", str(copy), "--block", "0", "--boot", "100", "-q"], capsys)
    assert code == 2 and "holds none of what entropy reads" in printed.err and len(printed.err.strip().splitlines()) == 1
    command = printed.err.split("`")[1]
    assert command.startswith(f"probe extract {root / 'dino.pth'} --images {root / 'data'}") and "--for entropy --blocks 0" in command
    code, printed = probe_main([*shlex.split(command)[1:], "-q"], capsys)
    assert code == 0, printed.err
    code, printed = probe_main(["entropy", str(copy), "--block", "0", "--boot", "100"], capsys)
    assert code == 0, printed.err
    assert "Block 0 (0-based) attention spread" in printed.out
    pasted = records.load(copy, "entropy")
    np.testing.assert_array_equal(pasted.patch_entropy.values, np.asarray(at[0]["patch_entropy"]))  # the same statistics, the same block
    assert pasted.attrs["block"] == 0


def test_a_block_is_checked_at_the_runs_own_view():
    """What a run at a block must find is what it reads at its view (``--view``), not at the protocol's default view."""
    from probe_toolkit.protocols import registry, selection

    assert selection.wanted(registry.get("overcluster"), "hbird@512") == ("tokens_hbird512",)
    assert selection.wanted(registry.get("decode"), "native-crop") == ("keys_native_crop",)
    assert selection.wanted(registry.get("entropy"), "224") == ("attention_224", "attention_blocks_224", "attention_stats_224")
    assert selection.wanted(registry.get("rank"), "short@448") == ("tokens_short@448", "cls_tokens_short@448")
    assert selection.wanted(registry.get("hummingbird"), None) == ("tokens_hbird512", "tokens_hbird512_aug0", "tokens_hbird512_aug1")


def test_a_sweeps_refusal_names_the_sweep_it_was_given(swept, capsys):
    """A block of ``--blocks`` the store lacks, or its network has not, is said of ``--blocks`` (the
    flag given), with the block and the extraction that adds it; a lone ``--block`` keeps its own."""
    root, store, last, c = swept
    code, printed = probe_main(["knn", str(last), "--train", "tr", "--val", "va", "--blocks", "0,2", "--cache", str(c)], capsys)
    assert code == 2 and "holds none of what knn reads" in printed.err and "at block 0 (asked in --blocks 0,2); extract it first: `" in printed.err
    assert "--block " not in printed.err.split("`")[0] and " --blocks 0 " in printed.err.split("`")[1], printed.err
    code, printed = probe_main(["knn", str(store), "--train", "tr", "--val", "va", "--blocks", "0,7", "--cache", str(c)], capsys)
    assert code == 2 and "holds a 3-block network: block 7 is not one of 0..2 (asked in --blocks 0,7); pass a 0-based block index, e.g. --blocks 2" in printed.err
    code, printed = probe_main(["knn", str(store), "--train", "tr", "--val", "va", "--block", "7", "--cache", str(c)], capsys)
    assert code == 2 and "holds a 3-block network: --block 7 is not one of 0..2" in printed.err, printed.err
