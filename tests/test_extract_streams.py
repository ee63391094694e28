"""The CPU's forward pass as single-threaded streams (store/streams.py) stores the same bytes as one
pass on torch's threads, and leaves the process's thread counts as they were."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import zarr

from probe_toolkit.demo.samples import TINY_DINOV3, write_checkpoint
from probe_toolkit.store import extract as extraction
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.extract import Settings, extract
from probe_toolkit.store.streams import Streams, replica


def _arrays(path):
    group = zarr.open_group(path, mode="r")
    return {name: group[name][:] for name in group.array_keys()}


@pytest.mark.parametrize("layout", ["dino-full", "dinov3"])
def test_streams_store_the_same_bytes(tmp_path, tiny_checkpoints, image_dir, monkeypatch, layout):
    checkpoint = tiny_checkpoints[layout] if layout in tiny_checkpoints else write_checkpoint(tmp_path / "d3.pth", "dinov3-official", TINY_DINOV3)
    settings = Settings(views=(224,), attention="all", chunk=4)
    stores = {}
    for count in (1, 3):  # runs of 4 and 3 shared out as 2 + 1 + 1 and 1 + 1 + 1
        monkeypatch.setattr(extraction, "cpu_streams", lambda device, count=count: count)
        stores[count] = extract(checkpoint, image_dir, settings=settings, store=tmp_path / f"{count}.zarr", batch_size=5, quiet=True).store
    one, three = _arrays(stores[1]), _arrays(stores[3])
    assert one.keys() == three.keys() and "attention_blocks_224" in one
    for name in one:
        assert np.array_equal(one[name], three[name], equal_nan=one[name].dtype.kind == "f"), name


def test_streams_share_the_weights_and_leave_the_thread_counts():
    before = torch.get_num_threads()
    torch.manual_seed(0)
    from probe_toolkit.demo.samples import TINY

    model = Backbone(TINY).eval()
    torch.set_num_threads(2)
    try:
        with Streams(model, 3) as streams:
            copy = streams.models[1]
            assert copy is not model and copy.vit.blocks[0] is not model.vit.blocks[0]
            assert all(a is b for a, b in zip(copy.parameters(), model.parameters()))
            batch = torch.arange(7.0)[:, None]
            seen = streams.run(batch, lambda m, images: {"rows": images * 1, "threads": torch.full((len(images),), torch.get_num_threads())})
            assert torch.equal(seen["rows"], batch) and seen["threads"].tolist() == [1] * 7
            assert torch.get_num_threads() == 2  # this thread's, and a new thread's
            found = []
            later = threading.Thread(target=lambda: found.append(torch.get_num_threads()))
            later.start()
            later.join()
            assert found == [2]
        assert not any(t.name.startswith("probe-stream") for t in threading.enumerate())
        assert replica(model).vit.pos_embed is model.vit.pos_embed
    finally:
        torch.set_num_threads(before)
