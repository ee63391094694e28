"""Saliency ground truth (a folder of masks, as ECSSD, DUTS-TE and DUT-OMRON ship) and the
scores TokenCut reports on it.

Definitions (TokenCut ``unsupervised_saliency_detection/metric.py``; predictions and masks at the
image's own size, foreground = an 8-bit mask value > 0.5, i.e. any grey above 0; DUTS-TE's
masks have anti-aliased grey edges, which count as foreground):

- **maxFβ**, β² = 0.3: for every image and each of 255 thresholds t ∈ {0, 1/255, …, 254/255},
  precision and recall of {prediction > t} (precision 1 when nothing is predicted, recall 1 when
  the mask is empty), Fβ = (1 + β²)·P·R / (β²·P + R) (0 where undefined); Fβ is averaged over
  images at each threshold and the maximum over thresholds is reported: a dataset-level maximum.
  FOUND's F-measure uses another β, so its numbers are not comparable.
- **IoU** and **accuracy**: prediction and mask binarised at 0.5; |P ∩ G| / |P ∪ G| and the share
  of equal pixels, each averaged over images. (TokenCut divides 0 by 0 when both are empty, which
  makes its mean NaN; here that image's IoU is 1.)
- **MAE** and **S-measure** (α = 0.5): ``pysodmetrics`` (``py_sod_metrics.MAE``, ``Smeasure``) on
  the prediction as 8-bit grey (× 255, rounded), which that library min–max normalises like
  MATLAB's ``mapminmax``, and the binarised mask (× 255); means over images.

Pure: the masks' bytes are read by ``panels.read_labels`` (which writes the ledger first).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError

BETA_SQ = 0.3
BINS = 255
MASK_SUFFIXES = (".png", ".bmp", ".jpg")


def read_mask(raw: bytes, where: Path, size: tuple[int, int]) -> tuple[np.ndarray, int]:
    """(the ground-truth mask (H, W) bool, how many of its pixels were neither 0 nor 255) from its
    file's bytes; ``size`` is its image's (W, H).

    Foreground is every pixel above 0 of the 8-bit grey mask, as TokenCut scores it (its
    ``metric.py`` compares the mask read with ``convert('L')`` to 0.5): DUTS-TE's masks are not all
    binary (anti-aliased edges), and a 0/1 mask counts its ones. The grey pixels are counted, so a
    panel says how much this rule decided."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            grey = np.asarray(im.convert("L"))
    except (OSError, ValueError) as error:
        raise ProbeError(where, f"is not an image ({error})", "give a folder of PNG masks (0 background, 255 object)") from None
    if (grey.shape[1], grey.shape[0]) != tuple(size):
        raise ProbeError(where, f"is {grey.shape[1]}×{grey.shape[0]} but its image is {size[0]}×{size[1]}", "give each image the mask of its own size")
    binary = grey > 0
    in_between = int(np.count_nonzero(binary & (grey < 255))) if grey.max(initial=0) > 1 else 0  # a 0/1 mask has none
    return binary, in_between


def mask_for(image: Path, masks: Path) -> Path | None:
    """The mask file of an image: same stem, a mask suffix (TokenCut: ``x.jpg`` → ``x.png``)."""
    for suffix in MASK_SUFFIXES:
        candidate = masks / Path(image).with_suffix(suffix)
        if candidate.is_file():
            return candidate
    return None


@dataclass
class SaliencyScores:
    max_f: float
    iou: float
    accuracy: float
    mae: float
    s_measure: float
    image_ids: list[int]
    f_curve: np.ndarray  # (BINS,) mean Fβ at each threshold
    per_image_iou: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)

    def table(self) -> dict[str, float]:
        return {"max_f": self.max_f, "iou": self.iou, "accuracy": self.accuracy, "mae": self.mae, "s_measure": self.s_measure}


def precision_recall(pred: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    tp = float(np.logical_and(pred, gt).sum())
    area, gt_area = float(pred.sum()), float(gt.sum())
    return (tp / area if area else 1.0), (tp / gt_area if gt_area else 1.0)


def f_beta(p: np.ndarray, r: np.ndarray, beta_sq: float = BETA_SQ) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        f = (1 + beta_sq) * p * r / (beta_sq * p + r)
    return np.nan_to_num(f, nan=0.0)


def f_curve(pred: np.ndarray, gt: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Fβ of {pred > t} for the 255 thresholds t = k/255, by one histogram of the prediction."""
    pred = np.asarray(pred, dtype=np.float64).ravel()
    gt = np.asarray(gt, dtype=bool).ravel()
    thresholds = np.arange(0.0, 1.0, 1.0 / bins)
    # count of pixels strictly above each threshold, overall and among the mask's pixels
    order = np.sort(pred)
    above = pred.size - np.searchsorted(order, thresholds, side="right")
    order_fg = np.sort(pred[gt])
    tp = order_fg.size - np.searchsorted(order_fg, thresholds, side="right")
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(above > 0, tp / np.maximum(above, 1), 1.0)
        recall = np.full(bins, 1.0) if gt.sum() == 0 else tp / gt.sum()
    return f_beta(precision, recall)


def evaluate(pairs: Iterable[tuple[np.ndarray, np.ndarray]], image_ids: list[int]) -> SaliencyScores:
    """Every saliency score of soft or binary predictions (values in [0, 1]) against binary masks,
    (prediction, mask) one image at a time (an iterator will do: memory holds one image's
    prediction and mask, whatever the panel's size)."""
    from py_sod_metrics import MAE, Smeasure

    mae, sm = MAE(), Smeasure()
    curves, ious, accs = [], [], []
    for pred, gt in pairs:
        pred = np.asarray(pred, dtype=np.float64)
        if pred.shape != gt.shape:
            raise ProbeError(None, f"a prediction of shape {pred.shape} meets a mask of shape {gt.shape}", "predict at the image's own size")
        curves.append(f_curve(pred, gt))
        p = pred > 0.5
        union = np.logical_or(p, gt).sum()
        ious.append(float(np.logical_and(p, gt).sum() / union) if union else 1.0)
        accs.append(float((p == gt).mean()))
        grey = np.clip(np.round(pred * 255), 0, 255).astype(np.uint8)
        mae.step(grey, gt.astype(np.uint8) * 255)
        sm.step(grey, gt.astype(np.uint8) * 255)
    if not curves:
        raise ProbeError(None, "no image of the saliency panel has a prediction", "extract the panel's images first (probe extract --panel)")
    curve = np.mean(curves, axis=0)
    return SaliencyScores(
        max_f=float(curve.max()),
        iou=float(np.mean(ious)),
        accuracy=float(np.mean(accs)),
        mae=float(mae.get_results()["mae"]),
        s_measure=float(sm.get_results()["sm"]),
        image_ids=list(image_ids),
        f_curve=curve,
        per_image_iou=np.asarray(ious),
        counts={"images": len(curves)},
    )


def score_results(coco, results: list[dict], soft: dict[int, np.ndarray] | None = None) -> SaliencyScores:
    """Saliency scores of COCO results (the first mask of each image) on a saliency panel's labels.

    ``soft`` may give a refined prediction per COCO image id (the bilateral solver's output) to
    score instead of the binary mask. An image without a result is scored as an empty prediction.
    """
    from .masks import decode_rle

    first: dict[int, dict] = {}
    for r in results:
        i = int(r["image_id"])
        if i not in first or r.get("mask", 0) < first[i].get("mask", 0):
            first[i] = r
    image_ids = sorted(coco.getImgIds())

    def pairs():  # one image's ground truth and prediction at a time
        for i in image_ids:
            anns = coco.loadAnns(coco.getAnnIds(imgIds=[i]))
            info = coco.imgs[i]
            gt = coco.annToMask(anns[0]).astype(bool) if anns else np.zeros((info["height"], info["width"]), dtype=bool)
            if soft is not None and i in soft:
                pred = np.asarray(soft[i], dtype=np.float64)
            elif i in first:
                pred = decode_rle(first[i]["segmentation"]).astype(np.float64)
            else:
                pred = np.zeros(gt.shape)
            yield pred, gt

    return evaluate(pairs(), image_ids)
