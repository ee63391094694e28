"""Issue 46, class 4: every table, figure caption and CSV row carries the settings that moved its
numbers, generated from the record's settings (``results/differ.py``), never per protocol.

The issue's case: DINOv3 decodes with ``--keys rope`` and ``--keys plain`` printed the same
settings text. Here both run on a tiny DINOv3 store; the report of each says which keys it read
(caption, CSV column), and ``probe results`` too. A registry-wide test shows that any setting of
any protocol, present or added later, is named when it differs.
"""

from __future__ import annotations

import csv
import dataclasses
import io

import pytest
from test_catalogue import probe

from probe_toolkit.demo.samples import TINY_DINOV3, write_checkpoint
from probe_toolkit.infra.settings import declared
from probe_toolkit.protocols import registry
from probe_toolkit.report import tables as report_tables
from probe_toolkit.results import records
from probe_toolkit.results.differ import columns, differing, differing_text, row
from probe_toolkit.store.extract import Settings, extract


@pytest.mark.parametrize("protocol", [p.name for p in registry.protocols()])
def test_any_setting_of_any_protocol_is_named_when_it_differs(protocol):
    settings = registry.get(protocol).settings
    base = settings().as_dict()
    # a setting that only picks what a figure shows (entropy's patch and image) moves no number: never named
    pickers = {f.name for f in dataclasses.fields(settings) if (d := declared(f)) is not None and not d.moves_numbers}
    assert differing({"protocol": protocol, "settings": base}) == {}
    for name in base:
        moved = dict(base, **{name: "SENTINEL"})
        assert differing_text({"protocol": protocol, "settings": moved}) == ("" if name in pickers else f"{name}=SENTINEL")


def test_a_setting_is_shown_as_its_declaration_spells_it():
    base = registry.get("hummingbird").settings().as_dict()
    assert differing_text({"protocol": "hummingbird", "settings": dict(base, memory=[1000, None])}) == "memory=1000,full"
    entropy = registry.get("entropy").settings().as_dict()
    assert differing({"protocol": "entropy", "settings": dict(entropy, patch=34, image="photos/chelsea.jpg")}) == {}


def test_block_and_facet_are_named_unless_the_default():
    meta = {"protocol": "entropy", "settings": registry.get("entropy").settings().as_dict(), "selection": {"block": 3, "facet": "keys", "last_block": 11}}
    assert differing(meta) == {"block": 3, "facet": "keys"}
    meta["selection"] = {"block": 11, "last_block": 11}
    assert differing(meta) == {}


def test_columns_and_rows_for_a_csv():
    plain = {"protocol": "decode", "settings": dict(registry.get("decode").settings().as_dict(), keys="plain")}
    rope = {"protocol": "decode", "settings": dict(plain["settings"], keys="rope", tau=0.3)}
    names = columns([plain, rope])
    assert names == ["keys", "tau"]
    assert row(plain, names) == ["plain", "None"] and row(rope, names) == ["rope", "0.3"]


@pytest.fixture(scope="module")
def dinov3(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("shown")
    checkpoint = write_checkpoint(root / "v3.pth", "dinov3-official", TINY_DINOV3, seed=4)
    store = extract(checkpoint, photos, settings=Settings(views=("480",), dtype="float32", chunk=4), store=root / "s.zarr", quiet=True, batch_size=4).store
    return root, store


def _decoder_tables(out) -> list[str]:
    text = (out / "report.md").read_text()
    return [line for line in text.splitlines() if "Settings other than the defaults" in line]


def test_rope_and_plain_decodes_say_which_keys_in_the_report_csv_and_results(dinov3):
    root, store = dinov3
    for keys in ("plain", "rope"):
        ran = probe("decode", store, "--preset", "tokencut", "--keys", keys, "--workers", "1", "--out", root / f"{keys}.json", "-q")
        assert ran.code == 0, ran.err
        out = root / f"report-{keys}"
        made = probe("report", store, "--out", out, "--cache", root / "cache")
        assert made.code == 0, made.err
        lines = _decoder_tables(out)
        assert lines and all("v3 (teacher): decode " in line and "preset=tokencut" in line for line in lines), lines
        assert all(("keys=rope" in line) == (keys == "rope") for line in lines), lines
        written = sorted((out / report_tables.FOLDER).glob("*.csv"))
        shown = [f for f in written if report_tables.SETTINGS_COLUMN in f.read_text().splitlines()[0]]
        assert shown, [f.name for f in written]
        for path in shown:
            for entry in csv.DictReader(io.StringIO(path.read_text())):
                assert "preset=tokencut" in entry[report_tables.SETTINGS_COLUMN]
                assert ("keys=rope" in entry[report_tables.SETTINGS_COLUMN]) == (keys == "rope")
    listed = probe("results", store, env={"COLUMNS": "300"})
    assert listed.code == 0 and "keys=rope" in listed.out and listed.out.count("keys=rope") == 1, listed.out
    found = records.runs(store, "decoder")
    assert [differing_text(r) for r in found] == ["preset=tokencut", "keys=rope, preset=tokencut"]
    assert all(r.meta["defaults"] == registry.get("decode").settings().as_dict() for r in found)  # what the run was measured against
    assert records.load(store, "decoder").attrs["record"]["defaults"]["keys"] == "plain"


def test_the_reports_captions_are_built_from_the_records_read(dinov3, tmp_path):
    root, store = dinov3
    from probe_toolkit.report.sections import gather

    report = gather([store])
    blocks = [b for s in report.sections for b in s.blocks if dataclasses.is_dataclass(b) and hasattr(b, "caption")]
    latest = records.find(store, "decoder")
    assert latest is not None and differing_text(latest)  # the latest decode ran with --preset tokencut --keys rope
    assert any("keys=rope" in b.caption for b in blocks)
