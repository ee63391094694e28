"""``probe depth``: NYUv2 linear depth from NYU-layout panels written here to a record and a report
for tiny DINO, DINOv2 and DINOv3 networks; the record's head re-scored plainly on the val images;
the same numbers at workers 1 and 2; every refusal before any label is read; the panel's checks
field by field; the network's blocks against timm's ``forward_intermediates``."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_runs import overridden, probe_main
from PIL import Image
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.demo.rooms import write_nyu
from probe_toolkit.demo.samples import TINY, TINY_DINOV2, TINY_DINOV3, write_checkpoint
from probe_toolkit.labels import ledger
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

NYU = {"train": ["kitchen_0001/00001", "kitchen_0001/00002", "bedroom_0002/00003", "bedroom_0002/00004"], "test": ["bathroom/00045", "office/00007"]}
SHORT = ["--iterations", "3", "--batch-size", "2", "--replicas", "2", "--crop", "48,64", "--chunk", "2"]


def _add(cache, *args) -> None:
    r = CliRunner().invoke(app, ["panel", "add", *map(str, args), "--cache", str(cache)])
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def nyu(tmp_path_factory):
    """An NYU folder (96 × 72 rooms), its train and test panels, and a folder of other photographs."""
    base = tmp_path_factory.mktemp("depth")
    root = base / "nyu"
    depths = write_nyu(root, NYU)
    cache = base / "cache"
    _add(cache, "nyu-train", "--nyu", root, "--role", "train")
    _add(cache, "nyu-test", "--nyu", root, "--role", "val")
    photos = base / "photos"
    photos.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photos / "a.jpg")
    return base, root, cache, depths, photos


def _network(nyu, name: str, layout: str, arch, seed: int):
    base, _, cache, _, photos = nyu
    checkpoint = write_checkpoint(base / f"{name}.pth", layout, arch, seed=seed)
    store = extract(checkpoint, photos, settings=Settings(views=("96",), chunk=1, dtype="float32"), cache_dir=cache, quiet=True, batch_size=1).store
    return checkpoint, store


def _run(nyu, checkpoint, store, capsys, *extra):
    _, _, cache, _, _ = nyu
    return probe_main(["depth", checkpoint, "--train", "nyu-train", "--val", "nyu-test", "--cache", cache, "--store", store, "-q", *overridden(SHORT, extra)], capsys)


def _plain_scores(ds, checkpoint, root, depths):
    """The record's head over the val images, written plainly: the centre-padded image's last block's normed patch tokens
    (``normed_patch_tokens``, not the hooks), the BatchNorm and 1×1 convolution as formulas, the bins,
    the mirror averaged, the metrics from their definitions in float64."""
    from probe_toolkit.store.backbone import Backbone, normed_patch_tokens
    from probe_toolkit.store.checkpoints import load_checkpoint

    model = Backbone.from_checkpoint(load_checkpoint(checkpoint)).eval()
    patch = model.arch.patch
    w, b = torch.from_numpy(ds.head_weight.values).double(), torch.from_numpy(ds.head_bias.values).double()
    mean, var = torch.from_numpy(ds.bn_mean.values).double(), torch.from_numpy(ds.bn_var.values).double()
    gamma, beta = torch.from_numpy(ds.bn_weight.values).double(), torch.from_numpy(ds.bn_bias.values).double()
    bins = torch.linspace(1e-3, 10, 256, dtype=torch.float64)

    def depth_of(x):
        ph, pw = -x.shape[-2] % patch, -x.shape[-1] % patch  # CenterPadding: the smaller half first
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        with torch.no_grad():
            t = normed_patch_tokens(model, x)[0].double()
        grid = t.reshape(x.shape[-2] // patch, x.shape[-1] // patch, -1)
        logits = ((grid - mean) / torch.sqrt(var + 1e-5) * gamma + beta) @ w.T + b
        weights = torch.relu(logits) + 0.1
        return (weights / weights.sum(-1, keepdim=True) @ bins)[None, None]

    out = []
    for name in ds.image.values:
        picture = np.asarray(Image.open(root / str(name)).convert("RGB"), np.float64) / 255
        x = torch.from_numpy(((picture - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)).transpose(2, 0, 1)).float()[None]
        pred = (depth_of(x) + depth_of(x.flip(-1)).flip(-1)) / 2
        truth = depths[str(name)].astype(np.float64) / 1000
        up = F.interpolate(pred, size=truth.shape, mode="bilinear", align_corners=False)[0, 0].numpy()
        from test_depth_parts import _metrics64

        out.append(_metrics64(truth, up))
    return out


@pytest.mark.parametrize("name,layout,arch", [("dino", "dino-full", TINY), ("dinov2", "dinov2-backbone", TINY_DINOV2), ("dinov3", "dinov3-official", TINY_DINOV3)])
def test_a_short_run_from_panels_to_a_record_and_a_report(nyu, name, layout, arch, capsys, tmp_path):
    from probe_toolkit.report import write_report
    from probe_toolkit.report.content import Table

    _base, root, cache, depths, _ = nyu
    checkpoint, store = _network(nyu, name, layout, arch, 5)
    out = tmp_path / "depth.json"
    before = len(ledger.entries(cache))
    code, printed = _run(nyu, checkpoint, store, capsys, "--json", out)
    assert code == 0, printed.err
    assert "short schedule: 3 of 38400" in printed.out and "0.403" in printed.out
    summary = json.loads(out.read_text())
    ds = records.load(store, "linear-depth")
    assert ds.loss.shape == (3,) and ds.attrs["schedule"]["full"] is False and ds.attrs["schedule"]["warmup"] == 1
    assert ds.attrs["blocks"] == [1] and ds.attrs["settings"]["lr"] == 3e-4 and ds.head_weight.shape == (256, 128)
    assert ds.attrs["schedule"]["unpublished_settings"] == {"iterations": 3, "replicas": 2, "warmup": 1, "crop": [48, 64]}
    assert [e.fields["purpose"] for e in ledger.entries(cache)[before:]] == ["linear-depth: train", "linear-depth: score"]
    assert [e.fields["images"] for e in ledger.entries(cache)[before:]] == [4, 2]
    assert math.isclose(float(ds.rmse), summary["metrics"]["rmse"], rel_tol=1e-6)
    assert ds.lr.values[0] == pytest.approx(3e-7) and ds.beta1.values[0] == 0.0  # WarmupOneCycleLR: β1 0 in the warm-up
    plain = _plain_scores(ds, checkpoint, root, depths)
    for i, want in enumerate(plain):
        for m in ("rmse", "abs_rel", "a1", "log_10", "silog"):
            got = float(ds.per_image.sel(metric=m).values[i])
            assert math.isclose(got, want[m], rel_tol=1e-4, abs_tol=1e-6), (name, i, m, got, want[m])
    assert math.isclose(float(ds.rmse), np.mean([p["rmse"] for p in plain]), rel_tol=1e-4)

    written = write_report([store], tmp_path / "report", cache_dir=cache, formats="png")
    section = next(s for s in written.report.sections if s.key == "linear-depth")
    table = next(b for b in section.blocks if isinstance(b, Table))
    assert table.rows[0][1] == f"{float(ds.rmse):.3f}" and "short schedule" in table.rows[0][0]
    assert table.rows[1][0].startswith("published, other weights: DINOv3 ViT-S/16") and table.rows[1][1] == "0.403"
    figure = section.figures()[0]
    assert "linear-depth" in figure.name and (tmp_path / "report" / "figures" / figure.name).is_file()
    assert ds.truth.shape == (2, 72, 96) and np.isnan(ds.truth.values[0][~ds.valid.values[0]]).sum() == 0


@pytest.fixture(scope="module")
def dino(nyu):
    return _network(nyu, "dino-w", "dino-full", TINY, 8)


def test_same_numbers_at_workers_1_and_2_and_whatever_the_networks_chunk(nyu, dino, capsys):
    checkpoint, store = dino
    runs = []
    for chunk, workers in (("2", "1"), ("2", "2"), ("1", "2")):
        code, printed = _run(nyu, checkpoint, store, capsys, "--chunk", chunk, "--workers", workers)
        assert code == 0, printed.err
        runs.append(records.load(store, "linear-depth", records.runs(store, "linear-depth")[-1].run_id))
    for field in ("loss", "per_image", "head_weight", "bn_mean", "prediction"):
        assert np.array_equal(runs[0][field].values, runs[1][field].values, equal_nan=True), field
        assert np.allclose(runs[0][field].values, runs[2][field].values, rtol=1e-4, atol=1e-6, equal_nan=True), field
    code, printed = _run(nyu, checkpoint, store, capsys, "--seed", "7")
    other = records.load(store, "linear-depth", records.runs(store, "linear-depth")[-1].run_id)
    assert code == 0 and not np.array_equal(other.loss.values, runs[0].loss.values)


def test_the_dinov2_lin4_preset_reads_four_blocks_with_the_class_token(nyu, capsys):
    checkpoint, store = _network(nyu, "dinov2-4", "dinov2-backbone", replace(TINY_DINOV2, depth=4), 3)
    code, printed = _run(nyu, checkpoint, store, capsys, "--preset", "dinov2-lin4")
    assert code == 0, printed.err
    assert "0.417" in printed.out  # DINOv2 ViT-S/14 linear 4 layers, marked as other weights
    ds = records.load(store, "linear-depth")
    assert ds.attrs["blocks"] == [0, 1, 2, 3] and ds.head_weight.shape == (256, 4 * 2 * 128) and "bn_mean" not in ds
    assert ds.attrs["schedule"]["kind"] == "cosine" and ds.attrs["settings"]["weight_decay"] == 1e-2
    assert ds.lr.values[0] == pytest.approx(1e-4 * 1e-3)  # mmcv's linear warm-up from 1e-3 of the rate
    assert "class token" in ds.attrs["feature"] and "without the final norm" in ds.attrs["feature"]


def test_the_networks_blocks_are_timms_intermediate_layers(tmp_path):
    from probe_toolkit.commands.depth import feature_fn
    from probe_toolkit.store.backbone import Backbone
    from probe_toolkit.store.checkpoints import load_checkpoint

    for layout, arch, side in (("dino-full", TINY, 224), ("dinov3-official", TINY_DINOV3, 80)):
        path = write_checkpoint(tmp_path / f"{layout}.pth", layout, replace(arch, depth=4), seed=2)
        model = Backbone.from_checkpoint(load_checkpoint(path)).eval()
        x = torch.randn(2, 3, side, side + 16 * (layout != "dino-full"), generator=torch.Generator().manual_seed(1))
        for norm in (True, False):
            got = feature_fn(model, (1, 3), norm, 1, torch.device("cpu"))(x)
            with torch.no_grad():
                want = model.vit.forward_intermediates(x, indices=[1, 3], return_prefix_tokens=True, norm=norm, intermediates_only=True)
            for (patch, cls), (spatial, prefix) in zip(got, want):
                assert torch.allclose(patch, spatial, atol=1e-5) and torch.allclose(cls, prefix[:, 0], atol=1e-5), (layout, norm)


def test_refusals_come_before_any_label_is_read(nyu, dino, capsys, tmp_path):
    base, root, cache, _, _ = nyu
    checkpoint, store = dino
    before = len(ledger.entries(cache))
    for extra, word in (
        (["--warmup", "5"], "--warmup"),
        (["--preset", "dinov4"], "--preset"),
        (["--iterations", "0"], "--iterations"),
        (["--crop", "70,64"], "smaller than the 64x70"),
        (["--preset", "dinov2-lin4"], "has 2 blocks"),
        (["--batch-size", "1"], "--batch-size"),
        (["--crop", "8,8"], "--crop"),
    ):
        code, printed = _run(nyu, checkpoint, store, capsys, *extra)
        assert code == 2 and word in printed.err and len(printed.err.strip().splitlines()) == 1, (extra, printed.err)
    code, printed = probe_main(
        ["depth", checkpoint, "--train", "nyu-train", "--val", "nyu-test", "--cache", cache, "--store", tmp_path / "none.zarr", "-q", *SHORT], capsys
    )
    assert code == 2 and "none.zarr" in printed.err and "not the NYU folder" in printed.err
    _add(cache, "nyu-sealed", "--nyu", root, "--split", "test", "--role", "test")
    code, printed = probe_main(["depth", checkpoint, "--train", "nyu-train", "--val", "nyu-sealed", "--cache", cache, "--store", store, "-q", *SHORT], capsys)
    assert code == 2 and "sealed" in printed.err
    selfpatch, its_store = _network(nyu, "selfpatch", "selfpatch-full", TINY, seed=1)
    code, printed = probe_main(
        ["depth", selfpatch, "--train", "nyu-train", "--val", "nyu-test", "--cache", cache, "--store", its_store, "-q", "--preset", "dinov2-lin1", *SHORT], capsys
    )
    assert code == 2 and "no class token" in printed.err
    import probe_toolkit as probe
    from probe_toolkit.infra.errors import ProbeError

    for placement in ({"dask_address": "tcp://127.0.0.1:1"}, {"shard": "1/2"}, {"threads": 2}):
        with pytest.raises(ProbeError, match="dask|shards|threads"):
            probe.run("linear-depth", checkpoint, train="nyu-train", val="nyu-test", cache_dir=cache, store=store, iterations=2, **placement)
    code, printed = probe_main(["extract", checkpoint, "--panel", "nyu-test", "--cache", cache], capsys)
    assert code == 2 and "labels as images" in printed.err and f"`probe extract {checkpoint} --images PHOTOS --cache {cache}` of another folder" in printed.err
    assert len(ledger.entries(cache)) == before


def test_a_panel_is_checked_field_by_field_when_added(tmp_path, capsys):
    root = tmp_path / "nyu"
    write_nyu(root, {"test": ["bathroom/00001", "bathroom/00002", "office/00003", "office/00004"]})
    lines = (root / "nyu_test.txt").read_text().splitlines()
    lines[0] = lines[0] + " extra"  # four fields
    lines[1] = lines[1].replace("518.8579", "focal")
    Image.fromarray(np.zeros((72, 96), np.uint8)).save(root / "office" / "sync_depth_00003.png")  # 8-bit
    Image.fromarray(np.zeros((70, 96), np.uint16)).save(root / "office" / "sync_depth_00004.png")  # another size
    (root / "nyu_test.txt").write_text("\n".join(lines + [lines[2]]) + "\n")  # office/00003 listed twice
    good = (root / "nyu_test.txt").read_text().splitlines()
    good[0], good[1] = good[0].removesuffix(" extra"), good[1].replace("focal", "518.8579")

    def listing(text_lines):
        return lambda: (root / "nyu_test.txt").write_text("\n".join(text_lines) + "\n")

    def depth_map(name):
        return lambda: Image.fromarray(np.zeros((72, 96), np.uint16)).save(root / "office" / name)

    # one line each time: the first problem and how many more (the map listed twice counts twice); each repaired in
    # turn, then the panel is added
    repairs = (
        ("has 4 fields, not 3", 5, listing([good[0], *lines[1:], lines[2]])),
        ("field focal is 'focal'", 4, listing([*good[:2], *lines[2:], lines[2]])),
        ("is listed again", 3, listing(good[:4])),
        ("not a 16-bit grey PNG", 1, depth_map("sync_depth_00003.png")),
        ("is 96x70 px, its photograph", 0, depth_map("sync_depth_00004.png")),
    )
    for problem, more, repair in repairs:
        code, printed = probe_main(["panel", "add", "broken", "--nyu", root, "--role", "val", "--cache", tmp_path / "cache"], capsys)
        assert code == 2 and len(printed.err.strip().splitlines()) == 1 and problem in printed.err, (problem, printed.err)
        assert (f"({more} more problem" in printed.err) if more else "more problem" not in printed.err, printed.err
        assert not (tmp_path / "cache" / "panels.toml").exists()
        repair()
    code, printed = probe_main(["panel", "add", "broken", "--nyu", root, "--role", "val", "--cache", tmp_path / "cache"], capsys)
    assert code == 0, printed.err


def test_a_depth_map_changed_after_its_ledger_read_is_refused(tmp_path):
    from probe_toolkit.infra.errors import ProbeError
    from probe_toolkit.labels import nyu
    from probe_toolkit.labels.panels import get_panel

    root = tmp_path / "nyu"
    depths = write_nyu(root, {"test": ["bathroom/00001", "office/00002"]})
    _add(tmp_path / "cache", "v", "--nyu", root, "--role", "val")
    read = nyu.read_depth_maps(get_panel("v", tmp_path / "cache"), purpose="test", cache=tmp_path / "cache")
    assert read.ids == ["bathroom/rgb_00001.jpg", "office/rgb_00002.jpg"] and np.array_equal(read.map(1), depths["office/rgb_00002.jpg"])
    Image.fromarray(np.ones((72, 96), np.uint16)).save(root / "office" / "sync_depth_00002.png")
    with pytest.raises(ProbeError, match="changed since its read was written to the ledger"):
        read.map(1)
    assert ledger.entries(tmp_path / "cache")[-1].fields["images"] == 2


def test_a_loss_that_is_not_finite_stops_the_run_and_saves_nothing(nyu, dino, tmp_path, capsys):
    base, _, _, _, _ = nyu
    checkpoint, store = dino
    root, cache = tmp_path / "nyu-blank", tmp_path / "cache"
    write_nyu(root, {"train": ["kitchen_0001/00001", "kitchen_0001/00002"], "test": ["bathroom/00045"]})
    for name in ("00001", "00002"):  # no measured pixel anywhere: SigLoss has nothing to average
        Image.fromarray(np.zeros((72, 96), np.uint16)).save(root / "kitchen_0001" / f"sync_depth_{name}.png")
    _add(cache, "blank-train", "--nyu", root, "--role", "train")
    _add(cache, "blank-test", "--nyu", root, "--role", "val")
    before = len(records.runs(store, "linear-depth"))
    code, printed = probe_main(["depth", checkpoint, "--train", "blank-train", "--val", "blank-test", "--cache", cache, "--store", store, "-q", *SHORT], capsys)
    assert code == 1 and "iteration 0: the loss is nan" in printed.err and "nothing was saved" in printed.err
    assert len(records.runs(store, "linear-depth")) == before
    assert [e.fields["purpose"] for e in ledger.entries(cache)] == ["linear-depth: train"]


def test_the_run_contexts_block_replaces_the_last_for_a_one_block_preset(tmp_path):
    from probe_toolkit.analyses import depth_published as pub
    from probe_toolkit.commands.depth import _check_network
    from probe_toolkit.infra.errors import ProbeError
    from probe_toolkit.protocols.depth import DepthSettings
    from probe_toolkit.store.checkpoints import load_checkpoint

    ck = load_checkpoint(write_checkpoint(tmp_path / "d.pth", "dinov2-backbone", replace(TINY_DINOV2, depth=4), seed=1))
    for preset, block, want in (("dinov3", None, (3,)), ("dinov3", 1, (1,)), ("dinov2-lin1", -2, (2,)), ("dinov2-lin4", None, (0, 1, 2, 3))):
        assert _check_network(DepthSettings(preset=preset), ck, pub.PRESETS[preset], block) == want
    with pytest.raises(ProbeError, match="reads its own four blocks"):
        _check_network(DepthSettings(preset="dinov2-lin4"), ck, pub.PRESETS["dinov2-lin4"], 1)
    with pytest.raises(ProbeError, match="no block 4"):
        _check_network(DepthSettings(), ck, pub.PRESETS["dinov3"], 4)
