"""probe table: one table from records alone, grouping only records measured alike (records written by the test)."""

from __future__ import annotations

import csv
import io
import json
import shutil

import numpy as np
import pytest
import xarray as xr
from cli_runs import probe_main

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.report import paper
from probe_toolkit.results import records
from probe_toolkit.store import completion
from probe_toolkit.store.extract import Settings, extract

KNN_DEFAULTS = {"ks": None, "temperature": 0.07, "feature": "auto"}
HBIRD_DEFAULTS = {"k": 30, "memory": None}


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory, image_dir):
    root = tmp_path_factory.mktemp("paper")
    stores = []
    for seed, name in enumerate(("alpha", "beta")):
        ckpt = write_checkpoint(root / f"{name}.pth", "dino-backbone", TINY, seed=seed)
        stores.append(extract(ckpt, image_dir, settings=Settings(views=(224,), attention="none", chunk=8), cache_dir=root / "cache", quiet=True).store)
    return stores


def knn_record(store, top1: dict[int, float], images: int = 40, digest: str = "aaaaaaaa11", **settings) -> None:
    ks = sorted(top1)
    ds = xr.Dataset({"top1": ("k", np.array([top1[k] for k in ks])), "top5": ("k", np.full(len(ks), np.nan))}, coords={"k": ks})
    context = records.RunStamp("knn", settings={**KNN_DEFAULTS, **settings}, inputs={"panel": "val"}, defaults=KNN_DEFAULTS)
    with records.opened(context):
        records.save(store, "knn", ds, {"computed_on": {"images": images, "images_sha256": digest, "scope": "panel"}})


def hbird_record(store, memory: list[int], miou: list[float]) -> None:
    ds = xr.Dataset({"miou": ("memory", np.array(miou)), "miou_hungarian": ("memory", np.array(miou))}, coords={"memory": memory})
    context = records.RunStamp("hummingbird", settings=dict(HBIRD_DEFAULTS), inputs={"panel": "voc-val"}, defaults=HBIRD_DEFAULTS)
    with records.opened(context):
        records.save(store, "hummingbird", ds, {"computed_on": {"images": 8, "images_sha256": "bbbbbbbb", "scope": "panel"}, "matching": "identity"})


def entropy_record(store, mean: float, low: float, high: float) -> None:
    ds = xr.Dataset(
        {name: ("statistic", np.array([v, 0.0])) for name, v in (("summary_mean", mean), ("summary_low", low), ("summary_high", high))},
        coords={"statistic": ["patch_effective", "distance"]},
    )
    with records.opened(records.RunStamp("entropy", settings={"boot": 1000}, defaults={"boot": 1000})):
        records.save(store, "entropy", ds, {"computed_on": {"images": 7, "images_sha256": "cccccccc", "scope": "store"}})


def test_comparable_records_share_a_column_and_others_get_their_own(two_stores):
    alpha, beta = two_stores
    knn_record(alpha, {10: 0.5, 20: 0.625})
    knn_record(beta, {10: 0.25, 20: 0.375})
    table = paper.build([alpha, beta], ["knn"])
    assert len(table.columns) == 1
    column = table.columns[0]
    assert column.heading == "k-NN top-1 (%), k = 20" and "40 images" in column.measured and "defaults" in column.measured
    assert [column.cells[r].text() for r in table.rows] == ["62.5", "37.5"]
    # beta measured again at another temperature: a column of its own, headed by what differs; alpha's stays
    knn_record(beta, {10: 0.125, 20: 0.25}, temperature=0.1)
    table = paper.build([alpha, beta], ["knn"])
    assert len(table.columns) == 2
    default, warm = table.columns
    assert "temperature=0.1" in warm.measured and set(warm.cells) == {table.rows[1]} and set(default.cells) == {table.rows[0]}
    assert warm.cells[table.rows[1]].text() == "25.0" and any("measured 2 ways" in n for n in table.notes)
    # other images: separate again, even with the same settings
    knn_record(beta, {20: 0.5}, images=39, digest="ffffffff00")
    table = paper.build([alpha, beta], ["knn"])
    assert len(table.columns) == 2 and any("39 images" in c.measured for c in table.columns)


def test_published_rows_fill_only_columns_at_their_setting_and_intervals_show(two_stores, capsys):
    alpha, beta = two_stores
    hbird_record(alpha, [1000, 102400], [0.4, 0.5])
    entropy_record(alpha, 150.0, 149.0, 151.0)
    table = paper.build([alpha, beta], ["hummingbird", "entropy"])
    published = [r for r in table.rows if r in table.published]
    assert published == ["DINO ViT-S/16, 512 px (published, other weights)", "DINOv2 ViT-S/14, 504 px (published, other weights)"]
    small, large = [c for c in table.columns if c.protocol == "hummingbird"]
    assert set(small.cells) == {table.rows[0]} and large.cells[published[0]].text() == "37.2" and large.cells[table.rows[0]].text() == "50.0"
    entropy = next(c for c in table.columns if c.protocol == "entropy")
    assert entropy.cells[table.rows[0]].text() == "150.0 [149.0, 151.0]"
    code, out = probe_main(["table", alpha, beta, "--protocols", "hummingbird,entropy", "--format", "csv"], capsys)
    assert code == 0, out.err
    rows = list(csv.DictReader(io.StringIO(out.out)))
    assert {r["published"] for r in rows} == {"True", "False"}
    assert next(r for r in rows if r["metric"] == "mean e^H (tokens)")["low"] == "149.0000"
    code, out = probe_main(["table", alpha, "--protocols", "hummingbird", "--format", "latex"], capsys)
    assert code == 0 and r"\begin{tabular}" in out.out and r"\textit{DINO ViT-S/16, 512 px (published, other weights)}" in out.out
    assert "memory 102,400" in out.out and "%" not in out.out.split(r"\end{tabular}")[0].replace(r"\%", "")


def test_bad_requests_are_one_line(two_stores, tmp_path, capsys):
    alpha, _ = two_stores
    with pytest.raises(ProbeError, match="no paper column"):
        paper.build([alpha], ["fancy"])
    with pytest.raises(ProbeError, match="no record of"):
        paper.build([alpha], ["decode"])
    code, out = probe_main(["table", alpha, "--format", "docx"], capsys)
    assert code == 2 and "--format" in out.err
    theirs = tmp_path / "mine.md"
    theirs.write_text("my notes")
    code, out = probe_main(["table", alpha, "--protocols", "entropy", "--out", theirs], capsys)
    assert code == 2 and theirs.read_text() == "my notes"
    code, out = probe_main(["table", alpha, "--protocols", "entropy", "--out", tmp_path / "t.md"], capsys)
    assert code == 0 and (tmp_path / "t.md").read_text().startswith("| checkpoint |")


def test_the_default_block_is_no_setting_even_where_the_record_names_a_store_not_here(two_stores, tmp_path):
    """A record copied with its store (docs/data/records) names the folder it was made in; the table takes the last block
    from the store the record lies in, so the last block reads as the default and another block is named."""
    moved = tmp_path / "moved.zarr"
    moved.mkdir()
    shutil.copy(two_stores[0] / "zarr.json", moved / "zarr.json")  # the manifest alone: the table reads records only
    last = json.loads((moved / "zarr.json").read_text())["attributes"]["manifest"]["arch"]["depth"] - 1
    for block in (last, 0):
        context = records.RunStamp(
            "knn",
            settings=dict(KNN_DEFAULTS),
            inputs={"panel": "val", "store": "/elsewhere/teacher.zarr"},
            selection={"block": block, "facet": None},
            defaults=KNN_DEFAULTS,
        )
        with records.opened(context):
            records.save(
                moved, "knn", xr.Dataset({"top1": ("k", np.array([0.5]))}, coords={"k": [20]}), {"computed_on": {"images": 4, "images_sha256": "dd", "scope": "panel"}}
            )
        (column,) = paper.build([moved], ["knn"]).columns
        assert column.measured.endswith("; defaults" if block == last else "; block=0"), column.measured


def test_images_read_from_a_panels_own_store_are_not_checked_against_the_records_store(two_stores):
    """knn and hummingbird record the val images they scored (the table groups by them); read from the panel's own store
    beside the record's, they are scope panel-store, which the report never calls current (or stale) by the record's store."""
    alpha, beta = two_stores
    own = completion.computed_on(alpha, ["a.jpg", "b.jpg"], scope="panel", read_from=alpha)
    other = completion.computed_on(alpha, ["a.jpg", "b.jpg"], scope="panel", read_from=beta)
    assert own["scope"] == "panel" and other["scope"] == "panel-store" and own["images_sha256"] == other["images_sha256"]
    assert completion.staleness(alpha, {**other, "store": {"image_list_sha256": "changed"}}) is None
    assert completion.staleness(alpha, {**own, "store": {"image_list_sha256": "changed"}}) == "the store's image list changed since"
