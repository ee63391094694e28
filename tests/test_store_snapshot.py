"""A protocol run reads its stores' whole per-image arrays once (``store.group.snapshot``), and a store
opened to read looks each array's metadata up once per opening (``store.group.open_read``)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from probe_toolkit.protocols.api import get, read_stores
from probe_toolkit.store import group


def _store(path, values):
    g = zarr.open_group(str(path), mode="w")
    g.create_array("done", shape=(len(values),), chunks=(4,), dtype=bool, fill_value=False)[:] = values
    return g


def test_a_whole_array_is_read_once_under_a_snapshot_and_each_caller_gets_a_copy(tmp_path, monkeypatch):
    first = np.array([True, False] * 9)
    _store(tmp_path / "s.zarr", first)
    other = _store(tmp_path / "o.zarr", first)
    reads = []
    real = zarr.Array.__getitem__

    def counted(self, selection):
        reads.append(str(self.store.root))
        return real(self, selection)

    monkeypatch.setattr(zarr.Array, "__getitem__", counted)
    reader = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    with group.snapshot([tmp_path / "s.zarr", tmp_path / "missing.zarr"]):
        a = group.whole(reader["done"])
        a[:] = False  # a caller's own copy
        zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")["done"][:] = ~first  # another writer meanwhile
        assert group.whole(reader["done"]).tolist() == first.tolist()  # the state the run first read
        assert len(reads) == 1
        assert group.whole(reader["done"], slice(2, 7)).tolist() == (~first)[2:7].tolist()  # a part: read from disk
        assert group.whole(other["done"]).tolist() == first.tolist() and group.whole(other["done"]).tolist() == first.tolist()
        assert len(reads) == 4  # another store: read each time
    assert group.whole(reader["done"]).tolist() == (~first).tolist()  # after the run: read again


def test_a_run_keeps_the_stores_it_reads_never_one_it_writes():
    """k-NN reads its store; decode-stream writes the masks store its ``store`` names."""
    assert read_stores(get("knn"), "a.zarr", {}) == ["a.zarr"]
    assert read_stores(get("similarity"), None, {"stores": ["a.zarr", "b.zarr"]}) == ["a.zarr", "b.zarr"]
    assert read_stores(get("decode-stream"), "ck.pth", {"store": "masks.zarr"}) == []


def test_a_read_group_reads_each_members_metadata_once_per_opening(tmp_path, monkeypatch):
    """``group.open_read``: a member looked up again (a test, then its use) is not read from disk
    again in one opening; a name not found is looked for again (an array added later is found);
    another opening reads the folder again."""
    from zarr.core import group as zarr_group

    first = np.array([True, False] * 9)
    writer = _store(tmp_path / "s.zarr", first)
    reads = []
    real = zarr_group.get_node

    async def counted(store, path, zarr_format):
        reads.append(path)
        return await real(store=store, path=path, zarr_format=zarr_format)

    monkeypatch.setattr(zarr_group, "get_node", counted)
    opened = group.open_read(tmp_path / "s.zarr")
    assert "done" in opened and opened["done"].shape == (18,) and "done" in opened
    assert opened["done"][:].tolist() == first.tolist() and opened["done"] is opened["done"]
    assert reads == ["done"]
    assert "failed" not in opened and "failed" not in opened
    assert reads == ["done", "failed", "failed"]
    writer.create_array("failed", shape=(18,), chunks=(4,), dtype=bool, fill_value=False)
    assert "failed" in opened and opened["failed"].shape == (18,)
    assert reads == ["done", "failed", "failed", "failed"]
    with pytest.raises(KeyError):
        opened["sizes"]
    assert group.open_read(tmp_path / "s.zarr")["done"].shape == (18,)
    assert reads == ["done", "failed", "failed", "failed", "sizes", "done"]


def test_an_array_read_from_a_plain_opening_is_checked_in_that_opening(tiny_stores, monkeypatch):
    """``cache.require`` on a store opened with zarr alone checks the array's chunks (a stat per
    chunk, every time) through the opening's group: the array's metadata is read from disk once
    (its first lookup there), the flags' not again."""
    from zarr.core import group as zarr_group

    from probe_toolkit.store import cache, integrity

    ds = cache.open_store(tiny_stores["dino"], plain=True)
    reads, checks = [], []
    real, present = zarr_group.get_node, integrity._chunk_keys

    async def counted(store, path, zarr_format):
        reads.append(path)
        return await real(store=store, path=path, zarr_format=zarr_format)

    monkeypatch.setattr(zarr_group, "get_node", counted)
    monkeypatch.setattr(integrity, "_chunk_keys", lambda array, chunk: checks.append(chunk) or present(array, chunk))
    for _ in range(2):
        assert cache.require(ds, "tokens_224").shape[0] == 7
    assert reads == ["tokens_224"]
    assert checks == [0, 1, 0] * 2  # in each read: the two chunks of tokens_224 (7 images, 4 a chunk), the image list's one
