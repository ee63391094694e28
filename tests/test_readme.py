"""The README's two commands are what CI runs, verbatim, in that order."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [block.strip() for block in blocks[:2]]


def test_readme_opens_with_two_commands():
    text = (ROOT / "README.md").read_text()
    setup, tests = readme_commands()
    assert "\n" not in setup and "\n" not in tests
    assert text.index(setup) < text.index(tests) < text.index("##")  # both before the guide
    assert "pip install -r requirements.lock -e '.[test]'" in setup and "probe demo" in setup  # the tested set, under the ranges
    assert "pytest" in tests


def test_ci_runs_the_readme_commands_verbatim():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    setup, tests = readme_commands()
    assert setup in ci and tests in ci
    assert ci.index(setup) < ci.index(tests)
    assert ci[-1] == tests  # the tests are the last thing CI does
