"""labels/index_write.py: the hygiene index written back member by member gives the bytes of the
whole-dict writing it replaced (re-implemented here with json.loads and dicts, independently of
probe's code), for indexes of any layout, repeated keys and names of any characters; and it holds
a member, not the index, as Python objects."""

from __future__ import annotations

import hashlib
import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe_toolkit.labels import hash_files, index_write


def _null(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_null(v) for v in obj]
    return obj


def _expected(text: str, panel: str, role: str, annotation: str, hashes: dict) -> str:
    index = json.loads(text) if text else {}
    mine = index.get(panel, {})
    kept = mine.get("hashes", {}) if mine.get("annotation_sha256") == annotation and mine.get("role") == role else {}
    entry = {"role": role, "annotation_sha256": annotation, "hashes": {**kept, **hashes}}
    return json.dumps(_null({**index, panel: entry}), separators=(",", ":"), allow_nan=False) + "\n"


def _content(names: list[str], contents: list[bytes]) -> tuple[hash_files.ContentHashes, dict]:
    digests = np.array([np.frombuffer(hashlib.sha256(c).digest(), np.uint8) for c in contents], np.uint8).reshape(-1, 32)
    as_dict = {}
    for name, c in zip(names, contents):
        as_dict[hashlib.sha256(c).hexdigest()] = name  # the last name of a content, in first-seen order
    return hash_files.ContentHashes(digests, names), as_dict


def _write(tmp_path: Path, text: str, panel: str, role: str, annotation: str, names: list[str], contents: list[bytes]):
    path = tmp_path / "panel-images.json"
    if text:
        path.write_text(text)
    elif path.exists():
        path.unlink()
    hashes, as_dict = _content(names, contents)
    written = index_write.write_panel(path, hash_files.Index(path), panel, role, annotation, hashes)
    return written, (path.read_text() if written else None), _expected(text, panel, role, annotation, as_dict)


def _h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


OTHER = {"role": "val", "annotation_sha256": "b" * 64, "hashes": {_h(b"x"): "x.png", _h(b"y"): "dir/y é.png", _h(b"q"): 'q"uote\\.png'}}
MINE = {"role": "train", "annotation_sha256": "a" * 64, "hashes": {_h(b"1"): "1.png", _h(b"2"): "2.png"}}
INDEXES = {
    "none": "",
    "compact": json.dumps({"o": OTHER, "tr": MINE}, separators=(",", ":")),
    "indented": json.dumps({"tr": MINE, "o": OTHER}, indent=2, ensure_ascii=False),
    "mine absent": json.dumps({"o": OTHER}),
    "a repeated panel": '{"tr": {"role": "x"}, "o": ' + json.dumps(OTHER) + ', "tr": ' + json.dumps(MINE) + "}",
    "a repeated field": '{"o": {"role": "val", "hashes": {}, "role": "test", "hashes": ' + json.dumps(OTHER["hashes"]) + "}}",
    "extra fields": json.dumps({"o": {**OTHER, "note": [1.5, None, {"k": True}], "n": float("nan")}, "tr": {**MINE, "x": 1}}),
    "no hashes": json.dumps({"o": {"role": "val"}, "tr": {"role": "train", "annotation_sha256": "a" * 64}}),
    "another role": json.dumps({"tr": {**MINE, "role": "val"}}),
}


@pytest.mark.parametrize("layout", sorted(INDEXES))
@pytest.mark.parametrize("read", ["same annotation", "new annotation"])
def test_the_index_is_written_as_the_whole_dict_would_be(tmp_path, layout, read):
    annotation = "a" * 64 if read == "same annotation" else "c" * 64
    names, contents = ["2b.png", "3.png", "3-copy.png", "x-again.png"], [b"2", b"3", b"3", b"x"]
    written, got, expected = _write(tmp_path, INDEXES[layout], "tr", "train", annotation, names, contents)
    assert written and got == expected
    assert [p.name for p in tmp_path.iterdir()] == ["panel-images.json"]  # no temporary file left


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"o": {"role": "val", "hashes": {"not a digest": "a.png"}}}),
        json.dumps({"o": {"role": "val", "hashes": {_h(b"x"): 3}}}),
        json.dumps({"o": {"role": "val", "hashes": [1, 2]}}),
        '{"o": {"role": "val", "hashes": {"' + _h(b"x") + '": "a.png", "' + _h(b"x") + '": "b.png"}}}',
        json.dumps({"o": [1, 2]}),
        "[1, 2]",
        "{} x",
    ],
)
def test_an_index_it_cannot_re_encode_is_left_to_the_whole_dict_writing(tmp_path, text):
    path = tmp_path / "panel-images.json"
    path.write_text(text)
    hashes, _ = _content(["a.png"], [b"a"])
    assert not index_write.write_panel(path, hash_files.Index(path), "tr", "train", "a" * 64, hashes)
    assert path.read_text() == text


_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    others=st.dictionaries(st.sampled_from(["p", "q", "tr", "é"]), st.dictionaries(st.sampled_from([b"a", b"b", b"c", b"d"]), _NAMES, max_size=3), max_size=3),
    roles=st.lists(st.sampled_from(["train", "val"]), min_size=4, max_size=4),
    read=st.lists(st.tuples(_NAMES, st.sampled_from([b"a", b"b", b"c", b"e", b"f"])), max_size=5),
    indent=st.sampled_from([None, 1]),
)
def test_any_index_and_read_give_the_whole_dicts_bytes(tmp_path_factory, others, roles, read, indent):
    index = {name: {"role": role, "annotation_sha256": "a" * 64, "hashes": {_h(c): n for c, n in hashes.items()}} for (name, hashes), role in zip(others.items(), roles)}
    text = json.dumps(index, indent=indent, separators=None if indent else (",", ":")) if index else ""
    written, got, expected = _write(tmp_path_factory.mktemp("index"), text, "tr", "train", "a" * 64, [n for n, _ in read], [c for _, c in read])
    assert written and got == expected


def test_a_member_of_the_index_is_held_not_the_index(tmp_path):
    """A first read of a 200-image panel beside an index of 2 × 10 k digests (about 1.8 MB): the
    writing holds a member's text beside what the check already read (peak traced under 5 % of the
    file); decoding the index whole to add the entry holds over twice the file."""
    path = tmp_path / "panel-images.json"
    rng = np.random.default_rng(0)
    index = {f"p{p}": {"role": "val", "annotation_sha256": "0" * 64, "hashes": {rng.bytes(32).hex(): f"img_{i:08d}.JPEG" for i in range(10_000)}} for p in range(2)}
    path.write_text(json.dumps(index, separators=(",", ":")))
    del index
    size = path.stat().st_size
    names = [f"new_{i}.png" for i in range(200)]
    hashes, as_dict = _content(names, [n.encode() for n in names])
    tracemalloc.start()
    try:
        read = hash_files.Index(path)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        assert index_write.write_panel(path, read, "tr", "train", "a" * 64, hashes)
        write_peak = tracemalloc.get_traced_memory()[1] - before
        del read
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        whole = json.loads(path.read_text())
        whole_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert whole["tr"]["hashes"] == as_dict and len(whole) == 3
    assert write_peak < 0.05 * size and whole_peak > 2 * size, (write_peak, whole_peak, size)
