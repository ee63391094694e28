"""Results written block by block (store/plain_rows.py, what ``probe decode`` saves as it decodes)
are the files ``store.plain.write`` writes from the whole arrays, byte for byte; the masks JSON
written from each block's text is the file ``write_json`` writes from the whole list."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from probe_toolkit.store import plain
from probe_toolkit.store.plain_rows import Rows


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _variables(n: int) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """Arrays large enough for zarr to cut them in several chunks along image (and along another
    axis), of every dtype decode saves, with whole chunks of fill value (NaN), which zarr skips."""
    rng = np.random.default_rng(0)
    fiedler = rng.standard_normal((n, 96)).astype(np.float32)
    fiedler[: n // 2] = np.nan
    return {
        "fiedler": (("image", "patch"), fiedler),
        "masks": (("image", "mask", "patch"), rng.random((n, 3, 96)) < 0.3),
        "score": (("image", "mask"), rng.standard_normal((n, 3))),
        "n_masks": (("image",), rng.integers(0, 4, n)),
        "degree": (("image", "patch"), np.full((n, 96), np.nan, np.float32)),  # LOST's, absent: dropped once every image is seen
    }


@pytest.mark.parametrize("sizes", [[2000], [7, 16, 16, 961, 1000], [1] * 5 + [1995]], ids=["one block", "uneven blocks", "single images first"])
def test_rows_written_block_by_block_are_the_bytes_of_one_write(tmp_path, sizes):
    n = sum(sizes)
    variables = _variables(n)
    coords = {"image": np.asarray([f"{i:05d}.jpg" for i in range(n)], dtype=object), "mask": np.arange(3)}
    attrs = {"grid": 30, "stops": ["a", "b"], "settings": {"preset": "tokencut"}}
    whole = {k: v for k, v in variables.items() if k != "degree"}
    plain.write(plain.Results(whole, coords=coords, attrs=attrs), tmp_path / "whole")
    rows = Rows(tmp_path / ".rows.tmp-1", n)
    start = 0
    for size in sizes:
        rows.add({name: (dims, values[start : start + size]) for name, (dims, values) in variables.items()})
        start += size
    chunked = [name for name, array in rows.arrays.items() if int(array.chunks[0]) < n]
    assert "masks" in chunked and "fiedler" in chunked  # the test crosses chunk rows
    assert all(spool.held < int(spool.step) for spool in rows.spools.values())  # a full chunk row is written at once
    rows.written(coords, attrs, drop=("degree",)).copy().move(tmp_path / "rows")
    ours, theirs = _files(tmp_path / "rows"), _files(tmp_path / "whole")
    assert sorted(ours) == sorted(theirs) and [f for f in ours if ours[f] != theirs[f]] == []
    assert not (tmp_path / ".rows.tmp-1").exists()


def test_rows_refuse_a_block_that_disagrees(tmp_path):
    rows = Rows(tmp_path / "r", 4)
    rows.add({"a": ("image", np.zeros(2)), "b": ("image", np.zeros(2))})
    with pytest.raises(ValueError):
        rows.add({"a": ("image", np.zeros(2)), "b": ("image", np.zeros(1))})
    with pytest.raises(ValueError):
        rows.written({}, {})  # 2 of 4 rows in


def test_a_json_list_written_from_its_blocks_texts_is_the_bytes_of_one_write(tmp_path):
    """The masks JSON kept as each block's text (decode without a panel, ``infra.atomic.write_json_list``):
    the bytes ``write_json`` writes for the whole list, a block without masks adding nothing."""
    from probe_toolkit.infra.atomic import json_text, write_json, write_json_list

    entries = [{"image_id": i, "segmentation": {"size": [4, 6], "counts": "0a1"}, "score": [0.5, float("nan")][i % 2], "bbox": [1.0, 2.5]} for i in range(7)]
    blocks = [entries[:3], [], entries[3:4], entries[4:]]
    write_json(tmp_path / "whole.json", entries)
    write_json_list(tmp_path / "blocks.json", (json_text(b, None, (",", ":"))[1:-1] for b in blocks))
    assert (tmp_path / "blocks.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
    write_json(tmp_path / "none.json", [])
    write_json_list(tmp_path / "none-blocks.json", ["", ""])
    assert (tmp_path / "none-blocks.json").read_bytes() == (tmp_path / "none.json").read_bytes() == b"[]\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks.json", "none-blocks.json", "none.json", "whole.json"]  # no temporary name left


def test_rows_waiting_for_their_chunk_are_not_kept_in_memory(tmp_path):
    """zarr picks taller chunks for a larger array, so the rows waiting for their chunk grow with
    the store: they wait on disk, and a chunk row is written one chunk at a time. The traced peak
    of handing in blocks and writing them stays under half of one chunk row's bytes (rows kept in
    memory until their chunk row filled took the chunk row, and more on joining and writing it)."""
    import tracemalloc
    import weakref

    import zarr

    n, width = 10000, 1024
    rows = Rows(tmp_path / "r", n)
    values = (np.arange(n * width, dtype=np.float32) % 97).reshape(n, width)
    first = values[:16].copy()
    watched = weakref.ref(first)
    rows.add({"fiedler": (("image", "patch"), first)})
    del first
    assert watched() is None  # the block handed in is not kept
    tall, wide = (int(c) for c in rows.arrays["fiedler"].chunks)
    assert tall >= 1000 and width // wide >= 8  # a chunk row of several chunks, each of many blocks' rows
    tracemalloc.start()
    try:
        for a in range(16, n, 16):
            rows.add({"fiedler": (("image", "patch"), values[a : a + 16])})
        written = rows.written({"image": np.arange(n)}, {})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < tall * width * 4 / 2, (peak, tall * width * 4)
    assert np.array_equal(zarr.open_array(str(written.folder / "fiedler"), mode="r")[:], values)
