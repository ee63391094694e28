"""``infra.atomic.write_json`` writes strict JSON (undefined values as null) piece by piece: the
bytes of one ``json.dumps`` of the converted object, and a container without an undefined value
is not copied to be written (a data set's index of file digests is 100 k entries)."""

from __future__ import annotations

import json
import math
import tracemalloc

from probe_toolkit.infra.atomic import undefined_as_null, write_json


def _plain_null(obj):
    """An independent conversion: every non-finite float as None, containers rebuilt."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _plain_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain_null(v) for v in obj]
    return obj


MIXED = {"ap": float("nan"), "rows": [1.5, float("inf"), (2, float("-inf")), {"x": "é", "y": None}], "n": 3, "deep": {"a": [[0.1, float("nan")]]}}


def test_the_file_is_the_text_of_one_dumps_of_the_converted_object(tmp_path):
    for indent in (None, 2):
        separators = None if indent else (",", ":")
        written = write_json(tmp_path / f"m{indent}.json", MIXED, indent=indent).read_text(encoding="utf-8")
        assert written == json.dumps(_plain_null(MIXED), indent=indent, separators=separators, allow_nan=False) + "\n"
        assert json.loads(written)["rows"][1] is None and json.loads(written)["deep"]["a"][0] == [0.1, None]


def test_a_container_without_an_undefined_value_is_not_copied():
    index = {"panel": {"role": "train", "hashes": {f"{i:06d}.jpg": f"{i:064x}" for i in range(1000)}}, "scores": [0.5, 1, "a"]}
    assert undefined_as_null(index) is index
    mixed = undefined_as_null(MIXED)
    assert mixed == _plain_null(MIXED) and mixed is not MIXED and math.isnan(MIXED["ap"])  # the caller's object is left as it was
    assert mixed["rows"][3] is MIXED["rows"][3]  # the parts without one are shared


def test_a_large_index_is_written_without_its_whole_text_in_memory(tmp_path):
    index = {"panel": {"role": "train", "hashes": {f"{i:08d}.jpg": f"{i:064x}" for i in range(20_000)}}}
    text = json.dumps(index, separators=(",", ":")) + "\n"
    tracemalloc.start()
    try:
        write_json(tmp_path / "index.json", index)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "index.json").read_text() == text
    assert peak < len(text) / 4, (peak, len(text))  # the text is 2 MB; writing it whole held more than that
