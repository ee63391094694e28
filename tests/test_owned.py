"""infra/owned.py: the output-folder rule every command shares (probe touches only what its manifest lists)."""

from __future__ import annotations

import json

import pytest

from probe_toolkit.infra import owned
from probe_toolkit.infra.errors import ProbeError


def _stage(root, files: dict[str, str]):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return list(files)


def test_a_new_or_empty_folder_is_taken_and_a_users_folder_refused(tmp_path):
    assert owned.claim(tmp_path / "new").groups == {}
    (tmp_path / "empty" / ".report.tmp-4194304").mkdir(parents=True)  # a killed run's temporary name only
    assert owned.claim(tmp_path / "empty").groups == {}
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "fig1-my-result.jpg").write_bytes(b"x")
    with pytest.raises(ProbeError, match=r"mine: is not empty and not probe's output folder.*'fig1-my-result.jpg'.*pick a new out folder, or empty this one"):
        owned.claim(tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ProbeError, match="is a file, not a folder"):
        owned.claim(tmp_path / "file")


def test_replace_moves_its_files_drops_its_stale_ones_and_never_touches_the_users(tmp_path):
    out = tmp_path / "out"
    first = _stage(tmp_path / "a", {"report.md": "1", "figures/01.png": "1", "figures/01.svg": "1"})
    owned.claim(out).replace("report", tmp_path / "a", first)
    (out / "figures" / "fig1-my-result.jpg").write_text("mine")
    second = _stage(tmp_path / "b", {"report.md": "2", "figures/01.png": "2"})
    owned.claim(out).replace("report", tmp_path / "b", second)
    assert (out / "report.md").read_text() == "2" and not (out / "figures" / "01.svg").exists()
    assert (out / "figures" / "fig1-my-result.jpg").read_text() == "mine"
    assert json.loads((out / owned.MANIFEST).read_text())["files"] == {"report": ["figures/01.png", "report.md"]}
    # a file of the user's where probe would write: refused, nothing moved
    (out / "notes.md").write_text("mine")
    third = _stage(tmp_path / "c", {"report.md": "3", "notes.md": "probe's"})
    with pytest.raises(ProbeError, match=r"notes.md: is not a file probe wrote here"):
        owned.claim(out).replace("report", tmp_path / "c", third)
    assert (out / "notes.md").read_text() == "mine" and (out / "report.md").read_text() == "2"


def test_groups_are_kept_apart_and_a_folder_entry_covers_its_tree(tmp_path):
    out = tmp_path / "demo"
    owned.claim(out).adopt("demo", ["work/"])
    (out / "work" / "cache").mkdir(parents=True)
    (out / "work" / "cache" / "x").write_text("demo's")
    names = _stage(tmp_path / "s", {"report.md": "r"})
    output = owned.claim(out)
    assert output.owns("work/cache/x") and not output.owns("workshop.txt")
    output.replace("report", tmp_path / "s", names)
    assert (out / "work" / "cache" / "x").read_text() == "demo's"  # the report's replace leaves the demo's files
    assert set(json.loads((out / owned.MANIFEST).read_text())["files"]) == {"demo", "report"}
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / owned.MANIFEST).write_text(json.dumps({"kind": "probe-output", "files": {"report": []}}))
    (tmp_path / "users" / "work").mkdir()
    with pytest.raises(ProbeError, match="work: is not a file probe wrote here"):
        owned.claim(tmp_path / "users").adopt("demo", ["work/"])


@pytest.mark.parametrize("text", ["{", json.dumps({"kind": "other", "files": {}}), json.dumps({"kind": "probe-output", "files": {"r": ["../../etc/passwd"]}})])
def test_a_manifest_probe_did_not_write_is_refused(tmp_path, text):
    (tmp_path / owned.MANIFEST).write_text(text)
    with pytest.raises(ProbeError, match=r"\.probe-output\.json: (is not a manifest probe wrote|lists '\.\./\.\./etc/passwd', outside its folder)"):
        owned.claim(tmp_path)


def test_single_files_and_the_same_file_under_other_names(tmp_path):
    path = tmp_path / "c.pth"
    assert owned.refuse_existing(path, force=False) == path
    path.write_text("x")
    with pytest.raises(ProbeError, match=r"c.pth: already exists; pass --force"):
        owned.refuse_existing(path, force=False)
    assert owned.refuse_existing(path, force=True) == path
    (tmp_path / "link.pth").symlink_to(path)
    (tmp_path / "sub").mkdir()
    assert owned.same_file(path, tmp_path / "link.pth") and owned.same_file(path, tmp_path / "sub" / ".." / "c.pth")
    assert not owned.same_file(path, tmp_path / "other.pth")


def test_the_folder_and_the_summary_are_named_per_caller(tmp_path):
    """The Python API names the keyword (``out``, ``json_path``), the command line its flag."""
    from probe_toolkit.cli import flagged

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("mine")
    with pytest.raises(ProbeError) as caught:
        owned.claim(tmp_path / "mine")
    assert caught.value.line().endswith("pick a new out folder, or empty this one") and flagged(caught.value).endswith("pick a new --out folder, or empty this one")
    with pytest.raises(ProbeError) as caught:
        owned.check_output_file(tmp_path / "mine", "json_path")
    assert caught.value.line().endswith("(json_path); pass json_path a file path") and flagged(caught.value).endswith("(--json); pass --json a file path")
