"""How good are the masks, against a panel's human outlines (read through the ledger).

- COCO AP, class-agnostic: pycocotools ``COCOeval`` with ``useCats = 0`` (every ground-truth
  object is "an object", as CutLER's collapsed-category files), maxDets [1, 10, 100], for
  ``segm`` and ``bbox``: AP, AP50, AP75, AR1, AR10, AR100 (fractions in [0, 1]). For ``segm``
  the results' boxes are dropped first, so the area of a mask is its mask area (detectron2 does
  the same). Ties in score are broken by pycocotools' stable sort, i.e. input order; the
  decoder's scores make ties rare.
- CorLoc (LOST ``main_lost.py``, copied by TokenCut): one box per image, the patch-aligned box of
  the first mask; a hit when IoU ≥ 0.5 with any non-crowd ground-truth box of the image, whose
  [x, y, x+w, y+h] is rounded to integers; IoU with eps 1e-7 in float32 as LOST's ``bbox_iou``
  computes it (``box_iou``). Images with no non-crowd box count as misses: LOST has no rule for
  them (``--no_hard`` leaves out VOC images left without boxes, as a ``--no-hard`` panel does;
  any other such image stops its script), so a panel holding them has no peer figure.
- Mean best IoU: for every non-crowd ground-truth object, the best mask IoU over the image's
  masks (0 when none), averaged over objects.
- Box-only panels (Pascal VOC, ``labels/voc.py``): ground truth without outlines has no mask
  scores, so ``segm`` and mean best IoU are NaN; CorLoc and ``bbox`` AP are computed as above.
"""

from __future__ import annotations

import contextlib
import copy
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval

from .coco_metrics import METRICS  # noqa: F401  (named once there)

STAT_INDEX = {"AP": 0, "AP50": 1, "AP75": 2, "AR1": 6, "AR10": 7, "AR100": 8}


@dataclass
class Scores:
    """COCO-style scores of one masks file on one panel; every share a fraction in [0, 1] (commands print %)."""

    segm: dict[str, float]  # class-agnostic mask AP, AP50, AP75, AR1, AR10, AR100 (pycocotools; fractions)
    bbox: dict[str, float]  # the same for the masks' boxes (fractions)
    corloc: float  # share of images whose first box has IoU ≥ 0.5 with some object (a fraction: 0.375 is 37.5 %)
    mean_best_iou: float  # each object's best IoU with any mask, averaged (a fraction)
    image_ids: list[int]  # the COCO image ids evaluated
    corloc_hit: np.ndarray  # (image,) bool
    first_box_iou: np.ndarray  # (image,) best IoU of the first box with any GT box (0 if none)
    object_ids: np.ndarray  # (object,) COCO annotation ids of the non-crowd objects
    object_images: np.ndarray  # (object,) their image ids
    best_iou: np.ndarray  # (object,)
    counts: dict[str, int] = field(default_factory=dict)

    def table(self) -> dict[str, float]:
        """One flat row of every headline number."""
        row = {f"segm_{k}": v for k, v in self.segm.items()}
        row.update({f"bbox_{k}": v for k, v in self.bbox.items()})
        row.update(corloc=self.corloc, mean_best_iou=self.mean_best_iou)
        return row


def _ground_truth(coco):
    """A copy whose annotations all have ``area`` and ``iscrowd`` (COCOeval needs both)."""
    gt = copy.copy(coco)
    dataset = dict(coco.dataset)
    anns = []
    for ann in coco.dataset["annotations"]:
        ann = dict(ann)
        ann.setdefault("iscrowd", 0)
        if "area" not in ann:
            ann["area"] = float(mask_utils.area(coco.annToRLE(ann))) if ann.get("segmentation") else float(ann["bbox"][2] * ann["bbox"][3])
        anns.append(ann)
    dataset["annotations"] = anns
    from pycocotools.coco import COCO

    gt = COCO()
    gt.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt


def coco_ap(gt, results: list[dict[str, Any]], image_ids: list[int], iou_type: str) -> dict[str, float]:
    """Class-agnostic COCOeval stats for ``segm`` or ``bbox``; NaN where pycocotools gives −1."""
    if not results:
        return {k: 0.0 for k in METRICS}
    dets = copy.deepcopy(results)
    if iou_type == "segm":
        for d in dets:
            d.pop("bbox", None)
    with contextlib.redirect_stdout(io.StringIO()):
        dt = gt.loadRes(dets)
        ev = COCOeval(gt, dt, iou_type)
        ev.params.useCats = 0
        ev.params.imgIds = list(image_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {k: (float(ev.stats[i]) if ev.stats[i] >= 0 else float("nan")) for k, i in STAT_INDEX.items()}


def box_iou(box: np.ndarray, boxes: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """IoU of one [x1, y1, x2, y2] box with many, as LOST's ``bbox_iou`` computes it (eps on
    heights and union), float32 values.

    LOST and TokenCut call it on integer (int64) boxes; adding eps promotes to torch's float32,
    so the arithmetic below is float32 in the same order. There eps vanishes against any
    height of a pixel or more, and an IoU of exactly 0.5 stays 0.5, a hit; in float64 it would
    land just under 0.5, a miss. The intersection is exact, as their integer one is.
    """
    box = np.asarray(box, dtype=np.float64)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    ih = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = (iw * ih).astype(np.float32)
    e = np.float32(eps)
    w1, h1 = np.float32(box[2] - box[0]), np.float32(box[3] - box[1]) + e
    w2, h2 = (boxes[:, 2] - boxes[:, 0]).astype(np.float32), (boxes[:, 3] - boxes[:, 1]).astype(np.float32) + e
    return inter / (w1 * h1 + w2 * h2 - inter + e)


def gt_boxes(anns: list[dict[str, Any]]) -> np.ndarray:
    """Non-crowd ground-truth boxes, [x, y, x+w, y+h] rounded to integers (LOST)."""
    boxes = []
    for a in anns:
        if a.get("iscrowd", 0) == 1:
            continue
        x, y, w, h = a["bbox"]
        boxes.append([int(round(v)) for v in (x, y, x + w, y + h)])
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 4)


def first_box(dets: list[dict[str, Any]]) -> np.ndarray | None:
    """The first mask's box [x1, y1, x2, y2]: its ``patch_box`` if recorded, else from toBbox."""
    if not dets:
        return None
    first = min(dets, key=lambda d: d.get("mask", 0))
    if "patch_box" in first:
        return np.asarray(first["patch_box"], dtype=np.float64)
    x, y, w, h = first["bbox"]
    return np.array([x, y, x + w, y + h], dtype=np.float64)


def evaluate(coco, results: list[dict[str, Any]]) -> Scores:
    """Every score of ``results`` (COCO results, class-agnostic) on the images of ``coco``."""
    boxes_only = bool(coco.dataset["annotations"]) and not any("segmentation" in a for a in coco.dataset["annotations"])
    gt = _ground_truth(coco)
    image_ids = sorted(gt.getImgIds())
    keep = set(image_ids)
    results = [r for r in results if int(r["image_id"]) in keep]
    by_image: dict[int, list[dict[str, Any]]] = {i: [] for i in image_ids}
    for r in results:
        by_image[int(r["image_id"])].append(r)

    hits = np.zeros(len(image_ids), dtype=bool)
    first_iou = np.zeros(len(image_ids))
    object_ids, object_images, best = [], [], []
    n_objects = 0  # non-crowd objects, boxes or masks: what CorLoc matched against
    for n, image_id in enumerate(image_ids):
        anns = gt.loadAnns(gt.getAnnIds(imgIds=[image_id]))
        dets = by_image[image_id]
        boxes = gt_boxes(anns)
        box = first_box(dets)
        if box is not None and len(boxes):
            ious = box_iou(box, boxes)
            first_iou[n] = float(ious.max())
            hits[n] = bool((ious >= 0.5).any())
        objects = [a for a in anns if a.get("iscrowd", 0) != 1]
        n_objects += len(objects)
        if not objects or boxes_only:
            continue
        gt_rles = [gt.annToRLE(a) for a in objects]
        if dets:
            dt_rles = [{"size": d["segmentation"]["size"], "counts": d["segmentation"]["counts"]} for d in dets]
            ious = np.asarray(mask_utils.iou(dt_rles, gt_rles, [0] * len(gt_rles))).reshape(len(dt_rles), len(gt_rles))
            best_here = ious.max(axis=0)
        else:
            best_here = np.zeros(len(objects))
        object_ids += [int(a["id"]) for a in objects]
        object_images += [image_id] * len(objects)
        best += [float(v) for v in best_here]

    best_arr = np.asarray(best, dtype=np.float64)
    return Scores(
        segm={k: float("nan") for k in METRICS} if boxes_only else coco_ap(gt, results, image_ids, "segm"),
        bbox=coco_ap(gt, results, image_ids, "bbox"),
        corloc=float(hits.mean()) if len(image_ids) else float("nan"),
        mean_best_iou=float(best_arr.mean()) if best_arr.size else float("nan"),
        image_ids=image_ids,
        corloc_hit=hits,
        first_box_iou=first_iou,
        object_ids=np.asarray(object_ids, dtype=np.int64),
        object_images=np.asarray(object_images, dtype=np.int64),
        best_iou=best_arr,
        counts={
            "images": len(image_ids),
            "images_without_boxes": int(sum(len(gt_boxes(gt.loadAnns(gt.getAnnIds(imgIds=[i])))) == 0 for i in image_ids)),
            "objects": n_objects,  # a boxes-only panel (VOC) has them too: CorLoc used them
            "objects_with_masks": int(best_arr.size),  # what mean best IoU averages over
            "masks": len(results),
        },
    )
