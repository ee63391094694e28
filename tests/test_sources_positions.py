"""store/sources.py: a store's images looked up by name as sorted arrays (``positions_of``) and the
(store id, file) pairs made when asked (``Pairs``) give what the dict and list they replaced gave
(re-implemented here), names of any characters and a name held twice included."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from probe_toolkit.store import sources


def _store(path, names: list[str]):
    group = zarr.open_group(str(path), mode="w")
    group.create_array("image", shape=(len(names),), dtype=str, chunks=(max(len(names), 1),))
    if names:
        group["image"][:] = np.array(names, dtype=object)
    return path


_NAME = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=5)  # file names hold no NUL


@settings(max_examples=40, deadline=None)
@given(held=st.lists(_NAME, min_size=1, max_size=12), picks=st.lists(st.integers(0, 11), max_size=8))
def test_positions_are_those_of_a_dict_of_the_stores_names(tmp_path_factory, held, picks):
    store = _store(tmp_path_factory.mktemp("s") / "s.zarr", held)
    ids = [held[p % len(held)] for p in picks]
    at = {name: i for i, name in enumerate(held)}  # the last of a name held twice
    assert [int(p) for p in sources.positions_of(store, ids)] == [at[i] for i in ids]


def test_a_name_the_store_lacks_is_a_key_error_as_before(tmp_path):
    store = _store(tmp_path / "s.zarr", ["a.jpg", "b.jpg"])
    with pytest.raises(KeyError, match="c.jpg"):
        sources.positions_of(store, ["a.jpg", "c.jpg"])
    with pytest.raises(KeyError):
        sources.positions_of(_store(tmp_path / "e.zarr", []), ["a.jpg"])


def test_pairs_are_the_list_they_replace(tmp_path):
    ids, names = ["sub/a.jpg", "sub/b.jpg", "sub/c.jpg"], ["a.jpg", "b.jpg", "c.jpg"]
    pairs = sources.Pairs(ids, "/data", names, np.array([0, 2]))
    listed = [(w, os.path.join("/data", n)) for w, n in zip(ids, names) if w != "sub/b.jpg"]
    assert len(pairs) == 2 and list(pairs) == listed and pairs[0:5] == listed and pairs[1:] == listed[1:]


@settings(max_examples=40, deadline=None)
@given(held=st.lists(_NAME, max_size=10), wanted=st.lists(_NAME, max_size=10))
def test_a_lookup_is_a_dicts_of_the_held_names(held, wanted):
    from probe_toolkit.infra.names import lookup

    at, found = lookup(held, wanted)
    last = {name: i for i, name in enumerate(held)}
    assert found.tolist() == [w in last for w in wanted]
    assert [int(a) for a, f in zip(at, found) if f] == [last[w] for w in wanted if w in last]
