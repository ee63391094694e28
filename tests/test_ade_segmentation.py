"""ADE20K (ADEChallengeData2016) segmentation panels: checked when added (the first image without
a mask named, no mask opened), read only through the ledger, and scored by ``probe hummingbird``
with 151 classes ("other" and the 150), every number against the plain computation of
test_hummingbird_protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runs import probe_main
from PIL import Image
from segmentation_folders import box_scene, write_ade
from test_hummingbird_protocol import _iou, _plain

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.labels import ade_segmentation as ade
from probe_toolkit.labels import guard, kinds, ledger, panels
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

NAMES = {"training": ["ADE_train_00000001", "ADE_train_00000002", "ADE_train_00000017"], "validation": ["ADE_val_00000001", "ADE_val_00000009"]}


@pytest.fixture(scope="module")
def ade_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ade") / "ADEChallengeData2016"
    return root, write_ade(root, NAMES, lambda split, n: box_scene(n + 10 * len(split), (80 + 8 * n, 64)))


def test_added_without_opening_a_mask_then_read_through_the_ledger(ade_root, tmp_path, capsys):
    root, written = ade_root
    cache = tmp_path / "cache"
    masks = sorted(root.glob("annotations/*/*.png"))
    with guard.forbid_label_reads(masks) as opened:
        code, printed = probe_main(["panel", "add", "ade-val", "--ade20k", root, "--role", "val", "--cache", cache], capsys)
        assert code == 0, printed.err
        panel = panels.get_panel("ade-val", cache)
        assert (panel.kind, panel.split, panel.images) == ("ade20k", "validation", (root / "images" / "validation").resolve())
        assert opened == []
        read = ade.read_label_maps("ade-val", purpose="score", checkpoint="c" * 64, cache=cache, command="probe hummingbird", images=["validation/ADE_val_00000009.jpg"])
    assert len(opened) == 1  # the one mask asked for, inside the reader
    assert read.ids == ["ADE_val_00000009.jpg"] and read.image_map == {"validation/ADE_val_00000009.jpg": "ADE_val_00000009.jpg"}
    assert np.array_equal(read.maps[0], written["validation/ADE_val_00000009.jpg"]) and read.maps[0].dtype == np.uint8
    assert len(read.classes) == 150 and read.classes[0] == "wall" and read.classes[-1] == "flag"
    entry = ledger.entries(cache)[-1]
    assert entry.id == read.entry_id and (entry.fields["panel"], entry.fields["images"], entry.fields["purpose"]) == ("ade-val", 1, "score")
    assert entry.fields["annotations"] == str((root / "annotations" / "validation").resolve())
    assert ledger.verify(cache) == [] and kinds.benchmark(panel) == "ADE20K"


def test_layout_errors_are_one_line_naming_the_file(ade_root, tmp_path, capsys):
    root, _ = ade_root
    broken = tmp_path / "ADEChallengeData2016"
    for split in ("training", "validation"):
        (broken / "images" / split).mkdir(parents=True)
        (broken / "annotations" / split).mkdir(parents=True)
    for name in ("ADE_train_1", "ADE_train_2"):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(broken / "images" / "training" / f"{name}.jpg")
    Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(broken / "annotations" / "training" / "ADE_train_1.png")
    cases = [
        (["--ade20k", broken, "--split", "training"], "ADE_train_2.png: is missing, the mask of"),
        (["--ade20k", root, "--split", "testing"], "--split 'testing' is not one of training, validation"),
        (["--ade20k", root, "--images", root / "images"], "is read from the release folder"),
        (["--ade20k", tmp_path / "nowhere"], "is not a folder"),
    ]
    for argv, words in cases:
        code, printed = probe_main(["panel", "add", "p", "--role", "train", "--cache", tmp_path / "c", *argv], capsys)
        err = " ".join(printed.err.split())
        assert code == 2 and words in err and len(printed.err.strip().splitlines()) == 1, printed.err
    assert not (tmp_path / "c" / "panels.toml").exists()


def test_a_colour_mask_or_a_label_above_150_is_refused_naming_it():
    rgb = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    high = Image.fromarray(np.full((4, 4), 151, np.uint8), mode="L")
    for image, words in ((rgb, "is an image of mode RGB"), (high, "holds label 151")):
        import io

        raw = io.BytesIO()
        image.save(raw, format="PNG")
        with pytest.raises(Exception, match=words):
            ade.decode(raw.getvalue(), "mask.png")


def test_hummingbird_on_ade20k_equals_a_plain_computation_with_151_classes(ade_root, tmp_path, capsys):
    root, written = ade_root
    cache = tmp_path / "cache"
    checkpoint = write_checkpoint(tmp_path / "dino.pth", "dino-full", TINY, seed=5)
    store = extract(
        checkpoint,
        root / "images",
        settings=Settings(views=("hbird512", "hbird512_aug0", "hbird512_aug1"), chunk=4, dtype="float32"),
        cache_dir=cache,
        quiet=True,
        batch_size=2,
    ).store
    for name, role in (("ade-train", "train"), ("ade-val", "val")):
        code, printed = probe_main(["panel", "add", name, "--ade20k", root, "--role", role, "--cache", cache], capsys)
        assert code == 0, printed.err
    out = tmp_path / "hb.json"
    code, printed = probe_main(
        ["hummingbird", store, "--train", "ade-train", "--val", "ade-val", "--memory", "60,full", "--cache", cache, "--json", out, "-q", "--workers", "1"], capsys
    )
    assert code == 0, printed.err
    assert "no published numbers for this data set" in printed.out and "other weights" not in printed.out
    summary = json.loads(out.read_text())
    assert summary["classes"][0] == "other" and len(summary["classes"]) == 151
    train = [(f"training/{n}.jpg", written[f"training/{n}.jpg"]) for n in NAMES["training"]]
    val = [(f"validation/{n}.jpg", written[f"validation/{n}.jpg"]) for n in NAMES["validation"]]
    saved = records.load(store, "hummingbird")
    assert [f"validation/{n}" for n in saved.shown.values] == [name for name, _ in val]  # every val image is shown: its whole prediction kept
    for m, (_, shown, rows) in enumerate(_plain(store, train, val, (60, None), n_classes=151)):
        assert summary["bank_rows"][m] == rows
        confusion = np.zeros((151, 151), np.int64)
        for j, (name, _) in enumerate(val):
            truth, predicted, margin, tied = shown[name]
            got = saved.prediction.values[m, j]
            # the plain computation in float64 and probe's in float32 may only part where float32 rounding decides
            assert np.array_equal(got[(margin > 1e-5) & ~tied], predicted[(margin > 1e-5) & ~tied]) and np.array_equal(saved.truth.values[j], truth)
            keep = truth != 255
            confusion += np.bincount(truth[keep].astype(np.int64) * 151 + got[keep], minlength=151**2).reshape(151, 151)
        assert np.array_equal(saved.confusion.values[m], confusion)
        assert summary["miou"][m] == pytest.approx(_iou(confusion).mean(), abs=1e-12)
        assert summary["iou"][m] == pytest.approx(_iou(confusion).tolist(), abs=1e-12)
