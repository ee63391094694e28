"""A COCO panel's image classes read entry by entry (``labels/coco_classes.py``): the classes, the
ledger entry and the refusals of the whole-file reader (``panels.read_labels``), in a fraction of its memory."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import coco_classes, ledger, panels

SIZE = (8, 6)  # every image's (width, height)


def _images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    Image.new("RGB", SIZE, (1, 2, 3)).save(buffer, format="PNG")
    for name in names:
        (folder / name).write_bytes(buffer.getvalue())


def _dataset(n_images=40, seed=0):
    """Unsorted image ids, categories out of order, crowd objects, ties, images without objects,
    float and whole areas, boxes reaching outside their image (clipped)."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.arange(1000, 1000 + n_images)).tolist()
    images = [{"id": i, "file_name": f"im{i}.png", "width": SIZE[0], "height": SIZE[1]} for i in ids]
    categories = [{"id": c, "name": f"c{c}"} for c in (7, 3, 11, 5)]
    annotations, n = [], 1
    for i in ids[:-3]:  # the last three images: no object
        for _ in range(int(rng.integers(1, 5))):
            x, y = float(rng.integers(-1, 7)), float(rng.integers(-1, 5))
            area = float(rng.choice([2.0, 3.5, 0.1, 0.2, 4]))
            ann = {"id": n, "image_id": i, "category_id": int(rng.choice([7, 3, 11, 5])), "bbox": [x, y, 3.0, 2.0], "area": area, "iscrowd": int(rng.random() < 0.2)}
            annotations.append(ann)
            n += 1
    annotations.append({"id": n, "image_id": ids[0], "category_id": 3, "bbox": [1, 1, 2, 2], "area": 1, "iscrowd": 0})  # ties broken by the lower id
    annotations.append({"id": n + 1, "image_id": ids[0], "category_id": 11, "bbox": [1, 1, 2, 2], "area": 1, "iscrowd": 0})
    return {"info": {"about": "test"}, "images": images, "annotations": annotations, "categories": categories}


def _reference(dataset):
    """Each image's class through pycocotools' index of every object, as read_classes computed it before."""
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    cats = sorted(c["id"] for c in dataset["categories"])
    ids, labels, dropped = [], [], 0
    for image_id in sorted(coco.getImgIds()):
        area = {}
        for ann in coco.imgToAnns.get(image_id, []):
            if not ann["iscrowd"]:
                area[ann["category_id"]] = area.get(ann["category_id"], 0.0) + float(ann["area"])
        if not area:
            dropped += 1
            continue
        best = sorted(area, key=lambda c: (-area[c], c))[0]
        ids.append(coco.imgs[image_id]["file_name"])
        labels.append(cats.index(best))
    return ids, labels, [f"c{c}" for c in cats], dropped


def _panel(tmp_path, dataset, text=None, name="tr"):
    folder = tmp_path / "images"
    _images(folder, [im["file_name"] for im in dataset["images"]])
    annotations = tmp_path / f"{name}.json"
    annotations.write_text(json.dumps(dataset))
    panels.add_panel(name, annotations, folder, "train", cache=tmp_path / "cache")
    if text is not None:
        annotations.write_bytes(text if isinstance(text, bytes) else text.encode())
    return annotations


def _same_entry(a, b):
    drop = ("time", "purpose", "command", "hash", "prev", "n")
    return {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_classes_and_ledger_entry_are_those_of_the_whole_file_reader(tmp_path, monkeypatch):
    dataset = _dataset()
    _panel(tmp_path, dataset)
    whole = []
    monkeypatch.setattr(panels, "read_labels", lambda *a, **k: whole.append(1) or pytest.fail("read whole"))
    got = panels.read_classes("tr", purpose="knn", cache=tmp_path / "cache", command="test")
    monkeypatch.undo()
    ids, labels, classes, dropped = _reference(dataset)
    assert got.image_ids == ids and got.labels.tolist() == labels and got.classes == classes and got.dropped == dropped > 3
    assert got.rule == "largest annotated category (summed area)" and whole == []
    entries = ledger.entries(tmp_path / "cache")
    assert len(entries) == 1 and entries[0].id == got.entry_id and entries[0].fields["clipped"] > 0
    panels.read_labels("tr", purpose="knn", cache=tmp_path / "cache", command="test")
    assert _same_entry(entries[0].fields, ledger.entries(tmp_path / "cache")[-1].fields)


@pytest.mark.parametrize(
    "layout",
    ["annotations-first", "indented", "utf-16", "bom", "repeated-key", "string-category-name"],
)
def test_any_layout_gives_the_same_classes(tmp_path, layout):
    """Fields in any order, spaces, UTF-16 or a BOM are walked entry by entry; a repeated key
    (json.loads keeps the last) goes through the whole-file reader; the classes are the same."""
    dataset = _dataset(seed=1)
    ordered = {k: dataset[k] for k in ("categories", "annotations", "info", "images")}
    text = {
        "annotations-first": json.dumps(ordered),
        "indented": json.dumps(dataset, indent=3),
        "utf-16": json.dumps(dataset).encode("utf-16"),
        "bom": codecs.BOM_UTF8 + json.dumps(dataset).encode(),
        "repeated-key": '{"images": [], ' + json.dumps(dataset)[1:],
        "string-category-name": json.dumps(dataset).replace('"name": "c7"', '"name": "c\\u0037"'),
    }[layout]
    _panel(tmp_path, dataset, text)
    got = panels.read_classes("tr", purpose="knn", cache=tmp_path / "cache", command="test")
    ids, labels, classes, dropped = _reference(dataset)
    assert got.image_ids == ids and got.labels.tolist() == labels and got.classes == classes and got.dropped == dropped


def _bad(dataset, case):
    d = json.loads(json.dumps(dataset))
    if case == "string image_id":
        d["annotations"][4]["image_id"] = str(d["annotations"][4]["image_id"])
    elif case == "box outside":
        d["annotations"][2]["bbox"] = [50.0, 50.0, 2.0, 2.0]
    elif case == "no annotations":
        d["annotations"] = []
    elif case == "unknown category":
        d["annotations"][1]["category_id"] = 99
    elif case == "two problems":
        d["images"][3]["width"] = -1
        d["annotations"][0]["area"] = -2
    elif case == "wrong size":
        d["images"][5]["width"] = 9
    elif case == "absent file":
        d["images"][6]["file_name"] = "gone.png"
    elif case == "not json":
        return json.dumps(d)[:-5]
    return json.dumps(d)


@pytest.mark.parametrize("case", ["string image_id", "box outside", "no annotations", "unknown category", "two problems", "wrong size", "absent file", "not json"])
def test_bad_files_are_refused_with_the_whole_file_readers_line(tmp_path, case):
    dataset = _dataset(seed=2)
    _panel(tmp_path, dataset, _bad(dataset, case))
    with pytest.raises(ProbeError) as whole:
        panels.read_labels("tr", purpose="knn", cache=tmp_path / "cache")
    with pytest.raises(ProbeError) as classes:
        panels.read_classes("tr", purpose="knn", cache=tmp_path / "cache")
    assert str(classes.value) == str(whole.value)
    assert ledger.entries(tmp_path / "cache") == []  # no label left


def test_the_read_holds_a_few_columns_not_a_dict_per_object(tmp_path):
    """Traced peak of the read against the file's size: json.loads' dicts, their clipped copies
    and pycocotools' index held about 10x its bytes (1,200 images, 3,000 objects); the columns
    a fraction of that beside the file's bytes and text."""
    dataset = _dataset(n_images=1200, seed=4)
    for ann in dataset["annotations"]:
        ann["segmentation"] = [[1.0, 1.0, 4.0, 1.0, 4.0, 3.0, 1.0, 3.0]]
    annotations = _panel(tmp_path, dataset)
    size = annotations.stat().st_size
    tracemalloc.start()
    try:
        got = panels.read_classes("tr", purpose="knn", cache=tmp_path / "cache", command="test")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.image_ids == _reference(dataset)[0]
    assert peak < 5 * size, (peak, size)
    assert coco_classes.SIZES_AT_ONCE >= 1024


def test_a_folders_image_ids_are_rglobs_without_a_path_per_image(tmp_path):
    """``images.image_ids`` / ``list_images`` list what ``Path.rglob`` finds (links to folders not
    followed, hidden files and folders skipped, suffixes in any case), and the listing of 3,000
    images holds their names, not a Path each (rglob keeps every Path it yields), nor a DirEntry each
    while it walks (a 100 k folder's entries at once left ~20 MiB of scattered heap behind)."""
    import os
    import sys

    from probe_toolkit.store import images

    tree = tmp_path / "tree"
    for name in ("x.jpg", "y.JPG", "a/z.png", "a/b/w.jpeg", ".h.jpg", ".hid/q.jpg", "c/.d/r.jpg", "c/s.txt", "e/t.Png", "a/b/.u.jpg", "sp ace.jpg", "dir.jpg/in.png"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(b"x")
    os.symlink(tree / "a", tree / "linkdir")
    os.symlink(tree / "x.jpg", tree / "link.jpg")
    os.symlink(tree / "nowhere.jpg", tree / "broken.jpg")
    reference = sorted(
        p.relative_to(tree).as_posix()
        for p in tree.rglob("*")
        if p.is_file() and p.suffix.lower() in images.EXTENSIONS and not any(part.startswith(".") for part in p.relative_to(tree).parts)
    )
    assert reference == ["a/b/w.jpeg", "a/z.png", "dir.jpg/in.png", "e/t.Png", "link.jpg", "sp ace.jpg", "x.jpg", "y.JPG"]
    assert images.image_ids(tree) == reference == [r.id for r in images.list_images(tree)]
    assert [r.path for r in images.list_images(tree)] == [tree / i for i in reference]
    many = tmp_path / "many"
    many.mkdir()
    for n in range(3000):
        (many / f"image_{n:05d}.jpg").write_bytes(b"")
    tracemalloc.start()
    try:
        ids = images.image_ids(many)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(ids) == 3000 and peak < 300 * 3000, peak  # rglob's Paths: ~0.5 KiB an image
    kept = sys.getsizeof(ids) + sum(sys.getsizeof(i) for i in ids)
    assert (peak - kept) / 3000 < 32, peak - kept  # entry by entry (before: the folder's DirEntries all at once, ~160 B an image)
