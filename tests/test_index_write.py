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

from probe_toolkit.labels import hash_files, hygiene, index_write, json_members


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


def _write(tmp_path: Path, text: str, panel: str, role: str, annotation: str, names: list[str], contents: list[bytes], block: int = json_members.BLOCK):
    path = tmp_path / "panel-images.json"
    if text:
        path.write_text(text)
    elif path.exists():
        path.unlink()
    hashes, as_dict = _content(names, contents)
    read = hash_files.Index(path, block, own=panel, against=hashes.sorted)  # as hygiene.check_overlap reads it
    written = index_write.write_panel(path, read, panel, role, annotation, hashes)
    return written, (path.read_text() if written else None), _expected(text, panel, role, annotation, as_dict)


def _h(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


OTHER = {"role": "val", "annotation_sha256": "b" * 64, "hashes": {_h(b"x"): "x.png", _h(b"y"): "dir/y é.png", _h(b"q"): 'q"uote\\.png'}}
MINE = {"role": "train", "annotation_sha256": "a" * 64, "hashes": {_h(b"1"): "1.png", _h(b"2"): "2.png"}}
PLAIN = {"role": "val", "annotation_sha256": "b" * 64, "hashes": {_h(b"x"): "x.png", _h(b"y"): "dir/y.png", _h(b"2"): "two 2.png"}}
INDEXES = {
    "none": "",
    "compact, plain names": json.dumps({"o": PLAIN, "tr": MINE}, separators=(",", ":")) + "\n",
    "compact, mine first": json.dumps({"tr": MINE, "o": PLAIN, "p": {**PLAIN, "role": "train"}}, separators=(",", ":")),
    "compact, a raw DEL in a name": json.dumps({"o": PLAIN, "tr": MINE}, separators=(",", ":")).replace("x.png", "x\x7f.png"),  # json.dumps writes \u007f
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
@pytest.mark.parametrize("block", [1, 7, 1 << 20])
def test_the_index_is_written_as_the_whole_dict_would_be(tmp_path, layout, read, block):
    annotation = "a" * 64 if read == "same annotation" else "c" * 64
    names, contents = ["2b.png", "3.png", "3-copy.png", "x-again.png"], [b"2", b"3", b"3", b"x"]
    written, got, expected = _write(tmp_path, INDEXES[layout], "tr", "train", annotation, names, contents, block)
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
    block=st.sampled_from([1, 5, 64, 1 << 20]),
)
def test_any_index_and_read_give_the_whole_dicts_bytes(tmp_path_factory, others, roles, read, indent, block):
    index = {name: {"role": role, "annotation_sha256": "a" * 64, "hashes": {_h(c): n for c, n in hashes.items()}} for (name, hashes), role in zip(others.items(), roles)}
    text = json.dumps(index, indent=indent, separators=None if indent else (",", ":")) if index else ""
    written, got, expected = _write(tmp_path_factory.mktemp("index"), text, "tr", "train", "a" * 64, [n for n, _ in read], [c for _, c in read], block)
    assert written and got == expected


def test_a_member_of_the_index_is_held_not_the_index(tmp_path):
    """A first read of a 200-image panel beside an index of 2 × 10 k digests (about 1.8 MB), read
    8 k characters at a time: read whole, the index keeps 40 bytes a digest, not the text (under
    half the file, peak under 0.8 of it); read against the panel's digests, as its check reads it,
    it keeps under 2 % of the file (peak under a quarter: 8 bytes a digest of one panel at a time,
    and a chunk of members); the writing holds a few blocks and members beside that (peak traced
    under 5 % of the file); decoding the index whole to add the entry holds over twice the file."""
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
        read = hash_files.Index(path, 1 << 13)
        read_held, read_peak = tracemalloc.get_traced_memory()
        del read
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        read = hash_files.Index(path, 1 << 13, own="tr", against=hashes.sorted)
        held_against, peak_against = (m - before for m in tracemalloc.get_traced_memory())
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
    assert read_held < 0.5 * size and read_peak < 0.8 * size, (read_held, read_peak, size)
    assert held_against < 0.02 * size and peak_against < 0.25 * size, (held_against, peak_against, size)
    assert write_peak < 0.05 * size and whole_peak > 2 * size, (write_peak, whole_peak, size)


def _contents(pairs: list[tuple[str, str]]) -> hash_files.ContentHashes:
    digests = np.array([np.frombuffer(bytes.fromhex(d), np.uint8) for d, _ in pairs], np.uint8).reshape(-1, 32)
    return hash_files.ContentHashes(digests, [n for _, n in pairs])


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_a_compact_index_is_read_by_blocks_with_the_whole_texts_answers(tmp_path, block):
    """The compact index (as probe writes it) is read by blocks and keeps no text; its panels,
    fields, digests, names, pairs and name checks are those of the same index written with an
    indent (read from its whole text) and of the dicts themselves."""
    rng = np.random.default_rng(1)
    index = {
        p: {"role": role, "annotation_sha256": "a" * 64, "x": [1, {"y": 2.5}, None], "hashes": {rng.bytes(32).hex(): f"{p}/img {i}.png" for i in range(n)}}
        for p, role, n in (("p", "train", 50), ("q", "val", 0), ("r", "val", 30))
    }
    compact, spaced = tmp_path / "compact.json", tmp_path / "spaced.json"
    compact.write_text(json.dumps(index, separators=(",", ":")) + "\n")
    spaced.write_text(json.dumps(index, indent=1))
    by_blocks, whole = hash_files.Index(compact, block), hash_files.Index(spaced, block)
    assert by_blocks.text is None and whole.text is not None
    assert list(by_blocks.panels) == list(whole.panels) == list(index)
    for name, panel in by_blocks.panels.items():
        other, hashes = whole.panels[name], index[name]["hashes"]
        assert panel.fields == other.fields == {k: v for k, v in index[name].items() if k != "hashes"}
        assert panel.order == other.order == list(index[name]) and panel.plain and other.plain
        assert (panel.sorted == other.sorted).all() and [d.tobytes().hex() for d in panel.sorted] == sorted(hashes)
        names = [hashes[d] for d in sorted(hashes)]
        assert [by_blocks.name(panel, i) for i in range(len(hashes))] == names == [whole.name(other, i) for i in range(len(hashes))]
        assert list(by_blocks.pairs(panel)) == list(hashes.items()) == list(whole.pairs(other))
    items = list(index["p"]["hashes"].items())
    for pairs, same in (
        (items[5:40], True),
        ([], True),
        ([*items[:3], (items[3][0], "another.png")], False),
        ([*items[:3], (rng.bytes(32).hex(), "new.png")], False),
    ):
        assert by_blocks.same_names(by_blocks.panels["p"], _contents(pairs)) == same == whole.same_names(whole.panels["p"], _contents(pairs))


def _shared(panel: dict[str, str], against: list[str]) -> tuple[int, tuple[int, str] | None]:
    """What a panel's hashes (hex → name) share with sorted hex digests, from sets and lists."""
    shared = sorted(set(panel) & set(against))
    return len(shared), (against.index(shared[0]), panel[shared[0]]) if shared else None


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_other_panels_are_matched_as_read_and_keep_no_arrays(tmp_path, block):
    """Read against one set of digests (as a panel's check is), every other panel of a compact
    index keeps no arrays, and what it shares with the set (how many; the first in sorted order:
    its place in the set and the panel's name for it) is what sets of hex texts give, and what
    the same index read from its whole text (its arrays kept) gives."""
    rng = np.random.default_rng(2)
    index = {
        p: {"role": role, "annotation_sha256": "a" * 64, "hashes": {rng.bytes(32).hex(): f"{p}/img {i}.png" for i in range(n)}}
        for p, role, n in (("r", "val", 30), ("own", "train", 50), ("q", "val", 0), ("s", "test", 40), ("t", "val", 25))
    }
    r, s = list(index["r"]["hashes"]), list(index["s"]["hashes"])
    mine = sorted({*r[3:9], *s[::7], *list(index["own"]["hashes"])[:5], *(rng.bytes(32).hex() for _ in range(20))})
    against = _contents([(d, f"mine {i}") for i, d in enumerate(mine)]).sorted
    compact, spaced = tmp_path / "compact.json", tmp_path / "spaced.json"
    compact.write_text(json.dumps(index, separators=(",", ":")) + "\n")
    spaced.write_text(json.dumps(index, indent=1))
    by_blocks = hash_files.Index(compact, block, own="own", against=against)
    whole = hash_files.Index(spaced, block, own="own", against=against)
    assert by_blocks.text is None and whole.text is not None
    for name, panel in by_blocks.panels.items():
        expected = _shared(index[name]["hashes"], mine)
        assert by_blocks.overlap(panel, against) == expected == whole.overlap(whole.panels[name], against)
        assert (panel.passed is None) == (name == "own") and len(panel.sorted) == len(panel.starts) == (50 if name == "own" else 0)
    assert _shared(index["r"]["hashes"], mine)[0] == 6 and _shared(index["s"]["hashes"], mine)[0] == 6 and _shared(index["t"]["hashes"], mine) == (0, None)
    with pytest.raises(ValueError):
        by_blocks.overlap(by_blocks.panels["r"], against.copy())


def test_two_digests_of_a_panel_read_past_that_share_8_bytes_send_it_to_the_text(tmp_path):
    """A panel read past keeps 8 bytes a digest to find a repeat: two distinct digests that share
    them are read from the whole text instead, with the same answers."""
    a, b = "ab" * 8 + "01" * 24, "ab" * 8 + "02" * 24
    hashes = {a: "a.png", b: "b.png", _h(b"z"): "z.png"}
    path = tmp_path / "panel-images.json"
    path.write_text(json.dumps({"o": {"role": "val", "hashes": hashes}}, separators=(",", ":")))
    against = _contents([(b, "mine.png")]).sorted
    read = hash_files.Index(path, 5, own="tr", against=against)
    assert read.text is not None and read.overlap(read.panels["o"], against) == (1, (0, "b.png"))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"o": {"role": "val", "hashes": {a: "a.png", _h(b"z"): "z.png"}}}, separators=(",", ":")))
    read = hash_files.Index(other, 5, own="tr", against=against)
    assert read.text is None and read.overlap(read.panels["o"], against) == (0, None)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"o": {"hashes": {_h(b"x"): "a.png", _h(b"y"): "a.png"}}}, separators=(",", ":")).replace(_h(b"y"), _h(b"x")),
        json.dumps({"o": {"hashes": {_h(b"x"): "dir/é.png"}}}, separators=(",", ":"), ensure_ascii=False),
        json.dumps({"o": {"hashes": {_h(b"x"): 'q"uote.png'}}}, separators=(",", ":")),
        json.dumps({"o": {"hashes": {_h(b"x"): "a.png"}}}, separators=(",", ":")) + " x",
        json.dumps({"o": {"hashes": {_h(b"x"): "a.png"}}}, separators=(",", ":")).replace("a.png", "a\x7f.png"),
    ],
)
def test_an_index_of_another_form_is_read_from_its_whole_text(tmp_path, text):
    path = tmp_path / "panel-images.json"
    path.write_text(text)
    read = hash_files.Index(path, 4)
    assert read.text == text


def _expected_without(text: str, panel: str) -> str:
    index = json.loads(text) if text else {}
    if index.pop(panel, None) is None:
        return text
    return json.dumps(_null(index), separators=(",", ":"), allow_nan=False) + "\n"


@pytest.mark.parametrize("layout", sorted({**INDEXES, "a list": "[1, 2]", "a panel of null": '{"tr": null, "o": {"role": "val"}}'}))
@pytest.mark.parametrize("panel", ["tr", "o", "absent"])
def test_a_replaced_panel_is_forgotten_as_the_whole_dict_would_be(tmp_path, layout, panel):
    """``probe panel add --replace`` drops the panel's entry (``hygiene.forget``): the bytes of
    json.loads, pop and the compact dump, the file untouched where the panel is absent."""
    text = {**INDEXES, "a list": "[1, 2]", "a panel of null": '{"tr": null, "o": {"role": "val"}}'}[layout]
    path = tmp_path / "panel-images.json"
    if text:
        path.write_text(text)
    hygiene.forget(tmp_path, panel)
    assert (path.read_text() if path.exists() else "") == (_expected_without(text, panel) if text.startswith("{") else text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([".panel-images.json.lock"] if text else []) + (["panel-images.json"] if text else [])


def test_forgetting_a_panel_holds_a_member_not_the_index(tmp_path):
    """The index of 3 × 10 k digests (about 2.6 MB) written back without one panel, read 8 k
    characters at a time: the writing's peak traced is under 5 % of the file."""
    path = tmp_path / "panel-images.json"
    rng = np.random.default_rng(0)
    index = {f"p{p}": {"role": "val", "annotation_sha256": "0" * 64, "hashes": {rng.bytes(32).hex(): f"img_{i:08d}.JPEG" for i in range(10_000)}} for p in range(3)}
    path.write_text(json.dumps(index, separators=(",", ":")))
    size = path.stat().st_size
    tracemalloc.start()
    try:
        read = hash_files.Index(path, 1 << 13)
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        assert index_write.write_without(path, read, "p1")
        write_peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    del index["p1"]
    assert path.read_text() == json.dumps(index, separators=(",", ":")) + "\n"
    assert write_peak < 0.05 * size, (write_peak, size)
