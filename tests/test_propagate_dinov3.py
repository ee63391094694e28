"""``probe propagate --preset dinov3-tracking``: DINOv3's tracking notebook, against its loop written out here.

The reference below follows facebookresearch/dinov3 ``notebooks/segmentation_tracking.ipynb`` cell by
cell (commit 6876159), sharing no code with probe_toolkit's propagation: torchvision's resize of the
PIL frame to ``ResizeToMultiple`` sizes, ``get_intermediate_layers``-style features (the last block
through the final norm, from timm's own forward), ``F.normalize``, the first mask by
``nearest-exact``, the circular neighbourhood by ``vector_norm``, top-k with ``>=``, softmax(dot / T),
``mode="nearest"`` upsampling, min-max with NaN → 0, argmax.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_runs import probe_main
from conftest import davis_video
from PIL import Image

from probe_toolkit.demo.samples import TINY_DINOV3
from probe_toolkit.protocols import registry
from probe_toolkit.results import records
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import Settings, extract


def notebook_transform(frame: Image.Image, short_side: int, multiple: int = 16) -> torch.Tensor:
    import torchvision.transforms as TVT
    import torchvision.transforms.functional as TVTF

    old_width, old_height = frame.size
    up = lambda side: math.ceil(side / multiple) * multiple  # noqa: E731
    if old_width > old_height:
        new_height = up(short_side)
        new_width = up(old_width * new_height / old_height)
    else:
        new_width = up(short_side)
        new_height = up(old_height * new_width / old_width)
    resized = TVTF.resize(frame, [new_height, new_width], interpolation=TVT.InterpolationMode.BICUBIC)
    return TVT.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])(TVT.ToTensor()(resized))


def notebook_tracking(model, frames, first_mask, short_side, size=12, topk=5, temperature=0.2, context=7):
    def forward(img):
        x = img[None]
        with torch.no_grad():
            tokens = model.vit.forward_features(x)[:, 5:]  # the last block through the final norm, class and storage tokens dropped
        h, w = x.shape[-2] // 16, x.shape[-1] // 16
        return F.normalize(tokens.reshape(h, w, -1), dim=-1, p=2)

    first = notebook_transform(Image.open(frames[0]).convert("RGB"), short_side)
    fh, fw = first.shape[1] // 16, first.shape[2] // 16
    mh, mw = first_mask.shape
    m = int(first_mask.max() + 1)
    small = F.interpolate(torch.from_numpy(first_mask)[None, None].float(), (fh, fw), mode="nearest-exact")[0, 0].long()
    first_probs = F.one_hot(small, m).float()
    ij = torch.stack(torch.meshgrid(torch.arange(fh, dtype=torch.float32), torch.arange(fw, dtype=torch.float32), indexing="ij"), dim=-1)
    mask = torch.linalg.vector_norm(ij[:, :, None, None, :] - ij[None, None, :, :, :], ord=2, dim=-1) <= size
    first_feats = forward(first)
    feats_q, probs_q, out = [], [], []
    for path in frames[1:]:
        cur = forward(notebook_transform(Image.open(path).convert("RGB"), short_side))
        ctx_f = torch.stack([first_feats, *feats_q])
        ctx_p = torch.stack([first_probs, *probs_q])
        dot = torch.einsum("ijd, tuvd -> ijtuv", cur, ctx_f)
        dot = torch.where(mask[:, :, None, :, :], dot, -torch.inf).flatten(2, -1).flatten(0, 1)
        kth = torch.topk(dot, dim=1, k=topk).values
        dot = torch.where(dot >= kth[:, -1:], dot, -torch.inf)
        probs = torch.mm(F.softmax(dot / temperature, dim=1), ctx_p.flatten(0, 2))
        probs = (probs / probs.sum(dim=1, keepdim=True)).unflatten(0, (fh, fw))
        feats_q.append(cur)
        probs_q.append(probs)
        if len(feats_q) > context:
            feats_q.pop(0)
            probs_q.pop(0)
        p = F.interpolate(probs.movedim(-1, -3)[None], size=(mh, mw), mode="nearest")
        vmin, vmax = p.flatten(2, 3).min(dim=2).values, p.flatten(2, 3).max(dim=2).values
        p = torch.nan_to_num((p - vmin[:, :, None, None]) / (vmax[:, :, None, None] - vmin[:, :, None, None]), nan=0)
        out.append(torch.argmax(p[0], dim=0).to(torch.uint8).numpy())
    return out


def test_the_preset_fills_the_notebooks_values():
    s = registry.get("propagate").make_settings(preset="dinov3-tracking")  # through the registry: importing the module first would reorder it
    assert (s.n_last_frames, s.size_mask_neighborhood, s.topk) == (7, 12, 5)
    from probe_toolkit.analyses import tracking

    assert tracking.SHORT_SIDE["dinov3-tracking"] == 960 and tracking.TEMPERATURE["dinov3-tracking"] == 0.2
    assert tracking.v3_frame_size(854, 480, 960, 16) == (1712, 960)  # DAVIS 480p: 107 × 60 patches


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return davis_video(tmp_path_factory.mktemp("davis3"), {"shapes": 5, "pair": 3}, 4, "dinov3-official", TINY_DINOV3, 2)


def test_dinov3_tracking_equals_the_notebooks_loop_and_is_recorded(video, capsys):
    root, checkpoint = video
    store = extract(checkpoint, root / "DAVIS" / "JPEGImages" / "480p", settings=Settings(views=("224",), attention="none"), store=root / "s.zarr", quiet=True).store
    out, c = root / "out", root / "cache"
    code, printed = probe_main(
        [
            "propagate",
            str(checkpoint),
            "--davis",
            str(root / "DAVIS"),
            "--out",
            str(out),
            "--cache",
            str(c),
            "--preset",
            "dinov3-tracking",
            "--short-side",
            "96",
            "--n-last-frames",
            "2",
            "--store",
            str(store),
            "--json",
            str(root / "p.json"),
            "--workers",
            "1",
            "-q",
        ],
        capsys,
    )
    assert code == 0, printed.err
    model = Backbone.from_checkpoint(load_checkpoint(checkpoint))
    for seq in ("shapes", "pair"):
        frames = sorted((root / "DAVIS" / "JPEGImages" / "480p" / seq).glob("*.jpg"))
        first = np.array(Image.open(root / "DAVIS" / "Annotations" / "480p" / seq / f"{frames[0].stem}.png"))
        expected = notebook_tracking(model, frames, first, short_side=96, context=2)
        for frame, want in zip(frames[1:], expected):
            np.testing.assert_array_equal(np.array(Image.open(out / seq / f"{frame.stem}.png")), want)
        assert all(len(np.unique(want)) > 1 for want in expected)  # objects are tracked, not lost to the background
    saved = records.load(store, "davis")
    settings = saved.attrs["settings"]
    assert settings["preset"] == "dinov3-tracking" and settings["temperature"] == 0.2 and settings["short_side"] == 96 and settings["window"] == "circle"
    assert "segmentation_tracking.ipynb" in saved.attrs["source"] and "std (0.229" in saved.attrs["frame_size"]
    record = json.loads((records.every_record(store)[-1].path / "record.json").read_text())
    assert record["settings"]["preset"] == "dinov3-tracking" and record["settings"]["short_side"] == 96
