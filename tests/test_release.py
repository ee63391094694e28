"""The version is declared once and moves with the changelog."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from probe_toolkit import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_the_changelog_names_the_version_being_made():
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings, "CHANGELOG.md has no release heading"
    newest, rest = headings[0]
    released = re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    # a development version (0.2.0.dev0) is the unreleased heading's; a release's heading carries a date
    assert newest == re.sub(r"\.dev\d+$", "", __version__)
    assert ("unreleased" in rest) == (not released)


def test_pyproject_reads_the_version_from_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "probe_toolkit._version.__version__"}
