"""Panels, the one function that opens annotation files, and the ledger's hash chain."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest
from decoder_scenes import Scene, write_panel
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import guard, ledger, matching, panels

runner = CliRunner()


@pytest.fixture
def panel_files(tmp_path):
    scenes = [Scene("a.png", 40, 40, [(2, 5, 2, 6)]), Scene("sub/b.png", 40, 60, [(1, 4, 3, 8)])]
    (tmp_path / "p" / "images" / "sub").mkdir(parents=True)
    return write_panel(tmp_path / "p", scenes, grid=10)


def test_registry_round_trips_and_never_opens_the_annotations(tmp_path, panel_files):
    annotations, images = panel_files
    root = tmp_path / "cache"
    with guard.forbid_label_reads([annotations]):
        panels.add_panel("val-1", annotations, images, "val", cache=root)
        odd = tmp_path / 'we"ird ü\\dir'
        odd.mkdir()
        for name in ("a.png", "sub/b.png"):  # every image the annotations name (checked when a panel is added)
            (odd / name).parent.mkdir(parents=True, exist_ok=True)
            (odd / name).write_bytes((images / name).read_bytes())
        panels.add_panel("held_out", annotations, odd, "test", cache=root)
        listed = panels.list_panels(root)
        assert panels.panel_images("val-1", root) == images.resolve()
    assert [p.name for p in listed] == ["held_out", "val-1"]
    assert listed[0].sealed and not listed[1].sealed and listed[0].images == odd.resolve()
    data = tomllib.loads((root / "panels.toml").read_text())
    assert data["val-1"]["role"] == "val" and data["held_out"]["images"] == str(odd.resolve())
    with pytest.raises(ProbeError, match="already has"):
        panels.add_panel("val-1", annotations, images, "train", cache=root)
    assert panels.add_panel("val-1", annotations, images, "train", cache=root, replace=True).role == "train"
    for name, role in (("bad name", "val"), ("ok", "holdout")):
        with pytest.raises(ProbeError):
            panels.add_panel(name, annotations, images, role, cache=root)
    with pytest.raises(ProbeError, match="no panel"):
        panels.get_panel("missing", root)


def test_read_labels_writes_the_ledger_before_returning(tmp_path, panel_files):
    annotations, images = panel_files
    root = tmp_path / "cache"
    panels.add_panel("v", annotations, images, "val", cache=root)
    read = panels.read_labels("v", purpose="score", checkpoint="c" * 64, images=["a.png", "other.png"], cache=root, command="probe test")
    assert read.image_map == {"a.png": 101}
    assert read.coco.getImgIds() == [101] and len(read.coco.getAnnIds()) == 1
    lines = (root / "ledger.jsonl").read_bytes().splitlines()
    assert len(lines) == 1 and read.entry_id == hashlib.sha256(lines[0]).hexdigest()
    entry = json.loads(lines[0])
    assert entry["annotation_sha256"] == hashlib.sha256(annotations.read_bytes()).hexdigest()
    assert entry["images"] == 1 and entry["purpose"] == "score" and entry["checkpoint"] == "c" * 64
    assert entry["command"] == "probe test" and entry["prev"] == ledger.ZERO and entry["n"] == 1 and entry["unseal"] is None
    whole = panels.read_labels("v", purpose="probe", cache=root)
    assert whole.entry["images"] == 2 and whole.entry["prev"] == hashlib.sha256(lines[0]).hexdigest()
    assert ledger.verify(root) == []


def test_a_sealed_test_panel_needs_an_unseal_reason(tmp_path, panel_files):
    annotations, images = panel_files
    root = tmp_path / "cache"
    panels.add_panel("t", annotations, images, "test", cache=root)
    with guard.forbid_label_reads([annotations]):
        for reason in (None, "  "):
            with pytest.raises(ProbeError, match="sealed"):
                panels.read_labels("t", purpose="score", unseal=reason, cache=root)
    assert not (root / "ledger.jsonl").exists()
    read = panels.read_labels("t", purpose="score", unseal="final numbers for the thesis", cache=root)
    assert read.entry["unseal"] == "final numbers for the thesis" and read.entry["role"] == "test"


def test_store_ids_match_file_names():
    names = {1: "a.jpg", 2: "val2017/b.jpg", 3: "x/c.jpg", 4: "y/c.jpg"}
    assert matching.match_images(["a.jpg", "./b.jpg", "q/val2017/b.jpg", "zzz.jpg"][:2], names) == {"a.jpg": 1, "./b.jpg": 2}
    assert matching.match_images(["photos/a.jpg", "x/c.jpg"], names) == {"photos/a.jpg": 1, "x/c.jpg": 3}
    with pytest.raises(ProbeError, match="several"):
        matching.match_images(["c.jpg"], names)


def _ledger_with(root: Path, n: int) -> list[bytes]:
    for i in range(n):
        ledger.append(root, {"time": f"t{i}", "panel": "v", "purpose": f"p{i}"})
    return (root / "ledger.jsonl").read_bytes().splitlines()


def _write(root: Path, lines: list[bytes]) -> None:
    (root / "ledger.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))


def _lines_named(root: Path) -> list[int]:
    return sorted({p.line for p in ledger.verify(root)})


def test_ledger_detects_edits_inserts_and_deletes_and_names_the_line(tmp_path):
    root = tmp_path / "c"
    lines = _ledger_with(root, 5)
    assert ledger.verify(root) == []

    edited = list(lines)
    edited[2] = edited[2].replace(b'"p2"', b'"p9"')  # line 3 edited by hand
    _write(root, edited)
    assert 3 in _lines_named(root)

    forged = json.loads(lines[2])  # line 3 edited and its own hash recomputed
    forged["purpose"] = "p9"
    forged["hash"] = ledger.self_hash(forged)
    _write(root, lines[:2] + [ledger.canonical(forged)] + lines[3:])
    assert _lines_named(root) == [3]

    _write(root, lines[:2] + [lines[1]] + lines[2:])  # a copy inserted as line 3
    assert 3 in _lines_named(root)

    _write(root, lines[:1] + lines[2:])  # line 2 deleted
    problems = ledger.verify(root)
    assert any(p.line == 2 and "deleted" in p.message for p in problems)

    _write(root, lines[:4])  # the last line deleted
    assert any("deleted" in p.message and p.line == 5 for p in ledger.verify(root))

    last = json.loads(lines[4])  # the last line edited, own hash recomputed
    last["purpose"] = "zz"
    last["hash"] = ledger.self_hash(last)
    _write(root, lines[:4] + [ledger.canonical(last)])
    assert _lines_named(root) == [5]

    _write(root, lines)
    assert ledger.verify(root) == []


def test_ledger_cli_show_and_verify(tmp_path):
    root = tmp_path / "c"
    lines = _ledger_with(root, 3)
    ok = runner.invoke(app, ["ledger", "verify", "--cache", str(root)])
    assert ok.exit_code == 0 and "3 entries" in ok.output
    shown = runner.invoke(app, ["ledger", "show", "--cache", str(root)])
    assert shown.exit_code == 0 and "p2" in shown.output
    _write(root, [lines[0], lines[2]])
    bad = runner.invoke(app, ["ledger", "verify", "--cache", str(root)])
    assert bad.exit_code == 1 and "line 2" in bad.output


def test_the_guard_catches_any_other_open_of_an_annotation_file(tmp_path, panel_files):
    annotations, images = panel_files
    root = tmp_path / "cache"
    panels.add_panel("v", annotations, images, "val", cache=root)
    with guard.forbid_label_reads([annotations]) as opened:
        for sneak in (lambda: open(annotations).read(), lambda: annotations.read_text(), lambda: json.load(annotations.open()), lambda: annotations.read_bytes()):
            with pytest.raises(ProbeError, match="outside panels.read_labels"):
                sneak()
        panels.read_labels("v", purpose="score", cache=root)
    assert opened == [str(annotations.resolve())]


def test_no_other_module_reads_annotation_paths():
    """Static half of the rule: only panels.read_labels touches ``Panel.annotations`` contents, and
    schema.checked when a panel is added (inside the guard, handing nothing out: issue 46's check
    field by field before the panel is registered)."""
    package = Path(panels.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        text = path.read_text()
        for needle in (".annotations.read", ".annotations.open", "open(panel.annotations", "COCO(panel", "json.load(open"):
            if needle in text and path.name not in ("panels.py", "schema.py"):
                offenders.append(f"{path.name}: {needle}")
    assert offenders == []
    source = Path(panels.__file__).read_text()
    assert source.count(".annotations.read_bytes()") == 1


def test_listed_names_and_printed_numbers_are_never_cut_at_80_columns(tmp_path, panel_files):
    """``panel list`` and ``ledger show`` keep each panel's name whole on its line (it is what every
    command takes), and a protocol's table too wide for 80 columns folds its cells where rich would
    cut them to "…" (a number shown as ``63.…``)."""
    from rich.console import Console
    from rich.table import Table

    from probe_toolkit.cli.app import whole

    annotations, images = panel_files
    root = tmp_path / "a-cache-folder-whose-path-is-long-enough-to-squeeze-every-column"
    names = ["voc07-trainval-discovery", "voc07-trainval-discovery-hard"]
    for name in names:
        panels.add_panel(name, annotations, images, "val", cache=root)
    listed = runner.invoke(app, ["panel", "list", "--cache", str(root)], env={"COLUMNS": "80"})
    assert listed.exit_code == 0 and "…" not in listed.output, listed.output
    for name in names:
        assert any(line.split("│")[1].strip() == name for line in listed.output.splitlines() if line.startswith("│ voc07")), listed.output
    wide = Table()
    wide.add_column("store")
    for k in range(12):
        wide.add_column(f"k={k}", justify="right")
    wide.add_row("a-long-store-name/teacher.zarr", *[f"{50 + 1.234 * k:.2f}" for k in range(12)])
    console = Console(width=80, record=True)
    console.print(whole(wide))
    text = console.export_text()
    assert "…" not in text and text.count("│") > 13
