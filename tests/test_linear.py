"""Linear probes: labels through the 224 view's geometry, metrics, the fits, and the ledgered pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import synthetic_scene
from PIL import Image
from pycocotools import mask as coco_mask

import probe_toolkit as probe
from probe_toolkit.analyses import linear
from probe_toolkit.commands import linear as probing
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import ledger
from probe_toolkit.labels.panels import add_panel
from probe_toolkit.protocols.linear import LinearSettings
from probe_toolkit.results import records
from probe_toolkit.store import cache, images
from probe_toolkit.store.create import create_store

# ----------------------------------------------------------------------------------------------
# geometry and labels


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (451, 300), (224, 224), (500, 200), (100, 150)])
def test_view_labels_follow_pils_resize_and_crop(size):
    """Carrying a label map into the view equals PIL's nearest resize + the view's crop (independent path)."""
    w, h = size
    g = images.geometry(w, h, 224)
    photo = Image.new("RGB", size)
    assert images.view(photo, 224).size == (224, 224) and g.box[2] - g.box[0] == 224
    lab = np.arange(w * h, dtype=np.int32).reshape(h, w)
    pil = np.asarray(Image.fromarray(lab, mode="I").resize(g.resized, Image.Resampling.NEAREST).crop(g.box))
    mine = linear.view_labels(lab, g)
    xs, ys = g.source_centres()
    # they may differ only where a view pixel's centre falls exactly on a pixel edge (PIL rounds in float32)
    exact_edge = (xs == np.round(xs))[None, :] | (ys == np.round(ys))[:, None]
    assert np.all((pil == mine) | exact_edge)


def test_the_course_photo_geometry():
    """A 640×480 photo: 298×224, crop from 37 px; its original pixels 79..560 fall inside the view."""
    g = images.geometry(640, 480, 224)
    assert g.resized == (298, 224) and g.box == (37, 0, 261, 224)
    x0, y0, x1, y1 = g.source_region()
    centres = (np.arange(640) + 0.5) * 298 / 640  # brute force: which centres land in [37, 261)
    inside = np.flatnonzero((centres >= 37) & (centres < 261))
    assert (x0, x1) == (inside[0], inside[-1] + 1) == (79, 561) and (y0, y1) == (0, 480)


def test_patch_majority_rule():
    view = np.zeros((224, 224), dtype=np.int16)
    view[0:16, 16:32] = 2  # patch 1: all class 2
    view[0:16, 32:40] = 1  # patch 2: half 1, half 0 → tie → the lower class (0)
    view[0:16, 48:54] = 1  # patch 3: 6/16 class 1, 4/16 class 2, 6/16 class 0 → nobody ≥ 50 % → ignore
    view[0:16, 54:58] = 2
    view[0:16, 64:80] = linear.IGNORE  # patch 4: crowd → ignore
    view[0:16, 80:96] = linear.IGNORE
    view[0:9, 80:96] = 3  # patch 5: 9/16 class 3 (the rest crowd) → class 3
    labels = linear.patch_labels(view, 4)
    assert labels.shape == (196,)
    assert list(labels[:7]) == [0, 2, 0, linear.IGNORE, linear.IGNORE, 3, 0]
    assert (labels[7:] == 0).all()


def test_metrics_against_sklearn():
    from sklearn.metrics import confusion_matrix, jaccard_score

    rng = np.random.default_rng(0)
    target = rng.integers(-1, 4, 500)
    pred = rng.integers(0, 5, 500)  # class 4 never in target: predicted → IoU 0, counted
    keep = target != -1
    conf = linear.confusion(target, pred, 5)
    assert np.array_equal(conf, confusion_matrix(target[keep], pred[keep], labels=range(5)))
    iou = linear.iou(conf)
    assert np.allclose(iou, jaccard_score(target[keep], pred[keep], labels=range(5), average=None, zero_division=0))
    assert linear.accuracy(conf) == pytest.approx((target[keep] == pred[keep]).mean())
    empty = linear.confusion(np.array([0, 0, 1]), np.array([0, 0, 1]), 3)
    assert np.isnan(linear.iou(empty)[2]) and linear.mean_iou(empty) == 1.0


def test_average_precision_by_hand():
    targets = np.array([[1, 0], [0, 0], [1, 0], [0, 0]], dtype=bool)
    scores = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.3], [0.1, 0.4]])
    ap = linear.average_precision(targets, scores)
    # ranked 0.9 (hit), 0.8 (miss), 0.3 (hit): precision at the hits 1 and 2/3
    assert ap[0] == pytest.approx((1 + 2 / 3) / 2) and np.isnan(ap[1])


def test_dense_logits_are_sampled_at_each_pixels_place_in_the_view():
    """Two classes split at the view's middle column: every original pixel of the crop region is
    predicted by the side of x = 112 (view pixels) its centre falls on."""
    g = images.geometry(640, 480, 224)
    logits = np.zeros((2, 14, 14))
    logits[0, :, :7], logits[1, :, 7:] = 1.0, 1.0
    x0, y0, x1, y1 = g.source_region()
    u = (np.arange(x0, x1) + 0.5) * 298 / 640 - 37
    truth = np.broadcast_to(np.where(u < 112, 0, 1), (y1 - y0, x1 - x0))
    conf = linear.dense_confusion(logits, truth, g, 2)
    assert conf.sum() == (y1 - y0) * (x1 - x0) == 480 * 482
    assert np.trace(conf) == conf.sum()  # exact split


def test_holdout_split():
    fit, held = linear.holdout_split(10, 0.2, seed=3)
    assert len(held) == 2 and sorted([*fit, *held]) == list(range(10))
    assert np.array_equal(held, linear.holdout_split(10, 0.2, seed=3)[1])
    assert not np.array_equal(held, linear.holdout_split(10, 0.2, seed=4)[1])


# ----------------------------------------------------------------------------------------------
# the fits


def separable(labels: np.ndarray, channels: int, seed: int, noise: float = 0.3) -> np.ndarray:
    """Tokens = a class's own direction × 4 + noise, plus a shared offset (as last-block tokens have)."""
    rng = np.random.default_rng(seed)
    centres = 4.0 * np.eye(channels)[: labels.max() + 2]
    return (centres[np.maximum(labels, 0)] + rng.normal(0, noise, (*labels.shape, channels)) + 7.0).astype(np.float32)


SMALL = LinearSettings(epochs=20, weight_decays=(1e-2, 1e-4), seed=0)
FIT = {"epochs": 20, "weight_decays": (1e-2, 1e-4), "seed": 0}  # SMALL as probe.run keywords


def test_separable_tokens_reach_100_percent():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, (12, 196))
    labels[0, :5] = linear.IGNORE
    tokens = separable(labels, 16, seed=1)
    fit = linear.fit_patch_level(tokens[:8], labels[:8], 4, SMALL)
    assert fit.n_ignored_patches == 5 and fit.n_fit_patches == 8 * 196 - 5
    conf = linear.confusion(labels[8:], fit.probe.predict(tokens[8:]), 4)
    assert linear.accuracy(conf) > 0.995 and linear.mean_iou(conf) > 0.99


def test_random_tokens_give_chance():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, (40, 196))
    tokens = rng.normal(0, 1, (40, 196, 8)).astype(np.float32)
    fit = linear.fit_patch_level(tokens[:30], labels[:30], 4, SMALL)
    acc = linear.accuracy(linear.confusion(labels[30:], fit.probe.predict(tokens[30:]), 4))
    assert 0.2 < acc < 0.3  # chance is 1/4; 1,960 val patches put 2 sd at ±0.02


def test_dense_probe_is_the_l2_logistic_regression_sklearn_solves():
    """Same objective (mean CE + wd/2‖W‖² ⇔ C = 1/(wd·n)) on the same standardised features."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    n, d, k = 3000, 12, 3
    y = rng.integers(0, k, n)
    x = (rng.normal(0, 1, (n, d)) + 0.8 * np.eye(d)[y] + 2.0).astype(np.float32)
    wd = 1e-3
    fitted = linear.fit_patch_probe(x, y, k, wd, LinearSettings(epochs=150, seed=0))
    z = (x - x.mean(0)) / x.std(0)
    ref = LogisticRegression(C=1.0 / (wd * n), max_iter=2000, tol=1e-8).fit(z, y)
    assert (fitted.predict(x) == ref.predict(z)).mean() > 0.98
    w = fitted.weight - fitted.weight.mean(0)  # softmax is invariant to a shared shift of the classes
    assert np.corrcoef(w.ravel(), (ref.coef_ - ref.coef_.mean(0)).ravel())[0, 1] > 0.99


def test_image_level_separable_and_random():
    rng = np.random.default_rng(3)
    targets = rng.random((60, 3)) < 0.4
    good = (targets @ (3 * np.eye(3, 10)) + rng.normal(0, 0.3, (60, 10))).astype(np.float32)
    fit = linear.fit_image_level(good[:40], targets[:40], seed=0)
    assert np.nanmean(linear.average_precision(targets[40:], linear.image_scores(fit.model, good[40:]))) > 0.99
    noise = rng.normal(0, 1, (400, 10))
    targets = rng.random((400, 3)) < 0.3
    fit = linear.fit_image_level(noise[:200], targets[:200], seed=0)
    m = np.nanmean(linear.average_precision(targets[200:], linear.image_scores(fit.model, noise[200:])))
    assert abs(m - targets[200:].mean()) < 0.1  # chance mAP is the positive rate


# ----------------------------------------------------------------------------------------------
# panels of synthetic scenes whose answer is known, and stores built for them

CATEGORIES = [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}]  # ids not contiguous on purpose
PIXEL_BOXES: dict[str, list[tuple[int, int, int, int, int]]] = {}  # "panel/file" → the squares in original pixels, with their class


def square_scene(folder: Path, name: str, size: tuple[int, int], squares: list[tuple[int, int, int, int, int]], seed: int):
    """Save an image and return its COCO record, annotations (polygons and RLE alternate) and the 14×14
    answer. ``squares`` are view-patch boxes (c0, r0, c1, r1, category) mapped back to original pixels
    with the view's geometry, so each covers exactly those patches."""
    w, h = size
    g = images.geometry(w, h, 224)
    sx, sy = w / g.resized[0], h / g.resized[1]
    left, top = g.box[:2]
    answer = np.zeros((14, 14), dtype=np.int16)
    boxes, anns = [], []
    for k, (c0, r0, c1, r1, cat) in enumerate(squares):
        x0, x1 = round((left + 16 * c0) * sx), round((left + 16 * c1) * sx)
        y0, y1 = round((top + 16 * r0) * sy), round((top + 16 * r1) * sy)
        boxes.append((x0, y0, x1, y1))
        answer[r0:r1, c0:c1] = 1 + [c["id"] for c in CATEGORIES].index(cat)
        PIXEL_BOXES.setdefault(f"{folder.name}/{name}", []).append((x0, y0, x1, y1, int(answer[r0, c0])))
        if k % 2 == 0:
            segmentation = [[x0, y0, x1, y0, x1, y1, x0, y1]]
        else:
            pixels = np.zeros((h, w), dtype=np.uint8, order="F")
            pixels[y0:y1, x0:x1] = 1
            segmentation = coco_mask.encode(pixels)
            segmentation["counts"] = segmentation["counts"].decode("ascii")
        anns.append({"segmentation": segmentation, "category_id": cat, "iscrowd": 0, "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    synthetic_scene(folder / name, size, boxes, seed=seed)
    return {"file_name": name, "width": w, "height": h}, anns, answer.ravel()


def write_panel(root: Path, name: str, role: str, scenes: list, cache_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    folder = root / name
    folder.mkdir()
    coco = {"images": [], "annotations": [], "categories": CATEGORIES}
    answers = {}
    for i, (file_name, size, squares) in enumerate(scenes):
        record, anns, answer = square_scene(folder, file_name, size, squares, seed=i)
        coco["images"].append(dict(record, id=100 + i))
        for ann in anns:
            coco["annotations"].append(dict(ann, image_id=100 + i, id=len(coco["annotations"]) + 1))
        answers[file_name] = answer
    path = root / f"{name}.json"
    path.write_text(json.dumps(coco))
    add_panel(name, path, folder, role, cache=cache_dir)
    return folder, answers


def scenes(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    sizes = [(448, 448), (896, 448), (448, 672), (640, 480)]
    out = []
    for i in range(n):
        squares = []
        for k, cat in enumerate([3, 7] if i % 2 else [7]):
            r, c = rng.integers(0, 4, 2) + 7 * k  # the first in rows/columns 0..6, the second in 7..13: no overlap
            squares.append((c, r, c + int(rng.integers(2, 5)), r + int(rng.integers(2, 5)), cat))
        out.append((f"img{i:02d}.png", sizes[i % len(sizes)], squares))
    return out


def make_store(
    path: Path, ids: list[str], tokens: np.ndarray, sizes: list[tuple[int, int]], *, sha: str, source: Path, class_token: bool = False, cls: np.ndarray | None = None
) -> Path:
    channels = tokens.shape[-1]
    manifest = {
        "checkpoint": {"path": f"/ckpt/{sha[:4]}.pth", "sha256": sha, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": channels, "depth": 1, "heads": 1, "patch": 16, "class_token": class_token, "final_norm": False, "mlp_hidden": 4},
        "views": [224],
        "interpolation": "dino",
        "attention": "none",
        "dtype": "float32",
        "chunk": 64,
        "image_list_sha256": "x",
        "image_source": str(source),
    }
    arrays = {"tokens_224": (("patch_224", "channel"), (196, channels))}
    data = {"tokens_224": tokens}
    if class_token:
        arrays["cls_tokens_224"] = (("channel",), (channels,))
        data["cls_tokens_224"] = cls
    writer = create_store(path, manifest, ids, arrays)
    writer.write(0, data, np.array([(h, w) for w, h in sizes]), np.zeros(len(ids), dtype=bool))
    return path


@pytest.fixture(scope="module")
def panels(tmp_path_factory):
    root = tmp_path_factory.mktemp("panels")
    cache_dir = root / "cache"
    train_folder, train_answers = write_panel(root, "tr", "train", scenes(10, seed=0), cache_dir)
    val_folder, val_answers = write_panel(root, "va", "val", scenes(6, seed=1), cache_dir)
    return {"root": root, "cache": cache_dir, "tr": train_answers, "va": val_answers, "folders": {"tr": train_folder, "va": val_folder}}


def sizes_of(folder: Path, ids: list[str]) -> list[tuple[int, int]]:
    return [Image.open(folder / i).size for i in ids]


def test_patch_labels_of_a_hand_made_coco_panel(panels):
    """The squares cover exactly the patches they were drawn on, polygons and RLE alike, at every aspect ratio."""
    from probe_toolkit.labels.panels import read_labels

    read = read_labels("tr", purpose="test", images=sorted(panels["tr"]), cache=panels["cache"])
    ids = sorted(panels["tr"])
    coco_ids = [read.image_map[i] for i in ids]
    sizes = sizes_of(panels["folders"]["tr"], ids)
    labels = probing.patch_targets(read, coco_ids, sizes, linear.LabelSpace.from_categories(CATEGORIES))
    for i, sid in enumerate(ids):
        assert np.array_equal(labels[i], panels["tr"][sid]), sid
    assert {s for s in sizes} == {(448, 448), (896, 448), (448, 672), (640, 480)}


@pytest.fixture(scope="module")
def stores(panels):
    """Two checkpoints: tokens that separate the answer's classes, and random tokens; panel stores side by side."""
    out = {}
    for kind, sha in (("good", "a" * 64), ("random", "b" * 64)):
        for panel in ("tr", "va"):
            ids = sorted(panels[panel])
            labels = np.stack([panels[panel][i] for i in ids])
            rng = np.random.default_rng(len(ids))
            tokens = separable(labels, 8, seed=len(ids)) if kind == "good" else rng.normal(0, 1, (len(ids), 196, 8)).astype(np.float32)
            cls = separable(np.stack([np.bincount(lab, minlength=3)[1:] > 0 for lab in labels]).astype(int) @ np.array([1, 2]), 8, seed=5)
            path = panels["root"] / f"stores/{kind}-{sha[:8]}/teacher-panel-{panel}.zarr"
            make_store(path, ids, tokens, sizes_of(panels["folders"][panel], ids), sha=sha, source=panels["folders"][panel], class_token=kind == "good", cls=cls)
        out[kind] = panels["root"] / f"stores/{kind}-{sha[:8]}/teacher-panel-tr.zarr"
    return out


def test_run_fits_before_reading_val_and_saves_the_documented_results(panels, stores, monkeypatch, tmp_path):
    root = panels["cache"]
    before = len(ledger.entries(root))
    seen = []
    real_fit = linear.fit_patch_level

    def watched(*args, **kwargs):  # at every fit, the ledger holds the train read and not the val read
        seen.append([e.fields["purpose"] for e in ledger.entries(root)[before:]])
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(linear, "fit_patch_level", watched)
    report = probe.run("linear", [stores["good"], stores["random"]], train="tr", val="va", **FIT, cache_dir=root, json_path=tmp_path / "out.json").report
    assert seen == [["linear-patch: fit"], ["linear-patch: fit"]]
    new = ledger.entries(root)[before:]
    assert [(e.fields["panel"], e.fields["purpose"]) for e in new] == [("tr", "linear-patch: fit"), ("va", "linear-patch: score")]
    assert report.ledger == {"train": new[0].id, "val": new[1].id}
    good, rand = report.outcomes
    assert good.scores["miou"] > 0.99 and good.scores["accuracy"] > 0.99 and good.scores["miou_dense"] > 0.8
    background = np.mean([panels["va"][i] == 0 for i in panels["va"]])
    assert rand.scores["accuracy"] <= background + 0.01 and rand.scores["miou"] < 0.5  # random tokens: no better than "all background"
    ds = records.load(stores["good"], "linear_patch")
    assert list(ds["class"].values) == ["background", "cat", "dog"] and list(ds.category_id.values) == [0, 3, 7]
    assert ds.iou.dims == ("class",) and ds.confusion.dims == ("class", "predicted") and ds.prediction.dims == ("image", "patch")
    assert ds.weight.dims == ("class", "channel") and ds.holdout_miou.dims == ("weight_decay",) and ds.prediction.shape == (6, 196)
    assert ds.attrs["ledger"]["val"] == new[1].id and ds.attrs["settings"]["seed"] == 0 and ds.attrs["label_space"]["category_ids"] == [3, 7]
    assert float(ds.miou) == pytest.approx(good.scores["miou"])
    assert ds.attrs["counts"]["val_images"] == 6 and ds.attrs["panels"]["val"] == {"name": "va", "role": "val"}
    # the dense confusion counts every original pixel of every val image's crop region
    regions = [images.geometry(*s, 224).source_region() for s in sizes_of(panels["folders"]["va"], sorted(panels["va"]))]
    assert int(ds.confusion_dense.sum()) == sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in regions)
    assert np.abs(ds.confusion_dense.values - dense_by_scipy(ds, stores["good"].parent / "teacher-panel-va.zarr", panels)).sum() <= 4
    out = json.loads((tmp_path / "out.json").read_text())
    assert [s["name"] for s in out["stores"]] == [good.name, rand.name] and out["ledger"] == report.ledger


def dense_by_scipy(ds, val_store: Path, panels) -> np.ndarray:
    """The dense confusion again, by another road: saved weights on the stored tokens, scipy's
    map_coordinates (order 1, edge values outside) at each original pixel's place on the patch
    grid, truth painted from the squares as drawn."""
    from scipy.ndimage import map_coordinates

    tokens = cache.open_store(val_store).tokens_224.values.astype(np.float64)
    logits = ((tokens - ds.channel_mean.values) / ds.channel_scale.values) @ ds.weight.values.T + ds.bias.values
    conf = np.zeros((3, 3), dtype=np.int64)
    for i, name in enumerate(ds.image.values):
        w, h = Image.open(panels["folders"]["va"] / name).size
        nw, nh = (224, int(224 * h / w)) if w <= h else (int(224 * w / h), 224)
        left, top = round((nw - 224) / 2), round((nh - 224) / 2)
        ys, xs = np.mgrid[0:h, 0:w]
        u, v = (xs + 0.5) * nw / w - left, (ys + 0.5) * nh / h - top
        inside = (u >= 0) & (u < 224) & (v >= 0) & (v < 224)
        grid_c, grid_r = (u[inside] - 8) / 16, (v[inside] - 8) / 16
        scores = np.stack([map_coordinates(logits[i, :, k].reshape(14, 14), [grid_r, grid_c], order=1, mode="nearest") for k in range(3)])
        truth = np.zeros((h, w), dtype=np.int64)
        for x0, y0, x1, y1, k in PIXEL_BOXES[f"va/{name}"]:
            truth[y0:y1, x0:x1] = k
        np.add.at(conf, (truth[inside], scores.argmax(0)), 1)
    return conf


def test_image_level(panels, stores):
    report = probe.run("linear", [stores["good"]], train="tr", val="va", level="image", **FIT, cache_dir=panels["cache"]).report
    assert report.outcomes[0].scores["map"] > 0.95
    ds = records.load(stores["good"], "linear_image")
    assert ds.ap.dims == ("category",) and ds.score.dims == ("image", "category") and ds.attrs["feature"] == "cls_tokens_224"
    purposes = [e.fields["purpose"] for e in ledger.entries(panels["cache"])[-2:]]
    assert purposes == ["linear-image: fit", "linear-image: score"]


def test_a_store_without_the_panels_images_is_refused_before_any_label_read(panels, stores):
    """Also: the train store holds files named like the val panel's (img00..img05) but from another folder."""
    root = panels["cache"]
    before = len(ledger.entries(root))
    lonely = panels["root"] / "stores/lonely-cccccccc/teacher.zarr"
    ids = sorted(panels["tr"])[:7]
    make_store(lonely, ids, np.zeros((7, 196, 8), np.float32), sizes_of(panels["folders"]["tr"], ids), sha="c" * 64, source=panels["folders"]["tr"])
    with pytest.raises(ProbeError) as error:
        probe.run("linear", [stores["good"], lonely], train="tr", val="va", **FIT, cache_dir=root)
    line = error.value.line()
    assert "lacks 3 of the 10 images of panel 'tr' (img07.png, img08.png, img09.png)" in line and "probe extract /ckpt/cccc.pth --panel tr" in line
    # a store extracted from the folder above the panel's (its ids carry the sub-folder) that misses one image
    folder = panels["folders"]["tr"]
    above = panels["root"] / "stores/above-eeeeeeee/teacher.zarr"
    ids = sorted(panels["tr"])[:9]
    make_store(above, [f"{folder.name}/{i}" for i in ids], np.zeros((9, 196, 8), np.float32), sizes_of(folder, ids), sha="e" * 64, source=folder.parent)
    with pytest.raises(ProbeError) as error:
        probe.run("linear", [stores["good"], above], train="tr", val="va", **FIT, cache_dir=root)
    assert f"lacks 1 of the 10 images of panel 'tr' ({folder.name}/img09.png)" in error.value.line()
    # the train panel's store has files named img00..img05, as the val panel does, but from the train folder
    alone = panels["root"] / "stores/alone-dddddddd/teacher.zarr"
    ids = sorted(panels["tr"])
    make_store(alone, ids, np.zeros((10, 196, 8), np.float32), sizes_of(panels["folders"]["tr"], ids), sha="d" * 64, source=panels["folders"]["tr"])
    with pytest.raises(ProbeError, match="extracted from another folder than the one of panel 'va'"):
        probe.run("linear", [alone], train="tr", val="va", **FIT, cache_dir=root)
    assert len(ledger.entries(root)) == before


def test_cli_table_and_one_line_errors(panels, stores, monkeypatch, capsys):
    import sys

    from probe_toolkit import cli

    args = [
        "probe",
        "linear",
        str(stores["good"]),
        str(stores["random"]),
        "--train",
        "tr",
        "--val",
        "va",
        "--epochs",
        "5",
        "--seed",
        "1",
        "--cache",
        str(panels["cache"]),
        "--quiet",
    ]
    monkeypatch.setattr(sys, "argv", args)
    cli.main()
    out = capsys.readouterr().out
    assert "aaaa (teacher)" in out and "bbbb (teacher)" in out and "mIoU" in out
    assert ledger.entries(panels["cache"])[-1].fields["command"].startswith("probe linear")
    monkeypatch.setattr(sys, "argv", [*args[:6], "--val", "tr", *args[8:]])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 2 and "both 'tr'" in capsys.readouterr().err


def test_on_a_store_the_real_extractor_wrote_from_the_panels_parent_folder(panels, tiny_checkpoints, tmp_path):
    """One store extracted from the folder above both panels (ids ``tr/…``, ``va/…``; tiny random network)."""
    from probe_toolkit.store.extract import Settings, extract

    store = extract(
        tiny_checkpoints["dino-full"],
        panels["root"],
        settings=Settings(views=(224,), attention="none", chunk=8),
        store=tmp_path / "teacher.zarr",
        quiet=True,
        batch_size=8,
    ).store
    assert "va/img00.png" in cache.open_store(store).image.values
    report = probe.run("linear", [store], train="tr", val="va", epochs=3, weight_decays=(1e-2,), cache_dir=panels["cache"]).report
    ds = records.load(store, "linear_patch")
    assert ds.weight.shape == (3, 128) and ds.prediction.shape == (6, 196) and 0 <= report.outcomes[0].scores["accuracy"] <= 1
    assert list(ds.image.values) == sorted(panels["va"])


def test_a_small_dense_fit_runs_on_one_thread_and_a_large_one_on_the_pool(monkeypatch):
    """Below ONE_THREAD_BELOW features the fit runs on one torch thread (a pool's threads cost more than the products
    they share, and on a busy machine every step waits for the slowest thread); the caller's count is restored after."""
    import torch

    seen = []
    real = linear._fit_patch_probe
    monkeypatch.setattr(linear, "_fit_patch_probe", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rng = np.random.default_rng(0)
        linear.fit_patch_probe(rng.normal(size=(980, 128)).astype(np.float32), rng.integers(0, 3, 980), 3, 1e-3, LinearSettings(epochs=2))
        monkeypatch.setattr(linear, "ONE_THREAD_BELOW", 100)
        linear.fit_patch_probe(rng.normal(size=(980, 128)).astype(np.float32), rng.integers(0, 3, 980), 3, 1e-3, LinearSettings(epochs=2))
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
