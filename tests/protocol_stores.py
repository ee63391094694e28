"""The frozen-feature protocols run on a report test's store through their own command line:
k-NN on two COCO panels (the photographs against the two scenes, two categories), the
attention masks scored on the scenes panel, label propagation on a synthetic DAVIS folder, and
keypoint correspondence on a synthetic SPair-71k panel (its square800 tokens in the sibling store
``probe extract --panel`` writes) and NAVI multiview correspondence on a synthetic NAVI folder;
hummingbird on a synthetic VOC folder whose images sit in sibling stores of the same checkpoint
(``<network>-panel-NAME.zarr``), so that no image of the report's store changes role; a short
linear segmentation on the same panels, its record in the report's store; NeCo's overclustering
of the val panel's scenes, read from the sibling store; a short linear depth on
an NYU-layout folder of rooms; NAVI correspondence on a synthetic NAVI folder of two objects (two pairs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from report_stores import invoke

from probe_toolkit.demo.spair import write_spair
from probe_toolkit.demo.video import write_davis
from probe_toolkit.store import cache

# panels of two roles may not share an image: the train panel holds the photographs (as scenes-train
# does), the val panel the two scenes (as the val panel scenes does)
KNN_TRAIN = {"astronaut.jpg": 1, "chelsea.jpg": 2, "coffee.jpg": 1, "rocket.jpg": 2, "camera.jpg": 1}
KNN_VAL = {"scenes/one.png": 1, "scenes/two.png": 2}


def _coco(path: Path, labels: dict[str, int], store: Path) -> Path:
    ds = cache.open_store(store)
    ids = [str(i) for i in ds.image.values]
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}, {"id": 2, "name": "other"}]}
    for n, (name, cat) in enumerate(labels.items(), 1):
        k = ids.index(name)
        w, h = int(ds.image_width.values[k]), int(ds.image_height.values[k])
        coco["images"].append({"id": n, "file_name": name, "width": w, "height": h})
        coco["annotations"].append(
            {
                "id": n,
                "image_id": n,
                "category_id": cat,
                "iscrowd": 0,
                "area": float(w * h // 4),
                "bbox": [0, 0, w // 2, h // 2],
                "segmentation": [[0, 0, w // 2, 0, w // 2, h // 2, 0, h // 2]],
            }
        )
    path.write_text(json.dumps(coco))
    return path


def protocol_results(store: Path, image_dir: Path, root: Path, cache_dir: Path) -> None:
    """results/knn, results/attention_masks (panel ``scenes``, registered by scenes_panels), results/davis, results/correspond
    (SPair-71k, and NAVI in results/correspond-navi),
    results/hummingbird, results/linear_segmentation and results/overcluster in ``store``."""
    for name, labels, role in (("classes-train", KNN_TRAIN, "train"), ("classes-val", KNN_VAL, "val")):
        invoke("panel", "add", name, "--annotations", _coco(root / f"{name}.json", labels, store), "--images", image_dir, "--role", role, "--cache", cache_dir)
    invoke("knn", store, "--train", "classes-train", "--val", "classes-val", "--k", "1,3", "--cache", cache_dir, "-q")
    invoke("attention-masks", store, "--panel", "scenes", "--cache", cache_dir, "--workers", "1", "-q")  # test_runner_analyses runs the pools
    checkpoint = cache.manifest(store)["checkpoint"]["path"]
    davis = write_davis(root / "DAVIS", {"shapes": 3}, size=(64, 48))
    invoke("propagate", checkpoint, "--davis", davis, "--out", root / "davis-out", "--store", store, "--cache", cache_dir, "--workers", "1", "-q")
    spair = write_spair(root / "SPair-71k", {"cat": 2, "dog": 2}, seed=5)
    invoke("panel", "add", "spair", "--spair", spair, "--role", "val", "--cache", cache_dir)
    invoke("extract", checkpoint, "--panel", "spair", "--views", "square800", "--cache", cache_dir, "-q")
    invoke("correspond", store, "--panel", "spair", "--cache", cache_dir, "--workers", "1", "-q")
    navi_results(store, root, cache_dir)
    hummingbird_results(store, root, cache_dir)


def navi_results(store: Path, root: Path, cache_dir: Path) -> None:
    """results/correspond-navi in ``store``: a NAVI folder of two objects whose wild images make two pairs."""
    from navi_folders import write_navi

    navi = write_navi(root / "navi_v1", {"bottle": [0, 20, 45, 70, 100], "mug": [5, 35, 60]}, seed=5)
    invoke("panel", "add", "navi-test", "--navi", navi, "--role", "test", "--cache", cache_dir)
    invoke("correspond", store, "--panel", "navi-test", "--unseal", "the report's test", "--cache", cache_dir, "--workers", "1", "-q")


def hummingbird_results(store: Path, root: Path, cache_dir: Path) -> None:
    """results/hummingbird in ``store``: a VOC2012 folder of five synthetic scenes (three train, two val),
    each panel extracted beside the store in the hbird512 views."""
    year = root / "VOC2012"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (year / folder).mkdir(parents=True)
    splits = {"train": ["2007_000001", "2007_000002", "2007_000003"], "val": ["2008_000001", "2008_000002"]}
    rng = np.random.default_rng(7)
    for split, ids in splits.items():
        (year / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        for n, i in enumerate(ids):
            pixels = rng.normal(110, 25, (60, 80, 3)).clip(0, 255)
            label = np.zeros((60, 80), np.uint8)
            label[10 + 5 * n : 40, 20 : 60 - 5 * n] = 255
            label[12 + 5 * n : 38, 22 : 58 - 5 * n] = 1 + n
            pixels[label == 1 + n] = (200, 40 * n, 60)
            Image.fromarray(pixels.astype(np.uint8)).save(year / "JPEGImages" / f"{i}.jpg", quality=95)
            Image.fromarray(label, mode="L").save(year / "SegmentationClass" / f"{i}.png")
    checkpoint = cache.manifest(store)["checkpoint"]["path"]
    for name, split, views in (("voc-seg-train", "train", "hbird512_aug0,hbird512_aug1"), ("voc-seg-val", "val", "hbird512")):
        invoke("panel", "add", name, "--voc-segmentation", year, "--split", split, "--role", split, "--cache", cache_dir)
        invoke(
            "extract",
            checkpoint,
            "--images",
            year / "JPEGImages",
            "--views",
            views,
            "--store",
            store.parent / f"{store.name.removesuffix('.zarr')}-panel-{name}.zarr",
            "--cache",
            cache_dir,
            "-q",
        )
    invoke("hummingbird", store, "--train", "voc-seg-train", "--val", "voc-seg-val", "--memory", "30,full", "--cache", cache_dir, "--workers", "1", "-q")
    # NeCo's overclustering of the val scenes' 512 px view (in the sibling store): one cluster per VOC class, and more
    invoke(
        "overcluster",
        store,
        "--panel",
        "voc-seg-val",
        "--view",
        "hbird@512",
        "--k",
        "21,40",
        "--seeds",
        "2",
        "--restarts",
        "1",
        "--iterations",
        "20",
        "--cache",
        cache_dir,
        "-q",
    )
    invoke(
        "segment",
        checkpoint,
        "--train",
        "voc-seg-train",
        "--val",
        "voc-seg-val",
        "--store",
        store,
        "--cache",
        cache_dir,
        "--iterations",
        "2",
        "--batch-size",
        "2",
        "--crop",
        "32",
        "--size",
        "32",
        "--stride",
        "21",
        "--workers",
        "1",
        "-q",
    )
    depth_results(store, root, cache_dir)


def depth_results(store: Path, root: Path, cache_dir: Path) -> None:
    """results/linear-depth in ``store``: a short run on an NYU-layout folder of rooms (probe_toolkit.demo.rooms)."""
    from probe_toolkit.demo.rooms import write_nyu

    nyu = root / "nyu"
    write_nyu(nyu, {"train": ["kitchen_0001/00001", "kitchen_0001/00002"], "test": ["bathroom/00045"]})
    for name, role in (("nyu-train", "train"), ("nyu-test", "val")):
        invoke("panel", "add", name, "--nyu", nyu, "--role", role, "--cache", cache_dir)
    checkpoint = cache.manifest(store)["checkpoint"]["path"]
    invoke(
        "depth",
        checkpoint,
        "--train",
        "nyu-train",
        "--val",
        "nyu-test",
        "--store",
        store,
        "--cache",
        cache_dir,
        "--iterations",
        "2",
        "--batch-size",
        "2",
        "--replicas",
        "1",
        "--crop",
        "48,64",
        "--chunk",
        "2",
        "--workers",
        "1",
        "-q",
    )
