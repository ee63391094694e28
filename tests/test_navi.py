"""NAVI in ``probe correspond``: the panel (a NAVI-layout folder written here) checked field by field
when added without a label read; the pairs, the views, the matching, the errors and the binned recall
against mbanani/probe3d's code written out here (``evals/datasets/navi.py``, ``evals/datasets/utils.py``,
``evals/utils/correspondence.py``, ``evaluate_navi_correspondence.py``, with torchvision's transforms and
OpenCV's nearest resize as albumentations calls it); end to end on tiny DINO, DINOv2 and DINOv3 networks,
the record the same at 1 and 2 workers and in shards."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
from cli_runs import probe_main
from navi_folders import quaternion, write_navi
from PIL import Image, ImageOps

from probe_toolkit.analyses import navi
from probe_toolkit.labels import guard, ledger, navi_pairs
from probe_toolkit.labels.navi import parse
from probe_toolkit.labels.panels import add_panel

OBJECTS = {"bottle": [0, 20, 45, 70, 100, 15], "mug": [5, 35, 60, 90, 110], "shoe": [0, 10, 130, 25]}
SMALL = {"bottle": [0, 20, 45, 70, 100], "mug": [5, 35, 60]}  # the end-to-end runs: two pairs

# ----------------------------------------------------------------------------------------------
# the reference, written out


def ref_quaternion_to_rotation_matrix(q):
    q = torch.as_tensor(q, dtype=torch.float32)
    w, x, y, z = torch.unbind(q, dim=-1)
    zero, one = torch.zeros_like(z), torch.ones_like(z)
    s = 2.0 / (q * q).sum(dim=-1)
    r = torch.stack(
        [
            1 - s * (y**2 + z**2),
            s * (x * y - z * w),
            s * (x * z + y * w),
            zero,
            s * (x * y + z * w),
            1 - s * (x**2 + z**2),
            s * (y * z - x * w),
            zero,
            s * (x * z - y * w),
            s * (y * z + x * w),
            1 - s * (x**2 + y**2),
            zero,
            zero,
            zero,
            zero,
            one,
        ],
        dim=-1,
    )
    return r.reshape(q.shape[:-1] + (4, 4))


def ref_camera(anno):
    v = torch.as_tensor(anno["camera"]["t"], dtype=torch.float32)
    translate = torch.constant_pad_nd(v[..., None, :].transpose(-1, -2), [3, 0, 0, 1]) + torch.eye(4)
    rt = translate @ ref_quaternion_to_rotation_matrix(anno["camera"]["q"])
    rt[:3, 3] = rt[:3, 3] / 1000.0
    return rt


def ref_pairs(root: Path):
    """generate_instance_pairs over the sorted instances of the test split, then instances[::4]."""
    data = {}
    for obj in sorted(p for p in root.iterdir() if p.is_dir()):
        notes = json.loads((obj / "wild_set" / "annotations.json").read_text())
        ids = sorted(p.name.split(".")[0] for p in (obj / "wild_set" / "images").iterdir() if "jpg" in p.name and "_" not in p.name.split(".")[0])
        data[obj.name] = (ids, {n["filename"].split(".")[0]: n for n in notes})
    instances = [(o, i) for o, (ids, _) in data.items() for i in ids]
    torch.manual_seed(8)
    partner = {}
    for obj, (ids, notes) in data.items():
        rots = torch.stack([ref_camera(notes[i])[:3, :3] for i in ids])
        for n, image_id in enumerate(ids):
            rots_ij = torch.bmm(rots[n, None].repeat(len(rots), 1, 1), rots.permute(0, 2, 1))
            tr = rots_ij[:, 0, 0] + rots_ij[:, 1, 1] + rots_ij[:, 2, 2]
            deg = (0.5 * tr - 0.5).clamp(min=-1, max=1).acos() * 180 / np.pi
            deg[deg > 120] = 0
            deg[deg > 0] = 1
            partner[(obj, image_id)] = ids[torch.multinomial(deg, 1).item()]
    return [(o, i, partner[(o, i)]) for o, i in instances[::4]], data


def ref_bbox_crop(image, depth, xyz):
    mask = depth > 0
    coords = mask.nonzero()
    tl, br = coords.min(dim=0).values[1:], coords.max(dim=0).values[1:]
    box = br - tl
    size = torch.tensor(mask.shape[1:])
    assert box.max() <= size.min()
    pad = box.max() - box
    tl_c = tl - pad // 2
    bl_c = tl_c + box.max()
    if (tl_c >= 0).all() and (bl_c <= size).all():
        a, b = tl_c, bl_c
    else:
        a = (tl - pad).clip(min=0)
        b = a + box.max()
    return [t[:, a[0] : b[0], a[1] : b[1]] for t in (image, depth, xyz)]


def ref_single(root: Path, obj: str, image_id: str, anno):
    """NAVI.get_single at image_size 512, bbox_crop, no augmentation: (image, xyz_grid, intrinsics, Rt)."""
    image = ImageOps.exif_transpose(Image.open(root / obj / "wild_set" / "images" / f"downsampled_{image_id}.jpg"))
    image_t = T.Compose(
        [T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]), T.Resize(512, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop(512)]
    )(image.convert("RGB"))
    disparity = np.array(Image.open(root / obj / "wild_set" / "depth" / f"downsampled_{image_id}.png")).astype("uint16")
    disparity = disparity.astype(np.float32) / (65535 * 10.0)
    disparity[disparity == 0] = np.inf
    depth = (1 / disparity) / 1000
    depth_t = T.Compose([T.ToTensor(), T.Resize(512, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop(512)])(depth)
    orig_h, orig_w = anno["image_size"]
    fx = anno["camera"]["focal_length"] * min(512, 512) / min(orig_h, orig_w)
    k = torch.eye(3)
    k[0, 0], k[1, 1], k[0, 2], k[1, 2] = fx, fx, 0.5 * 512, 0.5 * 512
    xs, ys = torch.linspace(0.5, 511.5, 512).view(1, 512).repeat(512, 1), torch.linspace(0.5, 511.5, 512).view(512, 1).repeat(1, 512)
    grid = torch.stack((xs, ys, torch.ones_like(xs)))
    xyz = (k.inverse() @ (depth_t * grid).view(3, -1)).view(3, 512, 512)
    image_t, depth_t, xyz = ref_bbox_crop(image_t, depth_t, xyz)
    side = image_t.shape[1]
    resize = lambda t: cv2.resize(t.permute(1, 2, 0).numpy(), (512, 512), interpolation=0)  # noqa: E731  albumentations Resize(interpolation=0)
    image_t, xyz = torch.tensor(resize(image_t)).permute(2, 0, 1), torch.tensor(resize(xyz)).permute(2, 0, 1)
    final_fx = fx * min(512, 512) / min(side, side)
    intrinsics = torch.eye(3)
    intrinsics[:2] = final_fx * intrinsics[:2]
    return image_t, xyz, intrinsics, ref_camera(anno)


def ref_knn(x, y, k=2):
    """faiss IndexFlatL2 on unit vectors, exactly: the k nearest by L2 (torch.cdist in float64, a stable
    sort: equal distances to the lower index), then the script's cosine distances."""
    x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    d = torch.cdist(x.double()[None], y.double()[None], compute_mode="use_mm_for_euclid_dist")[0]
    idx = torch.sort(d, dim=1, stable=True).indices[:, :k]
    dists = 1 - F.cosine_similarity(y[idx], x[:, None, :], dim=-1)
    return dists, idx


def ref_correspondence(feat0, feat1, xyz0, xyz1, num_corr):
    """estimate_correspondence_xyz with the ratio test, top-k by weight (ties to the lower index)."""
    _, h, w = xyz0.shape
    feat0 = F.interpolate(feat0[None], size=(h, w), mode="bicubic")[0]
    feat1 = F.interpolate(feat1[None], size=(h, w), mode="bicubic")[0]
    gx, gy = torch.linspace(0.5, w - 0.5, w).view(1, w).repeat(h, 1), torch.linspace(0.5, h - 0.5, h).view(h, 1).repeat(1, w)
    uvd = torch.stack((gx, gy, torch.ones_like(gx)))
    f0, f1 = feat0.permute(1, 2, 0)[xyz0[2] > 0], feat1.permute(1, 2, 0)[xyz1[2] > 0]
    p0, p1 = xyz0.permute(1, 2, 0)[xyz0[2] > 0], xyz1.permute(1, 2, 0)[xyz1[2] > 0]
    u0, u1 = uvd.permute(1, 2, 0)[xyz0[2] > 0], uvd.permute(1, 2, 0)[xyz1[2] > 0]
    dists, idx = ref_knn(f0, f1)
    dists = dists.clamp(min=1e-9)
    weight = 1 - dists[..., 0] / dists[..., 1].clamp(min=1e-9)
    n = min(num_corr, weight.shape[-1])
    source = torch.tensor(sorted(range(len(weight)), key=lambda i: (-float(weight[i]), i))[:n])
    target = idx[:, 0][source]
    return p0[source], p1[target], u0[source][:, :2], u1[target][:, :2]


def ref_binned(y, x, bins):
    return [y[(x >= lo) * (x < hi)].mean() for lo, hi in zip(bins[:-1], bins[1:])]


# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_navi(tmp_path_factory.mktemp("navi") / "navi_v1", OBJECTS, seed=3)


def test_the_panel_is_checked_field_by_field_without_a_label_read(folder, tmp_path, capsys):
    labels = sorted(folder.glob("*/wild_set/annotations.json")) + sorted(folder.glob("*/wild_set/depth/*.png"))
    with guard.forbid_label_reads(labels):
        code, printed = probe_main(["panel", "add", "navi-test", "--navi", folder, "--role", "test", "--cache", tmp_path / "c"], capsys)
    assert code == 0, printed.err
    assert ledger.entries(tmp_path / "c") == []
    # a broken copy: one line, the first problem (file, entry, field, fix) and how many more; nothing registered
    broken = write_navi(tmp_path / "broken", {"cup": [0, 30, 60]}, seed=1)
    notes = json.loads((broken / "cup" / "wild_set" / "annotations.json").read_text())
    del notes[0]["camera"]["focal_length"]
    notes[1]["image_size"] = [100]
    (broken / "cup" / "wild_set" / "annotations.json").write_text(json.dumps(notes))
    (broken / "cup" / "wild_set" / "depth" / "downsampled_002.png").unlink()
    code, printed = probe_main(["panel", "add", "b", "--navi", broken, "--role", "test", "--cache", tmp_path / "c"], capsys)
    lines = printed.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, printed.err
    assert "image 000: field camera.focal_length is None" in lines[0] and lines[0].endswith(f"(2 more problems in {broken})"), lines[0]
    (broken / "cup" / "wild_set" / "annotations.json").write_text(json.dumps([notes[0] | {"camera": {**notes[0]["camera"], "focal_length": 1.0}}, *notes[1:]]))
    code, printed = probe_main(["panel", "add", "b", "--navi", broken, "--role", "test", "--cache", tmp_path / "c"], capsys)
    assert code == 2 and "image 001: field image_size is [100]" in printed.err and "(1 more problem in" in printed.err, printed.err
    for argv, words in ((["--split", "train"], "--split 'train' is not one of test"), ([], "no other image of its collection lies within 120°")):
        lonely = write_navi(tmp_path / f"lonely{len(argv)}", {"cup": [0, 150]}, seed=2)
        code, printed = probe_main(["panel", "add", "l", "--navi", lonely, "--role", "test", "--cache", tmp_path / "c", *argv], capsys)
        assert code == 2 and words in printed.err, printed.err
    assert "[b]" not in (tmp_path / "c" / "panels.toml").read_text() and "[l]" not in (tmp_path / "c" / "panels.toml").read_text()


def test_pairs_are_generate_instance_pairs(folder):
    images, problems, _ = parse(folder, lambda p: Path(p).read_bytes())
    assert not problems
    want, _ = ref_pairs(folder)
    got = [(images[i].object, images[i].id, images[j].id) for i, j in navi_pairs.scored(images)]
    assert got == want and len(got) == math.ceil(len(images) / 4)
    assert all(i != j for _, i, j in got)


def test_the_view_is_the_references_chain(folder):
    _, data = ref_pairs(folder)
    for obj, image_id in (("bottle", "001"), ("mug", "003")):
        anno = data[obj][1][image_id]
        image, xyz, intrinsics, _ = ref_single(folder, obj, image_id, anno)
        rgb = np.asarray(Image.open(folder / obj / "wild_set" / "images" / f"downsampled_{image_id}.jpg").convert("RGB"))
        disparity = np.array(Image.open(folder / obj / "wild_set" / "depth" / f"downsampled_{image_id}.png"))
        got = navi.view(rgb, disparity, anno["camera"]["focal_length"], tuple(anno["image_size"]))
        assert np.array_equal(got.image, image.numpy()) and np.array_equal(got.points, xyz.numpy())
        assert np.float32(got.focal) == np.float32(intrinsics[0, 0].item()) and 0.05 < (got.points[2] > 0).mean() < 0.3


@pytest.mark.parametrize("patch", [16, 14])
def test_matching_errors_and_recall_are_the_references(folder, patch):
    """Random features on two real views: correspondences, 3-D and 2-D errors, recall and rotation bins."""
    _, data = ref_pairs(folder)
    rng = np.random.default_rng(patch)
    (i0, a0), (i1, a1) = (("001", data["bottle"][1]["001"]), ("003", data["bottle"][1]["003"]))
    im0, xyz0, _, rt0 = ref_single(folder, "bottle", i0, a0)
    im1, xyz1, k1, rt1 = ref_single(folder, "bottle", i1, a1)
    grid = -(-512 // patch)
    f0, f1 = (torch.from_numpy(rng.normal(size=(24, grid, grid)).astype(np.float32)) for _ in range(2))
    small0, small1 = (F.interpolate(x[None], scale_factor=0.25, mode="nearest")[0] for x in (xyz0, xyz1))
    c0, c1, u0, u1 = ref_correspondence(f0, f1, small0, small1, 300)
    rt01 = (rt1 @ rt0.inverse()).float()[:3, :4]
    moved = c0 @ rt01[:3, :3].transpose(-2, -1) + rt01[None, :3, 3]
    err3d = (moved - c1).norm(p=2, dim=1)
    proj = lambda x: (x @ k1.transpose(-1, -2))[:, :2] / (x @ k1.transpose(-1, -2))[:, 2:3].clamp(min=1e-9)  # noqa: E731
    err2d = (proj(moved) - proj(c1)).norm(p=2, dim=1)

    v0 = navi.view(
        np.asarray(Image.open(folder / "bottle/wild_set/images/downsampled_001.jpg").convert("RGB")),
        np.array(Image.open(folder / "bottle/wild_set/depth/downsampled_001.png")),
        a0["camera"]["focal_length"],
        tuple(a0["image_size"]),
    )
    v1 = navi.view(
        np.asarray(Image.open(folder / "bottle/wild_set/images/downsampled_003.jpg").convert("RGB")),
        np.array(Image.open(folder / "bottle/wild_set/depth/downsampled_003.png")),
        a1["camera"]["focal_length"],
        tuple(a1["image_size"]),
    )
    found = navi.match(f0, f1, v0.points, v1.points, 300)
    assert np.array_equal(found.source, c0.numpy()) and np.array_equal(found.target, c1.numpy())
    assert np.array_equal(found.source_uv, (u0 / 0.25).numpy()) and np.array_equal(found.target_uv, (u1 / 0.25).numpy())
    e3, e2 = navi.errors(found, navi.relative(navi_pairs.camera(_image(folder, "bottle", i0)), navi_pairs.camera(_image(folder, "bottle", i1))), v1.focal)
    assert np.array_equal(e3, err3d.numpy()) and np.array_equal(e2, err2d.numpy())
    for threshold in (0.01, 0.02, 0.05):
        assert navi.recall(e3, threshold) == float(100 * (err3d < threshold).float().mean())
    angle = torch.acos(((rt01[0, 0] + rt01[1, 1] + rt01[2, 2] - 1.0) * 0.5).clamp(min=-1, max=1)) * 180.0 / np.pi
    assert navi.rotation_angle(rt01) == float(angle)


def _image(folder, obj, image_id):
    images, _, _ = parse(folder, lambda p: Path(p).read_bytes())
    return next(i for i in images if i.object == obj and i.id == image_id)


def test_recall_binning_is_compute_binned_performance():
    rng = np.random.default_rng(0)
    y, x = rng.random(50).astype(np.float32), (rng.random(50) * 150).astype(np.float32)
    x[:3] = [30.0, 0.0, 120.0]  # bin edges: 30 opens the second bin, 120 falls outside every bin
    want = ref_binned(torch.from_numpy(y), torch.from_numpy(x), [0, 30, 60, 90, 120])
    np.testing.assert_array_equal(navi.binned(y, x), np.array([float(v) for v in want]))
    assert np.isnan(navi.binned(y[:1], np.array([100.0], np.float32))[:3]).all()  # an empty bin is NaN, as torch's mean of nothing


def test_a_quaternion_turns_as_the_annotation_says():
    angles = navi_pairs.angles(torch.stack([navi_pairs.rotation(quaternion(a)) for a in (0, 30, 125)]))
    np.testing.assert_allclose(angles.numpy(), [[0, 30, 125], [30, 0, 95], [125, 95, 0]], atol=2e-2)


# ----------------------------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return write_navi(tmp_path_factory.mktemp("navi-small") / "navi_v1", SMALL, seed=5)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, small):
    """A store of each family's tiny network (of one unrelated image: the NAVI views are made after the ledger entry)."""
    from probe_toolkit.demo.samples import TINY, TINY_DINOV2_REG, TINY_DINOV3, write_checkpoint
    from probe_toolkit.store.extract import Settings, extract

    root = tmp_path_factory.mktemp("navi-stores")
    (root / "one").mkdir()
    Image.fromarray(np.full((40, 40, 3), 128, np.uint8)).save(root / "one" / "a.png")
    out = {}
    for family, (layout, arch) in {"dino": ("dino-full", TINY), "dinov2": ("dinov2-reg-backbone", TINY_DINOV2_REG), "dinov3": ("dinov3-official", TINY_DINOV3)}.items():
        checkpoint = write_checkpoint(root / f"{family}.pth", layout, arch, seed=7)
        out[family] = extract(checkpoint, root / "one", settings=Settings(views=(224,), attention="none"), store=root / f"{family}.zarr", quiet=True).store
    cache = root / "cache"
    add_panel("navi-test", small, None, "test", cache=cache, kind="navi", split="test")
    return root, out, cache


def _reference_record(folder, store, num_corr=1000):
    """Every number of the record from the reference's chain above and the store's network (its plain forward)."""
    from probe_toolkit.store import cache, parts
    from probe_toolkit.store.backbone import Backbone

    meta = cache.manifest(store)
    model = Backbone.from_checkpoint(parts.store_checkpoint(meta, store, "test"))
    patch = model.arch.patch
    pairs, data = ref_pairs(folder)
    err3d, err2d, angles = [], [], []
    for obj, i0, i1 in pairs:
        views = [ref_single(folder, obj, i, data[obj][1][i]) for i in (i0, i1)]
        feats = []
        for image, *_ in views:
            pad = (-(-512 // patch) * patch - 512) if 512 % patch else 0  # center_padding
            x = F.pad(image, (pad // 2, pad - pad // 2, pad // 2, pad - pad // 2))
            with torch.inference_mode():
                tokens = model(x[None])[0]
            g = x.shape[-1] // patch
            feats.append(tokens.reshape(g, g, -1).permute(2, 0, 1))
        (_, xyz0, _, rt0), (_, xyz1, k1, rt1) = views
        small0, small1 = (F.interpolate(x[None], scale_factor=0.25, mode="nearest")[0] for x in (xyz0, xyz1))
        c0, c1, _, _ = ref_correspondence(feats[0], feats[1], small0, small1, num_corr)
        rt01 = (rt1 @ rt0.inverse()).float()[:3, :4]
        moved = c0 @ rt01[:3, :3].transpose(-2, -1) + rt01[None, :3, 3]
        proj = lambda x: (x @ k1.transpose(-1, -2))[:, :2] / (x @ k1.transpose(-1, -2))[:, 2:3].clamp(min=1e-9)  # noqa: E731, B023
        err3d.append((moved - c1).norm(p=2, dim=1))
        err2d.append((proj(moved) - proj(c1)).norm(p=2, dim=1))
        angles.append(torch.acos(((rt01[0, 0] + rt01[1, 1] + rt01[2, 2] - 1.0) * 0.5).clamp(min=-1, max=1)) * 180.0 / np.pi)
    e3, e2 = torch.stack(err3d), torch.stack(err2d)
    rec = (e3 < 0.02).float().mean(dim=1)
    return (
        [float(100 * (e3 < t).float().mean()) for t in (0.01, 0.02, 0.05)],
        [float(100 * (e2 < t).float().mean()) for t in (5, 25, 50)],
        [float(v) * 100 for v in ref_binned(rec, torch.stack(angles), [0, 30, 60, 90, 120])],
        e3.numpy(),
    )


@pytest.mark.parametrize("family", ["dino", "dinov2", "dinov3"])
def test_end_to_end_equals_the_reference(stores, small, family, tmp_path, capsys):
    from probe_toolkit.results import records

    root, out, cache = stores
    code, printed = probe_main(
        ["correspond", out[family], "--panel", "navi-test", "--unseal", "a test of NAVI", "--cache", cache, "-q", "--workers", "1", "--json", tmp_path / "n.json"], capsys
    )
    assert code == 0, printed.err
    assert "NAVI correspondence recall" in printed.out and "mean of the four rotation bins" in printed.out
    saved = records.load(out[family], "correspond-navi")
    cm, px, bins, e3 = _reference_record(small, out[family])
    np.testing.assert_allclose(saved.recall_cm.values, cm, atol=1e-4)
    np.testing.assert_allclose(saved.recall_px.values, px, atol=1e-4)
    np.testing.assert_allclose(saved.binned.values, bins, atol=1e-4, equal_nan=True)
    np.testing.assert_allclose(saved.error_3d.values, e3, rtol=1e-4, atol=1e-6)
    assert saved.sizes["pair"] == 2 and saved.source_view.shape == (2, 256, 256, 3)
    summary = json.loads((tmp_path / "n.json").read_text())
    assert summary["recall_cm"]["2"] == pytest.approx(cm[1], abs=1e-4)
    entries = ledger.entries(cache)
    assert entries[-1].fields["purpose"] == "correspond: score" and entries[-1].fields["pairs"] == 2


def test_the_same_record_at_one_and_two_workers_and_in_shards(stores, monkeypatch, capsys):
    from probe_toolkit import run
    from probe_toolkit.commands import correspond_navi
    from probe_toolkit.results import records

    root, out, cache = stores
    monkeypatch.setattr(correspond_navi, "BLOCK", 1)  # one pair a block: shards of whole pairs
    given = dict(panel="navi-test", unseal="a test of NAVI", cache_dir=cache)
    one = records.load(out["dino"], "correspond-navi", run("correspond", out["dino"], workers=1, **given).run_id)
    two = records.load(out["dino"], "correspond-navi", run("correspond", out["dino"], workers=2, **given).run_id)
    first = run("correspond", out["dino"], workers=1, shard="0/2", **given)
    assert first.report.waiting == [1]
    last = run("correspond", out["dino"], workers=1, shard="1/2", **given)
    sharded = records.load(out["dino"], "correspond-navi", last.run_id)
    for other in (two, sharded):
        for name in ("recall_cm", "recall_px", "binned", "error_3d", "error_2d", "source_uv", "matches", "angle", "source_view"):
            np.testing.assert_array_equal(one[name].values, other[name].values, err_msg=name)


def test_settings_of_the_other_data_set_are_refused_before_any_label_read(stores, capsys):
    root, out, cache = stores
    before = len(ledger.entries(cache))
    code, printed = probe_main(["correspond", out["dino"], "--panel", "navi-test", "--unseal", "x", "--cache", cache, "-q", "--instances", "50"], capsys)
    assert code == 2 and "instances applies to the other data set's panels, not to a NAVI panel" in " ".join(printed.err.split()), printed.err
    assert len(ledger.entries(cache)) == before
