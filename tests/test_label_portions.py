"""Segmentation label maps handed out in portions (``labels.label_maps.LabelMaps``): one ledger
entry naming the portions, written before any map leaves; the maps those of the files the entry
hashed (a mask changed since is refused); memory that does not grow with the data set."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import guard, label_maps, ledger, panels
from probe_toolkit.labels import voc_segmentation as vs


def _voc(root: Path, n: int, size=(96, 128)) -> dict[str, np.ndarray]:
    """A VOC2012 layout with ``n`` val images and their grey masks; the masks by id."""
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    ids = [f"2007_{i:06d}" for i in range(n)]
    (root / "ImageSets" / "Segmentation" / "val.txt").write_text("".join(f"{i}\n" for i in ids))
    written = {}
    for k, i in enumerate(ids):
        Image.fromarray(np.full((*size, 3), k % 250, np.uint8)).save(root / "JPEGImages" / f"{i}.jpg")
        mask = np.random.default_rng(k).integers(0, 21, size).astype(np.uint8)
        Image.fromarray(mask, mode="L").save(root / "SegmentationClass" / f"{i}.png")
        written[i] = mask
    return written


def _read(root: Path, cache: Path, name: str = "voc"):
    panels.add_panel(name, root, "", "val", cache=cache, kind=vs.KIND, split="val")
    return vs.read_label_maps(name, purpose="score", cache=cache)


def test_maps_come_in_portions_after_one_entry_that_names_them(tmp_path, monkeypatch):
    monkeypatch.setattr(label_maps, "PORTION", 3)
    root = tmp_path / "VOC2012"
    written = _voc(root, 8)
    cache = tmp_path / "cache"
    masks = sorted((root / "SegmentationClass").glob("*.png"))
    with guard.forbid_label_reads(masks) as opened:
        read = _read(root, cache)
        assert len(opened) == 8  # the first pass: every mask opened (decoded, hashed), none kept
        entries = ledger.entries(cache)
        assert len(entries) == 1 and entries[0].fields["portions"] == 3 and entries[0].fields["images"] == 8
        assert read.shapes == [(96, 128)] * 8  # known without decoding again
        portions = list(read.maps.portions())
        assert [len(p) for p in portions] == [3, 3, 2]
        assert all(np.array_equal(y, written[Path(name).stem]) for y, name in zip(read.maps, read.ids))
        assert np.array_equal(read.maps[5], written[Path(read.ids[5]).stem])
        assert [len(p) for p in read.maps.portions([7, 0, 4], size=2)] == [2, 1]
        assert np.array_equal(next(read.maps.portions([7]))[0], written[Path(read.ids[7]).stem])
    assert len(ledger.entries(cache)) == 1  # handing out the maps writes no other entry


def test_a_mask_changed_after_the_entry_is_refused(tmp_path):
    root = tmp_path / "VOC2012"
    _voc(root, 4)
    read = _read(root, tmp_path / "cache")
    mask = root / "SegmentationClass" / Path(read.ids[2]).with_suffix(".png").name
    Image.fromarray(np.zeros((96, 128), np.uint8), mode="L").save(mask)
    assert read.maps[1].shape == (96, 128)  # the others still read
    with pytest.raises(ProbeError) as refused:
        list(read.maps)
    assert "changed while its panel was read" in str(refused.value) and mask.name in str(refused.value)


def test_a_bad_mask_is_refused_before_the_entry(tmp_path):
    root = tmp_path / "VOC2012"
    _voc(root, 5)
    Image.fromarray(np.full((96, 128), 77, np.uint8), mode="L").save(root / "SegmentationClass" / "2007_000004.png")
    with pytest.raises(ProbeError, match="outside 0..20"):
        _read(root, tmp_path / "cache")
    assert not ledger.entries(tmp_path / "cache")


def test_peak_memory_of_handing_out_the_maps_does_not_grow_with_the_data_set(tmp_path, monkeypatch):
    """Every map of a 12-image and a 48-image panel read in portions of 4: the reader's peak
    allocation (tracemalloc) is the same, where holding every map would grow fourfold."""
    monkeypatch.setattr(label_maps, "PORTION", 4)
    peaks = []
    for n in (12, 48):
        root = tmp_path / f"VOC{n}"
        _voc(root, n, size=(256, 256))
        tracemalloc.start()
        read = _read(root, tmp_path / f"cache{n}")
        total = sum(int(y.sum()) for y in read.maps)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert total > 0
    assert peaks[1] < 1.3 * peaks[0], peaks


def test_a_read_keeps_no_python_object_per_mask(tmp_path):
    """What a read holds per mask until the run ends is compact (``label_maps.FolderFiles``, the digests
    and shapes in arrays): no Path, digest or shape tuple per mask (~0.5 KiB a mask at 100 k images)."""
    import gc

    def kept(name: str, n: int) -> tuple[int, object]:
        root = tmp_path / name / "VOC2012"
        _voc(root, n, size=(4, 4))
        panels.add_panel(name, root, "", "val", cache=tmp_path / "cache", kind=vs.KIND, split="val")
        gc.collect()
        before = len(gc.get_objects())
        read = vs.read_label_maps(name, purpose="score", cache=tmp_path / "cache")
        gc.collect()
        return len(gc.get_objects()) - before, read

    gc.freeze()  # the test process's objects out of every collection and count: fast
    try:
        kept("warm", 5)  # first-call caches out of the count
        small, _few = kept("small", 10)
        large, many = kept("large", 110)
    finally:
        gc.unfreeze()
    assert len(many.maps) == 110 and many.shapes == [(4, 4)] * 110
    assert (large - small) / 100 < 0.1  # container objects kept per mask (before: a Path, its parts list and a shape tuple)
