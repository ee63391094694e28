"""The report, paper-ready: stores named by the user, a k-NN grid whose titles never overlap and
whose tiles are never blank when the pictures exist, caveats beside what probe made up (random
weights, synthetic images), true statements of comparability, CSV cells that are numbers and
LaTeX in plain ASCII. Synthetic stores (no network), so this is cheap; the LaTeX and PDF checks
on a whole report are in test_report.py."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from cli_runs import probe_main
from PIL import Image
from report_stores import synthetic_store

from probe_toolkit.infra import origin
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.report import tables as report_tables
from probe_toolkit.report import write_report
from probe_toolkit.report.content import Note, Table
from probe_toolkit.report.context import Context
from probe_toolkit.report.freshness import _compare
from probe_toolkit.report.protocol_figures import fit, knn_figure, knn_grid
from probe_toolkit.report.sources import LedgerBook, default_label, open_stores, parse_labels
from probe_toolkit.store import images

HASH = re.compile(r"-[0-9a-f]{8}\b")


# ----------------------------------------------------------------------------------------------
# names


def test_default_label_is_checkpoint_and_network_and_the_manifest_name_wins():
    manifest = {"checkpoint": {"path": "/w/dino_deitsmall16_pretrain.pth"}, "network": "teacher"}
    path = Path("cache/dino_deitsmall16_pretrain-1a2b3c4d/teacher-panel-coco-val.zarr")
    assert default_label(path, manifest) == "dino_deitsmall16_pretrain (teacher, panel coco-val)"
    assert default_label(path.with_name("teacher.zarr"), manifest) == "dino_deitsmall16_pretrain (teacher)"
    assert default_label(path, {**manifest, "name": " DINO ViT-S/16 "}) == "DINO ViT-S/16"


def test_labels_name_the_stores_everywhere(tmp_path):
    a = synthetic_store(tmp_path / "synthetic-1a2b3c4d" / "teacher.zarr", 14, seed=1)
    b = synthetic_store(tmp_path / "synthetic-5e6f7a8b" / "teacher.zarr", 14, seed=2)
    plain = open_stores([a, b])
    assert [s.label for s in plain] == ["synthetic (teacher)", "synthetic (teacher) (2)"]  # unique, no folder hash
    written = write_report([a, b], tmp_path / "r", formats="png", labels=[f"DINO={a}", f"SelfPatch = {b}"])
    assert written.report.title == "probe report: DINO vs SelfPatch" and written.report.stores == ["DINO", "SelfPatch"]
    md, page = written.markdown.read_text(), written.html.read_text()
    assert md.startswith("# probe report: DINO vs SelfPatch\n") and "<title>probe report: DINO vs SelfPatch</title>" in page
    manifests = next(b for b in written.report.section("manifests").blocks if isinstance(b, Table))
    assert manifests.header == ["", "DINO", "SelfPatch"]
    for text in (written.report.title, md.splitlines()[0]):
        assert not HASH.search(text), text


@pytest.mark.parametrize(
    "items, problem",
    [
        (["DINO"], "is not NAME=STORE"),
        (["=x"], "is not NAME=STORE"),
        (["DINO=elsewhere.zarr"], "is not one of the stores"),
        (["A={a}", "B={a}"], "is named twice"),
        (["A={a}", "A={b}"], "names two stores"),
    ],
)
def test_bad_labels_are_refused_in_one_line(tmp_path, items, problem):
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    with pytest.raises(ProbeError, match=problem) as caught:
        parse_labels([i.format(a=a, b=b) for i in items], [a, b])
    assert caught.value.where == "--label"


def test_cli_label_error_exits_2_before_any_work(tmp_path, capsys):
    a = synthetic_store(tmp_path / "s-1a2b3c4d" / "teacher.zarr", 14)
    code, out = probe_main(["report", str(a), "--label", "nameless", "--out", str(tmp_path / "r")], capsys)
    err = out.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--label" in err and "NAME=STORE" in err
    assert not (tmp_path / "r" / "report.md").exists()


# ----------------------------------------------------------------------------------------------
# caveats


def test_random_weights_and_synthetic_images_get_a_caveat_where_they_are_shown(tmp_path):
    a = synthetic_store(tmp_path / "ck-1a2b3c4d" / "teacher.zarr", 14, seed=1)
    b = synthetic_store(tmp_path / "ck-5e6f7a8b" / "teacher.zarr", 14, seed=2)
    # a's checkpoint is marked random with the sha256 its manifest records; b's marker names another file
    (a.parent / "synthetic.pth.probe-origin.json").write_text(json.dumps({"origin": "random weights", "what": "random weights (test)", "sha256": "cd" * 32}))
    (b.parent / "synthetic.pth.probe-origin.json").write_text(json.dumps({"origin": "random weights", "what": "random weights (test)", "sha256": "ef" * 32}))
    origin.mark_synthetic(a.parent / "no-such-folder", "synthetic scenes (test)")
    written = write_report([a, b], tmp_path / "r", formats="png", labels=[f"A={a}", f"B={b}"])
    shown = [s for s in written.report.sections if s.present]
    assert shown
    for section in shown:
        first = section.blocks[0]
        assert isinstance(first, Note) and first.kind == "caveat", section.key
        assert "A — random weights (test), 1 of its 1 images are synthetic scenes (test)" in first.text
        assert "B —" not in first.text
    manifests = next(b for b in written.report.section("manifests").blocks if isinstance(b, Table))
    row = next(r for r in manifests.rows if r[0] == "made up by probe")
    assert row[2] == "nothing marked" and "random weights (test)" in row[1]
    assert "> **Caveat:** Not a measurement of a method: A — random weights (test)" in written.markdown.read_text()
    assert 'class="note caveat"' in written.html.read_text()
    # each figure showing A carries the caveat in its caption and drawn into its image; B's own do not
    stamp = "Not a measurement of a method: random weights and synthetic data made by probe"
    figures = [f for s in written.report.sections for f in s.figures()]
    mine = [f for f in figures if f.caption.startswith(f"{stamp}. A:")]
    theirs = [f for f in figures if f.caption.startswith("B:")]
    assert mine and theirs
    for f in mine:
        assert stamp in [t.get_text() for t in f.png.figure.texts]
        assert (written.folder / "figures" / f.name).read_bytes() == bytes(f.png)  # the stamped image is the one written
    assert all(stamp not in [t.get_text() for t in f.png.figure.texts] for f in theirs)


def test_probe_marks_its_random_checkpoints_for_their_bytes_only(tmp_path):
    from probe_toolkit.demo.samples import TINY, write_checkpoint
    from probe_toolkit.store.checkpoints import sha256_file

    path = write_checkpoint(tmp_path / "c.pth", "dino-full", TINY, seed=0)
    digest = sha256_file(path)
    assert "random weights made by probe (dino-full" in origin.random_weights(path, digest)
    assert origin.random_weights(path, "0" * 64) is None  # another file copied to the same name
    assert origin.random_weights(tmp_path / "other.pth", digest) is None
    assert origin.synthetic(tmp_path / "x" / "y") is None
    origin.mark_synthetic(tmp_path / "x", "drawn")
    assert origin.synthetic(tmp_path / "x" / "y" / "z.png") == "drawn"
    assert origin.synthetic(tmp_path / "x" / "y" / "z.png", stop=tmp_path / "x" / "y") is None  # not above the image root


# ----------------------------------------------------------------------------------------------
# the k-NN grid


def _title_spans(figure) -> list[list[tuple[float, float]]]:
    """Per row of tiles, each visible title's horizontal extent in display pixels."""
    renderer = figure.canvas.get_renderer()
    rows: dict[int, list[tuple[float, float]]] = {}
    for ax in figure.axes:
        if ax.get_visible() and ax.title.get_text():
            box = ax.title.get_window_extent(renderer)
            rows.setdefault(ax.get_subplotspec().rowspan.start, []).append((box.x0, box.x1))
    return [sorted(spans) for _, spans in sorted(rows.items())]


@pytest.mark.parametrize("length", [4, 40, 200])
def test_knn_titles_never_overlap_whatever_the_file_names(length):
    rng = np.random.default_rng(0)
    pic = lambda: rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)  # noqa: E731
    name = lambda i: f"n{i:02d}_" + "x" * length + ".JPEG"  # noqa: E731
    queries = [(f"val/{name(q)}", pic(), "class_" + "c" * length) for q in range(3)]
    neighbours = [[(f"train/{name(10 * q + r)}", pic(), 0.9 - r / 10) for r in range(5)] for q in range(3)]
    neighbours[1][2] = (neighbours[1][2][0], None, 0.7)  # a picture found nowhere
    drawing = knn_grid(queries, neighbours)
    drawing.png()  # laid out as it is saved
    for spans in _title_spans(drawing.figure):
        assert len(spans) == 6
        for (_, right), (left, _) in zip(spans, spans[1:]):
            assert right < left, spans  # titles of neighbouring tiles are disjoint
    texts = [t.get_text() for ax in drawing.figure.axes for t in ax.texts]
    assert texts == ["no picture:\nfile and\ntokens gone"]  # the one tile without a picture says so; none is blank
    tiles = [ax for ax in drawing.figure.axes if ax.get_visible()]
    assert sum(bool(ax.get_images()) for ax in tiles) == 3 * 6 - 1


def test_fit_keeps_both_ends():
    assert fit("short.jpg", 12) == "short.jpg"
    cut = fit("ILSVRC2012_val_00012345.JPEG", 12)
    assert len(cut) == 12 and cut.startswith("ILS") and cut.endswith("345.JPEG") and "…" in cut


def _knn_result(attrs: dict) -> xr.Dataset:
    return xr.Dataset(
        {"neighbour": (("image", "rank"), np.array([[0]], np.int32)), "similarity": (("image", "rank"), np.array([[0.9]])), "label": ("image", np.array([0], np.int32))},
        coords={"image": ["gone.jpg"], "train_image": ["gone.jpg"], "class": ["thing"]},
        attrs=attrs,
    )


def test_knn_pictures_come_from_the_store_that_holds_the_panel(tmp_path):
    """The store k-NN read a panel from (another, per-panel store) holds the image file: the tile
    shows the file's 224 view and nothing is said to be gone; without that record the store's
    own tokens are drawn and the note says where it looked."""
    a = synthetic_store(tmp_path / "ck-1a2b3c4d" / "teacher.zarr", 14, seed=1)
    b = synthetic_store(tmp_path / "other" / "ck-1a2b3c4d" / "teacher-panel-p.zarr", 14, seed=2)
    folder = b.parent / "no-such-folder"  # b's image source
    folder.mkdir()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (80, 120, 3), dtype=np.uint8)).save(folder / "gone.jpg")
    view = open_stores([a])[0]
    ctx = Context([view], None, 0, None, LedgerBook())
    figure, from_tokens, nothing = knn_figure(ctx, view, _knn_result({"stores": {"train": str(b), "val": str(b)}}))
    assert from_tokens == [] and nothing == []
    tiles = [ax.get_images()[0].get_array() for ax in figure.png.figure.axes if ax.get_visible() and ax.get_images()]
    expected = np.asarray(images.view(images.load_image(folder / "gone.jpg"), 224))
    assert len(tiles) == 2 and all(np.array_equal(np.asarray(t), expected) for t in tiles)
    _, from_tokens, nothing = knn_figure(ctx, view, _knn_result({}))
    assert from_tokens == ["gone.jpg"] and nothing == []


# ----------------------------------------------------------------------------------------------
# comparability


def test_same_images_in_another_order_are_the_same_set():
    assert _compare({"a": ("h1", {"x.jpg", "y.jpg"}, 2), "b": ("h2", {"y.jpg", "x.jpg"}, 2)}) is None
    differ = _compare({"a": ("h", {"x.jpg", "y.jpg"}, 2), "b": ("h", {"x.jpg"}, 1)})
    assert "different image sets (a: 2, b: 1; 1 images in common)" in differ
    assert _compare({"a": ("h", None, 2), "b": ("h", None, 2)}) is None
    assert "different image sets" in _compare({"a": ("h", None, 2), "b": ("g", None, 3)})
    unknown = _compare({"a": (None, None, None), "b": ("h", None, 2)})
    assert "cannot be checked: a recorded no image list." in unknown and "different" not in unknown


# ----------------------------------------------------------------------------------------------
# tables: numbers in the CSV, ASCII in the LaTeX


def test_csv_cells_are_numbers_with_their_units_in_the_headers():
    table = Table(
        ["statistic", "A", "B"],
        [
            ["entropy (nats)", "5.277 [5.270, 5.281]", "5.1 [5.0, 5.2]"],
            ["mean e^H / T", "99.9 % [99.8, 99.9]", "–"],
            ["images", "17", "17"],
        ],
    )
    rows = list(csv.reader(io.StringIO(report_tables.csv_text(table))))
    assert rows[0] == ["statistic", "A", "A low", "A high", "B", "B low", "B high"]
    assert rows[1] == ["entropy (nats)", "5.277", "5.270", "5.281", "5.1", "5.0", "5.2"]
    assert rows[2] == ["mean e^H / T (%)", "99.9", "99.8", "99.9", "", "", ""]
    assert rows[3] == ["images", "17", "", "", "17", "", ""]
    probes = Table(["store", "mIoU", "accuracy", "note"], [["A", "68.56 %", "1.70 %", "ok"], ["B", "−0.50 %", "–", "–"]])
    rows = list(csv.reader(io.StringIO(report_tables.csv_text(probes))))
    assert rows == [["store", "mIoU (%)", "accuracy (%)", "note"], ["A", "68.56", "1.70", "ok"], ["B", "-0.50", "", ""]]
    assert [float(v) for v in (rows[1][1], rows[1][2], rows[2][1])] == [68.56, 1.70, -0.50]


def test_latex_is_plain_ascii_with_symbols_as_math():
    out = report_tables.latex(Table(["β", "τ", "Λ", "Ω", "ε", "café", "→"], [["0.1", "1 %", "x_y", "#", "&", "~", "✓"]], "caption β"))
    assert out.isascii()
    for part in (r"$\beta$", r"$\tau$", r"$\Lambda$", r"$\Omega$", r"$\varepsilon$", "cafe", r"$\rightarrow$", r"1 \%", r"x\_y", r"\#", r"\&"):
        assert part in out, part


def test_store_columns_stay_whole_at_80_columns():
    """A terminal of 80 columns folds a store's column title onto more lines instead of cutting it
    to an ellipsis, so two stores of one checkpoint family stay told apart."""
    from rich.console import Console

    from probe_toolkit.results.summaries import ENTROPY_LABELS, summary_table

    stats = ["patch_entropy", "patch_effective", "patch_share", "distance"]
    ds = xr.Dataset(
        {
            "summary_mean": ("statistic", [5.277, 195.783, 0.999, 7.286]),
            "summary_low": ("statistic", [5.276, 195.742, 0.998, 7.282]),
            "summary_high": ("statistic", [5.278, 195.819, 0.999, 7.29]),
        },
        coords={"statistic": stats},
    )
    stores = ["cache/dino_deitsmall16_pretrain-1a2b3c4d/teacher.zarr", "cache/dino_deitsmall16_pretrain-5e6f7a8b/teacher.zarr"]
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(summary_table({s: ds for s in stores}, ENTROPY_LABELS, "spread"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    columns = ["".join(cells) for cells in zip(*[[c.strip() for c in line.split("┃")[2:4]] for line in text.splitlines() if line.startswith("┃")])]
    assert columns == ["dino_deitsmall16_pretrain-1a2b3c4d/teacher.zarr", "dino_deitsmall16_pretrain-5e6f7a8b/teacher.zarr"]
    assert "195.783" in text and "99.9 %" in text
