"""A store written before views had families and arrays had blocks reads, and scores, as it did.

``fixtures/store_before_42`` was written by probe 0.1.0 (commit 1ee983d, before issue 42) from a
tiny network (DINO layout, width 32, 2 blocks, patch 32) over two synthetic images, views 224 (every
block's attention), 480, eval224 and 96; ``expected.json`` holds what that code's ``probe entropy``,
``probe neighbours`` and ``probe decode`` saved on it. Today's code reads the same arrays and gives
the same numbers, bit for bit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

import probe_toolkit as probe
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.results import records
from probe_toolkit.store import cache, grids

FIXTURE = Path(__file__).parent / "fixtures" / "store_before_42"


@pytest.fixture()
def old_store(tmp_path):
    shutil.copytree(FIXTURE / "store.zarr", tmp_path / "store.zarr")
    return tmp_path / "store.zarr"


def test_an_old_store_reads_unchanged(old_store):
    raw = zarr.open_group(old_store, mode="r")
    ds = cache.open_store(old_store)
    assert ds.attrs["manifest"]["toolkit_version"] == "0.1.0" and grids.views_in(ds) == ["96", "224", "eval224", "480"]
    for name in ("tokens_224", "cls_tokens_224", "keys_480", "tokens_eval224", "tokens_96", "attention_224"):
        array = cache.require(ds, name)
        np.testing.assert_array_equal(array.values, raw[name][:])
        assert "patch_" not in " ".join(array.dims) and array.attrs["block"] == 1  # an old array holds the last block of two
        np.testing.assert_array_equal(cache.require(ds, name, block=1).values, raw[name][:])
    blocks = cache.require(ds, "attention_blocks_224")
    assert blocks.dims == ("image", "block", "head", "query", "key")
    np.testing.assert_array_equal(cache.require(ds, "attention_blocks_224", block=0).values, raw["attention_blocks_224"][:, 0])
    with pytest.raises(ProbeError, match=r"has no array tokens_224 at block 0; rerun `probe extract \S+ .*--views 224 .*--blocks 0"):
        cache.require(ds, "tokens_224", block=0)
    assert grids.fixed_grid(ds, "480") == (15, 15) and grids.fixed_grid(ds, "224") == (7, 7)


def _values(ds) -> dict:
    out = {}
    for name, var in ds.data_vars.items():
        v = np.asarray(var.values)
        if v.dtype.kind in "fcbiu":
            out[name] = (list(v.shape), v.astype(np.float64).ravel())
    return out


def test_an_old_store_scores_as_before(old_store):
    expected = json.loads((FIXTURE / "expected.json").read_text())
    probe.run("entropy", [old_store], boot=100)
    probe.run("neighbours", [old_store], boot=100)
    probe.run("decode", old_store)
    assert sorted(records.results(old_store)) == sorted(expected)
    for result, arrays in expected.items():
        got = _values(records.load(old_store, result))
        for name, want in arrays.items():
            shape, values = got[name]
            assert shape == want["shape"], (result, name)
            np.testing.assert_array_equal(values, np.array([np.nan if x is None else x for x in want["values"]], dtype=np.float64), err_msg=f"{result} {name}")
