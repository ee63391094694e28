"""``probe report``: sections appear exactly when their results exist, the numbers shown are the
results' (checked against plain computations from the stored arrays), the explorer's data is
quantised within half a step, the page fetches nothing, and the write is atomic."""

from __future__ import annotations

import base64
import json
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from cli_runs import probe_main
from protocol_stores import protocol_results
from report_stores import bare_copies, invoke, plain_cosine, plain_rank, plain_window, saliency_panel, scenes_panels, stored, training_store

from probe_toolkit.labels import ledger
from probe_toolkit.report import build, default_name, render_report, write_report
from probe_toolkit.report import html as report_html
from probe_toolkit.report.content import Figure, Note, Table
from probe_toolkit.report.sources import shown_path
from probe_toolkit.results import records
from probe_toolkit.store import cache
from probe_toolkit.store.extract import Settings, extract

FROM_ARRAYS = {"manifests", "explorer", "followed", "attention", "neighbour-map", "token-pca", "references"}
FROM_RESULTS = {
    "entropy": "probe entropy",
    "premise": "probe neighbours",
    "decoder": "probe decode",
    "decoder-cuts": "probe decode",
    "scores": "probe decode",
    "linear": "probe linear",
    "training": "probe train",
    "discovery": "probe decode",
    "knn": "probe knn",
    "attention-masks": "probe attention-masks",
    "davis": "probe propagate",
    "correspond": "probe correspond",
    "hummingbird": "probe hummingbird",
    "linear-segmentation": "probe segment",
    "linear-depth": "probe depth",
    "blocks": "--blocks 3,7,11",
    "rank": "probe rank",
    "position": "probe position",
    "similarity": "probe similarity",
    "overcluster": "probe overcluster",
}
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
    invoke("entropy", dino, selfpatch, "--patch", PATCH, "--boot", 100, "-q")
    invoke("neighbours", dino, selfpatch, "--grid", 14, "--boot", 100, "-q")
    invoke("neighbours", dino, selfpatch, "--grid", 6, "--boot", 100, "-q")
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
    for store in (dino, selfpatch):  # the label-free protocols (selfpatch's network has no class token)
        invoke("rank", store, "--tokens", "patch", "--sizes", "64,256", "-q")
        invoke("position", store, "--held-out", "0.34", "--epochs", "2", "-q")
    invoke("similarity", dino, "--other", selfpatch, "--batch", "4", "-q")
    run, run_dir = training_store(image_dir, root)
    written = write_report([dino, selfpatch, run], root / "report", follow="scenes/one.png", patch=PATCH, cache_dir=cache_dir, formats="png")
    return SimpleNamespace(root=root, cache=cache_dir, dino=dino, selfpatch=selfpatch, run=run, run_dir=run_dir, written=written, image_dir=image_dir)


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
    # the per-block section names what it draws: rank and position draw their own per-block lines
    blocks_missing = next(b.text for b in report.section("blocks").blocks if isinstance(b, Note))
    assert "k-NN top-1, linear accuracy (patch)" in blocks_missing and "rank and position draw theirs in their own sections" in blocks_missing
    # the followed image defaults to the first image both stores hold; patch 34 of its grid
    assert report.follow == "astronaut.jpg" and report.patch == PATCH


def test_every_section_appears_once_its_results_exist(full):
    report = full.written.report
    assert all(s.present for s in report.sections), [s.key for s in report.sections if not s.present]
    labels = report.stores
    assert labels == ["dino-full (teacher)", "selfpatch-full (teacher)", "checkpoint (teacher)"]  # checkpoint and network, no folder hash
    # stores that lack a result get one line naming them and the command, inside a present section
    entropy = _text(report.section("entropy"))
    assert f"No attention entropy for {labels[2]}: run `probe entropy" in entropy
    assert f"No decoder masks for {labels[2]}" in _text(report.section("decoder"))
    assert f"{labels[0]}: the 480 view (480 × 480 px)" in _text(report.section("decoder"))  # the view the masks were cut on
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
        # per head, one number per cell: the same mean for each head alone
        per_head = _table(full.written.report.section("entropy"), "Per head")
        label = full.written.report.stores[column - 1]
        shown = {int(r[1]): float(r[2]) for r in per_head.rows if r[0] == label}
        want = np.exp(h[..., start:]).mean(-1).mean(0)
        assert sorted(shown) == list(range(len(want))) and all(shown[k] == pytest.approx(want[k], abs=0.06) for k in shown)
    assert len(table.header) == 3  # no unpublished reference column


def test_attention_tables_rank_the_stored_row_like_the_entropy_result(full):
    report = full.written.report
    section = report.section("attention")
    image = report.follow
    for store, label in ((full.dino, report.stores[0]), (full.selfpatch, report.stores[1])):
        weights = stored(store, "attention_224", image).astype(np.float64)  # float16 values, exactly
        start = 1 if cache.manifest(store)["arch"]["class_token"] else 0
        table = _table(section, f"{label}: row of patch {PATCH}")
        saved = records.load(store, "entropy")
        index = [str(i) for i in saved.image.values].index(image)
        for head in range(weights.shape[0]):
            row = weights[head, start + PATCH]
            plain = [k - start for k in plain_rank(row, list(range(row.size)), 5)]
            shown = [-1 if p.startswith("[CLS]") else int(p.split(":")[0]) for p in _row(table, str(head))[3].split(", ")]
            assert shown == plain == [int(k) for k in saved.detail_key.values[index, head]]
    # the class token's row of the network that has one
    assert any(isinstance(b, Table) and "class token's row" in b.caption for b in section.blocks)


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
    assert len(premise.header) == 3  # the two stores, no unpublished reference column
    saved = records.load(full.dino, "neighbours_g14")
    mean = float(saved.summary_mean.sel(statistic="top_in_window"))
    assert _row(premise, "top 8 most similar inside the window")[1].startswith(f"{100 * mean:.1f} %")

    scores = report.section("scores")
    table = _table(scores, "Panel scenes (val)")
    saved = records.load(full.dino, "scores_scenes")
    assert _row(table, "CorLoc")[1] == f"{100 * float(saved.corloc):.2f} %"
    # a 2-image synthetic panel at 480 px matches no published protocol and data: no reference beside it
    assert table.header == ["metric", *report.stores[:2]]
    published = _table(report.section("references"), "Published numbers")
    rows = [tuple(r) for r in published.rows]
    assert len(rows) == len(set(rows))  # no duplicate rows
    corloc = [r for r in published.rows if r[0] == "CorLoc (%)" and r[1] == "68.8"]
    assert len(corloc) == 1 and corloc[0][2] == "TokenCut" and corloc[0][-1] == "YangtaoWANG95/TokenCut README.md"
    assert [r[1] for r in published.rows if r[0].startswith("Jaccard")].count("45.9") == 1
    assert not any("_" in r[0] for r in published.rows)  # readable labels, not result keys
    entries = {e.id: e for e in ledger.entries(full.cache)}
    provenance = _table(scores, "Where the scores on scenes came from")
    entry = entries[saved.attrs["ledger_entry"]]
    assert f"entry {entry.n} ({entry.id[:12]})" in _row(provenance, report.stores[0])[1]
    assert "chain intact" in _text(scores)
    assert "★ tokencut" in _text(scores)  # the sweep's chosen setting

    linear = _text(report.section("linear"))
    saved = records.load(full.dino, "linear_patch")
    for role in ("train", "val"):
        assert f"({saved.attrs['ledger'][role][:12]})" in linear
    assert "patch mIoU" in linear and "mAP (categories present)" in linear


def test_training_section_reads_the_run_folder(full):
    section = full.written.report.section("training")
    table = _table(section, "Runs of training/")
    row = _row(table, full.written.report.stores[2])
    logged = [json.loads(line) for line in (full.run_dir / "log.jsonl").read_text().splitlines()[:-1]]
    manifest = json.loads((full.run_dir / "manifest.json").read_text())
    assert row[1] == shown_path(full.run_dir) and not row[1].startswith("/") and row[2] == manifest["run"] and row[3] == manifest["rule"]
    assert row[5] == str(len(logged)) and row[7] == f"{logged[-1]['loss']:.4f}"  # the line cut by a crash is skipped
    assert any(f.name.endswith("training-curves.png") for f in section.figures())


# ----------------------------------------------------------------------------------------------
# the explorer's data and the page


def test_explorer_data_is_exact_up_to_half_a_quantisation_step(bare):
    data = _explorer(bare.written.html.read_text())
    assert data["grid"] == [14, 14] and data["patch"] == PATCH and data["picture"].startswith("data:image/png;base64,")
    for entry, store in zip(data["stores"], (bare.stores["dino"], bare.stores["selfpatch"])):
        assert (entry["rows"], entry["cols"], entry["size"], entry["patch"], entry["indexBytes"]) == (14, 14, 16, PATCH, 1)
        window = np.frombuffer(base64.b64decode(entry["window"]), np.uint8).reshape(196, 8)
        assert all(sorted(window[a].tolist()) == plain_window(14, a) for a in (0, 13, PATCH, 195))
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
    store = extract(
        tiny_checkpoints["selfpatch-full"], folder, settings=Settings(views=(224,), attention="last", chunk=1), cache_dir=tmp_path / "cache", quiet=True, batch_size=1
    ).store
    shutil.rmtree(folder)
    written = write_report([store], tmp_path / "r", patch=0, formats="png")
    section = written.report.section("followed")
    assert section.present and "image file was not found" in _text(section) and "principal components" in _text(section)
    assert _explorer(written.html.read_text())["picture"].startswith("data:image/png")


# ----------------------------------------------------------------------------------------------
# writing and the command line


def test_write_replaces_its_own_files_and_leaves_the_rest(bare, monkeypatch, tmp_path):
    """The report replaces only the files its folder's manifest lists as probe's: files the user
    added (even inside figures/ and tables/) stay; a figure the report no longer writes goes; a
    failed write leaves the previous report and no temporary files."""
    import json

    from probe_toolkit.infra import owned
    from probe_toolkit.infra.errors import ProbeError

    stores = [bare.stores["dino"]]
    out = tmp_path / "r"
    first = write_report(stores, out, patch=5, formats="png,svg")
    assert first.report.patch == 5 and "patch 5" in first.markdown.read_text()
    svgs = sorted(p.name for p in (out / "figures").glob("*.svg"))
    assert svgs
    (out / "figures" / "fig1-my-result.jpg").write_bytes(b"mine")
    (out / "tables" / "t1.tex").write_text("my table")
    (out / "notes.md").write_text("mine")
    second = render_report(stores, out, patch=6, formats="png")
    assert second == out / "report.html" and "patch 6" in (out / "report.md").read_text()
    assert not list((out / "figures").glob("*.svg"))  # the report's own figures it no longer writes
    assert (out / "figures" / "fig1-my-result.jpg").read_bytes() == b"mine" and (out / "tables" / "t1.tex").read_text() == "my table"
    assert (out / "notes.md").read_text() == "mine"
    listed = json.loads((out / owned.MANIFEST).read_text())["files"]["report"]
    assert "report.md" in listed and "figures/fig1-my-result.jpg" not in listed and "notes.md" not in listed
    theirs = ("fig1-my-result.jpg", "t1.tex", "notes.md", owned.MANIFEST)
    assert sorted(listed) == sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name not in theirs)

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_html, "render", broken)
    with pytest.raises(RuntimeError):
        write_report(stores, out, patch=7, formats="png")
    assert "patch 6" in (out / "report.md").read_text() and "patch 6" in (out / "report.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == [owned.MANIFEST, "figures", "notes.md", "report.html", "report.md", "tables"]
    monkeypatch.undo()

    # a folder of the user's (no manifest) is refused whole, before any work, and left as it was
    mine = tmp_path / "mine"
    (mine / "figures").mkdir(parents=True)
    (mine / "figures" / "fig1-my-result.jpg").write_bytes(b"mine")
    (mine / "report.md").write_text("my own report")
    with pytest.raises(ProbeError, match=r"not probe's output folder.*pick a new out folder"):
        write_report(stores, mine, formats="png")
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == ["figures", "figures/fig1-my-result.jpg", "report.md"]
    assert (mine / "report.md").read_text() == "my own report"


def test_same_labels_are_made_unique(bare, tmp_path):
    twin = tmp_path / "elsewhere" / bare.stores["dino"].parent.name / bare.stores["dino"].name
    shutil.copytree(bare.stores["dino"], twin)
    written = write_report([bare.stores["dino"], twin], tmp_path / "r", formats="png")
    assert written.report.stores[1] == written.report.stores[0] + " (2)"


def _main(args, capsys) -> tuple[int, str, str]:
    code, captured = probe_main(args, capsys)
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

    saved = records.load(full.selfpatch, "saliency_scenes-sal")
    text = _text(full.written.report.section("discovery"))
    assert f"{100 * float(saved['max_f'].values):.1f}" in text and f"{100 * float(saved['iou'].values):.1f}" in text
    assert saved.attrs["kind"] == "saliency" and "β² = 0.3" in text


# ----------------------------------------------------------------------------------------------
# print output: vector figures, tables as CSV and LaTeX, legible text, one scale per figure


def test_every_figure_is_also_pdf_and_svg_and_every_table_csv_and_latex(bare):
    import csv

    from probe_toolkit.report import tables

    folder = bare.written.folder
    for png in bare.written.figures:
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
        assert b"<svg" in png.with_suffix(".svg").read_bytes()[:2000]
    named = tables.named_tables(bare.written.report)
    assert named and sorted(p.name for p in (folder / "tables").iterdir()) == sorted(f"{n}.{k}" for n, _ in named for k in ("csv", "tex"))
    for stem, table in named:
        with open(folder / "tables" / f"{stem}.csv", newline="", encoding="utf-8") as f:
            header, rows = tables.numeric(table)
            assert list(csv.reader(f)) == [header, *rows]
        tex = (folder / "tables" / f"{stem}.tex").read_text(encoding="utf-8")
        assert tex.count(r"\\") == 1 + len(table.rows) and r"\begin{tabular}" in tex
        body = tex.split(r"\begin{tabular}", 1)[1]
        assert "%" not in body.replace(r"\%", "") and "_" not in body.replace(r"\_", "")
    assert tables.latex_text("50 % of T_k, τ ≤ 0.2 & e^H") == r"50 \% of T\_k, $\tau$ $\leq$ 0.2 \& $e^H$"


def test_figures_are_legible_at_one_column_and_attention_shares_one_scale(full):
    from matplotlib.image import AxesImage

    from probe_toolkit.report import figures, figures_attention

    for section in full.written.report.sections:
        for f in section.figures():
            assert figures.smallest_text(f.png.figure) >= figures.MIN_PT - 1e-6, f.name
    section = full.written.report.section("attention")
    maps = [f for f in section.figures() if "attention-patch" in f.name]
    assert len(maps) == 3
    scales = {(im.norm.vmin, im.norm.vmax) for f in maps for im in f.png.figure.findobj(AxesImage)}
    assert len(scales) == 1 and next(iter(scales))[0] == 0.0  # every map of every store on one scale from 0
    # a uniform row is drawn uniform: one colour over the whole map
    row = np.full((2, 196), 1 / 196)
    drawn = figures_attention.attention_rows(row, np.zeros((2, 5), int), np.full(2, 196.0), 14, 34, "uniform", vmax=0.05)
    for im in drawn.figure.findobj(AxesImage):
        assert np.ptp(im.get_array()) < 1e-9 and im.norm.vmax == 0.05
    # histogram bins span the data, not 0..T
    bins = figures_attention.shared_bins([np.array([[195.1, 195.9]]), np.array([[195.5, 195.6]])])
    assert 195.0 < bins[0] < 195.1 and 195.9 < bins[-1] < 196.0


def test_decoder_cuts_show_the_saved_fiedler_vector_and_ground_truth(full):
    """The saved vector is TokenCut's: a plain dense generalized eigenproblem in float64 gives it."""
    import scipy.linalg

    saved = records.load(full.selfpatch, "decoder")
    keys = np.asarray(cache.open_store(full.selfpatch)["keys_480"].values[0], dtype=np.float64)
    keys = keys - keys.mean(0)  # the centred preset
    unit = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    w = np.where(unit @ unit.T > 0.2, 1.0, 1e-5)
    d = np.diag(w.sum(1))
    x = scipy.linalg.eigh(d - w, d, subset_by_index=[1, 1])[1][:, 0]
    x = x * np.sign(x[np.abs(x).argmax()])
    shown = saved["fiedler"].values[0].astype(np.float64)
    assert np.corrcoef(x, shown)[0, 1] > 0.999
    assert int(saved["seed"].values[0]) == int(np.abs(x).argmax())
    section = full.written.report.section("decoder-cuts")
    assert len(section.figures()) == 2 and "dashed: the objects of panel scenes" in section.figures()[0].caption
    reads = [e for e in ledger.entries(full.cache) if e.fields.get("purpose") == "report"]
    assert reads and {e.fields["panel"] for e in reads} == {"scenes"}


def _shown(figure) -> list[list[np.ndarray]]:
    """Per visible panel of a drawn figure, the arrays of its images in drawing order."""
    return [[np.asarray(im.get_array()) for im in ax.get_images()] for ax in figure.axes if ax.get_visible() and ax.get_images()]


def test_knn_grid_shows_the_saved_nearest_train_images(full):
    from probe_toolkit.store import images

    saved = records.load(full.dino, "knn")
    train, classes = [str(v) for v in saved.train_image.values], [str(v) for v in saved["class"].values]
    (grid,) = [f for f in full.written.report.section("knn").figures() if "knn-retrieval" in f.name]
    queries = [str(v) for v in saved.image.values[:3]]
    expected = []
    for q, query in enumerate(queries):
        ranked = [train[int(t)] for t in saved.neighbour.values[q]]
        assert len(ranked) == min(5, int(saved.k.values.max())) and len(set(ranked)) == len(ranked)
        part = f"{query} ({classes[int(saved.label.values[q])]}) → " + ", ".join(f"{n} ({float(s):.3f})" for n, s in zip(ranked, saved.similarity.values[q]))
        assert part in grid.caption
        expected += [query, *ranked]
    # each panel shows the 224 view of the file the caption names, query first
    drawn = _shown(grid.png.figure)
    assert len(drawn) == len(expected)
    for image_id, arrays in zip(expected, drawn):
        view = np.asarray(images.view(images.load_image(full.image_dir / image_id), 224))
        assert np.array_equal(arrays[0], view), image_id


def test_knn_neighbours_are_the_plain_cosine_ranking(full):
    """The saved top ranks are the most similar train images by a float64 cosine of the class
    tokens put through the checkpoint's final LayerNorm (torch's, here)."""
    import torch

    from probe_toolkit.store.checkpoints import load_checkpoint

    saved = records.load(full.dino, "knn")
    assert saved.attrs["feature"] == "cls-normed"
    ds = cache.open_store(full.dino)
    backbone = load_checkpoint(cache.manifest(ds)["checkpoint"]["path"]).backbone
    norm = torch.nn.LayerNorm(backbone["norm.weight"].shape[0], eps=1e-6)
    norm.load_state_dict({"weight": backbone["norm.weight"], "bias": backbone["norm.bias"]})

    def feats(ids):
        raw = torch.from_numpy(np.asarray(ds["cls_tokens_224"].sel(image=ids).values, np.float32))
        with torch.no_grad():
            x = norm(raw).numpy().astype(np.float64)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    train = [str(v) for v in saved.train_image.values]
    cos = feats([str(v) for v in saved.image.values]) @ feats(train).T
    for q in range(cos.shape[0]):
        order = sorted(range(len(train)), key=lambda t: (-round(cos[q, t], 5), t))[: saved.sizes["rank"]]
        assert [int(t) for t in saved.neighbour.values[q]] == order
        assert np.allclose(saved.similarity.values[q], cos[q, order], atol=1e-4)


def test_propagation_strip_shows_the_written_masks_beside_the_first_annotation(full):
    from pathlib import Path

    from PIL import Image

    saved = records.load(full.dino, "davis")
    out, davis = Path(saved.attrs["out"]) / "shapes", Path(saved.attrs["davis"])
    written = sorted(out.glob("*.png"))
    (strip,) = [f for f in full.written.report.section("davis").figures() if "davis-strip" in f.name]
    assert f"sequence shapes, frames {', '.join(p.stem for p in written)} of {len(written)}" in strip.caption
    assert shown_path(out) in strip.caption and str(out) not in strip.caption  # no path of the machine
    # the first PNG is the ground truth the command was given
    first = np.asarray(Image.open(davis / "Annotations" / "480p" / "shapes" / f"{written[0].stem}.png"))
    assert np.array_equal(np.asarray(Image.open(written[0])), first)
    panels = _shown(strip.png.figure)
    assert len(panels) == len(written)
    for png, (rgb, *overlays) in zip(written, panels):
        labels = np.asarray(Image.open(png))
        assert np.array_equal(rgb, np.asarray(Image.open(davis / "JPEGImages" / "480p" / "shapes" / f"{png.stem}.jpg").convert("RGB")))
        assert len(overlays) == len(np.unique(labels[labels > 0]))
        for n, fill in zip(sorted(np.unique(labels[labels > 0])), overlays):
            assert np.array_equal(fill[..., 3] > 0, labels == n)


def test_decoder_caption_names_each_runs_view():
    import xarray as xr

    from probe_toolkit.report.sections_decoder import _cut_on

    own = xr.Dataset({"grid_rows": ("image", np.array([3, 4]))}, attrs={"view": "native_crop", "size": "native_crop"})
    assert _cut_on(own) == "the native_crop view, a grid per image"
    assert _cut_on(xr.Dataset(attrs={"view": "480", "size": 480})) == "the 480 view (480 × 480 px)"


# ----------------------------------------------------------------------------------------------
# paper-ready: LaTeX that compiles, PDFs that render, honest axes, caveats, versions


def _tool(name: str, package: str) -> str:
    """The path of a Debian tool the check needs; absent, the test skips with the reason, except in
    CI (``CI`` or ``PROBE_REQUIRE_LATEX=1``, which .ci/run sets after installing it), where it fails."""
    import os

    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") or os.environ.get("PROBE_REQUIRE_LATEX") == "1":
            pytest.fail(f"{name} is absent; .ci/run installs Debian's {package}")
        pytest.skip(f"{name} is absent (Debian's {package}, which .ci/run installs)")
    return found


def _pages(pdf, out, prefix: str) -> list[np.ndarray]:
    """Every page of ``pdf`` rendered by poppler's pdftoppm at 40 dpi, as grey arrays."""
    import subprocess

    from PIL import Image

    subprocess.run([_tool("pdftoppm", "poppler-utils"), "-r", "40", "-png", str(pdf), str(out / prefix)], check=True, capture_output=True, timeout=120)
    pages = sorted(out.glob(f"{prefix}*.png"))
    assert pages, pdf
    return [np.asarray(Image.open(p).convert("L"), dtype=np.float64) for p in pages]


def _inked(page: np.ndarray) -> bool:
    """Not blank: some dark pixels (text, lines, pictures) on the page."""
    return float((page < 160).mean()) > 1e-4 and float(page.std()) > 1.0


def test_every_latex_table_compiles_with_pdflatex_and_every_page_renders(full, tmp_path):
    import subprocess

    pdflatex = _tool("pdflatex", "texlive-latex-base")
    texs = sorted((full.written.folder / "tables").glob("*.tex"))
    assert len(texs) > 10
    inputs = []
    for i, tex in enumerate(texs):
        text = tex.read_text(encoding="utf-8")
        assert text.isascii(), tex.name  # no raw β, τ or → for an engine without unicode set up
        (tmp_path / f"t{i:03d}.tex").write_text(text, encoding="ascii")
        inputs.append(rf"\noindent t{i:03d}\par\resizebox{{\linewidth}}{{!}}{{\input{{t{i:03d}.tex}}}}\par\bigskip")
    doc = tmp_path / "tables.tex"
    doc.write_text(
        "\n".join(
            [
                r"\documentclass{article}",
                r"\usepackage{graphicx}",
                r"\IfFileExists{booktabs.sty}{\usepackage{booktabs}}{\newcommand\toprule{\hline}\newcommand\midrule{\hline}\newcommand\bottomrule{\hline}}",
                r"\begin{document}",
                *inputs,
                r"\end{document}",
                "",
            ]
        ),
        encoding="ascii",
    )
    done = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "tables.tex"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    log = (tmp_path / "tables.log").read_text(errors="replace")
    assert done.returncode == 0, log[-3000:]
    assert "Missing character" not in log and "Undefined control sequence" not in log
    pages = _pages(tmp_path / "tables.pdf", tmp_path, "page")
    assert all(_inked(p) for p in pages), [i for i, p in enumerate(pages) if not _inked(p)]


def test_every_pdf_figure_renders_to_pages_that_are_not_blank(bare, tmp_path):
    pdfs = sorted((bare.written.folder / "figures").glob("*.pdf"))
    assert pdfs and len(pdfs) == len(bare.written.figures)
    for k, pdf in enumerate(pdfs):
        pages = _pages(pdf, tmp_path, f"f{k:02d}-")
        assert len(pages) == 1 and _inked(pages[0]), pdf.name


def test_entropy_per_block_shows_its_intervals_on_an_axis_from_zero_past_t(full):
    from matplotlib.collections import PolyCollection

    saved = records.load(full.dino, "entropy")
    (drawn,) = [f for f in full.written.report.section("entropy").figures() if "entropy-blocks" in f.name]
    ax = drawn.png.figure.axes[0]
    keys = int(saved.attrs["n_keys"])
    bottom, top = ax.get_ylim()
    assert bottom == 0 and top > keys  # not zoomed onto the lines: a 1 % difference looks like 1 %
    assert any(line.get_linestyle() == ":" and np.allclose(line.get_ydata(), keys) for line in ax.get_lines())
    # a plain percentile bootstrap over images of the per-image block values, with the result's own settings
    values = np.asarray(saved.block_patch_effective.values, dtype=np.float64)
    n = values.shape[0]
    picks = np.random.default_rng(int(saved.attrs["seed"])).integers(0, n, size=(int(saved.attrs["n_boot"]), n))
    means = values[picks].mean(axis=1)
    alpha = (1 - float(saved.attrs["level"])) / 2
    low, high = np.quantile(means, alpha, axis=0), np.quantile(means, 1 - alpha, axis=0)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == values.shape[2]
    for h, band in enumerate(bands):
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        assert np.isclose(ys.min(), low[:, h].min()) and np.isclose(ys.max(), high[:, h].max())
    assert "bootstrap interval" in drawn.caption and "from 0" in drawn.caption


def test_training_figure_says_why_the_total_loss_is_below_the_patch_loss(full):
    weight = json.loads((full.run_dir / "config.json").read_text())["rule"]["weight"]
    (drawn,) = [f for f in full.written.report.section("training").figures() if "training-curves" in f.name]
    assert "L = L_global + λ·L_patch" in drawn.caption and f"λ = {weight:g}" in drawn.caption and "below the patch loss" in drawn.caption


def test_random_weights_and_the_synthetic_video_are_said_where_they_are_shown(full):
    report = full.written.report
    dino = report.stores[0]
    for key in ("entropy", "knn", "attention-masks", "linear", "davis"):
        first = report.section(key).blocks[0]
        assert isinstance(first, Note) and first.kind == "caveat", key
        assert f"{dino} — random weights made by probe (dino-full" in first.text, key
    assert "'s J&F — a synthetic DAVIS folder drawn by probe" in report.section("davis").blocks[0].text
    # the trained store is not said to be random (its checkpoint carries no marker)
    caveats = [b.text for b in report.section("training").blocks if isinstance(b, Note) and b.kind == "caveat"]
    assert not any(f"{report.stores[2]} — random" in text for text in caveats)


def test_freshness_says_the_stores_shared_their_images(full):
    section = full.written.report.section("freshness")
    notes = [b.text for b in section.blocks if isinstance(b, Note)]
    same = next(n for n in notes if n.startswith("Measured on the same images in every store that has them:"))
    n = len(cache.open_store(full.dino).image.values)
    assert f"entropy ({n} images)" in same and f"neighbours_g14 ({n} images)" in same
    assert not any(n.startswith("entropy: the stores were measured on different image sets") for n in notes)
    table = _table(section, "latest record")
    from probe_toolkit import __version__

    assert table.header[3] == "probe" and all(row[3] == __version__ for row in table.rows if row[2] != "before records")


def test_the_report_and_its_figures_name_probes_version(bare):
    from probe_toolkit import __version__

    assert f"by probe {__version__} (git " in bare.written.markdown.read_text().split("\n\n")[1]
    assert f"by probe {__version__} (git " in bare.written.html.read_text()
    pdf = next((bare.written.folder / "figures").glob("*.pdf")).read_bytes()
    assert f"probe {__version__}".encode() in pdf


def test_every_record_names_probes_version(full):
    """Run records, the decoder's masks record and every ledger entry name the probe that wrote them."""
    from probe_toolkit import __version__

    for store in (full.dino, full.selfpatch):
        found = sorted((store / "results").glob("*/*/record.json"))
        assert found and all(json.loads(p.read_text())["toolkit_version"] == __version__ for p in found)
        meta = json.loads((store / "results" / "decoder-masks.meta.json").read_text())
        assert meta["toolkit_version"] == __version__ and meta["git_revision"]
    entries = ledger.entries(full.cache)
    assert entries and all(e.fields["toolkit_version"] == __version__ for e in entries)
