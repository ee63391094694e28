"""``probe decode --keys plain|rope`` on a DINOv3 store: the keys before RoPE by default, those after on request.

The keys after RoPE are rebuilt here from the stored keys before it, with RoPE written out from its
definition (tests/test_dinov3.py), and decoded image by image; the run's masks must be those.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_runs import probe_main
from test_dinov3 import rotate

import probe_toolkit as probe
from probe_toolkit.analyses.decoder import decode_image
from probe_toolkit.analyses.decoder_settings import Settings as DecoderSettings
from probe_toolkit.demo.samples import TINY, TINY_DINOV3, write_checkpoint
from probe_toolkit.results import records
from probe_toolkit.store.cache import open_store
from probe_toolkit.store.extract import Settings, extract


@pytest.fixture(scope="module")
def dinov3_store(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("dec3")
    checkpoint = write_checkpoint(root / "v3.pth", "dinov3-official", TINY_DINOV3, seed=4)
    store = extract(checkpoint, photos, settings=Settings(views=("480",), dtype="float32", chunk=4), store=root / "s.zarr", quiet=True, batch_size=4).store
    return root, store


def _masks(store, run):
    saved = records.load(store, "decoder")
    assert saved.attrs["keys"] == run
    return saved.masks.values[:, 0]


def test_decode_reads_the_keys_asked_for_and_records_which(dinov3_store, tmp_path):
    root, store = dinov3_store
    ds = open_store(store)
    n = ds.sizes["image"]
    plain = ds.keys_480.values
    rotated = rotate(torch.as_tensor(plain, dtype=torch.float64).reshape(n, 900, 2, 64).transpose(1, 2), 30, 30)
    rotated = rotated.transpose(1, 2).reshape(n, 900, 128).float().numpy()
    settings = DecoderSettings.from_preset("tokencut")
    runs = {}
    for keys, source in (("plain", plain), ("rope", rotated)):
        run = probe.run("decode", store, preset="tokencut", keys=keys, workers=1, out=tmp_path / f"{keys}.json")
        assert run.records[0].meta["settings"]["keys"] == keys and run.report.extra["keys"] == keys
        got = _masks(store, keys)
        compared = 0
        for i in range(n):
            want = decode_image(source[i], settings)
            if want.degenerate:  # a tie of eigenvalues: decided by solver noise on either side, not compared
                continue
            np.testing.assert_array_equal(got[i], want.masks[0], err_msg=f"{keys} image {i}")
            compared += 1
        assert compared >= n - 1
        runs[keys] = got
        assert json.loads((tmp_path / f"{keys}.meta.json").read_text())["keys"] == keys  # the masks file's metadata says which keys
    assert (runs["plain"] != runs["rope"]).any()  # the rotation changes the cut
    default = probe.run("decode", store, preset="lost", workers=1, out=tmp_path / "d.json")
    assert default.records[0].meta["settings"]["keys"] == "plain" and records.load(store, "decoder").attrs["keys"] == "plain"


def test_keys_after_rope_are_refused_where_there_are_none(dinov3_store, photos, tmp_path, capsys):
    root, store = dinov3_store
    dino = extract(
        write_checkpoint(tmp_path / "dino.pth", "dino-full", TINY, seed=0), photos, settings=Settings(views=("480",), chunk=4), store=tmp_path / "dino.zarr", quiet=True
    ).store
    code, printed = probe_main(["decode", str(dino), "--keys", "rope", "--workers", "1", "-q"], capsys)
    assert code == 2 and "position table, not RoPE" in printed.err and len(printed.err.strip().splitlines()) == 1
    code, printed = probe_main(["decode", str(store), "--keys", "rope", "--workers", "1", "-q", "--out", str(tmp_path / "r.json")], capsys)
    assert code == 0 and "keys after RoPE" in printed.out.replace("\n", " ")
    code, printed = probe_main(["decode", str(store), "--keys", "after", "--workers", "1", "-q"], capsys)
    assert code == 2 and "--keys" in printed.err and len(printed.err.strip().splitlines()) == 1
    # a DINOv3 store extracted before keys after RoPE were stored
    import shutil

    old = tmp_path / "old.zarr"
    shutil.copytree(store, old, ignore=shutil.ignore_patterns("results"))
    shutil.rmtree(old / "keys_rope_480")
    import zarr

    zarr.consolidate_metadata(str(old))  # as a store of before lists its arrays (a listed array gone is damage)
    code, printed = probe_main(["decode", str(old), "--keys", "rope", "--workers", "1", "-q"], capsys)
    assert code == 2 and "before keys after RoPE were stored" in printed.err and len(printed.err.strip().splitlines()) == 1


@pytest.mark.parametrize("keys", ["plain", "rope"])
def test_streaming_a_dinov3_checkpoint_equals_extract_then_decode(tmp_path, photos, keys):
    """``probe decode CKPT --images DIR --keys K`` on DINOv3 (keys in memory only) gives the masks of
    extracting the same float16 keys and decoding the store with the same ``--keys``."""
    import probe_toolkit as probe

    checkpoint = write_checkpoint(tmp_path / "v3.pth", "dinov3-hf", TINY_DINOV3, seed=6)
    store = extract(checkpoint, photos, settings=Settings(views=("480",), attention="none", chunk=4), store=tmp_path / "s.zarr", quiet=True, batch_size=4).store
    probe.run("decode", store, preset="tokencut", workers=1, keys=keys)
    streamed = probe.run(
        "decode-stream", None, checkpoint=checkpoint, images=photos, preset="tokencut", chunk=4, batch_size=4, store=tmp_path / "m.zarr", workers=1, keys=keys
    ).report
    assert streamed.done == 7 and open_store(tmp_path / "m.zarr").attrs["manifest"]["keys_kind"] == keys
    a, b = records.load(store, "decoder"), records.load(tmp_path / "m.zarr", "decoder")
    np.testing.assert_array_equal(a.masks.values, b.masks.values)
    with pytest.raises(Exception, match="position table, not RoPE"):
        probe.run(
            "decode-stream",
            None,
            checkpoint=write_checkpoint(tmp_path / "dino.pth", "dino-full", TINY, seed=0),
            images=photos,
            preset="tokencut",
            store=tmp_path / "d.zarr",
            workers=1,
            keys="rope",
        )
