"""labels/hash_memo.py: the memo of hashed files read and extended a block of its text at a time
gives the answers and writes the bytes of the whole-text reading (re-implemented here with
json.loads and a dict, independently of probe's code), at every block size, for the compact
memo probe writes and for any other layout; and it holds a block, not the memo, in memory."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe_toolkit.labels import hash_memo, json_members


def _dump(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


def _whole(path: Path) -> dict:
    try:
        found = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _expected_entries(path: Path, wanted: list[str]):
    memo = _whole(path)
    rows = []
    for key in wanted:
        v = memo.get(key)
        ok = isinstance(v, list) and len(v) == 3 and all(type(x) is int and -(2**63) <= x < 2**63 for x in v[:2])
        ok = ok and isinstance(v[2], str) and len(v[2]) == 64 and set(v[2]) <= set("0123456789abcdef")
        rows.append((True, v[0], v[1], v[2]) if ok else (False,))
    return rows


def _entries(path: Path, wanted: list[str], block: int):
    size, mtime, found, digests = hash_memo.memo_entries(path, wanted, block)
    return [(True, int(s), int(m), d.tobytes().hex()) if f else (False,) for f, s, m, d in zip(found, size, mtime, digests)]


def _fresh(entries: dict[str, list], paths: list[str] | None = None) -> hash_memo.Fresh:
    """``entries`` as content_hashes hands them over: for each of ``paths`` (default: the keys), its entry."""
    paths = list(entries) if paths is None else paths
    values = [entries[p] for p in paths]
    return hash_memo.Fresh(
        paths,
        np.arange(len(paths)),
        np.array([v[0] for v in values], np.int64),
        np.array([v[1] for v in values], np.int64),
        np.array([np.frombuffer(bytes.fromhex(v[2]), np.uint8) for v in values], np.uint8).reshape(-1, 32),
    )


def _digest(i: int) -> str:
    return f"{i:064x}"


MEMO = {f"/data/img_{i:05d}.jpg": [100 + i, 1796559286709694735 + i, _digest(i)] for i in range(300)}
TEXTS = {
    "compact": _dump(MEMO),
    "trailing space": _dump(MEMO) + "  \n\n",
    "a repeated key": _dump(MEMO)[:-2] + f',"/data/img_00003.jpg":[1,2,"{_digest(7)}"]' + "}\n",  # the last one counts
    "a non-ASCII key": _dump({**MEMO, "/data/é.jpg": [1, 2, _digest(1)]}).replace("\\u00e9", "é"),
    "an escaped key": _dump({**MEMO, '/data/"q".jpg': [1, 2, _digest(1)]}),
    "a bad member at the end": _dump(MEMO)[:-2] + ',"/data/img_00001.jpg":[1,2,"xyz"]}\n',
    "indented": json.dumps(MEMO, indent=1),
    "text after it": _dump(MEMO) + "x",
    "a list": "[1, 2]",
    "empty object": "{}",
    "empty object spaced": "{ }",
    "nothing": "",
    "huge integers": _dump({**MEMO, "/data/big.jpg": [2**70, 1, _digest(2)]}),
}
WANTED = ["/data/img_00003.jpg", "/data/img_00299.jpg", "/data/é.jpg", '/data/"q".jpg', "/data/big.jpg", "/data/img_00001.jpg", "/nowhere.jpg"]


@pytest.mark.parametrize("layout", sorted(TEXTS))
@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_the_entries_are_those_of_the_whole_memo_at_every_block_size(tmp_path, layout, block):
    path = tmp_path / "panel-hashes.json"
    path.write_text(TEXTS[layout])
    assert _entries(path, WANTED, block) == _expected_entries(path, WANTED)


@pytest.mark.parametrize("layout", sorted(TEXTS))
@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_the_memo_is_written_as_the_whole_dict_would_be(tmp_path, layout, block):
    path = tmp_path / "panel-hashes.json"
    path.write_text(TEXTS[layout])
    fresh = {"/data/img_00003.jpg": [5, 6, _digest(9)], "/new/b.jpg": [1, 1, _digest(3)], "/new/a.jpg": [2, 2, _digest(4)], "/data/img_00010.jpg": [0, 0, _digest(5)]}
    expected = _dump({**_whole(path), **fresh})
    hash_memo.write_memo(path, _fresh(fresh), block)
    assert path.read_text() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["panel-hashes.json"]  # no temporary file left


def test_a_member_longer_than_the_longest_is_read_whole_with_the_same_answers(tmp_path, monkeypatch):
    path = tmp_path / "panel-hashes.json"
    long_key = "/data/" + "x" * 300 + ".jpg"
    path.write_text(_dump({**MEMO, long_key: [1, 2, _digest(8)]}))
    monkeypatch.setattr(json_members, "LONGEST", 100)
    assert _entries(path, [*WANTED, long_key], 16) == _expected_entries(path, [*WANTED, long_key])
    hash_memo.write_memo(path, _fresh({long_key: [3, 4, _digest(9)]}), 16)
    assert json.loads(path.read_text())[long_key] == [3, 4, _digest(9)]


def test_bytes_that_are_not_text_find_nothing_and_are_rebuilt(tmp_path):
    path = tmp_path / "panel-hashes.json"
    path.write_bytes(_dump(MEMO).encode()[:-2] + b',"/data/\xff.jpg":[1,2,"' + _digest(1).encode() + b'"]}\n')
    assert not any(f for f, *_ in _entries(path, WANTED, 64))
    hash_memo.write_memo(path, _fresh({"/a.jpg": [1, 2, _digest(1)]}), 64)
    assert path.read_text() == _dump({"/a.jpg": [1, 2, _digest(1)]})


@settings(max_examples=60, deadline=None)
@given(
    old=st.dictionaries(st.sampled_from([f"/p/{c}.jpg" for c in "abcdefgh"]), st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=8),
    fresh=st.lists(st.sampled_from([f"/p/{c}.jpg" for c in "defghijk"]), max_size=6),
    block=st.integers(1, 40),
)
def test_any_memo_and_fresh_entries_give_the_whole_dicts_bytes(tmp_path_factory, old, fresh, block):
    path = tmp_path_factory.mktemp("memo") / "panel-hashes.json"
    path.write_text(_dump({k: [a, b, _digest(a * 10 + b)] for k, (a, b) in old.items()}))
    entries = {}
    for i, key in enumerate(fresh):  # a name listed twice: one entry (in a read, the same file's twice)
        entries.setdefault(key, [i, i, _digest(i)])
    made = _fresh(entries, fresh)
    expected = _dump({**_whole(path), **entries}) if entries else path.read_text()
    wanted = sorted({*old, *fresh})
    assert _entries(path, wanted, block) == _expected_entries(path, wanted)
    hash_memo.write_memo(path, made, block)
    assert path.read_text() == expected


def test_a_block_of_the_memo_is_held_not_the_memo(tmp_path):
    """A memo of 20 k paths (about 2.4 MB): read and extended with 64 k-character blocks, the peak
    traced memory stays under a fifth of the file; the whole-text reading holds several files' worth."""
    path = tmp_path / "panel-hashes.json"
    rng = np.random.default_rng(0)
    path.write_text(_dump({f"/data/set/train/n{i:08d}/img_{i:08d}.JPEG": [1000 + i, 1796559286709694735 + i, rng.bytes(32).hex()] for i in range(20_000)}))
    size = path.stat().st_size
    wanted = [f"/data/set/train/n{i:08d}/img_{i:08d}.JPEG" for i in range(0, 20_000, 4_000)]
    tracemalloc.start()
    try:
        found = hash_memo.memo_entries(path, wanted, 1 << 16)[2]
        read_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        hash_memo.write_memo(path, _fresh({"/new.jpg": [1, 2, _digest(1)]}), 1 << 16)
        write_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        _whole(path)
        whole_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.all() and json.loads(path.read_text())["/new.jpg"] == [1, 2, _digest(1)]
    assert read_peak < size / 5 and write_peak < size / 5 < whole_peak / 10, (read_peak, write_peak, whole_peak, size)
