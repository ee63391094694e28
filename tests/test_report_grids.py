"""One report over stores of different patch grids (ViT-S/16 14 × 14, ViT-S/8 28 × 28, DINOv2 /14
16 × 16 with registers): every store is drawn on its own grid and follows the patch under the
centre of the ``--patch`` given on the first store's grid, checked against a plain pixel loop.
Synthetic stores (no network), so this is cheap.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from report_stores import plain_follow, plain_rank, plain_window, stored, synthetic_store

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.report import write_report
from probe_toolkit.report.content import Table
from probe_toolkit.report.patches import follow_patches, under
from probe_toolkit.report.sources import open_stores


@pytest.mark.parametrize("sizes", [(16, 8), (8, 16), (16, 14), (14, 16), (8, 14), (16, 12), (8, 12), (14, 14)])
def test_under_is_the_patch_holding_the_centre(sizes):
    size0, size = sizes
    ref, grid = (224 // size0, 224 // size0, size0), (224 // size, 224 // size)
    for patch in range(ref[0] * ref[1]):
        r0, c0 = divmod(patch, ref[1])
        r, c = under(r0, size, size0), under(c0, size, size0)
        mine = r * grid[1] + c if r < grid[0] and c < grid[1] else None
        assert mine == plain_follow(patch, ref, grid, size), (sizes, patch)


def _explorer(html_text: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="probe-explorer-data">(.*?)</script>', html_text, re.S).group(1))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed-grids")
    stores = {
        "s16": synthetic_store(root / "s16-aaaaaaaa" / "teacher.zarr", 14, class_token=True, seed=1),
        "s8": synthetic_store(root / "s8-bbbbbbbb" / "teacher.zarr", 28, seed=2),
        "v2reg": synthetic_store(root / "v2reg-cccccccc" / "teacher.zarr", 16, heads=3, class_token=True, registers=4, seed=3),
    }
    return root, stores, write_report(list(stores.values()), root / "report", patch=34, formats="png")


def test_every_store_on_its_own_grid(mixed):
    root, stores, written = mixed
    data = _explorer(written.html.read_text())
    assert data["grid"] == [14, 14] and data["size"] == 16 and data["patch"] == 34
    by_name = dict(zip(stores, data["stores"]))
    for name, (grid, size) in {"s16": (14, 16), "s8": (28, 8), "v2reg": (16, 14)}.items():
        entry = by_name[name]
        want = plain_follow(34, (14, 14, 16), (grid, grid), size)
        assert (entry["rows"], entry["cols"], entry["size"], entry["patch"]) == (grid, grid, size, want)
        width = 1 if grid * grid < 254 else 2
        assert entry["indexBytes"] == width
        window = np.frombuffer(base64.b64decode(entry["window"]), np.uint8 if width == 1 else "<u2").reshape(grid * grid, 8)
        assert sorted(window[want].tolist()) == plain_window(grid, want)
        start = entry["start"]
        assert start == {"s16": 1, "s8": 0, "v2reg": 5}[name] and entry["registers"] == (4 if name == "v2reg" else 0)
        assert entry["tokens"] == start + grid * grid and entry["note"] == ""
    assert [by_name[n]["patch"] for n in stores] == [34, 4 * 28 + 12, 2 * 16 + 7]  # (2, 6) → (4, 12) at /8, (2, 7) at /14

    # the figures and tables follow each store's own patch, never patch 34 of a finer grid
    report = written.report
    attention = report.section("attention")
    tables = {b.caption: b for b in attention.blocks if isinstance(b, Table)}
    for (name, store), label in zip(stores.items(), report.stores):
        patch, start, cls = by_name[name]["patch"], by_name[name]["start"], int(by_name[name]["classToken"])
        table = tables[f"{label}: row of patch {patch}, last block"]
        weights = stored(store, "attention_224", "gone.jpg").astype(np.float64)
        for head, row in enumerate(table.rows):
            keys = plain_rank(weights[head, start + patch], list(range(weights.shape[-1])), 5)
            names = ["[CLS]" if k < cls else f"[REG {k - cls}]" if k < start else str(k - start) for k in keys]
            assert [cell.split(":")[0] for cell in row[3].split(", ")] == names
    text = " ".join(getattr(b, "text", "") for b in report.section("followed").blocks)
    assert "patch 124 (row 4, column 12) of its 28 × 28 grid" in text and "patch 39 (row 2, column 7) of its 16 × 16 grid" in text
    maps = [f.name for f in report.section("neighbour-map").figures()]
    assert len(maps) == 3  # one cosine figure per grid
    assert any(f.name.endswith("attention-registers.png") for f in attention.figures())


def test_a_patch_outside_the_first_grid_is_one_line(mixed, tmp_path):
    _, stores, _ = mixed
    with pytest.raises(ProbeError) as found:
        write_report([stores["s16"], stores["s8"]], tmp_path / "report", patch=196, formats="png")
    line = found.value.line()
    assert "--patch" in line and "0..195" in line and "14 × 14" in line and not (tmp_path / "report" / "report.html").exists()
    # with the 28 × 28 store first, patch 700 is valid and the others follow (25, 0) → (12, 0) at /16, (14, 0) at /14
    followed = follow_patches(open_stores([stores["s8"], stores["s16"], stores["v2reg"]]), 700)
    assert [f.patch for f in followed.values()] == [700, plain_follow(700, (28, 28, 8), (14, 14), 16), plain_follow(700, (28, 28, 8), (16, 16), 14)]
    assert [f.patch for f in followed.values()] == [700, 12 * 14, 14 * 16]


def test_a_grid_that_leaves_the_centre_unused_follows_nothing(tmp_path):
    """Patch 12 at 224 px: 18 × 18 patches cover 216 pixels; patch 783 of a 28 × 28 grid is centred at pixel 220."""
    s8 = synthetic_store(tmp_path / "s8-dddddddd" / "teacher.zarr", 28, seed=4)
    p12 = synthetic_store(tmp_path / "p12-eeeeeeee" / "teacher.zarr", 18, patch=12, seed=5)
    written = write_report([s8, p12], tmp_path / "report", patch=783, formats="png")
    data = _explorer(written.html.read_text())
    refused = data["stores"][1]
    assert refused["patch"] is None and refused["attention"] is None and refused["cosine"] is None
    assert "follows no patch" in refused["note"] and "18 × 18" in refused["note"]
    assert written.report.section("attention").present
    assert [f.patch for f in follow_patches(open_stores([s8, p12]), 0).values()] == [0, 0]
    assert [f.patch for f in follow_patches(open_stores([s8, p12]), 26 * 28 + 26).values()] == [26 * 28 + 26, 17 * 18 + 17]  # centre 212 px
