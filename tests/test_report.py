"""``probe report``: sections appear exactly when their results exist, the numbers shown are the
results' (checked against plain computations from the stored arrays), the explorer's data is
quantised within half a step, the page fetches nothing, and the write is atomic."""

from __future__ import annotations

import base64
import json
import re
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from protocol_stores import protocol_results
from report_stores import bare_copies, invoke, plain_cosine, plain_rank, plain_window, saliency_panel, scenes_panels, stored, training_store

from probe_toolkit.cli import main
from probe_toolkit.labels import ledger
from probe_toolkit.report import build, default_name, render_report, write_report
from probe_toolkit.report import html as report_html
from probe_toolkit.report.content import Figure, Note, Table
from probe_toolkit.store import cache
from probe_toolkit.store.extract import Settings, extract

FROM_ARRAYS = {"manifests", "explorer", "followed", "attention", "neighbour-map", "references"}
FROM_RESULTS = {"entropy": "probe entropy", "premise": "probe neighbours", "decoder": "probe decode", "scores": "probe decode",
                "linear": "probe linear", "training": "probe train", "discovery": "probe decode",
                "knn": "probe knn", "attention-masks": "probe attention-masks", "davis": "probe propagate"}
PATCH = 34


@pytest.fixture(scope="module")
def bare(tiny_stores, tmp_path_factory):
    root = tmp_path_factory.mktemp("report-bare")
    stores = bare_copies(tiny_stores, root / "cache")
    written = write_report([stores["dino"], stores["selfpatch"]], root / "report", cache_dir=root / "cache")
    return SimpleNamespace(root=root, stores=stores, written=written)


@pytest.fixture(scope="module")
def full(tiny_stores, image_dir, tmp_path_factory):
    """Every analysis run through its CLI on copies of the tiny stores, plus a store from a training run folder."""
    root = tmp_path_factory.mktemp("report-full")
    cache_dir = root / "cache"
    stores = bare_copies(tiny_stores, cache_dir)
    dino, selfpatch = stores["dino"], stores["selfpatch"]
    invoke("entropy", dino, selfpatch, "--patch", PATCH, "--boot", 50, "-q")
    invoke("neighbours", dino, selfpatch, "--grid", 14, "--boot", 50, "-q")
    invoke("neighbours", dino, selfpatch, "--grid", 6, "--boot", 50, "-q")
    scenes_panels(image_dir, root, cache_dir)
    invoke("decode", dino, "--panel", "scenes", "--preset", "maskcut", "--masks", 2, "--cache", cache_dir, "-q")
    saliency_panel(image_dir, root, cache_dir)  # same settings as the next decode, which replaces results/decoder
    invoke("decode", selfpatch, "--panel", "scenes-sal", "--cache", cache_dir, "-q")
    invoke("decode", selfpatch, "--panel", "scenes", "--cache", cache_dir, "-q")
    grid = root / "grid.toml"
    grid.write_text('preset = ["tokencut"]\ncenter = [true]\ntau = [0.1, 0.2]\nmasks = [1]\n')
    invoke("decode-sweep", dino, "--panel", "scenes", "--grid", grid, "--settings-out", root / "best.json", "--cache", cache_dir, "-q")
    invoke("linear", dino, selfpatch, "--train", "scenes-train", "--val", "scenes", "--epochs", 5, "--cache", cache_dir, "-q")
    invoke("linear", dino, selfpatch, "--train", "scenes-train", "--val", "scenes", "--level", "image", "--cache", cache_dir, "-q")
    protocol_results(dino, image_dir, root, cache_dir)
    run, run_dir = training_store(image_dir, root)
    written = write_report([dino, selfpatch, run], root / "report", follow="scenes/one.png", patch=PATCH, cache_dir=cache_dir)
    return SimpleNamespace(root=root, cache=cache_dir, dino=dino, selfpatch=selfpatch, run=run, run_dir=run_dir, written=written)


def _text(section) -> str:
    parts = []
    for b in section.blocks:
        if isinstance(b, Table):
            parts += [b.caption, *b.header, *(c for row in b.rows for c in row)]
        elif isinstance(b, (Note, Figure)):
            parts.append(getattr(b, "text", None) or b.caption)
    return "\n".join(parts)


def _table(section, caption_part: str) -> Table:
    return next(b for b in section.blocks if isinstance(b, Table) and caption_part in b.caption)


def _row(table: Table, first: str) -> list[str]:
    return next(r for r in table.rows if r[0] == first)


def _explorer(html_text: str) -> dict:
    found = re.search(r'<script type="application/json" id="probe-explorer-data">(.*?)</script>', html_text, re.S)
    return json.loads(found.group(1))


# ----------------------------------------------------------------------------------------------
# which sections exist


def test_a_store_without_results_shows_only_what_its_arrays_give(bare):
    report = bare.written.report
    present = {s.key for s in report.sections if s.present}
    assert present == FROM_ARRAYS
    html_text = bare.written.html.read_text()
    md = bare.written.markdown.read_text()
    for key, command in FROM_RESULTS.items():
        section = report.section(key)
        missing = [b.text for b in section.blocks if isinstance(b, Note) and b.kind == "missing"]
        assert len(missing) == 1 and command in missing[0], (key, missing)
        assert f'data-section="{key}" data-present="false"' in html_text
        assert f"{section.title} (not available)" in md
    for key in FROM_ARRAYS:
        assert f'data-section="{key}" data-present="true"' in html_text
    # the followed image defaults to the first image both stores hold; patch 34 of its grid
    assert report.follow == "astronaut.jpg" and report.patch == PATCH


def test_every_section_appears_once_its_results_exist(full):
    report = full.written.report
    assert all(s.present for s in report.sections), [s.key for s in report.sections if not s.present]
    labels = report.stores
    assert len(labels) == 3 and labels[2].startswith("checkpoint-")
    # stores that lack a result get one line naming them and the command, inside a present section
    entropy = _text(report.section("entropy"))
    assert f"No attention entropy for {labels[2]}: run `probe entropy" in entropy
    assert f"No decoder masks for {labels[2]}" in _text(report.section("decoder"))
    assert f"No premise statistics (neighbours_g6) for {labels[2]}" in _text(report.section("premise"))
    assert f"No training log beside the checkpoint for {labels[0]}, {labels[1]}" in _text(report.section("training"))
    assert f"No attention of every block for {labels[1]}, {labels[2]}" in _text(report.section("attention"))
    # every figure is a PNG beside report.md and embedded once in the HTML
    figures = sorted((full.written.folder / "figures").iterdir())
    assert figures and [p.name for p in figures] == sorted(p.name for p in full.written.figures)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in figures)
    html_text = full.written.html.read_text()
    md = full.written.markdown.read_text()
    assert html_text.count('<img alt="') == len(figures)
    assert all(f"(figures/{p.name})" in md for p in figures)


# ----------------------------------------------------------------------------------------------
# the numbers shown


def test_entropy_table_shows_the_saved_results(full):
    """The mean e^H printed for each store equals a plain float64 computation from its stored rows."""
    table = _table(full.written.report.section("entropy"), "mean over images")
    row = _row(table, "patch rows: mean e^H (tokens)")
    for column, store in ((1, full.dino), (2, full.selfpatch)):
        ds = cache.open_store(store)
        rows = np.asarray(ds["attention_224"].values, dtype=np.float64)  # (image, head, T, T)
        start = 1 if cache.manifest(store)["arch"]["class_token"] else 0
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.where(rows > 0, rows * np.log(rows), 0.0).sum(-1)
        plain = np.exp(h[..., start:]).mean(-1).mean(-1).mean()
        assert float(row[column].split(" ")[0]) == pytest.approx(plain, abs=2e-3)
    assert "< 25 %" in row[-1] or "< 25 %" in _row(table, "patch rows: mean e^H / T")[-1]
    assert "measured on other weights" in table.header[-1]


def test_attention_tables_rank_the_stored_row_like_the_entropy_result(full):
    report = full.written.report
    section = report.section("attention")
    image = report.follow
    for store, label in ((full.dino, report.stores[0]), (full.selfpatch, report.stores[1])):
        weights = stored(store, "attention_224", image).astype(np.float64)  # float16 values, exactly
        start = 1 if cache.manifest(store)["arch"]["class_token"] else 0
        table = _table(section, f"{label}: row of patch {PATCH}")
        saved = cache.load_results(store, "entropy")
        index = [str(i) for i in saved.image.values].index(image)
        for head in range(weights.shape[0]):
            row = weights[head, start + PATCH]
            plain = [k - start for k in plain_rank(row, list(range(row.size)), 5)]
            shown = [-1 if p.startswith("[CLS]") else int(p.split(":")[0]) for p in _row(table, str(head))[3].split(", ")]
            assert shown == plain == [int(k) for k in saved.detail_key.values[index, head]]
    # the class token's row of the network that has one, and the course's reference beside it
    assert any(isinstance(b, Table) and "class token's row" in b.caption for b in section.blocks)
    assert "63, 49, 35, 33, 47" in _text(section)


def test_neighbour_table_matches_a_plain_window_and_ranking(full):
    report = full.written.report
    table = _table(report.section("neighbour-map"), f"Anchor {PATCH}")
    for store, label in ((full.dino, report.stores[0]), (full.selfpatch, report.stores[1])):
        sim = plain_cosine(stored(store, "tokens_224", report.follow))
        window = plain_window(14, PATCH)
        row = _row(table, label)
        assert row[1] == ", ".join(map(str, window))
        assert [int(p.split(":")[0]) for p in row[2].split(", ")] == plain_rank(sim[PATCH], window, 4)
        others = [j for j in range(196) if j != PATCH]
        top8 = plain_rank(sim[PATCH], others, 8)
        assert [int(p.split(":")[0].rstrip("*")) for p in row[3].split(", ")] == top8
        assert row[4] == f"{len(set(top8) & set(window))} of 8"


def test_premise_and_scores_carry_their_references_and_ledger_entries(full):
    report = full.written.report
    premise = _table(report.section("premise"), "neighbours_g14:")
    assert "43.6 %" in _row(premise, "top 8 most similar inside the window")[-1]
    assert "2.65" in premise.rows[1][-1] and "58.7 %" in _row(premise, "top 4 most similar inside the window")[-1]
    saved = cache.load_results(full.dino, "neighbours_g14")
    mean = float(saved.summary_mean.sel(statistic="top_in_window"))
    assert _row(premise, "top 8 most similar inside the window")[1].startswith(f"{100 * mean:.1f} %")

    scores = report.section("scores")
    table = _table(scores, "Panel scenes (val)")
    saved = cache.load_results(full.dino, "scores_scenes")
    assert _row(table, "CorLoc")[1] == f"{100 * float(saved.corloc):.2f} %"
    assert "TokenCut, DINO ViT-S/16: 68.8 (VOC07 trainval), 72.1 (VOC12 trainval), 58.8 (COCO20k) [TokenCut README [R]]" in _row(table, "CorLoc")[-1]
    assert "measured on other weights" in table.header[-1]
    entries = {e.id: e for e in ledger.entries(full.cache)}
    provenance = _table(scores, "Where the scores on scenes came from")
    entry = entries[saved.attrs["ledger_entry"]]
    assert f"entry {entry.n} ({entry.id[:12]})" in _row(provenance, report.stores[0])[1]
    assert "chain intact" in _text(scores)
    assert "★ tokencut" in _text(scores)  # the sweep's chosen setting

    linear = _text(report.section("linear"))
    saved = cache.load_results(full.dino, "linear_patch")
    for role in ("train", "val"):
        assert f"({saved.attrs['ledger'][role][:12]})" in linear
    assert "patch mIoU" in linear and "mAP (categories present)" in linear


def test_training_section_reads_the_run_folder(full):
    section = full.written.report.section("training")
    table = _table(section, "Runs of training/")
    row = _row(table, full.written.report.stores[2])
    logged = [json.loads(line) for line in (full.run_dir / "log.jsonl").read_text().splitlines()[:-1]]
    manifest = json.loads((full.run_dir / "manifest.json").read_text())
    assert row[1] == str(full.run_dir) and row[2] == manifest["run"] and row[3] == manifest["rule"]
    assert row[5] == str(len(logged)) and row[7] == f"{logged[-1]['loss']:.4f}"  # the line cut by a crash is skipped
    assert any(f.name.endswith("training-curves.png") for f in section.figures())


# ----------------------------------------------------------------------------------------------
# the explorer's data and the page


def test_explorer_data_is_exact_up_to_half_a_quantisation_step(bare):
    data = _explorer(bare.written.html.read_text())
    assert data["grid"] == 14 and data["patch"] == PATCH and data["picture"].startswith("data:image/png;base64,")
    window = np.frombuffer(base64.b64decode(data["window"]), np.uint8).reshape(196, 8)
    assert all(sorted(window[a].tolist()) == plain_window(14, a) for a in (0, 13, PATCH, 195))
    for entry, store in zip(data["stores"], (bare.stores["dino"], bare.stores["selfpatch"])):
        weights = stored(store, "attention_224", data["image"]).astype(np.float64)
        heads, t = entry["heads"], entry["tokens"]
        assert entry["classToken"] == (t == 197) and (heads, t) == weights.shape[:2]
        q = np.frombuffer(base64.b64decode(entry["attention"]), np.uint8).reshape(heads, t, t)
        top = np.asarray(entry["rowMax"]).reshape(heads, t)
        assert np.abs(q / 255.0 * top[..., None] - weights).max() <= (top[..., None] / 510.0 * 1.001 + 1e-6).max()
        sim = plain_cosine(stored(store, "tokens_224", data["image"]))
        cos = np.frombuffer(base64.b64decode(entry["cosine"]), np.uint8).reshape(196, 196) / 127.5 - 1.0
        assert np.abs(cos - sim).max() <= 1 / 255 + 1e-6
        ranked = np.frombuffer(base64.b64decode(entry["top"]), np.uint8).reshape(heads, t, 5)
        start = t - 196
        for head in range(heads):
            keys = [k - start for k in plain_rank(weights[head, start + 7], list(range(t)), 5)]
            assert [(-1 if k == 255 else int(k)) for k in ranked[head, start + 7]] == keys
    # about two bytes of base64 per stored weight: compact
    assert len(bare.written.html.read_bytes()) < 4 * sum(e["heads"] * e["tokens"] ** 2 + 196 * 196 for e in data["stores"]) + 2_000_000


def test_the_page_fetches_nothing(bare):
    text = bare.written.html.read_text()
    assert 'http-equiv="Content-Security-Policy"' in text and "default-src 'none'" in text
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", text)
    assert "<link" not in text and "@import" not in text and "url(" not in text.replace("data:image", "")
    assert not re.search(r"https?://", text)


def test_missing_image_file_is_drawn_from_tokens(tiny_checkpoints, tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    from probe_toolkit.demo.samples import sample_photos

    shutil.copy(sample_photos() / "chelsea.jpg", folder / "cat.jpg")
    store = extract(tiny_checkpoints["selfpatch-full"], folder, settings=Settings(views=(224,), attention="last", chunk=1),
                    cache_dir=tmp_path / "cache", quiet=True, batch_size=1).store
    shutil.rmtree(folder)
    written = write_report([store], tmp_path / "r", patch=0)
    section = written.report.section("followed")
    assert section.present and "image file is gone" in _text(section) and "principal components" in _text(section)
    assert _explorer(written.html.read_text())["picture"].startswith("data:image/png")


# ----------------------------------------------------------------------------------------------
# writing and the command line


def test_write_replaces_its_own_files_and_leaves_the_rest(bare, monkeypatch, tmp_path):
    """The report owns report.md, report.html and figures/ in its folder: other files stay (probe demo
    keeps its cache beside its report); a failed write leaves the previous report and no temporary files."""
    stores = [bare.stores["dino"]]
    out = tmp_path / "r"
    (out / "work").mkdir(parents=True)
    (out / "work" / "keep.txt").write_text("the demo's cache")
    (out / "notes.md").write_text("mine")
    first = write_report(stores, out, patch=5)
    assert first.report.patch == 5 and "patch 5" in first.markdown.read_text()
    (out / "figures" / "99-stale.png").write_bytes(b"old")
    second = render_report(stores, out, patch=6)
    assert second == out / "report.html" and "patch 6" in (out / "report.md").read_text()
    assert not (out / "figures" / "99-stale.png").exists()  # the figures folder is the report's, replaced whole
    assert (out / "work" / "keep.txt").read_text() == "the demo's cache" and (out / "notes.md").read_text() == "mine"

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_html, "render", broken)
    with pytest.raises(RuntimeError):
        write_report(stores, out, patch=7)
    assert "patch 6" in (out / "report.md").read_text() and "patch 6" in (out / "report.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["figures", "notes.md", "report.html", "report.md", "work"]


def test_same_labels_are_made_unique(bare, tmp_path):
    twin = tmp_path / "elsewhere" / bare.stores["dino"].parent.name / bare.stores["dino"].name
    shutil.copytree(bare.stores["dino"], twin)
    written = write_report([bare.stores["dino"], twin], tmp_path / "r")
    assert written.report.stores[1] == written.report.stores[0] + " (2)"


def _main(args, capsys) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = ["probe", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_defaults_and_one_line_errors(bare, monkeypatch, tmp_path, capsys):
    dino, selfpatch = bare.stores["dino"], bare.stores["selfpatch"]
    monkeypatch.chdir(tmp_path)
    code, out, _ = _main(["report", dino, selfpatch, "--patch", 0, "--follow", "scenes/two.png"], capsys)
    name = default_name([dino, selfpatch])
    assert code == 0 and name in out and "sections present" in out
    folder = tmp_path / build.DEFAULT_ROOT / name
    assert (folder / "report.html").is_file() and (folder / "report.md").is_file()
    assert "followed image `scenes/two.png`, patch 0" in (folder / "report.md").read_text()
    code, _, err = _main(["report", dino, "--follow", "no-such.jpg"], capsys)
    assert code == 2 and "--follow" in err and "no-such.jpg" in err and len(err.strip().splitlines()) == 1
    code, _, err = _main(["report", dino, "--patch", 196], capsys)
    assert code == 2 and "--patch" in err and "0..195" in err
    code, _, err = _main(["report", tmp_path / "nothing.zarr"], capsys)
    assert code == 2 and "not a probe store" in err


def test_discovery_section_shows_saliency_scores_beside_tokencuts(full):
    """The saliency panel's scores as saved, in the discovery section, with the published line labelled."""
    from probe_toolkit.store import cache as store_cache

    saved = store_cache.load_results(full.selfpatch, "saliency_scenes-sal")
    text = _text(full.written.report.section("discovery"))
    assert f"{100 * float(saved['max_f'].values):.1f}" in text and f"{100 * float(saved['iou'].values):.1f}" in text
    assert saved.attrs["kind"] == "saliency" and "β² = 0.3" in text
