"""VOC2012 segmentation panels: checked when added (missing files named, no mask opened), read
only through the ledger, sealed when their role is test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import guard, kinds, ledger, panels
from probe_toolkit.labels import voc_segmentation as vs

IDS = {"train": ["2007_000032", "2007_000039"], "val": ["2007_000033", "2008_000001"], "trainaug": ["2007_000032", "2007_000039", "2011_003276"]}


def _palette_png(path: Path, array: np.ndarray) -> None:
    image = Image.fromarray(array.astype(np.uint8), mode="P")
    image.putpalette([v for c in range(256) for v in ((c * 37) % 256, (c * 91) % 256, (c * 53) % 256)])
    image.save(path)


def _mask(seed: int, h: int = 12, w: int = 16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 21, (h, w)).astype(np.uint8)
    y[0, :] = 255
    return y


@pytest.fixture
def voc(tmp_path):
    root = tmp_path / "VOCdevkit" / "VOC2012"
    for folder in ("JPEGImages", "SegmentationClass", "SegmentationClassAug", "ImageSets/Segmentation"):
        (root / folder).mkdir(parents=True)
    written = {}
    for split, ids in IDS.items():
        (root / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        for n, i in enumerate(ids):
            Image.fromarray(np.full((12, 16, 3), 40 * n + len(i), np.uint8)).save(root / "JPEGImages" / f"{i}.jpg")
            mask = _mask(int(i.replace("_", "")))
            if split == "trainaug":
                Image.fromarray(mask, mode="L").save(root / "SegmentationClassAug" / f"{i}.png")
                written[("aug", i)] = mask
            else:
                _palette_png(root / "SegmentationClass" / f"{i}.png", mask)
                written[("class", i)] = mask
    return root, written


def _all_masks(root: Path) -> list[Path]:
    return sorted(root.glob("SegmentationClass*/*.png"))


def test_added_without_opening_a_mask_then_read_through_the_ledger(tmp_path, voc):
    root, written = voc
    cache = tmp_path / "cache"
    with guard.forbid_label_reads(_all_masks(root)) as opened:
        panel = panels.add_panel("voc-val", root, "", "val", cache=cache, kind=vs.KIND, split="val")
        assert panel.images == root / "JPEGImages" and panel.annotations == root
        assert opened == []
        read = vs.read_label_maps("voc-val", purpose="score", checkpoint="c" * 64, cache=cache, command="probe hummingbird")
    assert len(opened) == 2  # the two val masks, inside the reader
    assert read.ids == ["2007_000033.jpg", "2008_000001.jpg"]
    for name, array in zip(read.ids, read.maps):
        assert array.dtype == np.uint8 and np.array_equal(array, written[("class", Path(name).stem)])
    assert read.classes[0] == "background" and len(read.classes) == 21
    entries = ledger.entries(cache)
    assert [e.id for e in entries] == [read.entry_id]
    fields = entries[0].fields
    assert (fields["panel"], fields["role"], fields["purpose"], fields["images"], fields["checkpoint"]) == ("voc-val", "val", "score", 2, "c" * 64)
    assert fields["annotations"] == str(root / "SegmentationClass")
    assert ledger.verify(cache) == []
    assert kinds.benchmark(panel) == "VOC12-seg"


def test_trainaug_reads_the_augmented_grey_masks_and_store_ids_restrict_the_read(tmp_path, voc):
    root, written = voc
    cache = tmp_path / "cache"
    panels.add_panel("voc-aug", root, "", "train", cache=cache, kind=vs.KIND, split="trainaug")
    read = vs.read_label_maps("voc-aug", purpose="hummingbird: memory", images=["2011_003276.jpg", "not-there.jpg"], cache=cache)
    assert read.ids == ["2011_003276.jpg"] and read.image_map == {"2011_003276.jpg": "2011_003276.jpg"}
    assert np.array_equal(read.maps[0], written[("aug", "2011_003276")])
    assert ledger.entries(cache)[-1].fields["images"] == 1


def test_missing_files_are_named_when_the_panel_is_added(tmp_path, voc):
    root, _ = voc
    cache = tmp_path / "cache"
    (root / "SegmentationClass" / "2008_000001.png").unlink()
    with pytest.raises(ProbeError, match=r"2008_000001\.png: is missing, listed in .*val\.txt"):
        panels.add_panel("v", root, "", "val", cache=cache, kind=vs.KIND, split="val")
    (root / "JPEGImages" / "2007_000032.jpg").unlink()
    (root / "JPEGImages" / "2007_000039.jpg").unlink()
    with pytest.raises(ProbeError, match=r"2007_000032\.jpg: is missing, listed in .*train\.txt \(and 1 more of the 2 files it lists\)"):
        panels.add_panel("t", root, "", "train", cache=cache, kind=vs.KIND, split="train")
    with pytest.raises(ProbeError, match="--split 'test' is not one of train, val, trainaug"):
        panels.add_panel("x", root, "", "val", cache=cache, kind=vs.KIND, split="test")
    (root / "ImageSets" / "Segmentation" / "trainaug.txt").unlink()
    with pytest.raises(ProbeError, match=r"trainaug\.txt: does not exist"):
        panels.add_panel("a", root, "", "train", cache=cache, kind=vs.KIND, split="trainaug")
    assert panels.list_panels(cache) == []


def test_a_sealed_panel_needs_a_reason_and_the_coco_reader_refuses_the_kind(tmp_path, voc):
    root, _ = voc
    cache = tmp_path / "cache"
    panels.add_panel("voc-test", root, "", "test", cache=cache, kind=vs.KIND, split="val")
    with guard.forbid_label_reads(_all_masks(root)):
        with pytest.raises(ProbeError, match="sealed test panel"):
            vs.read_label_maps("voc-test", purpose="score", cache=cache)
        with pytest.raises(ProbeError, match="segmentation panel: its labels are label maps"):
            panels.read_labels("voc-test", purpose="score", unseal="checking", cache=cache)
    assert ledger.entries(cache) == []
    read = vs.read_label_maps("voc-test", purpose="score", unseal="final table", cache=cache)
    assert ledger.entries(cache)[-1].fields["unseal"] == "final table" and len(read.maps) == 2


def test_a_mask_with_foreign_values_or_colours_is_refused_naming_it(tmp_path, voc):
    root, _ = voc
    cache = tmp_path / "cache"
    panels.add_panel("v", root, "", "val", cache=cache, kind=vs.KIND, split="val")
    bad = np.zeros((12, 16), np.uint8)
    bad[3, 3] = 40
    _palette_png(root / "SegmentationClass" / "2008_000001.png", bad)
    with pytest.raises(ProbeError, match=r"2008_000001\.png: holds values \[40\] outside 0\.\.20 and 255"):
        vs.read_label_maps("v", purpose="score", cache=cache)
    Image.fromarray(np.zeros((12, 16, 3), np.uint8)).save(root / "SegmentationClass" / "2008_000001.png")
    with pytest.raises(ProbeError, match="is an image of mode RGB, not a palette or grey mask"):
        vs.read_label_maps("v", purpose="score", cache=cache)
    assert ledger.entries(cache) == []  # nothing was handed out, nothing recorded


def test_the_registry_keeps_the_kind_and_split(tmp_path, voc):
    root, _ = voc
    cache = tmp_path / "cache"
    panels.add_panel("voc-train", root, "", "train", cache=cache, kind=vs.KIND, split="train")
    panel = panels.get_panel("voc-train", cache)
    assert (panel.kind, panel.split) == (vs.KIND, "train")
    assert vs.KIND in panels.KINDS
    with pytest.raises(ProbeError, match="is a coco panel"):
        coco = tmp_path / "a.json"
        name = sorted(p.name for p in (root / "JPEGImages").iterdir())[0]
        width, height = Image.open(root / "JPEGImages" / name).size
        image = {"id": 1, "file_name": name, "width": width, "height": height}
        box = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2], "area": 4, "iscrowd": 0}
        coco.write_text(json.dumps({"images": [image], "annotations": [box], "categories": [{"id": 1, "name": "thing"}]}))
        panels.add_panel("c", coco, root / "JPEGImages", "val", cache=cache)
        vs.read_label_maps("c", purpose="score", cache=cache)
