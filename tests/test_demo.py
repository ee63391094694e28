"""probe demo in its reduced mode: every stage runs offline and the report has every section."""

from __future__ import annotations

import sys
from pathlib import Path

from probe_toolkit.demo.run import run_demo
from probe_toolkit.labels import ledger
from probe_toolkit.report.sections import gather
from probe_toolkit.results import records
from probe_toolkit.store.cache import open_store


def test_demo_quick_produces_a_report_with_every_section(tmp_path):
    out = tmp_path / "demo"
    demo = run_demo(out, quick=True, quiet=True, say=lambda _: None, formats="png")
    assert demo.html is not None and demo.html.is_file() and (out / "report.md").is_file()
    assert len(demo.stores) == 2
    formats = sorted(open_store(s).attrs["manifest"]["checkpoint"]["format"] for s in demo.stores)
    assert formats == ["probe-training", "selfpatch-full"]  # trained by training/, and its random start
    for store in demo.stores:
        assert {"entropy", "neighbours_g14", "neighbours_g6", "decoder", "scores_demo-val", "saliency_demo-sal", "linear_patch",
                "linear_image"} <= set(records.results(store))
    report = gather(demo.stores, follow="photos/chelsea.jpg", patch=34, cache_dir=out / "work" / "cache")
    absent = [s.key for s in report.sections if not s.present]
    assert not absent, f"sections without content: {absent}"
    # the labels the demo read are all in the ledger, chain intact, and none of them is a test panel
    root = out / "work" / "cache"
    assert ledger.verify(root) == []
    entries = ledger.entries(root)
    assert entries and {e.fields["role"] for e in entries} <= {"train", "val"}
    davis = str((out / "work" / "davis").resolve())
    # demo-sal: the val scenes as saliency masks; davis: the synthetic video's first frames; demo-spair: keypoint pairs;
    # demo-seg-train, demo-seg-val: Hummingbird's VOC-layout scenes
    assert {e.fields["panel"] for e in entries} == {"demo-train", "demo-val", "demo-sal", f"davis:{davis}", "demo-spair", "demo-seg-train", "demo-seg-val"}

    # the README's example blocks are what the commands print on this demo (tools/readme_examples.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import readme_examples

    readme = readme_examples.blocks(readme_examples.README.read_text(encoding="utf-8"))
    printed = readme_examples.examples(demo.stores, root)
    assert set(printed) <= set(readme)
    for name, text in printed.items():
        assert readme_examples.volatile(readme[name], name) == readme_examples.volatile(text, name), f"README example {name!r} differs: rerun tools/readme_examples.py"
