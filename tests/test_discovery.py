"""Object discovery as the field measures it: VOC, COCO20k and saliency panels, CorLoc and the
saliency scores, and the LOST and DSM presets, each held to a plain re-implementation written here."""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
from decoder_scenes import Scene, make_store, photo_store, planted_keys, run_main
from PIL import Image
from typer.testing import CliRunner

from probe_toolkit.analyses.decoder import decode_image
from probe_toolkit.analyses.decoder_settings import Settings
from probe_toolkit.analyses.dsm import dsm, knn_color_affinity
from probe_toolkit.analyses.lost import lost
from probe_toolkit.cli import app
from probe_toolkit.commands.decode_sweep import load_grid
from probe_toolkit.labels import guard, ledger, panels
from probe_toolkit.labels import saliency as sal
from probe_toolkit.labels.kinds import COCO20K_SIZE, coco20k_ids
from probe_toolkit.results import records

runner = CliRunner()
GRID = 16


_main = run_main


# ----------------------------------------------------------------------------------------------
# plain references (loops, float64, own graph search)


def components(mask: np.ndarray, eight: bool) -> np.ndarray:
    """Labels of a 2-D bool mask by breadth-first search, numbered in raster order of their first pixel."""
    rows, cols = mask.shape
    labels = np.zeros(mask.shape, dtype=int)
    steps = [(-1, 0), (1, 0), (0, -1), (0, 1)] + ([(-1, -1), (-1, 1), (1, -1), (1, 1)] if eight else [])
    count = 0
    for r in range(rows):
        for c in range(cols):
            if mask[r, c] and not labels[r, c]:
                count += 1
                labels[r, c] = count
                queue = deque([(r, c)])
                while queue:
                    y, x = queue.popleft()
                    for dy, dx in steps:
                        v, u = y + dy, x + dx
                        if 0 <= v < rows and 0 <= u < cols and mask[v, u] and not labels[v, u]:
                            labels[v, u] = count
                            queue.append((v, u))
    return labels


def plain_lost(keys: np.ndarray, rows: int, cols: int, k: int = 100, ties: str = "argsort") -> np.ndarray:
    """LOST's mask; ``ties``: argsort ranks equal degrees as LOST's own torch.argsort(-degree, descending=True)
    does (object_discovery.py patch_scoring), lowest-index by patch index."""
    import torch

    n = len(keys)
    a = [[float(np.dot(keys[i].astype(np.float64), keys[j].astype(np.float64))) for j in range(n)] for i in range(n)]
    degree = [sum(1 for j in range(n) if j != i and a[i][j] > 0) for i in range(n)]
    if ties == "argsort":
        order = torch.argsort(-torch.tensor(degree, dtype=torch.float32), descending=True).tolist()
    else:
        order = sorted(range(n), key=lambda i: (degree[i], i))
    seed = order[0]
    similar = [p for p in order[:k] if a[seed][p] > 0]
    m = np.array([sum(a[p][j] for p in similar) for j in range(n)])
    labels = components((m > 0).reshape(rows, cols), eight=False).ravel()
    return labels == labels[seed] if labels[seed] else np.zeros(n, bool)


def plain_dsm(keys: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """DSM as published: ARPACK shift-invert on (D − W, D), its sign rule, the largest 8-component."""
    f = keys.astype(np.float64) / np.linalg.norm(keys.astype(np.float64), axis=1, keepdims=True)
    w = f @ f.T
    w = w * (w > 0)
    w = w / w.max()
    d = w.sum(axis=1)
    d[d < 1e-12] = 1.0
    dm = scipy.sparse.diags(d).toarray()
    values, vectors = scipy.sparse.linalg.eigsh(dm - w, k=3, sigma=0, which="LM", M=dm)
    v = vectors[:, np.argsort(values)[1]]
    if v[int(np.argmax(np.abs(v)))] < 0:  # the tie rule of probe's DSM (only an exact half split depends on it)
        v = -v
    if 0.5 < np.mean(v > 0) < 1.0:
        v = -v
    patch = (v > 0).reshape(rows, cols)
    if not patch.any():
        patch[:] = True
    labels = components(patch, eight=True)
    sizes = [int((labels == c).sum()) for c in range(1, labels.max() + 1)]
    return (labels == 1 + sizes.index(max(sizes))).ravel()


def lost_keys(grid: int, objects, channels: int = 12, seed: int = 0) -> np.ndarray:
    """Raw keys as LOST sees them: a background direction, objects leaning against it."""
    rng = np.random.default_rng(seed)
    keys = np.tile(np.eye(channels)[0], (grid * grid, 1))
    for k, (r0, r1, c0, c1) in enumerate(objects):
        inside = np.zeros((grid, grid), bool)
        inside[r0:r1, c0:c1] = True
        keys[inside.ravel()] = -0.5 * np.eye(channels)[0] + np.eye(channels)[1 + k]
    return (keys + 0.02 * rng.standard_normal(keys.shape)).astype(np.float32)


def plain_iou(box, gt) -> float:
    """LOST's bbox_iou written out for one pair (eps 1e-7 on the heights and the union)."""
    eps = 1e-7
    iw = max(0.0, min(box[2], gt[2]) - max(box[0], gt[0]))
    ih = max(0.0, min(box[3], gt[3]) - max(box[1], gt[1]))
    inter = iw * ih
    union = (box[2] - box[0]) * (box[3] - box[1] + eps) + (gt[2] - gt[0]) * (gt[3] - gt[1] + eps) - inter + eps
    return inter / union


# ----------------------------------------------------------------------------------------------
# LOST and DSM


@pytest.mark.parametrize("grid", [(6, 9), (8, 5), (7, 7)])
def test_lost_equals_a_plain_reimplementation_on_any_grid(grid):
    rows, cols = grid
    rng = np.random.default_rng(rows * cols)
    for trial in range(3):
        keys = planted_keys(1, [], channels=12, noise=0.0, seed=trial)  # background mean only
        keys = np.repeat(keys, rows * cols, axis=0) * 0.3 + rng.standard_normal((rows * cols, 12))
        for k in (100, 7):
            for ties in ("argsort", "lowest-index"):
                got = lost(keys, grid, k, ties)
                assert np.array_equal(got.mask, plain_lost(keys, rows, cols, k, ties)), (grid, trial, k, ties)
    # a planted object (its mean against the background's) is what LOST finds: fewer positive links
    want = np.zeros((rows, cols), bool)
    want[1:4, 2:5] = True
    background, thing = np.eye(12)[0], -0.5 * np.eye(12)[0] + np.eye(12)[1]
    keys = np.where(want.reshape(-1, 1), thing, background) + 0.02 * rng.standard_normal((rows * cols, 12))
    mask = decode_image(keys, Settings.from_preset("lost"), grid=grid).masks[0].reshape(rows, cols)
    assert np.array_equal(mask, want)


def test_lost_degree_ties_break_at_the_lowest_index_and_a_lost_seed_is_flagged():
    keys = np.ones((6, 2))
    keys[4] = [-1.0, -1.0]  # degree 0: the seed
    keys[5] = [-1.0, -1.0]  # degree 1 as well as patch 4: the lower index wins
    r = lost(keys, (2, 3), k=100)
    assert r.seed == 4 and r.degree.tolist() == [3, 3, 3, 3, 1, 1]
    assert np.array_equal(r.mask, plain_lost(keys, 2, 3)) and r.mask.tolist() == [False, False, False, False, True, True]
    # M_s > 0 whenever k_s ≠ 0 (S holds s and only patches with A_sp > 0); a zero key as the seed
    # empties S: LOST raises, probe flags the image with an empty mask
    keys = np.ones((4, 2))
    keys[2] = 0.0
    r = lost(keys, (2, 2), k=100)
    assert r.seed == 2 and r.flagged and not r.mask.any()
    assert not plain_lost(keys, 2, 2).any()


@pytest.mark.parametrize("grid", [(6, 10), (9, 7)])
def test_dsm_equals_arpack_shift_invert_as_published(grid):
    rows, cols = grid
    for seed in range(3):
        rng = np.random.default_rng(seed)
        keys = rng.standard_normal((rows * cols, 10)) + 0.5
        got = dsm(keys, grid)
        assert not got.flagged
        assert np.array_equal(got.mask, plain_dsm(keys, rows, cols)), (grid, seed)
    # the preset keeps the planted object (minority side of the Fiedler vector)
    keys = planted_keys(12, [(2, 6, 3, 9)], channels=16, noise=0.02, seed=1)
    mask = decode_image(keys, Settings.from_preset("dsm")).masks[0].reshape(12, 12)
    assert mask.sum() == 24 and mask[2:6, 3:9].all()


def test_dsm_colour_term_is_symmetric_and_changes_the_graph_only_when_weighted():
    rng = np.random.default_rng(0)
    image = rng.random((5, 6, 3))
    w = knn_color_affinity(image)
    assert (abs(w - w.T)).max() == 0 and w.shape == (30, 30)
    # DSM's knn_affinity by brute force: each (k, weight) links every pixel to its k nearest
    # (itself included) in (r, g, b, weight·x, weight·y), both ways, duplicates summed
    h, wd = 5, 6
    plain = np.zeros((30, 30))
    for k, weight in ((20, 2.0), (10, 0.1)):
        feats = [[*image[i // wd, i % wd], weight * (i % wd) / (wd - 1), weight * (i // wd) / (h - 1)] for i in range(30)]
        for i in range(30):
            dist = [sum((a - b) ** 2 for a, b in zip(feats[i], feats[j])) for j in range(30)]
            for j in sorted(range(30), key=lambda j: dist[j])[:k]:
                plain[i, j] += 1
                plain[j, i] += 1
    np.testing.assert_array_equal(w.toarray(), plain)
    keys = rng.standard_normal((30, 8))
    plain = dsm(keys, (5, 6))
    same = dsm(keys, (5, 6), color=w.toarray(), color_lambda=0.0)
    assert np.array_equal(plain.mask, same.mask)
    assert not np.allclose(dsm(keys, (5, 6), color=w.toarray(), color_lambda=10.0).fiedler, plain.fiedler)


def test_sweep_grid_covers_lost_and_dsm_once_per_centring():
    grid = load_grid(None)
    rules = [s.rule for s in grid]
    assert rules.count("lost") == 2 and rules.count("dsm") == 2 and len(grid) == 148
    with pytest.raises(Exception, match="one object"):
        Settings.from_preset("lost", masks=2)


# ----------------------------------------------------------------------------------------------
# saliency metrics


def plain_metrics(preds, gts):
    """TokenCut's metric.py written as loops: maxFβ over 255 thresholds averaged over images first."""
    fs = np.zeros((len(preds), 255))
    for i, (p, g) in enumerate(zip(preds, gts)):
        for t in range(255):
            b = p > t / 255
            tp = np.sum(b & g)
            prec = tp / b.sum() if b.sum() else 1.0
            rec = tp / g.sum() if g.sum() else 1.0
            fs[i, t] = 0.0 if 0.3 * prec + rec == 0 else 1.3 * prec * rec / (0.3 * prec + rec)
    ious = [np.sum((p > 0.5) & g) / np.sum((p > 0.5) | g) for p, g in zip(preds, gts)]
    accs = [np.mean((p > 0.5) == g) for p, g in zip(preds, gts)]
    maes = []
    for p, g in zip(preds, gts):
        q = np.round(p * 255) / 255
        if q.max() != q.min():
            q = (q - q.min()) / (q.max() - q.min())
        maes.append(np.mean(np.abs(q - g)))
    return fs.mean(axis=0).max(), np.mean(ious), np.mean(accs), np.mean(maes)


def test_saliency_scores_equal_tokencuts_definitions():
    rng = np.random.default_rng(0)
    gts = [np.zeros((12, 17), bool) for _ in range(3)]
    gts[0][2:8, 3:9] = True
    gts[1][5:, :6] = True
    gts[2][1:4, 10:16] = True
    preds = [np.clip(g * 0.7 + rng.random(g.shape) * 0.5, 0, 1) for g in gts]
    preds[2] = (rng.random(gts[2].shape) > 0.8).astype(float)  # a binary prediction
    got = sal.evaluate(zip(preds, gts), [1, 2, 3])
    f, iou, acc, mae = plain_metrics(preds, gts)
    assert got.max_f == pytest.approx(f, abs=1e-12) and got.iou == pytest.approx(iou) and got.accuracy == pytest.approx(acc)
    assert got.mae == pytest.approx(mae)
    perfect = sal.evaluate(((g.astype(float), g) for g in gts), [1, 2, 3])
    assert perfect.max_f == pytest.approx(1.0) and perfect.iou == 1.0 and perfect.mae == 0.0 and perfect.s_measure == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------------------------
# panels: VOC, COCO20k, saliency


def voc_xml(width: int, height: int, objects) -> str:
    body = "".join(
        f"<object><name>{n}</name><truncated>{t}</truncated><difficult>{d}</difficult>"
        f"<bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
        for n, (x1, y1, x2, y2), t, d in objects
    )
    return f"<annotation><filename>x.jpg</filename><size><width>{width}</width><height>{height}</height><depth>3</depth></size>{body}</annotation>"


def write_voc(root, scenes: dict[str, tuple[int, int, list]]) -> None:
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    (root / "ImageSets" / "Main").mkdir(parents=True)
    for name, (w, h, objects) in scenes.items():
        Image.fromarray(np.full((h, w, 3), 80, np.uint8)).save(root / "JPEGImages" / f"{name}.jpg")
        (root / "Annotations" / f"{name}.xml").write_text(voc_xml(w, h, objects))
    (root / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(scenes) + "\n")


def test_voc_panel_reads_boxes_as_lost_does_and_no_hard_drops_hard_images(tmp_path):
    root = tmp_path / "VOC2007"
    write_voc(
        root,
        {
            "000001": (64, 48, [("dog", (1, 1, 32, 24), 0, 0), ("cat", (10, 5, 64, 48), 1, 0)]),
            "000002": (48, 64, [("car", (5, 6, 20, 30), 0, 1)]),  # only a difficult object
        },
    )
    cache_dir = tmp_path / "cache"
    for name, extra in (("voc07", []), ("voc07easy", ["--no-hard"])):
        result = runner.invoke(app, ["panel", "add", name, "--voc", str(root), "--split", "trainval", "--role", "val", "--cache", str(cache_dir), *extra])
        assert result.exit_code == 0, result.output
    notes = sorted((root / "Annotations").iterdir())
    with guard.forbid_label_reads(notes) as opened:
        full = panels.read_labels("voc07", purpose="test", cache=cache_dir)
        easy = panels.read_labels("voc07easy", purpose="test", cache=cache_dir)
    assert len(opened) == 4 and len(ledger.entries(cache_dir)) == 2
    boxes = {(a["image_id"], tuple(a["bbox"])) for a in full.coco.dataset["annotations"]}
    assert boxes == {(1, (0, 0, 32, 24)), (1, (9, 4, 55, 44)), (2, (4, 5, 16, 25))}  # [xmin − 1, ymin − 1, xmax, ymax] as x, y, w, h
    assert [im["file_name"] for im in easy.coco.dataset["images"]] == ["000001.jpg"]
    assert [a["bbox"] for a in easy.coco.dataset["annotations"]] == [[0, 0, 32, 24]]


def test_voc_bad_folders_and_files_exit_2_with_one_line(tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    bare = tmp_path / "notvoc"
    (bare / "JPEGImages").mkdir(parents=True)
    code, err = _main(["panel", "add", "v", "--voc", str(bare), "--role", "val", "--cache", str(cache_dir)], capsys)
    assert code == 2 and "Annotations/" in err and len(err.strip().splitlines()) == 1
    assert not (cache_dir / "panels.toml").exists()
    root = tmp_path / "VOC2012"
    write_voc(root, {"a": (32, 32, [("dog", (1, 1, 8, 8), 0, 0)])})
    add = ["panel", "add", "v", "--voc", str(root), "--role", "val", "--cache", str(cache_dir)]
    # issue 46: each file's schema is checked when the panel is added: one line naming it, exit 2, nothing registered
    for text, problem in (('<?xml version="1.0"?><svg><size/></svg>', "not a VOC annotation"), ("<annotation><size><width>x</width>", "is not XML")):
        (root / "Annotations" / "a.xml").write_text(text)
        code, err = _main(add, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "a.xml" in err and problem in err, err
        assert not (cache_dir / "panels.toml").exists() and not (cache_dir / "ledger.jsonl").exists()
    # a file damaged after the panel was added is refused when its labels are read
    write_voc(tmp_path / "VOCgood", {"a": (32, 32, [("dog", (1, 1, 8, 8), 0, 0)])})
    (root / "Annotations" / "a.xml").write_bytes((tmp_path / "VOCgood" / "Annotations" / "a.xml").read_bytes())
    assert _main(add, capsys)[0] == 0
    (root / "Annotations" / "a.xml").write_text("<annotation><size><width>x</width>")
    # through the CLI: one line naming the file, exit 2, no scores and no ledger line
    store = make_store(tmp_path / "store.zarr", [Scene("a.jpg", 32, 32, [(2, 9, 2, 9)])], lost_keys(GRID, [(2, 9, 2, 9)])[None])
    code, err = _main(["decode", str(store), "--preset", "lost", "--panel", "v", "--cache", str(cache_dir), "-q", "--json", str(tmp_path / "s.json")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "a.xml" in err and "is not XML" in err
    assert not (tmp_path / "s.json").exists() and not (store / "results" / "scores_v").exists()
    assert not (cache_dir / "ledger.jsonl").exists()  # a refused file leaves no ledger line


def test_coco20k_panel_keeps_the_listed_images_and_drops_crowds(tmp_path):
    ids = coco20k_ids()
    assert len(ids) == COCO20K_SIZE == len(set(ids)) and ids[0] == 560992
    images = tmp_path / "train2014"
    images.mkdir()
    listed, other = ids[:2], 999999999
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for n, i in enumerate(listed + [other]):
        name = f"COCO_train2014_{i:012d}.jpg"
        Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(images / name)
        coco["images"].append({"id": i, "file_name": name, "height": 20, "width": 30})
        coco["annotations"].append({"id": 10 + n, "image_id": i, "category_id": 1, "bbox": [1, 2, 5, 6], "area": 30, "iscrowd": 0})
        coco["annotations"].append({"id": 20 + n, "image_id": i, "category_id": 1, "bbox": [0, 0, 9, 9], "area": 81, "iscrowd": 1})
    path = tmp_path / "instances_train2014.json"
    path.write_text(json.dumps(coco))
    result = runner.invoke(
        app, ["panel", "add", "c20k", "--coco20k", "--annotations", str(path), "--images", str(images), "--role", "val", "--cache", str(tmp_path / "c")]
    )
    assert result.exit_code == 0, result.output
    labels = panels.read_labels("c20k", purpose="test", cache=tmp_path / "c")
    assert sorted(labels.coco.getImgIds()) == sorted(listed)
    assert sorted(a["id"] for a in labels.coco.dataset["annotations"]) == [10, 11]
    assert labels.coco.dataset["coco20k_found"] == 2


def saliency_setup(tmp_path, masks_of):
    """Four scenes whose keys plant one object; photos and masks (the exact object, by default)."""
    scenes = [
        Scene("a.png", 64, 96, [(3, 9, 4, 12)]),
        Scene("b.png", 80, 80, [(2, 7, 2, 7)]),
        Scene("c.png", 96, 48, [(5, 12, 6, 10)]),
        Scene("d.png", 48, 96, [(6, 11, 3, 13)]),
    ]
    keys = np.stack([planted_keys(GRID, s.objects, channels=24, noise=0.01, seed=i) for i, s in enumerate(scenes)])
    store = make_store(tmp_path / "store.zarr", scenes, keys)
    (tmp_path / "img").mkdir()
    (tmp_path / "gt").mkdir()
    truth = {}
    for s in scenes:
        r0, r1, c0, c1 = s.objects[0]
        m = np.zeros((s.height, s.width), np.uint8)
        ph, pw = s.height // GRID, s.width // GRID
        m[r0 * ph : r1 * ph, c0 * pw : c1 * pw] = 255
        photo = np.full((s.height, s.width, 3), 90, np.uint8)
        photo[m > 0] = (220, 80, 40)
        Image.fromarray(photo).save(tmp_path / "img" / s.name)
        m = masks_of(s, m)
        truth[s.name] = m
        Image.fromarray(m).save(tmp_path / "gt" / s.name)
    root = tmp_path / "cache"
    result = runner.invoke(app, ["panel", "add", "ecssd", "--images", str(tmp_path / "img"), "--masks", str(tmp_path / "gt"), "--role", "val", "--cache", str(root)])
    assert result.exit_code == 0, result.output
    return store, root, truth


def test_saliency_panel_scores_the_decoded_masks(tmp_path):
    def shifted(scene, m):  # the mask moved by 3 pixels: no longer perfect, but known
        return np.roll(m, 3, axis=1)

    store, root, truth = saliency_setup(tmp_path, shifted)
    masks = sorted((tmp_path / "gt").iterdir())
    with guard.forbid_label_reads(masks) as opened:
        result = runner.invoke(app, ["decode", str(store), "--preset", "tokencut", "--panel", "ecssd", "--cache", str(root), "-q", "--json", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert len(opened) == 4 and len(ledger.entries(root)) == 1
    summary = json.loads((tmp_path / "s.json").read_text())["scores"]
    # the decoder finds each planted object exactly, so the reference scores the unshifted masks
    preds = []
    for name in ("a.png", "b.png", "c.png", "d.png"):
        preds.append(np.roll(truth[name], -3, axis=1) > 0)
    f, iou, acc, mae = plain_metrics([p.astype(float) for p in preds], [truth[n] > 0 for n in ("a.png", "b.png", "c.png", "d.png")])
    assert summary["max_f"] == pytest.approx(f) and summary["iou"] == pytest.approx(iou) and summary["accuracy"] == pytest.approx(acc)
    assert summary["mae"] == pytest.approx(mae) and 0 < summary["iou"] < 1
    saved = records.load(store, "saliency_ecssd")
    assert float(saved["iou"]) == pytest.approx(iou) and saved.attrs["ledger_entry"] == ledger.entries(root)[0].id
    # scoring the written masks again gives the same numbers, through a second ledger entry
    again = runner.invoke(
        app, ["score", str(records.results_path(store, "decoder-masks.json")), "--panel", "ecssd", "--cache", str(root), "--json", str(tmp_path / "sc.json")]
    )
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "sc.json").read_text())["scores"]["max_f"] == pytest.approx(f) and len(ledger.entries(root)) == 2


def test_a_mask_of_another_size_or_with_broken_runs_is_refused_before_the_labels(tmp_path, capsys):
    """A result whose RLE is not its image's size, or whose runs do not fill that size, was scored as
    some other mask (a mean best IoU of -0.76 %); now one line, before any label read."""
    from pycocotools import mask as mask_utils

    from probe_toolkit.labels.schema import result_mask_problems

    store, root, _ = saliency_setup(tmp_path, lambda scene, m: m)
    code, err = _main(["decode", str(store), "--preset", "tokencut", "--panel", "ecssd", "--cache", str(root), "-q"], capsys)
    assert code == 0, err
    written = json.loads(records.results_path(store, "decoder-masks.json").read_text())
    entries = len(ledger.entries(root))
    b = next(n for n, r in enumerate(written) if r["file_name"] == "b.png")  # an 80×80 photograph
    for change, needle in (
        ({"size": [80, 81]}, "its RLE mask is [80, 81] (height, width), its image 80×80"),
        ({"size": [10**6, 10**6]}, "its image 80×80"),
        ({"counts": "zzzz"}, "do not describe a 80×80 mask"),
        ({"counts": ""}, "do not describe a 80×80 mask"),
        ({"counts": [6400]}, "an uncompressed RLE"),
    ):
        damaged = [dict(r) for r in written]
        damaged[b] = dict(damaged[b], segmentation={**damaged[b]["segmentation"], **change})
        (tmp_path / "damaged.json").write_text(json.dumps(damaged))
        code, err = _main(["score", str(tmp_path / "damaged.json"), "--panel", "ecssd", "--cache", str(root)], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"result [{b}]" in err and needle in err, (change, err)
        assert len(ledger.entries(root)) == entries  # refused before the labels were read
    # the check behind it (a mask whose image file is not found by its name), on pycocotools' own encoding
    mask = np.zeros((6, 5), np.uint8, order="F")
    mask[1:4, 2:5] = 1
    rle = {"size": [6, 5], "counts": mask_utils.encode(mask)["counts"].decode()}
    assert result_mask_problems("r", rle, 6, 5) == []
    assert "its image 5×6" in result_mask_problems("r", rle, 5, 6)[0]
    assert "do not describe" in result_mask_problems("r", dict(rle, counts=rle["counts"] + "1"), 6, 5)[0]


def test_grey_mask_pixels_are_foreground_as_tokencut_scores_them(tmp_path):
    """DUTS-TE's masks have anti-aliased grey edges; TokenCut's metric.py counts every grey above 0
    as object (the 8-bit mask compared to 0.5). Scored so, and the grey pixels counted."""

    def feathered(scene, m):
        m = m.copy()
        edge = np.zeros_like(m, dtype=bool)
        edge[:, 1:] |= (m[:, 1:] == 0) & (m[:, :-1] == 255)  # the column right of the object
        m[edge] = 128 if scene.name != "c.png" else 1
        return m

    store, root, truth = saliency_setup(tmp_path, feathered)
    result = runner.invoke(app, ["decode", str(store), "--preset", "tokencut", "--panel", "ecssd", "--cache", str(root), "-q", "--json", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "s.json").read_text())["scores"]
    names = ("a.png", "b.png", "c.png", "d.png")
    preds = [(truth[n] == 255).astype(float) for n in names]  # the decoder finds the planted object exactly
    f, iou, acc, _ = plain_metrics(preds, [truth[n] > 0 for n in names])
    assert summary["max_f"] == pytest.approx(f) and summary["iou"] == pytest.approx(iou) and summary["accuracy"] == pytest.approx(acc)
    assert summary["iou"] < 1  # the grey column is object, which the prediction misses
    grey = sum(int(((truth[n] > 0) & (truth[n] < 255)).sum()) for n in names)
    assert grey > 0 and records.load(store, "saliency_ecssd").attrs["grey_ground_truth"] == {"masks": 4, "pixels": grey}


def test_saliency_mask_of_another_size_exits_2(tmp_path, capsys):
    store, root, truth = saliency_setup(tmp_path, lambda scene, m: m)
    Image.fromarray(truth["b.png"][:-2]).save(tmp_path / "gt" / "b.png")  # 80×78 for an 80×80 photograph
    # issue 46: refused when the panel is added: one line naming the mask, exit 2, nothing registered
    add = ["panel", "add", "ecssd2", "--images", str(tmp_path / "img"), "--masks", str(tmp_path / "gt"), "--role", "val", "--cache", str(root)]
    code, err = _main(add, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "b.png" in err and "80×78" in err, err
    assert "ecssd2" not in (root / "panels.toml").read_text() and not (root / "ledger.jsonl").exists()
    # a mask changed after its panel was added is refused when the labels are read
    code, err = _main(["decode", str(store), "--panel", "ecssd", "--cache", str(root), "-q", "--json", str(tmp_path / "s.json")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "b.png" in err
    assert "80×78" in err
    assert not (tmp_path / "s.json").exists() and not (root / "ledger.jsonl").exists()
    assert "saliency_ecssd" not in str(list((store / "results").iterdir()) if (store / "results").exists() else [])


def voc_store(tmp_path, second_box):
    """Two images with one planted object each, their store, and a VOC07 panel ``voc07``: image 1's box
    is its object exactly (1-based, inclusive), image 2's box is ``second_box``."""
    scenes = [Scene("000001.jpg", 64, 96, [(3, 9, 4, 12)]), Scene("000002.jpg", 80, 80, [(2, 7, 2, 7)])]
    keys = np.stack([lost_keys(GRID, s.objects, seed=i) for i, s in enumerate(scenes)])
    store = make_store(tmp_path / "store.zarr", scenes, keys)
    write_voc(tmp_path / "VOC2007", {"000001": (96, 64, [("dog", (25, 13, 72, 36), 0, 0)]), "000002": (80, 80, [("cat", second_box, 0, 0)])})
    root = tmp_path / "cache"
    assert runner.invoke(app, ["panel", "add", "voc07", "--voc", str(tmp_path / "VOC2007"), "--role", "val", "--cache", str(root)]).exit_code == 0
    return store, root


def test_lost_on_a_voc_panel_gives_corloc_by_lost_iou(tmp_path):
    """``probe decode --preset lost --panel voc`` against CorLoc counted here by hand."""
    store, root = voc_store(tmp_path, (60, 60, 80, 80))  # image 2's box lies far off its object
    result = runner.invoke(
        app,
        ["decode", str(store), "--preset", "lost", "--panel", "voc07", "--cache", str(root), "-q", "--out", str(tmp_path / "m.json"), "--json", str(tmp_path / "s.json")],
    )
    assert result.exit_code == 0, result.output

    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON")

    summary = json.loads((tmp_path / "s.json").read_text(), parse_constant=refuse)  # strict JSON
    res = {r["file_name"]: r for r in json.loads((tmp_path / "m.json").read_text(), parse_constant=refuse)}
    hits = []
    for name, gt in (("000001.jpg", (24, 12, 72, 36)), ("000002.jpg", (59, 59, 80, 80))):
        hits.append(plain_iou(res[name]["patch_box"], gt) >= 0.5)
    assert hits == [True, False]
    assert summary["scores"]["corloc"] == 0.5 and summary["settings"]["rule"] == "lost"
    assert summary["scores"]["segm_AP"] is None and summary["scores"]["mean_best_iou"] is None  # undefined: VOC has no outlines
    segm = next(line for line in result.output.splitlines() if "segm" in line)
    assert segm.count("–") == 6 and "nan" not in result.output and "mean best IoU –" in result.output


# ----------------------------------------------------------------------------------------------
# TokenCut's bilateral solver


def plain_bilateral_system(image, target, s):
    """The solver's linear system built with dicts and dense matrices, pixel by pixel."""
    h, w = target.shape
    vertex_of, vertices = [], {}
    for y in range(h):
        for x in range(w):
            r, g, b = (float(v) for v in image[y, x])
            yy = 0.299 * r + 0.587 * g + 0.114 * b
            u = -0.168736 * r - 0.331264 * g + 0.5 * b + 128
            v = 0.5 * r - 0.418688 * g - 0.081312 * b + 128
            key = (int(x / s.sigma_spatial), int(y / s.sigma_spatial), int(yy / s.sigma_luma), int(u / s.sigma_chroma), int(v / s.sigma_chroma))
            vertex_of.append(vertices.setdefault(key, len(vertices)))
    nv = len(vertices)
    S = np.zeros((nv, h * w))
    for p, v in enumerate(vertex_of):
        S[v, p] = 1
    B = 10 * np.eye(nv)
    for key, i in vertices.items():
        for d in range(5):
            for step in (-1, 1):
                other = list(key)
                other[d] += step
                if tuple(other) in vertices:
                    B[i, vertices[tuple(other)]] += 1
    m = S.sum(axis=1)
    n = np.ones(nv)
    for _ in range(10):
        n = np.sqrt(n * m / (B @ n))
    m = n * (B @ n)
    c = np.full(h * w, s.confidence)
    A = s.lam * (np.diag(m) - np.diag(n) @ B @ np.diag(n)) + np.diag(S @ c)
    rhs = S @ (c * target.ravel())
    return S, A, rhs


def test_bilateral_solver_solves_tokencuts_system():
    from dataclasses import replace

    import scipy.sparse.linalg as spla

    from probe_toolkit.analyses.bilateral import BilateralSettings, refine

    rng = np.random.default_rng(0)
    image = np.zeros((14, 18, 3))
    image[:, 9:] = [200, 40, 40]
    image += rng.integers(0, 30, image.shape)
    target = np.zeros((14, 18))
    target[3:12, 8:16] = 1.0
    s = BilateralSettings(sigma_spatial=4, sigma_luma=16, sigma_chroma=8)
    S, A, rhs = plain_bilateral_system(image, target, s)
    exact = S.T @ np.linalg.solve(A, rhs)
    converged = refine(image, target, replace(s, cg_maxiter=2000, cg_tol=1e-13))
    np.testing.assert_allclose(converged.ravel(), exact, atol=1e-8)
    # at TokenCut's 25 iterations: scipy's Jacobi-preconditioned cg on the same system, same start
    x0 = rhs / (S @ np.full(S.shape[1], s.confidence))
    M = np.diag(1 / np.maximum(np.diag(A), 1e-5))
    try:
        y, _ = spla.cg(A, rhs, x0=x0, M=M, maxiter=25, rtol=1e-5)
    except TypeError:  # scipy < 1.12 names it tol
        y, _ = spla.cg(A, rhs, x0=x0, M=M, maxiter=25, tol=1e-5)
    np.testing.assert_allclose(refine(image, target, s).ravel(), S.T @ y, atol=1e-7)
    # the refined mask follows the colour edge at column 9 better than the blocky target
    soft = refine(image, target, BilateralSettings(sigma_spatial=4))
    assert soft[5, 10] > 0.5 and soft[5, 2] < 0.5


def test_refine_bilateral_scores_the_soft_output_on_a_saliency_panel(tmp_path, capsys):
    store, root, truth = saliency_setup(tmp_path, lambda scene, m: m)
    result = runner.invoke(
        app, ["decode", str(store), "--preset", "tokencut", "--panel", "ecssd", "--refine", "bilateral", "--cache", str(root), "-q", "--json", str(tmp_path / "s.json")]
    )
    assert result.exit_code == 0, result.output
    saved = records.load(store, "saliency_ecssd")
    assert saved.attrs["refine"] == "bilateral"
    # the object has its own colour, so the solver keeps it (lower IoU would mean it bled or shrank)
    assert 0.9 < float(saved["iou"]) <= 1.0 and float(saved["mae"]) < 0.05
    code, err = _main(["decode", str(store), "--refine", "bilateral", "--cache", str(root), "-q"], capsys)
    assert code == 2 and "--panel" in err


def test_each_preset_says_its_published_view_and_maskcut_warns_on_a_bicubic_store(tmp_path, capsys):
    scenes = [Scene("a.png", 64, 64, [(3, 9, 4, 12)]), Scene("b.png", 64, 64, [(2, 7, 2, 7)])]
    keys = np.stack([planted_keys(GRID, s.objects, channels=24, noise=0.01, seed=i) for i, s in enumerate(scenes)])
    store = make_store(tmp_path / "store.zarr", scenes, keys)
    for preset, view in (("maskcut", "480 lanczos"), ("lost", "native"), ("dsm", "native_crop")):
        code, err = _main(["decode", str(store), "--preset", preset, "--cache", str(tmp_path / "c"), "-q", "--json", str(tmp_path / "s.json")], capsys)
        summary = json.loads((tmp_path / "s.json").read_text())
        assert code == 0 and summary["published_view"] == view and len(summary["warnings"]) == 1
        assert ("LANCZOS" in err and "--resample lanczos" in err) if preset == "maskcut" else f"({view} view)" in err


def test_sweep_on_a_voc_panel_covers_lost_and_dsm_and_refuses_an_undefined_metric(tmp_path, capsys):
    store, root = voc_store(tmp_path, (13, 11, 35, 35))  # both boxes are the planted objects
    grid = tmp_path / "grid.toml"
    grid.write_text('preset = ["tokencut", "lost", "dsm"]\ncenter = [false]\ntau = [0.2, 0.5]\n')
    code, err = run_main(["decode-sweep", str(store), "--panel", "voc07", "--grid", str(grid), "--cache", str(root), "-q"], capsys)
    assert code == 2 and "--metric segm_AP" in err and "corloc" in err and not (root / "decoder-settings.json").exists()
    code, _ = run_main(
        ["decode-sweep", str(store), "--panel", "voc07", "--grid", str(grid), "--metric", "corloc", "--cache", str(root), "-q", "--json", str(tmp_path / "t.json")],
        capsys,
    )
    table = json.loads((tmp_path / "t.json").read_text())["table"]
    assert code == 0 and [r["rule"] for r in table] == ["tokencut", "tokencut", "lost", "dsm"]
    assert next(r for r in table if r["rule"] == "lost")["corloc"] == 1.0  # both planted boxes found
    saved = records.load(store, "sweep_voc07")
    assert saved.sizes["setting"] == 4


def test_dsm_colour_term_reads_the_stores_photographs(tmp_path, capsys):
    scenes = [Scene("a.png", 64, 64, [(3, 9, 4, 12)]), Scene("b.png", 48, 80, [(2, 7, 2, 7)])]
    store, photos, keys = photo_store(tmp_path, scenes, GRID)
    code, err = run_main(["decode", str(store), "--preset", "dsm", "--color-lambda", "10", "--cache", str(tmp_path / "c"), "--workers", "1", "-q"], capsys)
    assert code == 0, err
    saved = records.load(store, "decoder")
    for i, s in enumerate(scenes):
        small = np.asarray(Image.fromarray(photos[s.name]).resize((GRID, GRID), Image.BILINEAR), dtype=np.float64) / 255
        want = dsm(keys[i], (GRID, GRID), color=knn_color_affinity(small), color_lambda=10.0).mask
        assert np.array_equal(saved["masks"].values[i, 0], want)
    assert not np.array_equal(saved["masks"].values[0, 0], dsm(keys[0], (GRID, GRID)).mask)
    code, err = run_main(["decode", str(store), "--preset", "lost", "--color-lambda", "1", "--cache", str(tmp_path / "c"), "-q"], capsys)
    assert code == 2 and "--color-lambda" in err


def test_maskcut_reads_the_filter_from_the_480_views_manifest_entry():
    """A LANCZOS 480 view (the store's per-view entry) is MaskCut's own: no warning; bicubic warns."""
    from probe_toolkit.commands.decode_views import view_check

    lanczos = {"views": ["480"], "per_view": {"480": {"resample": "lanczos"}}}
    bicubic = {"views": ["480"], "per_view": {"480": {"resample": "bicubic"}}}
    old = {"views": [480]}  # written before views had their own entry: bicubic
    assert view_check("maskcut", 480, lanczos)["warnings"] == []
    assert len(view_check("maskcut", 480, bicubic)["warnings"]) == 1
    assert len(view_check("maskcut", 480, old)["warnings"]) == 1
    assert view_check("tokencut", "native", lanczos)["warnings"] == []
    assert view_check("dsm", "native_crop", lanczos)["warnings"] == []  # DSM's own view: cut to whole patches
    assert "(native_crop view); these are the native view's keys" in view_check("dsm", "native", lanczos)["warnings"][0]
    assert "(native view); these are the native_crop view's keys" in view_check("lost", "native_crop", lanczos)["warnings"][0]
