"""probe demo in its reduced mode: every stage runs offline and the report has every section."""

from __future__ import annotations

import sys
from pathlib import Path

from report_reader import absolute_paths, caption_claims, figures_of, outside_axes

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
        assert {"entropy", "neighbours_g14", "neighbours_g6", "decoder", "scores_demo-val", "saliency_demo-sal", "linear_patch", "linear_image"} <= set(
            records.results(store)
        )
    report = gather(demo.stores, follow="photos/chelsea.jpg", patch=34, cache_dir=out / "work" / "cache")
    absent = [s.key for s in report.sections if not s.present]
    assert not absent, f"sections without content: {absent}"
    read_as_a_reader(out, demo.stores, tmp_path, report)
    # the labels the demo read are all in the ledger, chain intact, and none of them is a test panel
    root = out / "work" / "cache"
    assert ledger.verify(root) == []
    entries = ledger.entries(root)
    assert entries and {e.fields["role"] for e in entries} <= {"train", "val"}
    davis = str((out / "work" / "davis").resolve())
    # demo-sal: the val scenes as saliency masks; davis: the synthetic video's first frames; demo-spair: keypoint pairs;
    # demo-seg-train, demo-seg-val: Hummingbird's VOC-layout scenes
    assert {e.fields["panel"] for e in entries} == {
        "demo-train",
        "demo-val",
        "demo-sal",
        f"davis:{davis}",
        "demo-spair",
        "demo-seg-train",
        "demo-seg-val",
        "demo-nyu-train",
        "demo-nyu-test",
        "demo-navi",
    }

    # the README's example blocks are what the commands print on this demo (tools/readme_examples.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import readme_examples

    readme = readme_examples.blocks(readme_examples.README.read_text(encoding="utf-8"))
    printed = readme_examples.examples(demo.stores, root)
    assert set(printed) <= set(readme)
    for name, text in printed.items():
        assert readme_examples.volatile(readme[name], name) == readme_examples.volatile(text, name), f"README example {name!r} differs: rerun tools/readme_examples.py"


def read_as_a_reader(out: Path, stores: list[Path], tmp_path: Path, report) -> None:
    """The demo's report read as its reader reads it (issue 47): no path of this machine, every record's images
    known, the panels found where the demo registered them, published rows shown, captions equal to the records,
    no figure element outside its axes."""
    text = (out / "report.md").read_text(encoding="utf-8")
    assert not absolute_paths(text, [tmp_path, Path.cwd(), Path.home()])
    assert "no record of its images" not in text  # every record written through probe.run says what it read
    assert "could not be read" not in text  # the panels are looked up in the demo's cache, not ./cache
    assert "DINO ViT-S/16, 512 px | 37.2 | 43.1 | 46.6" in text  # Hummingbird's published rows at their own memory sizes
    for store in stores:  # captions name the image counts the records hold
        for result, phrase in (("knn", "{train} ({n} images) → {val} ({m} images"), ("hummingbird", "→ {val} ({m} images)")):
            ds = records.load(store, result)
            counts, panels = ds.attrs["counts"], ds.attrs["panels"]
            assert phrase.format(train=panels["train"]["name"], val=panels["val"]["name"], n=counts["train"], m=counts["val"]) in text, (store, result)
    # every caption's image counts, k, view, block, panel and named settings against the records its section read
    claims = caption_claims(report)
    assert not claims, claims
    problems = [f"{name}: {problem}" for name, fig in figures_of(report) for problem in outside_axes(fig)]
    assert not problems
