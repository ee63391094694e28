"""``probe propagate``: J&F on hand-computed cases, and label propagation against a plain per-frame
loop written here (DINO's procedure step by step) on a synthetic DAVIS folder."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_runs import probe_main
from conftest import davis_video
from PIL import Image

from probe_toolkit.demo.samples import TINY
from probe_toolkit.demo.video import write_davis
from probe_toolkit.labels import davis, ledger
from probe_toolkit.store.backbone import Backbone, normed_patch_tokens
from probe_toolkit.store.checkpoints import load_checkpoint

BLOCK = np.zeros((10, 10), bool)
BLOCK[1:3, 1:3] = True


def test_boundary_map_by_hand():
    expected = np.zeros((10, 10), bool)
    expected[0:3, 0:3] = True
    expected[1, 1] = False
    np.testing.assert_array_equal(davis.seg2bmap(BLOCK), expected)


def test_region_and_boundary_by_hand():
    shifted = np.roll(BLOCK, 1, axis=1)
    assert davis.region_iou(BLOCK, shifted) == pytest.approx(2 / 6)
    assert davis.region_iou(np.zeros((4, 4)), np.zeros((4, 4))) == 1.0
    assert davis.tolerance((10, 10)) == 1 and davis.tolerance((480, 854)) == 8
    # shifted by 3 columns: 3 of 8 boundary pixels within 1 pixel of the other boundary, both ways
    assert davis.boundary_f(BLOCK, np.roll(BLOCK, 3, axis=1)) == pytest.approx(3 / 8)
    assert davis.boundary_f(BLOCK, BLOCK) == 1.0
    assert davis.boundary_f(BLOCK, np.zeros_like(BLOCK)) == 0.0
    assert davis.boundary_f(np.zeros_like(BLOCK), np.zeros_like(BLOCK)) == 1.0


def plain_f(truth, pred, r):
    """F with pixel loops: a boundary pixel matches when one of the other boundary lies within dx² + dy² ≤ r²."""

    def bmap(seg):
        h, w = seg.shape
        out = np.zeros_like(seg)
        for y in range(h):
            for x in range(w):
                nbrs = (
                    [(y, x + 1), (y + 1, x), (y + 1, x + 1)]
                    if y < h - 1 and x < w - 1
                    else [(y, x + 1)]
                    if y == h - 1 and x < w - 1
                    else [(y + 1, x)]
                    if x == w - 1 and y < h - 1
                    else []
                )
                out[y, x] = any(seg[y, x] != (seg[a, b] if a < h and b < w else False) for a, b in nbrs)
        return out

    def matched(a, b):
        pts = np.argwhere(b)
        return sum(any((y - py) ** 2 + (x - px) ** 2 <= r * r for py, px in pts) for y, x in np.argwhere(a))

    fb, gb = bmap(pred), bmap(truth)
    if not fb.sum() or not gb.sum():
        return None
    p, q = matched(fb, gb) / fb.sum(), matched(gb, fb) / gb.sum()
    return 0.0 if p + q == 0 else 2 * p * q / (p + q)


def test_boundary_f_equals_pixel_loops_on_random_shapes():
    from skimage.morphology import disk

    np.testing.assert_array_equal(davis.disk(3), disk(3).astype(bool))
    rng = np.random.default_rng(0)
    for _ in range(4):
        truth = np.zeros((20, 30), bool)
        pred = np.zeros((20, 30), bool)
        y, x = rng.integers(2, 12), rng.integers(2, 20)
        truth[y : y + 6, x : x + 8] = True
        pred[max(0, y + rng.integers(-2, 3)) : y + 7, max(0, x + rng.integers(-3, 3)) : x + 9] = True
        expected = plain_f(truth, pred, davis.tolerance(truth.shape))
        assert davis.boundary_f(truth, pred) == pytest.approx(expected)


def test_statistics_and_first_last_frames_by_hand():
    mean, recall, decay = davis.statistics(np.array([1, 1, 0, 0, 0.6, 0.4, 0.8, 0.2]))
    assert (mean, recall) == (pytest.approx(0.5), pytest.approx(0.5))
    assert decay == pytest.approx((1 + 1 + 0) / 3 - (0.4 + 0.8 + 0.2) / 3)  # bins [0:3] and [5:8]
    truth = [np.where(BLOCK, 1, 0).astype(np.uint8)] * 4
    wrong = np.zeros((10, 10), np.uint8)
    pred = [wrong, truth[1], np.roll(truth[2], 1, axis=1), wrong]  # first and last wrong: not scored
    s = davis.score_sequence("seq", truth, pred)
    np.testing.assert_allclose(s.j, [[1.0, 2 / 6]])
    row = davis.global_row([s])
    assert row["J-Mean"] == pytest.approx((1 + 1 / 3) / 2)
    assert row["J&F-Mean"] == pytest.approx((row["J-Mean"] + row["F-Mean"]) / 2)


# ----------------------------------------------------------------------------------------------
# propagation against DINO's procedure written out per frame


MEAN, STD = (0.485, 0.456, 0.406), (0.228, 0.224, 0.225)


def plain_frame(path):
    """eval_video_segmentation.py's read_frame, step by step: OpenCV decodes (BGR) and resizes the
    8-bit frame (INTER_LINEAR), then float32 / 255, channels reversed, normalised per channel."""
    import cv2

    bgr = cv2.imread(str(path))
    h0, w0 = bgr.shape[:2]
    if h0 > w0:
        tw, th = 480, int((480 * h0 / w0) // 64 * 64)
    else:
        th, tw = 480, int((480 * w0 / h0) // 64 * 64)
    img = cv2.resize(bgr, (tw, th), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255.0
    rgb = img[:, :, [2, 1, 0]].transpose(2, 0, 1).copy()
    for c in range(3):
        rgb[c] = (rgb[c] - np.float32(MEAN[c])) / np.float32(STD[c])
    return torch.from_numpy(rgb)


def test_frames_are_read_as_opencv_reads_them(tmp_path):
    """The network input equals the script's read_frame to the bit: 8-bit resize, not a float one."""
    import cv2

    from probe_toolkit.analyses.propagation import frame_tensor

    rng = np.random.default_rng(1)
    path = tmp_path / "f.jpg"
    Image.fromarray(rng.integers(0, 256, (75, 101, 3), dtype=np.uint8)).save(path, quality=90)
    got = frame_tensor(cv2.imread(str(path)))
    want = plain_frame(path)
    assert got.shape == want.shape == (3, 480, 640)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    floated = (
        F.interpolate(
            torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), np.float32)).permute(2, 0, 1)[None], size=(480, 640), mode="bilinear", align_corners=False
        )[0]
        / 255.0
    )
    assert not np.array_equal(floated.numpy(), (want * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)).numpy())


def plain_propagation(model, frames, annotation, n_last=7, radius=12, topk=5):
    """eval_video_segmentation.py's loop: one frame at a time, the window built cell by cell."""
    patch = model.arch.patch
    h0, w0 = annotation.shape
    first = plain_frame(frames[0])
    h, w = first.shape[1] // patch, first.shape[2] // patch
    small = np.array(Image.fromarray(annotation).resize((w, h), Image.Resampling.NEAREST))
    n = int(small.max()) + 1
    first_seg = torch.zeros(1, n, h, w)
    for c in range(n):
        first_seg[0, c] = torch.from_numpy(small == c).float()
    mask = torch.zeros(h, w, h, w)
    for i in range(h):
        for j in range(w):
            mask[i, j, max(0, i - radius) : i + radius + 1, max(0, j - radius) : j + radius + 1] = 1
    mask = mask.reshape(h * w, h * w)
    feat1 = normed_patch_tokens(model, first[None])[0].T  # dim × hw, unnormalised
    queue, out, soft = [], [], []
    for path in frames[1:]:
        feat_tar = normed_patch_tokens(model, plain_frame(path)[None])[0]  # hw × dim
        sources = torch.stack([feat1] + [q[0] for q in queue])
        segs = torch.cat([first_seg] + [q[1] for q in queue])
        m = sources.shape[0]
        tar = F.normalize(feat_tar, dim=1, p=2).unsqueeze(0).repeat(m, 1, 1)
        aff = torch.exp(torch.bmm(tar, F.normalize(sources, dim=1, p=2)) / 0.1) * mask.unsqueeze(0)
        aff = aff.transpose(2, 1).reshape(-1, h * w)
        tk_min = torch.topk(aff, dim=0, k=topk).values.min(dim=0).values
        aff[aff < tk_min] = 0
        aff = aff / aff.sum(0, keepdim=True)
        segs = segs.reshape(m, n, -1).transpose(2, 1).reshape(-1, n).T
        seg_tar = torch.mm(segs, aff).reshape(1, n, h, w)
        if len(queue) == n_last:
            queue.pop(0)
        queue.append([feat_tar.T, seg_tar.clone()])
        soft.append(seg_tar[0].clone())
        up = F.interpolate(seg_tar, scale_factor=patch, mode="bilinear", align_corners=False, recompute_scale_factor=False)[0]
        for c in range(n):
            if up[c].max() > 0:
                up[c] = up[c] - up[c].min()
                up[c] = up[c] / up[c].max()
        labels = torch.max(up, dim=0).indices.numpy().astype(np.uint8)
        out.append(np.array(Image.fromarray(labels).resize((w0, h0), Image.Resampling.NEAREST)))
    return out, soft


def plain_j_and_f(truth, pred):
    """davis2017-evaluation's semi-supervised J and F per object, written out: frames 1..n-2 scored,
    J the region IoU (1 when both are empty), F from the pixel-loop boundaries (1 when both are empty)."""
    r = int(np.ceil(0.008 * np.hypot(*truth[0].shape)))
    objects = [int(o) for o in np.unique(truth[0]) if o != 0]
    j, f = {}, {}
    for o in objects:
        js, fs = [], []
        for t, p in zip(truth[1:-1], pred[1:-1]):
            a, b = t == o, p == o
            union = np.logical_or(a, b).sum()
            js.append(1.0 if union == 0 else np.logical_and(a, b).sum() / union)
            value = plain_f(a, b, r)
            fs.append(value if value is not None else float(a.any() == b.any()))
        j[o], f[o] = float(np.mean(js)), float(np.mean(fs))
    return j, f


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return davis_video(tmp_path_factory.mktemp("davis"), {"shapes": 4, "pair": 3}, 3, "dino-full", TINY, 0)


def test_propagation_equals_the_plain_loop_and_scores_as_davis(video, capsys):
    from probe_toolkit.results.records import load
    from probe_toolkit.store.extract import Settings, extract

    root, checkpoint = video
    out, c = root / "out", root / "cache"
    (root / "one").mkdir()
    Image.new("RGB", (32, 32), (90, 90, 90)).save(root / "one" / "grey.png")
    store = extract(checkpoint, root / "one", settings=Settings(views=(96,)), cache_dir=root / "stores", quiet=True).store
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
            "--store",
            str(store),
            "--n-last-frames",
            "2",
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
    scores = []
    for seq in ("shapes", "pair"):
        frames = sorted((root / "DAVIS" / "JPEGImages" / "480p" / seq).glob("*.jpg"))
        truth = [np.array(Image.open(root / "DAVIS" / "Annotations" / "480p" / seq / f"{f.stem}.png")) for f in frames]
        expected, soft = plain_propagation(model, frames, truth[0], n_last=2)
        written = [Image.open(out / seq / f"{f.stem}.png") for f in frames]
        assert all(im.mode == "P" for im in written)
        assert written[1].getpalette()[:9] == [0, 0, 0, 128, 0, 0, 0, 128, 0]  # the first annotation's palette
        np.testing.assert_array_equal(np.array(written[0]), truth[0])
        for got, want in zip(written[1:], expected):
            np.testing.assert_array_equal(np.array(got), want)
        scores.append(plain_j_and_f(truth, [truth[0], *expected]))
        kept = np.load(out / seq / "soft.npy")
        np.testing.assert_allclose(kept, torch.stack(soft).numpy(), rtol=0, atol=1e-6)
        record = load(store, "davis")
        np.testing.assert_array_equal(record[f"soft_{seq}"].values, kept)
        assert list(record[f"frame_{seq}"].values) == [f.stem for f in frames[1:]]
    js = [v for j, _ in scores for v in j.values()]
    fs = [v for _, f in scores for v in f.values()]
    overall = {"J-Mean": float(np.mean(js)), "F-Mean": float(np.mean(fs))}
    overall["J&F-Mean"] = (overall["J-Mean"] + overall["F-Mean"]) / 2
    with open(out / "global_results-val.csv") as handle:
        table = list(csv.DictReader(handle))
    for column in ("J&F-Mean", "J-Mean", "F-Mean"):
        assert float(table[0][column]) == pytest.approx(overall[column], abs=5e-4)
    assert overall["J&F-Mean"] > 0.3  # the shapes are tracked, not lost
    with open(out / "per-sequence_results-val.csv") as handle:
        assert [r["Sequence"] for r in csv.DictReader(handle)] == ["shapes_1", "shapes_2", "pair_1", "pair_2"]
    purposes = [e.fields["purpose"] for e in ledger.entries(c)]
    assert purposes == ["propagate: first frame", "propagate: score"]
    assert [e.fields["images"] for e in ledger.entries(c)] == [2, 7]
    summary = json.loads((root / "p.json").read_text())["global"]
    for column in ("J&F-Mean", "J-Mean", "F-Mean"):
        assert summary[column] == pytest.approx(overall[column], abs=1e-12)


def test_bad_davis_folders_are_one_line(video, capsys, tmp_path):
    root, checkpoint = video

    def broken(change):
        folder = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        write_davis(folder, {"shapes": 3}, size=(64, 48))
        change(folder)
        return folder

    cases = [
        (broken(lambda d: [p.unlink() for p in (d / "JPEGImages" / "480p" / "shapes").glob("*.jpg")]), "holds no frames"),
        (broken(lambda d: [p.unlink() for p in sorted((d / "JPEGImages" / "480p" / "shapes").glob("*.jpg"))[1:]]), "single frame"),
        (broken(lambda d: Image.new("P", (32, 32)).save(d / "Annotations" / "480p" / "shapes" / "00000.png")), "32×32"),
        (broken(lambda d: (d / "ImageSets" / "2017" / "val.txt").unlink()), "is missing"),
    ]
    for folder, needle in cases:
        code, printed = probe_main(["propagate", str(checkpoint), "--davis", str(folder), "--out", str(folder / "out"), "--cache", str(tmp_path / "c"), "-q"], capsys)
        assert code == 2 and needle in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err
        assert not (folder / "out" / "shapes").exists()
    code, printed = probe_main(["propagate", str(checkpoint), "--davis", str(cases[0][0]), "--out", str(tmp_path / "o"), "--topk", "0", "-q"], capsys)
    assert code == 2 and "--topk" in printed.err


def test_out_of_the_users_is_refused_before_any_label_and_a_rerun_keeps_the_users_files(video, capsys, tmp_path):
    """--out is probe's output folder: a non-empty folder without probe's manifest is refused in
    one line before a label is read; in its own folder a rerun keeps what the user added."""
    root, checkpoint = video
    mine, c = tmp_path / "mine", tmp_path / "cache"
    (mine / "shapes").mkdir(parents=True)
    (mine / "shapes" / "my-notes.txt").write_text("mine")
    args = ["propagate", str(checkpoint), "--davis", str(root / "DAVIS"), "--sequence", "pair", "--n-last-frames", "2", "--workers", "1", "--cache", str(c), "-q"]
    code, printed = probe_main([*args, "--out", str(mine)], capsys)
    assert code == 2 and len(printed.err.strip().splitlines()) == 1 and "not probe's output folder" in printed.err and "pick a new --out" in printed.err
    assert not ledger.entries(c) and sorted(p.name for p in mine.rglob("*")) == ["my-notes.txt", "shapes"]
    own = tmp_path / "own"
    code, printed = probe_main([*args, "--out", str(own)], capsys)
    assert code == 0, printed.err
    (own / "my-notes.txt").write_text("mine")
    code, printed = probe_main([*args, "--out", str(own)], capsys)
    assert code == 0, printed.err
    assert (own / "my-notes.txt").read_text() == "mine" and (own / "pair").is_dir()


def test_a_run_lost_mid_way_says_which_sequences_it_left_in_out(video, capsys, tmp_path, monkeypatch):
    """A cluster lost after the first sequence: the one line says that sequence's PNGs are in
    --out (each written whole), not "nothing was saved"; the rerun writes every sequence."""
    from probe_toolkit.commands import propagate as command
    from probe_toolkit.infra.cluster import lost_cluster

    root, checkpoint = video
    out, c = tmp_path / "out", tmp_path / "cache"
    real = command.map_blocks

    def first_then_lost(fn, read, ranges, **kwargs):
        real(fn, read, ranges[:1], **{**kwargs, "workers": 1, "client": None})
        raise lost_cluster(None, "went away mid-run (FuturesCancelledError)")

    monkeypatch.setattr(command, "map_blocks", first_then_lost)
    args = ["propagate", str(checkpoint), "--davis", str(root / "DAVIS"), "--out", str(out), "--cache", str(c), "--n-last-frames", "2", "--workers", "1", "-q"]
    code, printed = probe_main(args, capsys)
    lines = [line for line in printed.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, printed.err
    assert "nothing was saved" not in lines[0] and f"1 sequences' PNGs are in {out}" in lines[0], lines[0]
    written = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert written == ["pair"] or written == ["shapes"]
    monkeypatch.undo()
    code, printed = probe_main(args, capsys)
    assert code == 0, printed.err
    assert {p.name for p in out.iterdir() if p.is_dir()} >= {"shapes", "pair"}
