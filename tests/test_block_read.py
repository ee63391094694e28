"""Reading one block of a store (``store.cache.require(ds, name, block=B)``): the block's own array,
its block dimension dropped; ``block=None`` the last block as every store holds it; a later part
read only once it is finished; a missing block is one line naming the extract flags."""

from __future__ import annotations

import numpy as np
import pytest

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import cache, layout
from probe_toolkit.store.create import create_store

DEPTH, N, PATCHES, WIDTH, HEADS = 4, 3, 4, 6, 2


@pytest.fixture(scope="module")
def blocked_store(tmp_path_factory):
    """tokens at blocks 1 and 3 (the last), attention of every block, and ``normed`` at block 1
    in a later part (``.p1``) that image 2 has not finished."""
    path = tmp_path_factory.mktemp("blocks") / "store.zarr"
    rng = np.random.default_rng(0)
    t = PATCHES + 1
    arrays = {
        "tokens_224": (("patch_224", "channel"), (PATCHES, WIDTH)),
        "tokens_b1_224": (("patch_224", "channel"), (PATCHES, WIDTH)),
        "cls_tokens_b1_224": (("channel",), (WIDTH,)),
        "attention_blocks_224": (("block", "head", "query", "key"), (DEPTH, HEADS, t, t)),
        "normed_b1_224.p1": (("patch_224.p1", "channel"), (PATCHES, WIDTH)),
    }
    manifest = {
        "kind": "probe-store",
        "checkpoint": {"path": "x.pth", "sha256": "ab" * 32, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": WIDTH, "depth": DEPTH, "heads": HEADS, "patch": 16, "class_token": True},
        "views": [224],
        "interpolation": "dino",
        "attention": "all",
        "dtype": "float32",
        "chunk": 2,
        "image_list_sha256": "0" * 64,
        "n_images": N,
    }
    writer = create_store(path, manifest, [f"{i}.jpg" for i in range(N)], arrays)
    values = {name: rng.standard_normal((N, *shape)).astype(np.float32) for name, (_, shape) in arrays.items()}
    sizes = np.full((N, 2), 32)
    writer.write_views(0, {"224": ({k: v for k, v in values.items() if not k.endswith(".p1")}, np.zeros(N, bool))}, sizes)
    writer.write_views(0, {"224.p1": ({"normed_b1_224.p1": values["normed_b1_224.p1"][:2]}, np.zeros(2, bool))}, sizes[:2])
    return path, values


@pytest.mark.parametrize("plain", [False, True])
def test_one_block_is_its_own_array_with_the_block_dimension_dropped(blocked_store, plain):
    path, values = blocked_store
    ds = cache.open_store(path, arrays="tokens_224", plain=plain)
    last = cache.require(ds, "tokens_224")
    assert last.dims == ("image", "patch", "channel") and last.attrs["block"] == DEPTH - 1 and last.attrs["facet"] == "tokens"
    np.testing.assert_array_equal(last.values, values["tokens_224"])
    for block in (DEPTH - 1, -1):
        np.testing.assert_array_equal(cache.require(ds, "tokens_224", block=block).values, values["tokens_224"])
    one = cache.require(ds, "tokens_224", block=1)
    assert one.dims == ("image", "patch", "channel") and one.attrs["block"] == 1
    np.testing.assert_array_equal(one.values, values["tokens_b1_224"])
    np.testing.assert_array_equal(cache.require(ds, "cls_tokens_224", block=1).values, values["cls_tokens_b1_224"])
    maps = cache.require(ds, "attention_blocks_224", block=2)
    assert maps.dims == ("image", "head", "query", "key") and maps.attrs["block"] == 2
    np.testing.assert_array_equal(maps.values, values["attention_blocks_224"][:, 2])
    assert cache.require(ds, "attention_blocks_224").dims == ("image", "block", "head", "query", "key")  # None: whole, as before
    assert "block" not in cache.checked(ds, "tokens_224").dims and cache.checked(ds, "tokens_224", block=1).dims[1] == "patch_224"
    assert cache.require(ds, "tokens_224").attrs["block"] == DEPTH - 1  # selecting a block left the dataset's own attributes alone


def test_a_later_part_reads_once_finished_and_missing_blocks_name_the_flags(blocked_store):
    path, values = blocked_store
    ds = cache.open_store(path, arrays="tokens_224")
    with pytest.raises(ProbeError, match=r"holds normed_b1_224.p1 for 2 of its 3 images .* same `probe extract` command"):
        cache.require(ds, "normed_224", block=1)
    two = ds.isel(image=[0, 1])
    normed = cache.require(two, "normed_224", block=1)
    assert normed.dims == ("image", "patch", "channel") and normed.attrs == {**normed.attrs, "block": 1, "facet": "normed"}
    np.testing.assert_array_equal(normed.values, values["normed_b1_224.p1"][:2])
    with pytest.raises(ProbeError, match=r"has no array tokens_224 at block 2; rerun `probe extract CKPT --views 224 --blocks 2 --facets tokens`"):
        cache.require(ds, "tokens_224", block=2)
    with pytest.raises(ProbeError, match=r"network of 4 blocks: block 4 is not one of 0..3"):
        cache.require(ds, "tokens_224", block=4)


def test_a_missing_view_at_the_last_block_is_said_as_a_missing_view(blocked_store):
    """A run reads its resolved block (the last, where none is asked): a view the store lacks is then
    named with the view it holds, not as a block to extract."""
    path, _ = blocked_store
    ds = cache.open_store(path, arrays="tokens_224")
    for block in (None, DEPTH - 1, -1):
        with cache.reading_block(block), pytest.raises(ProbeError) as raised:
            cache.require(ds, "tokens_480")
        message = str(raised.value)
        assert "has no array tokens_480;" in message and "at block" not in message and "--blocks" not in message, message
        assert "it holds tokens_224: read it with --view 224" in message, message
    with cache.reading_block(1), pytest.raises(ProbeError, match=r"has no array tokens_480 at block 1; .* --views 480 --blocks 1"):
        cache.require(ds, "tokens_480")


def test_names_carry_kind_block_view_and_part():
    assert layout.parse("cls_tokens_b3_224.p1") == layout.ArrayName("cls_tokens", "224", 3, 1)
    assert layout.parse("keys_rope_square@1024") == layout.ArrayName("keys_rope", "square@1024")
    assert layout.parse("tokens_hbird512_aug1").view == "hbird512_aug1" and layout.parse("keys_native_crop").kind == "keys"
    assert layout.named("tokens", "224", 11, depth=12) == "tokens_224" and layout.named("queries", "eval@448", 3, depth=12, part=2) == "queries_b3_eval@448.p2"
    assert layout.unit_of("done_224.p2") == "224.p2" and layout.view_of("tokens_b3_native_crop.p1") == "native_crop"
    names = ("cls_keys_480", "keys_rope_480", "registers_224", "registers_normed_224", "values_224")
    assert [layout.parse(n).facet for n in names] == ["k", "k", "tokens", "normed", "v"]


def _row_sums(values):
    return {"sum": values.reshape(values.shape[0], -1).astype(np.float64).sum(1)}


def test_workers_read_the_same_block(blocked_store):
    """A block of an array holding every block, read by local worker processes by its name: the same block."""
    from probe_toolkit.infra.runner import Where, per_image

    path, values = blocked_store
    ds = cache.open_store(path, arrays="attention_blocks_224")
    one = cache.require(ds, "attention_blocks_224", block=2)
    here = per_image()(_row_sums, {"values": one})
    there = per_image(Where(workers=2), block=1)(_row_sums, {"values": one})
    want = values["attention_blocks_224"][:, 2].reshape(N, -1).astype(np.float64).sum(1)
    np.testing.assert_allclose(here["sum"], want, rtol=1e-6)
    np.testing.assert_array_equal(there["sum"], here["sum"])


@pytest.mark.parametrize("held", [("keys_224",), ("keys_224", "keys_native")])
def test_a_missing_key_view_is_offered_only_in_a_view_the_decoders_cut(tmp_path, held):
    """Keys of the 224 view (``--facets k``) are no fix for a decoder asking for keys_480: the
    decoders cut 480 and the own-size views alone, so the line names those or the extract rerun."""
    arrays = {name: ((f"patch_{name[5:]}", "channel"), (PATCHES, WIDTH)) for name in held}
    manifest = {"kind": "probe-store", "checkpoint": {"path": "x.pth", "sha256": "cd" * 32, "format": "synthetic"}, "network": "teacher"}
    manifest |= {"arch": {"width": WIDTH, "depth": DEPTH, "heads": HEADS, "patch": 16, "class_token": True}, "views": [224], "dtype": "float32"}
    writer = create_store(tmp_path / "keys.zarr", {**manifest, "chunk": 2, "image_list_sha256": "0" * 64, "n_images": N}, [f"{i}.jpg" for i in range(N)], arrays)
    values = {name: np.zeros((N, PATCHES, WIDTH), np.float32) for name in held}
    writer.write_views(0, {"224": (values, np.zeros(N, bool))}, np.full((N, 2), 32))
    ds = cache.open_store(tmp_path / "keys.zarr", arrays="keys_224")
    with pytest.raises(ProbeError) as raised:
        cache.require(ds, "keys_480")
    message = str(raised.value)
    assert "--view 224" not in message and "probe extract CKPT --views 480" in message, message
    assert ("it holds keys_native: read it with --view native, or rerun" in message) == ("keys_native" in held), message


def test_a_missing_view_is_offered_only_where_the_run_could_read_it(blocked_store):
    """Within a run, the line offers the store's other view only where the protocol could be told
    to read it: ``--view`` of a protocol that has one, taking that view; never for a fixed view."""
    from probe_toolkit.protocols import api, registry

    path, _ = blocked_store
    ds = cache.open_store(path, arrays="tokens_224")
    for protocol, offered in (("rank", True), ("neighbours", True), ("linear", False), ("hummingbird", False)):
        settings = registry.get(protocol).make_settings()
        with cache.reading_block(None, views=api.view_choices(settings)), pytest.raises(ProbeError) as raised:
            cache.require(ds, "tokens_480")
        message = str(raised.value)
        assert ("read it with --view 224" in message) == offered and "rerun `probe extract CKPT --views 480`" in message, (protocol, message)
    takes = api.view_choices(registry.get("decode").make_settings())
    assert [v for v in ("224", "480", "native", "native_crop", "hbird512") if takes(v)] == ["480", "native", "native_crop"]
