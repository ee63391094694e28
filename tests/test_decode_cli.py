"""``probe decode``, ``probe score``, ``probe decode-sweep`` and ``probe panel`` end to end on
synthetic stores whose objects are exact rectangles, and the label-hygiene rule around them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runs import probe_main
from decoder_scenes import Scene, make_store, planted_keys, run_main, write_panel
from PIL import Image
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.labels import guard, ledger, panels
from probe_toolkit.results import records
from probe_toolkit.store.create import create_store
from probe_toolkit.store.extract import Settings as ExtractSettings
from probe_toolkit.store.extract import extract

runner = CliRunner()
GRID = 16


@pytest.fixture
def setup(tmp_path):
    """Four images (one or two objects each), their store, and a val and a test panel."""
    scenes = [
        Scene("one.png", 96, 128, [(3, 9, 4, 12)]),
        Scene("two.png", 160, 160, [(2, 7, 2, 7), (9, 14, 8, 14)]),
        Scene("tall.png", 192, 64, [(5, 12, 6, 10)]),
        Scene("wide.png", 64, 192, [(6, 11, 3, 13)]),
    ]
    keys = np.stack([planted_keys(GRID, s.objects, channels=24, noise=0.01, seed=i) for i, s in enumerate(scenes)])
    store = make_store(tmp_path / "store.zarr", scenes, keys)
    annotations, images = write_panel(tmp_path / "panel", scenes, GRID)
    root = tmp_path / "cache"
    held = tmp_path / "held"  # a test panel may not share images with the val panel: the same layout, other pixels
    held.mkdir()
    for picture in images.iterdir():
        Image.open(picture).transpose(Image.Transpose.ROTATE_180).save(held / picture.name)
    for name, role, folder in (("val", "val", images), ("held", "test", held)):
        result = runner.invoke(app, ["panel", "add", name, "--annotations", str(annotations), "--images", str(folder), "--role", role, "--cache", str(root)])
        assert result.exit_code == 0, result.output
    return store, annotations, root


_main = run_main


def test_decode_without_a_panel_reads_no_label(setup, tmp_path):
    store, annotations, root = setup
    with guard.forbid_label_reads([annotations]):
        result = runner.invoke(
            app,
            [
                "decode",
                str(store),
                "--preset",
                "maskcut",
                "--masks",
                "2",
                "--cache",
                str(root),
                "-q",
                "--out",
                str(tmp_path / "m.json"),
                "--json",
                str(tmp_path / "s.json"),
            ],
        )
        listed = runner.invoke(app, ["panel", "list", "--cache", str(root)])
    assert result.exit_code == 0, result.output
    assert "held" in listed.output and "sealed" in listed.output
    assert not (root / "ledger.jsonl").exists()
    res = json.loads((tmp_path / "m.json").read_text())
    assert {r["image_id"] for r in res} == {0, 1, 2, 3} and all(isinstance(r["segmentation"]["counts"], str) for r in res)
    saved = records.load(store, "decoder")
    assert dict(saved.sizes) == {"image": 4, "mask": 2, "patch": GRID * GRID}
    assert saved.attrs["settings"]["preset"] == "maskcut" and saved.attrs["manifest"]["checkpoint"]["sha256"] == "ab" * 32
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["images"] == 4 and summary["masks"] == int(saved["n_masks"].sum())


def test_decode_on_a_panel_scores_exact_masks_perfectly(setup, tmp_path):
    store, annotations, root = setup
    with guard.forbid_label_reads([annotations]) as opened:
        result = runner.invoke(
            app,
            [
                "decode",
                str(store),
                "--preset",
                "maskcut",
                "--tau",
                "0.2",
                "--masks",
                "2",
                "--panel",
                "val",
                "--cache",
                str(root),
                "-q",
                "--out",
                str(tmp_path / "m.json"),
            ],
        )
    assert result.exit_code == 0, result.output
    assert len(opened) == 1  # exactly one read, by read_labels
    scores = records.load(store, "scores_val")
    entries = ledger.entries(root)
    assert len(entries) == 1 and scores.attrs["ledger_entry"] == entries[0].id
    assert entries[0].fields["images"] == 4 and entries[0].fields["checkpoint"] == "ab" * 32
    # every object is found exactly, one mask per object, so every AP is 1
    np.testing.assert_allclose(scores["segm"].sel(metric=["AP", "AP50", "AP75", "AR10", "AR100"]).values, 1.0)
    np.testing.assert_allclose(scores["bbox"].sel(metric="AP").values, 1.0)
    assert float(scores["corloc"]) == 1.0 and float(scores["mean_best_iou"]) == pytest.approx(1.0)
    assert dict(scores.sizes) == {"metric": 6, "image": 4, "object": 5}
    assert set(scores["object_image"].values) == {"one.png", "two.png", "tall.png", "wide.png"}
    # scoring the written JSON again: same numbers, a second ledger entry
    again = runner.invoke(app, ["score", str(tmp_path / "m.json"), "--panel", "val", "--cache", str(root), "--json", str(tmp_path / "sc.json")])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "sc.json").read_text())["scores"]["segm_AP"] == pytest.approx(1.0)
    assert len(ledger.entries(root)) == 2 and ledger.verify(root) == []


def test_sealed_panel_and_missing_keys_exit_2(setup, tmp_path, capsys):
    store, annotations, root = setup
    code, err = _main(["decode", str(store), "--panel", "held", "--cache", str(root), "-q"], capsys)
    assert code == 2 and "sealed" in err and "--unseal" in err
    assert not (root / "ledger.jsonl").exists()
    code, _ = _main(["decode", str(store), "--panel", "held", "--unseal", "final table", "--cache", str(root), "-q"], capsys)
    assert code == 0 and ledger.entries(root)[-1].fields["unseal"] == "final table"
    scenes = [Scene("x.png", 32, 32)]
    bare = create_store(tmp_path / "bare.zarr", {"chunk": 1, "dtype": "float32", "checkpoint": {}}, ["x.png"], {"tokens_224": (("patch_224", "channel"), (4, 3))})
    bare.write(0, {"tokens_224": np.zeros((1, 4, 3), np.float32)}, np.array([[32, 32]]), np.zeros(1, bool))
    code, err = _main(["decode", str(tmp_path / "bare.zarr"), "--cache", str(root), "-q"], capsys)
    assert code == 2 and "keys_480" in err and "--views 480" in err
    assert scenes


def test_sweep_reads_labels_once_and_its_best_settings_drive_decode(setup, tmp_path):
    store, annotations, root = setup
    grid = tmp_path / "grid.toml"
    grid.write_text('preset = ["tokencut", "maskcut"]\ncenter = [true, false]\ntau = [0.2, 0.99]\nmasks = [1, 2]\n')
    with guard.forbid_label_reads([annotations]):
        result = runner.invoke(
            app, ["decode-sweep", str(store), "--panel", "val", "--grid", str(grid), "--cache", str(root), "-q", "--json", str(tmp_path / "table.json")]
        )
    assert result.exit_code == 0, result.output
    assert len(ledger.entries(root)) == 1 and "sweep of 16" in ledger.entries(root)[0].fields["purpose"]
    table = json.loads((tmp_path / "table.json").read_text())["table"]
    assert len(table) == 16
    best = json.loads((root / "decoder-settings.json").read_text())
    assert best["chosen_by"]["ledger_entry"] == ledger.entries(root)[0].id and best["chosen_by"]["grid_size"] == 16
    assert best["settings"]["tau"] == 0.2 and best["settings"]["masks"] == 2  # τ = 0.99 links nothing; two objects need two masks
    sweep = records.load(store, "sweep_val")
    assert sweep.sizes["setting"] == 16 and sweep.attrs["ledger_entry"] == best["chosen_by"]["ledger_entry"]
    # a later decode uses the sweep's settings, and says so
    later = runner.invoke(app, ["decode", str(store), "--cache", str(root), "-q"])
    assert later.exit_code == 0, later.output
    saved = records.load(store, "decoder")
    assert saved.attrs["settings"] == best["settings"] and "decoder-settings.json" in saved.attrs["settings_source"]
    assert len(ledger.entries(root)) == 1


def test_sweep_shards_read_labels_once_and_give_the_one_process_table(setup, tmp_path, capsys):
    """Two shards (two images each) decode every setting of the grid; the first waits without
    reading a label, the second assembles the parts, reads the panel once and scores: the same
    table, best setting and saved sweep as one process."""
    store, annotations, root = setup
    grid = tmp_path / "grid.toml"
    grid.write_text('preset = ["tokencut", "lost"]\ncenter = [true, false]\ntau = [0.2]\nmasks = [1, 2]\n')
    args = ["decode-sweep", str(store), "--panel", "val", "--grid", str(grid), "--cache", str(root), "--workers", "1"]
    assert _main([*args, "-q", "--json", str(tmp_path / "one.json"), "--settings-out", str(tmp_path / "one-best.json")], capsys) == (0, "")
    one = json.loads((tmp_path / "one.json").read_text())["table"]
    one_sweep = records.load(store, "sweep_val").load()
    shards = [*args, "--json", str(tmp_path / "two.json"), "--settings-out", str(tmp_path / "two-best.json")]
    with guard.forbid_label_reads([annotations]) as opened:
        code, printed = probe_main([*shards, "--shard", "0/2"], capsys)
        assert code == 0 and "waiting for shards [1]" in printed.out
        assert len(opened) == 0 and not (tmp_path / "two.json").exists()  # no label read yet
    assert _main([*shards, "-q", "--shard", "1/2"], capsys) == (0, "")
    assert json.loads((tmp_path / "two.json").read_text())["table"] == one
    best = [json.loads((tmp_path / f"{k}-best.json").read_text()) for k in ("one", "two")]
    assert best[0]["settings"] == best[1]["settings"]
    assert best[1]["chosen_by"]["ledger_entry"] in {e.id for e in ledger.entries(root)}  # the scoring shard's read is in the ledger
    sweep = records.load(store, "sweep_val").load()
    for name in one_sweep.data_vars:
        assert list(sweep[name].values) == list(one_sweep[name].values), name


def test_extraction_and_decoding_of_a_real_store_never_open_annotations(tmp_path, tiny_checkpoints, image_dir):
    """Extraction from a panel's folder and decoding its keys, under the guard."""
    scenes = [Scene("scenes/one.png", 480, 640, [(2, 5, 2, 5)])]  # one object: a panel of none is refused when added
    annotations, _ = write_panel(tmp_path / "p", scenes, GRID)
    root = tmp_path / "cache"
    panels.add_panel("v", annotations, image_dir, "val", cache=root)
    with guard.forbid_label_reads([annotations]):
        report = extract(
            tiny_checkpoints["dino-full"],
            panels.panel_images("v", root),
            settings=ExtractSettings(views=(480,), attention="none", chunk=4),
            cache_dir=root,
            quiet=True,
            batch_size=4,
        )
        result = runner.invoke(app, ["decode", str(report.store), "--cache", str(root), "-q"])
    assert result.exit_code == 0, result.output
    saved = records.load(report.store, "decoder")
    assert saved.sizes["patch"] == 900 and saved["n_masks"].min() >= 1
    assert not (root / "ledger.jsonl").exists()


def test_the_default_sweep_grid_has_148_settings_in_52_decodes():
    from probe_toolkit.commands.decode_sweep import load_grid

    grid = load_grid(None)  # 144 cuts, and LOST and DSM once per centring (τ, ε, masks do not apply)
    assert len(grid) == 148 and len(set(grid)) == 148
    assert len({(s.preset, s.center, s.tau, s.eps) for s in grid}) == 52
    assert {s.rule for s in grid} == {"tokencut", "maskcut", "lost", "dsm"} and {s.masks for s in grid} == {1, 2, 3}
