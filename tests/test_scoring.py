"""Mask geometry, RLE, and the scores against numbers worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from probe_toolkit.analyses.decoder import decode
from probe_toolkit.analyses.decoder_settings import Settings
from probe_toolkit.labels import masks, scoring


def _coco(dataset: dict) -> COCO:
    coco = COCO()
    coco.dataset = dataset
    coco.createIndex()
    return coco


def _rle(m: np.ndarray) -> dict:
    return masks.encode(m)


def test_upsampling_maps_each_pixel_centre_to_its_patch():
    grid, height, width = 30, 47, 101  # sides that are not multiples of the grid
    patch = np.random.default_rng(0).random((grid, grid)) > 0.5
    full = masks.upsample(patch.reshape(-1), height, width)
    assert full.shape == (height, width)
    for i in range(height):  # plain loop: pixel centre (i + ½) in the 480 view, then its patch
        for j in range(width):
            r = int((i + 0.5) * 480 / height // 16)
            c = int((j + 0.5) * 480 / width // 16)
            assert full[i, j] == patch[r, c]


def test_rle_round_trip_at_the_original_size():
    grid, height, width = 30, 375, 500
    patch = np.zeros((grid, grid), dtype=bool)
    patch[5:17, 8:21] = True
    patch[20, 3] = True
    full = masks.upsample(patch, height, width)
    rle = masks.encode(full)
    assert isinstance(rle["counts"], str) and rle["size"] == [height, width]
    json.dumps(rle)
    np.testing.assert_array_equal(masks.decode_rle(rle), full)
    assert mask_utils.area(rle) == full.sum()
    rows, cols = np.nonzero(full)
    assert mask_utils.toBbox(rle).tolist() == [cols.min(), rows.min(), cols.max() - cols.min() + 1, rows.max() - rows.min() + 1]
    # LOST's patch-aligned box, mapped back: columns 3..20, rows 5..20 of 30
    assert masks.patch_box(patch, height, width) == pytest.approx([3 * width / 30, 5 * height / 30, 21 * width / 30, 21 * height / 30])


def test_coco_results_hold_one_entry_per_mask():
    grid = 12
    keys = np.random.default_rng(1).standard_normal((2, grid * grid, 8)).astype(np.float32)
    d = decode(keys, Settings.from_preset("maskcut", masks=2))
    res = masks.coco_results(d, ["a.jpg", "b/c.jpg"], np.array([60, 48]), np.array([72, 36]), {"a.jpg": 7})
    assert len(res) == int(d.n_masks[0]) and {r["image_id"] for r in res} == {7}
    r = res[0]
    assert r["category_id"] == 1 and r["file_name"] == "a.jpg" and r["segmentation"]["size"] == [60, 72]
    assert r["score"] == pytest.approx(d.score[0, 0]) and r["mask"] == 0
    assert r["bbox"] == pytest.approx(mask_utils.toBbox(r["segmentation"]).tolist())


def _square(h, w, y0, y1, x0, x1):
    m = np.zeros((h, w), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def _hand_panel():
    """Two images with one 8 × 8 object each, and one image with no object."""
    h = w = 20
    a, b = _square(h, w, 2, 10, 2, 10), _square(h, w, 5, 13, 6, 14)
    images = [{"id": i, "file_name": f"{i}.png", "height": h, "width": w} for i in (1, 2, 3)]
    anns = []
    for k, (img, m) in enumerate(((1, a), (2, b)), start=1):
        rle = _rle(m)
        anns.append({"id": k, "image_id": img, "category_id": k, "segmentation": rle, "area": float(m.sum()), "bbox": mask_utils.toBbox(rle).tolist(), "iscrowd": 0})
    return _coco({"images": images, "annotations": anns, "categories": [{"id": 1}, {"id": 2}]}), a, b, (h, w)


def _det(image_id, m, score, index=0):
    rle = _rle(m)
    return {"image_id": image_id, "category_id": 1, "segmentation": rle, "bbox": mask_utils.toBbox(rle).tolist(), "score": score, "mask": index}


def test_coco_ap_on_a_hand_made_panel():
    coco, a, b, (h, w) = _hand_panel()
    part = _square(h, w, 5, 10, 6, 14)  # 5 of b's 8 rows: IoU 40/64 = 0.625 (mask and box)
    dets = [_det(1, a, 0.9), _det(2, part, 0.8), _det(3, _square(h, w, 0, 4, 0, 4), 0.1)]
    # thresholds .50 .55 .60: both objects found → AP 1. Thresholds .65 … .95 (7 of 10): only
    # image 1 → recall ½ at precision 1, i.e. 51 of COCO's 101 recall points → 51/101.
    ap_high = 51 / 101
    expected = {"AP": (3 + 7 * ap_high) / 10, "AP50": 1.0, "AP75": ap_high, "AR1": 0.65, "AR10": 0.65, "AR100": 0.65}
    for kind in ("segm", "bbox"):
        got = scoring.coco_ap(coco, dets, [1, 2, 3], kind)
        assert got == pytest.approx(expected, abs=1e-9), kind
    # class-agnostic: the objects' categories (1 and 2) do not matter; order does not matter
    assert scoring.coco_ap(coco, dets[::-1], [1, 2, 3], "segm") == pytest.approx(expected)


def test_corloc_by_hand_with_crowd_and_rounding():
    h = w = 100
    images = [{"id": i, "file_name": f"{i}.png", "height": h, "width": w} for i in (1, 2, 3, 4)]

    def ann(k, img, bbox, crowd=0):
        x, y, bw, bh = bbox
        m = _square(h, w, int(y), int(y + bh), int(x), int(x + bw))
        return {"id": k, "image_id": img, "category_id": 1, "segmentation": _rle(m), "area": float(m.sum()), "bbox": bbox, "iscrowd": crowd}

    anns = [
        ann(1, 1, [0.4, 0.6, 9.2, 9.9]),  # rounds to [0, 1, 10, 10] (LOST: int(round(.)))
        ann(2, 1, [50, 50, 10, 10]),
        ann(3, 2, [0, 0, 10, 10]),
        ann(4, 3, [0, 0, 10, 10], crowd=1),  # removed
    ]
    coco = _coco({"images": images, "annotations": anns, "categories": [{"id": 1}]})

    def det(img, box, index=0):
        x1, y1, x2, y2 = box
        return {
            "image_id": img,
            "category_id": 1,
            "segmentation": _rle(_square(h, w, y1, y2, x1, x2)),
            "bbox": [x1, y1, x2 - x1, y2 - y1],
            "score": 0.5,
            "mask": index,
            "patch_box": [float(v) for v in box],
        }

    dets = [
        det(1, (0, 1, 10, 7)),  # IoU with [0, 1, 10, 10] = 60/90 = 0.667 → hit
        det(1, (50, 50, 60, 60), index=1),  # a perfect second mask does not count: first mask only
        det(2, (0, 0, 10, 4)),  # IoU 0.4 → miss
        det(3, (0, 0, 10, 10)),  # only a crowd box → miss
        det(4, (0, 0, 10, 10)),  # no box at all → miss
    ]
    s = scoring.evaluate(coco, dets)
    assert s.corloc == pytest.approx(1 / 4)
    np.testing.assert_array_equal(s.corloc_hit, [True, False, False, False])
    np.testing.assert_allclose(s.first_box_iou, [60 / 90, 0.4, 0.0, 0.0], atol=1e-6)
    assert s.counts["images_without_boxes"] == 2
    # mean best IoU over the three non-crowd objects (masks, not boxes): object 1's outline is
    # rows 0-9 × cols 0-8 (90 px), the mask rows 1-6 × cols 0-9 (60 px), sharing 54 → 54/96;
    # object 2 is matched by the second mask (1); object 3: 40/100
    assert s.mean_best_iou == pytest.approx((54 / 96 + 1 + 0.4) / 3, abs=1e-9)
    assert sorted(s.object_ids.tolist()) == [1, 2, 3]


def lost_bbox_iou(box1, box2, eps=1e-7):
    """valeoai/LOST datasets.py ``bbox_iou`` (x1y1x2y2), written out here in torch, called as
    main_lost.py calls it: on int64 tensors of the predicted box and the ground-truth boxes."""
    import torch

    box1, box2 = torch.from_numpy(np.asarray(box1, np.int64)), torch.from_numpy(np.asarray(box2, np.int64)).T
    inter = (torch.min(box1[2], box2[2]) - torch.max(box1[0], box2[0])).clamp(0) * (torch.min(box1[3], box2[3]) - torch.max(box1[1], box2[1])).clamp(0)
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1] + eps
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1] + eps
    return (inter / (w1 * h1 + w2 * h2 - inter + eps)).numpy()


def test_box_iou_matches_lost_formula():
    box = np.array([0.0, 0.0, 10.0, 10.0])
    got = scoring.box_iou(box, np.array([[5.0, 5.0, 15.0, 15.0], [20.0, 20.0, 30.0, 30.0]]))
    np.testing.assert_allclose(got, [25 / 175, 0.0], rtol=1e-6)
    # an IoU of exactly one half is a hit in LOST (its float32 arithmetic loses eps), and here
    for pred, gt in (([0, 0, 32, 32], [[0, 0, 32, 64]]), ([16, 0, 336, 240], [[16, 0, 336, 480], [0, 0, 8, 8]])):
        ours, theirs = scoring.box_iou(np.array(pred), np.array(gt)), lost_bbox_iou(pred, gt)
        assert ours[0] == theirs[0] == 0.5
    rng = np.random.default_rng(0)  # and bit for bit on random integer boxes
    for _ in range(200):
        corners = np.sort(rng.integers(0, 700, size=(6, 2, 2)), axis=1).reshape(6, 4)  # [x1, y1, x2, y2], x1 ≤ x2, y1 ≤ y2
        np.testing.assert_array_equal(scoring.box_iou(corners[0], corners[1:]), lost_bbox_iou(corners[0], corners[1:]))
