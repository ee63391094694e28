"""Published numbers: a reference sits beside a score only when metric, protocol and data all
match, every number names its source, and the product text speaks no private vocabulary."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from probe_toolkit.report import references

ROOT = Path(__file__).resolve().parents[1]
VOC07 = references.Measurement("corloc", "tokencut", "native", "ViT-S/16", 5011, ("voc07-trainval",))


def test_a_reference_matches_only_the_same_metric_protocol_and_data():
    assert [r.value for r in references.beside(VOC07)] == [68.8]
    for change in (
        dict(statistic="bbox_AP50"),
        dict(preset="centred"),
        dict(view="480"),
        dict(arch="ViT-B/16"),
        dict(images=8),
        dict(names=("demo-val",)),
        dict(names=("voc070",)),
    ):
        assert references.beside(replace(VOC07, **change)) == [], change
    coco = replace(VOC07, images=19817, names=("coco20k",))
    assert [r.value for r in references.beside(coco)] == [58.8]


def test_every_reference_names_a_published_source_once():
    seen = set()
    for r in references.PUBLISHED:
        assert re.search(r"(^[\w.-]+/[\w.-]+ \S+\.\w+$)|(et al\., \w+ \d{4}, (Fig|Table)\. \d+)", r.source), r.source
        key = (r.statistic, r.value, r.protocol, r.data, r.note)
        assert key not in seen
        seen.add(key)
        assert r.label != r.statistic or "_" not in r.statistic
    assert references.elsewhere({references.PUBLISHED[0]}) == list(references.PUBLISHED[1:])


def test_product_text_has_no_private_vocabulary():
    """No "course", "thesis" or files outside the repository, in the toolkit, training and benchmarks."""
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "probe_toolkit").rglob("*.py")),
        *sorted((ROOT / "training").rglob("*.py")),
        *sorted((ROOT / "training").rglob("*.toml")),
        *sorted((ROOT / "benchmarks").rglob("*.py")),
    ]
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not re.search(r"course|thesis|shared/reference|reference/\w+\.md|seeds/|dog's nose|run 2's", line, re.I), f"{path.name}:{n}: {line.strip()}"


def test_an_unknown_figure_format_is_one_line_before_anything_is_read(tmp_path):
    import pytest

    from probe_toolkit.infra.errors import ProbeError
    from probe_toolkit.report import write_report
    from probe_toolkit.report.build import parse_formats

    assert parse_formats("pdf") == ("png", "pdf") and parse_formats(None) == ("png", "pdf", "svg")
    with pytest.raises(ProbeError) as error:
        write_report([tmp_path / "no-such.zarr"], tmp_path / "r", formats="png,eps")
    assert "--format" in error.value.line() and "eps" in error.value.line()
    assert not (tmp_path / "r").exists()
