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
from cli_runs import overridden, probe_main
from PIL import Image
from segmentation_folders import box_scene, write_ade, write_voc

from probe_toolkit.demo.samples import TINY, TINY_DINOV2, TINY_DINOV3, write_checkpoint
from probe_toolkit.labels import ledger
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

ADE = {"training": ["ADE_train_00000001", "ADE_train_00000002", "ADE_train_00000003"], "validation": ["ADE_val_00000001", "ADE_val_00000002"]}
SHORT = ["--iterations", "3", "--batch-size", "2", "--crop", "32", "--size", "32", "--stride", "21", "--chunk", "1"]


def _scene(seed: int, size: tuple[int, int], n_classes: int, zero: bool) -> tuple[np.ndarray, np.ndarray]:
    """A textured image with two 14-pixel coloured boxes and its label map (ADE: a band of label 0 'other')."""
    return box_scene(seed, size, n_classes, zero, box=14, room=16, mean=110, sd=25)


@pytest.fixture(scope="module")
def ade(tmp_path_factory):
    """An ADEChallengeData2016 folder, its two panels registered, a store of the val images per network."""
    base = tmp_path_factory.mktemp("segment")
    root = base / "ADEChallengeData2016"
    written = write_ade(root, ADE, lambda split, n: _scene(n + 7 * len(split), (40 + 8 * n, 36), 151, True))
    labels = {path.split("/")[1].removesuffix(".jpg"): label for path, label in written.items()}
    cache = base / "cache"
    for name, role in (("ade-train", "train"), ("ade-val", "val")):
        from typer.testing import CliRunner

        from probe_toolkit.cli import app

        r = CliRunner().invoke(app, ["panel", "add", name, "--ade20k", str(root), "--role", role, "--cache", str(cache)])
        assert r.exit_code == 0, r.output
    return base, root, cache, labels


def _network(base, cache, root, layout: str, arch, seed: int):
    checkpoint = write_checkpoint(base / f"{layout}.pth", layout, arch, seed=seed)
    store = extract(
        checkpoint, root / "images" / "validation", settings=Settings(views=("96",), chunk=2, dtype="float32"), cache_dir=cache, quiet=True, batch_size=2
    ).store
    return checkpoint, store


def _plain_scores(ds, checkpoint, folder, names, labels, crop, stride, size, reduce_zero, n_classes):
    """The record's head over the val images, computed plainly: torchvision's resize of the PIL
    image (dinov3 FixedSideResize), one window at a time as ``slide_inference``, the BatchNorm
    and the 1×1 convolution written as formulas, torch.histc areas, nanmean (dinov3 metrics.py)."""
    from probe_toolkit.store.backbone import Backbone, normed_patch_tokens
    from probe_toolkit.store.checkpoints import load_checkpoint

    model = Backbone.from_checkpoint(load_checkpoint(checkpoint)).eval()
    patch = model.arch.patch
    w, b = torch.from_numpy(ds.head_weight.values), torch.from_numpy(ds.head_bias.values)
    mean, var = torch.from_numpy(ds.bn_mean.values), torch.from_numpy(ds.bn_var.values)
    gamma, beta = torch.from_numpy(ds.bn_weight.values), torch.from_numpy(ds.bn_bias.values)

    def logits(window):
        hp, wp = -window.shape[-2] % patch, -window.shape[-1] % patch  # DINOv2's CenterPadding
        x = F.pad(window, (wp // 2, wp - wp // 2, hp // 2, hp - hp // 2))
        with torch.no_grad():
            t = normed_patch_tokens(model, x)[0]
        grid = t.reshape(x.shape[-2] // patch, x.shape[-1] // patch, -1)
        normed = (grid - mean) / torch.sqrt(var + 1e-5) * gamma + beta
        out = (normed @ w.T + b).permute(2, 0, 1)[None]
        return F.interpolate(out, size=window.shape[-2:], mode="bilinear", align_corners=False)

    total = torch.zeros(4, n_classes)
    for name in names:
        pil = Image.open(folder / f"{name}.jpg").convert("RGB")
        w0, h0 = pil.size
        new = (int(size * h0 / w0 + 0.5), size) if h0 > w0 else (size, int(size * w0 / h0 + 0.5))
        x = TF.normalize(
            torch.from_numpy(np.array(T.Resize(new, interpolation=T.InterpolationMode.BILINEAR)(pil))).permute(2, 0, 1).float(),
            [123.675, 116.28, 103.53],
            [58.395, 57.12, 57.375],
        )[None]
        _, _, H, W = x.shape
        hc = wc = crop
        if hc > H and wc > W:
            hc = wc = min(H, W)
        preds, count = torch.zeros(1, n_classes, H, W), torch.zeros(1, 1, H, W)
        for i in range(max(H - hc + stride - 1, 0) // stride + 1):
            for j in range(max(W - wc + stride - 1, 0) // stride + 1):
                y2, x2 = min(i * stride + hc, H), min(j * stride + wc, W)
                y1, x1 = max(y2 - hc, 0), max(x2 - wc, 0)
                preds += F.pad(logits(x[:, :, y1:y2, x1:x2]), (x1, W - x2, y1, H - y2))
                count[:, :, y1:y2, x1:x2] += 1
        label = torch.from_numpy(labels[name].astype(np.int64))
        pred = F.interpolate(preds / count, size=label.shape, mode="bilinear", align_corners=False).softmax(1).argmax(1)[0].float()
        if reduce_zero:
            label[label == 255] += 1
            label -= 1
            label[label == -1] = 255
        keep = label != 255
        p, t = pred[keep], label[keep].float()
        i_ = torch.histc(p[p == t], bins=n_classes, min=0, max=n_classes - 1)
        a_p, a_t = torch.histc(p, bins=n_classes, min=0, max=n_classes - 1), torch.histc(t, bins=n_classes, min=0, max=n_classes - 1)
        total += torch.stack([i_, a_p + a_t - i_, a_p, a_t])
    return total, float((total[0] / total[1]).nanmean())


@pytest.mark.parametrize("layout,arch", [("dino-full", TINY), ("dinov2-backbone", TINY_DINOV2), ("dinov3-official", TINY_DINOV3)])
def test_a_short_run_from_panels_to_a_record_and_a_report(ade, layout, arch, capsys, tmp_path):
    from probe_toolkit.report import write_report
    from probe_toolkit.report.content import Table

    base, root, cache, labels = ade
    checkpoint, store = _network(base, cache, root, layout, arch, 5)
    out = tmp_path / "seg.json"
    before = len(ledger.entries(cache))
    code, printed = probe_main(
        ["segment", checkpoint, "--train", "ade-train", "--val", "ade-val", "--cache", cache, "--store", store, "--json", out, "-q", *SHORT], capsys
    )
    assert code == 0, printed.err
    assert "short schedule: 3 of 40000" in printed.out and "47.0" in printed.out
    summary = json.loads(out.read_text())
    record = records.runs(store, "linear-segmentation")[-1]
    ds = records.load(store, "linear-segmentation", record.run_id)
    assert ds["loss"].shape == (3,) and ds.attrs["schedule"]["full"] is False and ds.attrs["schedule"]["warmup"] == 0
    assert ds.attrs["settings"]["weight_decay"] == 1e-3 and ds.attrs["settings"]["dropout"] == 0.1 and len(ds["class"]) == 150
    assert ds.attrs["schedule"]["unpublished_settings"] == {"iterations": 3, "batch_size": 2, "warmup": 0, "crop": 32, "size": 32, "stride": 21}
    assert "settings other than the published: iterations 3" in printed.out.replace("\n", " ")
    assert math.isclose(float(ds["miou"]), summary["miou"], rel_tol=1e-12)
    entries = ledger.entries(cache)[before:]
    assert [e.fields["purpose"] for e in entries] == ["linear-segmentation: train", "linear-segmentation: score"]
    assert [e.fields["panel"] for e in entries] == ["ade-train", "ade-val"]
    areas, miou = _plain_scores(ds, checkpoint, root / "images" / "validation", ADE["validation"], labels, 32, 21, 32, True, 150)
    assert np.array_equal(ds.areas.values, areas.numpy().astype(np.int64))
    assert math.isclose(float(ds["miou"]), miou, rel_tol=1e-6)

    written = write_report([store], tmp_path / "report", cache_dir=cache, formats="png")
    section = next(s for s in written.report.sections if s.key == "linear-segmentation")
    table = next(b for b in section.blocks if isinstance(b, Table))
    assert table.rows[0][1] == f"{100 * float(ds.miou):.2f}" and "short schedule" in table.rows[0][0]
    assert table.rows[1][0].startswith("published, other weights: DINOv3 ViT-S/16") and table.rows[1][1] == "47.0"
    figure = section.figures()[0]
    assert "linear-segmentation" in figure.name and (tmp_path / "report" / "figures" / figure.name).is_file()


@pytest.fixture(scope="module")
def dino(ade):
    base, root, cache, _ = ade
    return _network(base, cache, root, "dino-full", TINY, 8)


def _run(ade, dino, capsys, *extra):
    base, root, cache, _ = ade
    checkpoint, store = dino
    return probe_main(["segment", checkpoint, "--train", "ade-train", "--val", "ade-val", "--cache", cache, "--store", store, "-q", *overridden(SHORT, extra)], capsys)


def test_same_seed_same_numbers_whatever_the_network_chunk_and_the_threads(ade, dino, capsys):
    store = dino[1]
    runs = []
    for chunk, workers in (("1", "1"), ("2", "2"), ("1", "3")):
        code, printed = _run(ade, dino, capsys, "--chunk", chunk, "--workers", workers)
        assert code == 0, printed.err
        runs.append(records.load(store, "linear-segmentation", records.runs(store, "linear-segmentation")[-1].run_id))
    assert np.array_equal(runs[0].loss.values, runs[2].loss.values) and np.array_equal(runs[0].areas.values, runs[2].areas.values)
    assert np.allclose(runs[0].loss.values, runs[1].loss.values, rtol=1e-5) and np.array_equal(runs[0].areas.values, runs[1].areas.values)
    code, printed = _run(ade, dino, capsys, "--seed", "7")
    other = records.load(store, "linear-segmentation", records.runs(store, "linear-segmentation")[-1].run_id)
    assert code == 0 and not np.array_equal(other.loss.values, runs[0].loss.values)


def test_refusals_come_before_any_label_is_read(ade, dino, capsys, tmp_path):
    base, root, cache, _ = ade
    checkpoint, store = dino
    before = len(ledger.entries(cache))
    for extra, word in (
        (["--stride", "40"], "--stride"),
        (["--warmup", "5"], "--warmup"),
        (["--preset", "dinov4"], "--preset"),
        (["--crop", "8", "--stride", "8"], "--crop"),
        (["--iterations", "0"], "--iterations"),
    ):
        code, printed = _run(ade, dino, capsys, *extra)
        assert code == 2 and word in printed.err and len(printed.err.strip().splitlines()) == 1, (extra, printed.err)
    code, printed = probe_main(
        ["segment", checkpoint, "--train", "ade-train", "--val", "ade-val", "--cache", cache, "--store", tmp_path / "none.zarr", "-q", *SHORT], capsys
    )
    assert code == 2 and "none.zarr" in printed.err and "probe extract" in printed.err
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    r = CliRunner().invoke(app, ["panel", "add", "ade-test", "--ade20k", str(root), "--split", "validation", "--role", "test", "--cache", str(cache)])
    assert r.exit_code == 0, r.output
    code, printed = probe_main(["segment", checkpoint, "--train", "ade-train", "--val", "ade-test", "--cache", cache, "--store", store, "-q", *SHORT], capsys)
    assert code == 2 and "sealed" in printed.err
    import probe_toolkit as probe
    from probe_toolkit.infra.errors import ProbeError

    for placement in ({"dask_address": "tcp://127.0.0.1:1"}, {"shard": "1/2"}):
        with pytest.raises(ProbeError, match="dask|shards"):
            probe.run("linear-segmentation", checkpoint, train="ade-train", val="ade-val", cache_dir=cache, store=store, iterations=2, **placement)
    assert len(ledger.entries(cache)) == before


def test_voc_layout_with_the_dinov2_preset(tmp_path, capsys):
    year = tmp_path / "VOCdevkit" / "VOC2012"

    def scene(i: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        pixels, label = _scene(int(i.replace("_", "")) % 1000, (44 + 6 * n, 38), 21, False)
        label[:2] = 255  # VOC's void band
        return pixels, label

    labels = write_voc(year, {"train": ["2007_000032", "2007_000039"], "val": ["2007_000033", "2008_000001"]}, scene)
    cache = tmp_path / "cache"
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    for name, split, role in (("voc-train", "train", "train"), ("voc-val", "val", "val")):
        r = CliRunner().invoke(app, ["panel", "add", name, "--voc-segmentation", str(year), "--split", split, "--role", role, "--cache", str(cache)])
        assert r.exit_code == 0, r.output
    checkpoint = write_checkpoint(tmp_path / "dinov2.pth", "dinov2-backbone", TINY_DINOV2, seed=2)
    store = extract(checkpoint, year / "JPEGImages", settings=Settings(views=("96",), chunk=2, dtype="float32"), cache_dir=cache, quiet=True, batch_size=2).store
    code, printed = probe_main(["segment", checkpoint, "--train", "voc-train", "--val", "voc-val", "--cache", cache, "--preset", "dinov2", "-q", *SHORT], capsys)
    assert code == 0, printed.err
    assert "no published numbers" in printed.out
    ds = records.load(store, "linear-segmentation")
    assert len(ds["class"]) == 21 and ds.attrs["reduce_zero_label"] is False
    assert ds.attrs["settings"]["weight_decay"] == 1e-4 and ds.attrs["settings"]["dropout"] == 0.0 and ds.attrs["schedule"]["decay"] == "poly"
    assert int(ds.areas.values[3].sum()) == sum(int((labels[i] != 255).sum()) for i in ("2007_000033", "2008_000001"))


def test_a_mask_of_another_size_is_refused_before_the_network_is_built(tmp_path, capsys, monkeypatch):
    root = tmp_path / "ADEChallengeData2016"
    for split, name in (("training", "ADE_train_00000001"), ("validation", "ADE_val_00000001")):
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        pixels, label = _scene(1, (40, 36), 151, True)
        Image.fromarray(pixels).save(root / "images" / split / f"{name}.jpg", quality=95)
        Image.fromarray(label[:, :30] if split == "training" else label, mode="L").save(root / "annotations" / split / f"{name}.png")
    cache = tmp_path / "cache"
    from typer.testing import CliRunner

    from probe_toolkit.cli import app
    from probe_toolkit.store import backbone

    for name, role in (("t", "train"), ("v", "val")):
        assert CliRunner().invoke(app, ["panel", "add", name, "--ade20k", str(root), "--role", role, "--cache", str(cache)]).exit_code == 0
    checkpoint = write_checkpoint(tmp_path / "dino.pth", "dino-full", TINY, seed=1)
    store = extract(
        checkpoint, root / "images" / "validation", settings=Settings(views=("96",), chunk=1, dtype="float32"), cache_dir=cache, quiet=True, batch_size=1
    ).store

    def never(*args, **kwargs):
        raise AssertionError("the network was built")

    monkeypatch.setattr(backbone.Backbone, "from_checkpoint", never)
    code, printed = probe_main(["segment", checkpoint, "--train", "t", "--val", "v", "--cache", cache, "--store", store, "-q", *SHORT], capsys)
    assert code == 2 and "ADE_train_00000001.jpg 40x36" in printed.err and "is 30x36 px, its image" in printed.err
    assert list(ledger.entries(cache)) == []  # refused before the read's ledger entry (label_maps.sized_as_images): nothing was handed out
