"""``probe segment``: linear segmentation as DINOv3 and DINOv2 train it, each piece against a plain
re-implementation written here from the reference code (facebookresearch/dinov3
``dinov3/eval/segmentation``: transforms.py, inference.py, metrics.py, schedulers.py, train.py;
DINOv2's mmseg linear config), then a short run from ADE-layout and VOC-layout panels to a
record and a report for tiny DINO, DINOv2 and DINOv3 networks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image

from cli_runs import probe_main
from probe_toolkit.analyses import segment as seg
from probe_toolkit.analyses import segment_augment as aug
from probe_toolkit.demo.samples import TINY, TINY_DINOV2, TINY_DINOV3, write_checkpoint
from probe_toolkit.labels import ledger
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

ADE = {"training": ["ADE_train_00000001", "ADE_train_00000002", "ADE_train_00000003"], "validation": ["ADE_val_00000001", "ADE_val_00000002"]}
SHORT = ["--iterations", "3", "--batch-size", "2", "--crop", "32", "--size", "32", "--stride", "21", "--chunk", "1"]


def _scene(seed: int, size: tuple[int, int], n_classes: int, zero: bool) -> tuple[np.ndarray, np.ndarray]:
    """A textured image with coloured boxes and its label map (ADE: a band of label 0 'other')."""
    rng = np.random.default_rng(seed)
    w, h = size
    pixels = rng.normal(110, 25, (h, w, 3)).clip(0, 255)
    label = np.full((h, w), int(rng.integers(1, n_classes)), np.uint8)
    if zero:
        label[: h // 6] = 0
    for _ in range(2):
        cls = int(rng.integers(1, n_classes))
        x0, y0 = int(rng.integers(0, w - 16)), int(rng.integers(0, h - 16))
        label[y0:y0 + 14, x0:x0 + 14] = cls
        pixels[y0:y0 + 14, x0:x0 + 14] = ((cls * 47) % 256, (cls * 91) % 256, (cls * 23) % 256)
    return pixels.astype(np.uint8), label


@pytest.fixture(scope="module")
def ade(tmp_path_factory):
    """An ADEChallengeData2016 folder, its two panels registered, a store of the val images per network."""
    base = tmp_path_factory.mktemp("segment")
    root = base / "ADEChallengeData2016"
    labels = {}
    for split, names in ADE.items():
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for n, name in enumerate(names):
            pixels, label = _scene(n + 7 * len(split), (40 + 8 * n, 36), 151, True)
            Image.fromarray(pixels).save(root / "images" / split / f"{name}.jpg", quality=95)
            Image.fromarray(label, mode="L").save(root / "annotations" / split / f"{name}.png")
            labels[name] = label
    cache = base / "cache"
    for name, role in (("ade-train", "train"), ("ade-val", "val")):
        from typer.testing import CliRunner

        from probe_toolkit.cli import app

        r = CliRunner().invoke(app, ["panel", "add", name, "--ade20k", str(root), "--role", role, "--cache", str(cache)])
        assert r.exit_code == 0, r.output
    return base, root, cache, labels


def _network(base, cache, root, layout: str, arch, seed: int):
    checkpoint = write_checkpoint(base / f"{layout}.pth", layout, arch, seed=seed)
    store = extract(checkpoint, root / "images" / "validation", settings=Settings(views=("96",), chunk=2, dtype="float32"), cache_dir=cache,
                    quiet=True, batch_size=2).store
    return checkpoint, store


@pytest.mark.parametrize("layout,arch", [("dino-full", TINY), ("dinov2-backbone", TINY_DINOV2), ("dinov3-official", TINY_DINOV3)])
def test_a_short_run_from_panels_to_a_record_and_a_report(ade, layout, arch, capsys, tmp_path):
    base, root, cache, labels = ade
    checkpoint, store = _network(base, cache, root, layout, arch, 5)
    out = tmp_path / "seg.json"
    code, printed = probe_main(["segment", checkpoint, "--train", "ade-train", "--val", "ade-val", "--cache", cache, "--store", store,
                                "--json", out, "-q", *SHORT], capsys)
    assert code == 0, printed.err
    assert "short schedule: 3 of 40000" in printed.out and "47.0" in printed.out
    summary = json.loads(out.read_text())
    record = records.runs(store, "linear-segmentation")[-1]
    ds = records.load(store, "linear-segmentation", record.run_id)
    assert ds["loss"].shape == (3,) and ds.attrs["schedule"]["full"] is False and ds.attrs["schedule"]["warmup"] == 0
    assert math.isclose(float(ds["miou"]), summary["miou"], rel_tol=1e-12)
    purposes = [e.fields["purpose"] for e in ledger.entries(cache)][-2:]
    assert purposes == ["linear-segmentation: train", "linear-segmentation: score"]
