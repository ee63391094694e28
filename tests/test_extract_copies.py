"""The forward pass's device copies (``store.extract_forward.Copies``): a batch's arrays brought to
the host one batch behind the network (a GPU's overlapped copies, in the same order on the CPU)
give the same arrays as the immediate copies, for every kind a view stores, into plain arrays and
into the shared buffers a writing process reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract_forward import forward_view
from probe_toolkit.store.extract_plan import Settings
from probe_toolkit.store.writer import SharedBuffers


@pytest.mark.parametrize("shared", [False, True])
def test_overlapped_copies_give_the_immediate_arrays(tmp_path, shared):
    backbone = Backbone.from_checkpoint(load_checkpoint(write_checkpoint(tmp_path / "tiny.pth", "dino-full", TINY, seed=3))).eval()
    pixels = torch.from_numpy(np.random.default_rng(0).normal(size=(7, 3, 224, 224)).astype(np.float32))
    names = ["tokens_224", "cls_tokens_224", "keys_224", "attention_224", "tokens_b0_224", "attention_entropy_224"]
    settings = Settings(views=(224,), chunk=8)
    cpu = torch.device("cpu")
    found = {}
    for overlap in (False, True):
        ticks = []
        found[overlap] = forward_view(backbone, pixels, names, settings, 3, cpu, ticks.append, SharedBuffers() if shared else None, overlap=overlap)
        assert sum(ticks) == 7 and sorted(found[overlap]) == sorted(names)
    for name in names:
        assert found[True][name].shape[0] == 7 and found[True][name].dtype == found[False][name].dtype
        assert np.array_equal(found[True][name], found[False][name], equal_nan=True), name
