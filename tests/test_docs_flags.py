"""The docs name only options the parser has: every --flag on a page exists, and one written after
`probe COMMAND` is that command's; option tables come from the parser itself."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import gen_pages  # noqa: E402

# flags of other programs a page quotes: pip / uv (installing), mkdocs, torchrun, LOST's and DSM's own scripts
OTHER_PROGRAMS = {
    "--index-url",
    "--torch-backend",  # uv pip install's (docs/getting-started.md, the CPU-only set)
    "--extra",
    "--upgrade",
    "--upgrade-package",
    "--python-version",
    "--python-platform",
    "--strict",
    "--nproc",
    "--no",
    "--eigenseg",
    "--help",
    "--folder",  # benchmarks/hummingbird_cpu.py's (docs/scaling.md)
    "--compare",
}
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


@pytest.fixture(scope="module")
def parsed():
    return gen_pages.parser_commands()


@pytest.fixture(scope="module")
def pages():
    """Every page a reader sees (history.md keeps the benchmark flags of its day, dated, and is left out)."""
    found = {str(p.relative_to(ROOT)): p.read_text() for p in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"] if p.name != "history.md"}
    found.update({f"(generated) {k}": v for k, v in gen_pages.pages().items()})
    return found


def test_every_flag_a_page_names_exists(parsed, pages):
    """A flag written as code (`--flag`, or at the start of a code span) is probe's; the flags of reference scripts a
    page quotes in prose (RADIO's --num-epochs) are theirs."""
    known = set().union(*(gen_pages.parser_flags(c) for c in parsed.values()))
    spans = {name: " ".join(re.findall(r"`([^`\n]+)`", text)) for name, text in pages.items()}
    missing = sorted({(flag, name) for name, text in spans.items() for flag in FLAG.findall(text) if flag not in known | OTHER_PROGRAMS})
    assert not missing


def test_a_flag_after_probe_command_is_that_commands(parsed, pages):
    wrong = []
    for name, text in pages.items():
        for line in text.splitlines():
            for m in re.finditer(r"(?<![\w/.-])probe ([a-z][a-z-]*(?: [a-z][a-z-]*)?)", line):
                words = m[1].split()
                command = next((c for c in (" ".join(words[:2]), words[0]) if c in parsed), None)
                if command is None:
                    continue
                said = re.split(r"`|\||;|&&|#|\)|,(?= )", line[m.end() :])[0]  # up to the end of the command as written
                wrong += [(name, command, flag) for flag in FLAG.findall(said) if flag not in gen_pages.parser_flags(parsed[command]) | {"--help"}]
    assert not wrong


def test_option_tables_come_from_the_parser(parsed):
    page = gen_pages.options_page()
    for command_name, command in parsed.items():
        assert f"## `probe {command_name}`" in page
        for flags, _, _ in gen_pages.parser_options(command):
            assert f"`{flags}`" in page
    hummingbird = gen_pages.pages()["protocols/hummingbird.md"]
    # a setting's flag column is the parser's: hummingbird's figure_images has had --figure-images since the run context
    # gave it an option (before, the page named a flag the command lacked)
    spelled = "`--figure-images`" if "--figure-images" in gen_pages.parser_flags(parsed["hummingbird"]) else "(Python only)"
    assert f"| `figure_images` | {spelled} |" in hummingbird
    placement = next(line for line in hummingbird.splitlines() if line.startswith("Placement"))
    assert "`threads`" not in placement and "`shard`" in placement


def test_decode_sweeps_stated_count_is_the_grids():
    import dataclasses

    from probe_toolkit.commands.decode_sweep import load_grid
    from probe_toolkit.infra.settings import declared
    from probe_toolkit.protocols.registry import get

    count = len(load_grid(None))
    grid = next(f for f in dataclasses.fields(get("decode-sweep").settings) if f.name == "grid")  # --grid's help: declared on the setting
    assert f"default {count} settings" in declared(grid).help
    assert f"default {count}:" in (ROOT / "docs" / "commands" / "decode.md").read_text()
