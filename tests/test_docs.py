"""The documentation site: a generated page for every registered protocol, a README a newcomer
reads in two minutes whose links all land, every command two clicks from it, and a strict build."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import probe_main
from report_reader import absolute_paths

from probe_toolkit.protocols.registry import protocols

ROOT = Path(__file__).resolve().parents[1]
README_LINES = 250


def gen_pages():
    spec = importlib.util.spec_from_file_location("gen_pages", ROOT / "docs" / "gen_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_protocol_has_a_generated_page():
    pages = gen_pages().pages()
    for protocol in protocols():
        page = pages[f"protocols/{protocol.name}.md"]
        assert page.startswith(f"# `{protocol.name}`")
        assert protocol.summary in page
        for difference in protocol.difference_list():
            assert difference["what"] in page or difference["what"].replace("|", "\\|") in page, (protocol.name, difference["what"])
        for field in protocol.settings.__dataclass_fields__:
            assert f"| `{field}` |" in page, f"{protocol.name}: setting {field} missing from its page"
        for result in protocol.results:
            assert f"results/{result}/" in page
        for reference in protocol.references:
            assert reference.paper in page and reference.code in page
        assert f"[`{protocol.name}`]({protocol.name}.md)" in pages["protocols/index.md"]


def test_settings_table_reads_defaults_and_comments():
    from probe_toolkit.protocols.knn import KnnSettings

    rows = {row[0]: row for row in gen_pages().settings_rows(KnnSettings)}
    assert rows["ks"][1] == "--k"  # the CLI's one flag table
    assert rows["ks"][3] == "None" and "eval_knn.py" in rows["ks"][4] and "narrowed" in rows["ks"][4]
    assert rows["temperature"][3] == "0.07"


def test_views_page_lists_every_view():
    from probe_toolkit.store.views import FAMILIES, TABLE

    page = gen_pages().views_page()
    for view in TABLE:  # every name of before, as an alias of its family
        assert f"`{view.name}`" in page and view.reference in page
    for family in FAMILIES:
        assert f"`{family.name}@S`" in page if family.sized else f"`{family.name}`" in page


def test_benchmarks_page_comes_from_records_only(tmp_path):
    gen = gen_pages()
    empty = gen.benchmarks_page(tmp_path / "none")
    assert "None were recorded on this machine yet" in empty
    (tmp_path / "knn.jsonl").write_text(json.dumps({"benchmark": "knn", "ratio": 1.234, "cpu": "test-cpu"}) + "\n")
    page = gen.benchmarks_page(tmp_path)
    assert "## knn" in page and "1.234" in page and "test-cpu" in page and "knn.jsonl:1" in page
    assert "None were recorded" not in page


def test_the_results_page_is_what_probe_table_prints_from_the_kept_records(capsys, monkeypatch):
    """Each table of the results page is `probe table --format markdown` on the records under docs/data/records, shown
    under that very command; the kept records name no folder of the machine they were made on."""
    gen = gen_pages()
    page = gen.results_page()
    monkeypatch.chdir(ROOT)  # the page's command runs from a checkout's root
    for table in gen.RESULTS:
        code, printed = probe_main(table.arguments(), capsys)
        assert code == 0, printed.err
        assert printed.out == table.text()
        assert "| checkpoint |" in printed.out and all(f"| {label} |" in printed.out for label in table.stores)
        command = shlex.join(["probe", *table.arguments()])
        assert f"```bash\n{command}\n```\n\n{printed.out}" in page
    kept = list(gen.DATA.rglob("*.json"))
    assert kept
    for path in kept:
        assert absolute_paths(path.read_text(encoding="utf-8"), [ROOT, Path.home()]) == [], path


def test_readme_is_short_and_its_links_land():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the site"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []  # generated pages exist only in the built site: the README links to files


def test_every_command_is_two_clicks_from_the_readme():
    from probe_toolkit import cli

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/commands/index.md)" in readme
    manual = (ROOT / "docs" / "commands" / "index.md").read_text(encoding="utf-8")
    names = [c.name or c.callback.__name__.replace("_", "-") for c in cli.app.registered_commands]
    names += [g.name for g in cli.app.registered_groups]
    unlisted = [name for name in names if f"`probe {name}" not in manual]
    assert unlisted == []
    for target in re.findall(r"\]\(([\w.-]+\.md)\)", manual):
        assert (ROOT / "docs" / "commands" / target).is_file(), target


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="mkdocs and mkdocstrings are not installed (pip install -e '.[docs]')",
)
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING -" not in done.stderr
    for protocol in protocols():
        assert (site / "protocols" / protocol.name / "index.html").is_file()
    assert (site / "api" / "index.html").is_file() and (site / "benchmarks" / "index.html").is_file()


def test_architectures_table_lists_every_released_size():
    from probe_toolkit.store.architectures import RELEASED

    table = gen_pages().architectures_table()
    assert all(f"| `{name}` |" in table for name in RELEASED)
    assert "<!-- generated: architectures -->" in (ROOT / "docs" / "checkpoints.md").read_text(encoding="utf-8")


def test_dinov3_table_lists_every_size_in_every_layout_with_its_counts():
    """docs/checkpoints.md's DINOv3 table: each released size × layout, the S/16 counts from the layout's arithmetic."""
    from probe_toolkit.store.architectures import DINOV3_RELEASED

    table = gen_pages().dinov3_networks_table()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert len(rows) == 3 * len(DINOV3_RELEASED) and all(f"(`{name}`)" in table for name in DINOV3_RELEASED)
    d, depth, hidden, head_dim = 384, 12, 1536, 64
    block = 2 * 2 * d + (3 * d * d + 2 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d) + 2 * d  # norms, qkv (q, v bias), proj, MLP, LayerScale
    network = (3 * 16 * 16 * d + d) + d + 4 * d + depth * block + 2 * d  # patch embedding, class token, 4 storage tokens, blocks, norm
    assert network == 21_596_160  # DINOv3's README: ViT-S/16, 21 M
    official = network + d + head_dim // 4 + depth * (d + 3 * d)  # mask_token, RoPE periods, each block's zero key bias and bias_mask
    hf = network + d  # mask_token
    s16 = {r[4]: r for r in rows[:3]}
    assert rows[0][3] == f"{network:,}"
    assert s16["`dinov3-official`"][6] == f"{official:,}" and s16["`dinov3-timm`"][6] == f"{network:,}" and s16["`dinov3-hf`"][6] == f"{hf:,}"
    assert s16["`dinov3-official`"][5] == str(4 + depth * 15 + 2 + 2)  # cls, storage, mask, periods; 15 a block; patch embed; norm
    text = (ROOT / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    assert "<!-- generated: dinov3-networks -->" in text and "<!-- generated: dinov3-keys -->" in text


# ----------------------------------------------------------------------------------------------
# links: every relative link of the README and the site lands on a file and, with #, a heading


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (mkdocs' anchors): markup dropped, lower case, words joined by '-'."""
    text = re.sub(r"`|\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(text: str) -> set[str]:
    """The anchors a page has: its headings' slugs (the toc's -1, -2 suffixes for repeats) and {#id}s."""
    found: set[str] = set()
    body = re.sub(r"```.*?```", "", text, flags=re.S)  # a '#' inside a code block is no heading
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", body, flags=re.M):
        custom = re.search(r"\{\s*#([\w-]+)[^}]*\}\s*$", heading)
        if custom:
            found.add(custom.group(1))
            continue
        slug, n = _slug(heading), 1
        while slug in found:
            slug = f"{_slug(heading)}_{n}"
            n += 1
        found.add(slug)
    found |= set(re.findall(r'\bid="([\w-]+)"', body)) | set(re.findall(r"\{\s*#([\w-]+)", body))
    return found


def _site_pages() -> dict[Path, str]:
    """Every page of README.md and docs/, the generated ones included (they exist only in the built site)."""
    pages = {ROOT / "README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    pages |= {p: p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")}
    pages |= {ROOT / "docs" / name: text for name, text in gen_pages().pages().items()}
    return pages


def test_every_relative_link_and_anchor_lands():
    pages = _site_pages()
    broken = []
    for page, text in pages.items():
        body = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", body):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if path and not (where.exists() or where in pages):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and where.suffix == ".md":
                anchors = _anchors(pages.get(where) or where.read_text(encoding="utf-8"))
                if anchor not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor})")
    assert broken == []


def test_the_link_checker_sees_a_broken_link_and_anchor():
    assert _slug("The contract: registry → runner → records → report") == "the-contract-registry-runner-records-report"
    assert _slug("Decoding at scale: every core, a cluster, a GPU; sets too large to cache") == "decoding-at-scale-every-core-a-cluster-a-gpu-sets-too-large-to-cache"
    assert _anchors("# A\n\n## B `c`\n\n```\n# not\n```\n## Exit status {#exit}\n") == {"a", "b-c", "exit"}


def test_each_command_page_is_linked_beside_the_command_in_the_manual():
    """Two clicks: README → the manual → the page; the manual's row of a command links its page,
    and that page shows the command."""
    from probe_toolkit import cli

    manual_path = ROOT / "docs" / "commands" / "index.md"
    rows = [line for line in manual_path.read_text(encoding="utf-8").splitlines() if line.startswith("| `probe ")]
    names = [c.name or c.callback.__name__.replace("_", "-") for c in cli.app.registered_commands]
    names += [g.name for g in cli.app.registered_groups]
    for name in names:
        row = next((r for r in rows if re.search(rf"`probe {re.escape(name)}(?:[ `])", r)), None)
        assert row is not None, name
        targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", row)
        assert targets, name
        shown = [(manual_path.parent / t).resolve() for t in targets]
        assert any(p.is_file() and f"probe {name}" in p.read_text(encoding="utf-8") for p in shown), (name, targets)
