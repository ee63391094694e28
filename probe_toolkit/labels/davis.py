"""DAVIS-2017 semi-supervised scores, as davisvideochallenge/davis2017-evaluation computes them.

- J (region similarity): IoU of the object's predicted and true masks; 1 when both are empty.
- F (boundary measure): each mask's boundary is a one-pixel map (``seg2bmap``: a pixel is on it
  when it differs from its right, lower or lower-right neighbour; the last row and column compare
  with their one neighbour, the corner never); each boundary is dilated by a disk of radius
  ceil(0.008 × image diagonal) pixels (a disk: offsets with dx² + dy² ≤ r², as skimage's
  ``disk``); precision = predicted boundary pixels within the true dilated boundary, recall the
  converse; F = 2PR / (P + R), with the repository's conventions for empty boundaries.
- Per object and sequence: mean, recall (share of frames above 0.5) and decay (mean of the
  first quarter of frames minus the last, by the repository's bins) over the frames scored —
  every frame but the first (given) and the last; an object is a label 1..max of the first
  annotation; 255 is void and counts as background in the semi-supervised task.
- J&F-mean = (mean of J-means over objects + mean of F-means) / 2.

Pure arrays in, arrays out; the CSV tables are written by ``commands/propagate.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

THRESHOLD = 0.008  # davis2017-evaluation db_eval_boundary bound_th


def region_iou(truth: np.ndarray, prediction: np.ndarray) -> float:
    t, p = np.asarray(truth, bool), np.asarray(prediction, bool)
    union = np.logical_or(t, p).sum()
    return 1.0 if union == 0 else float(np.logical_and(t, p).sum() / union)


def seg2bmap(mask: np.ndarray) -> np.ndarray:
    """One-pixel boundary map of a binary mask (the repository's ``_seg2bmap`` at full size)."""
    seg = np.asarray(mask, bool)
    east, south, south_east = np.zeros_like(seg), np.zeros_like(seg), np.zeros_like(seg)
    east[:, :-1] = seg[:, 1:]
    south[:-1, :] = seg[1:, :]
    south_east[:-1, :-1] = seg[1:, 1:]
    b = (seg ^ east) | (seg ^ south) | (seg ^ south_east)
    b[-1, :] = seg[-1, :] ^ east[-1, :]
    b[:, -1] = seg[:, -1] ^ south[:, -1]
    b[-1, -1] = False
    return b


def disk(radius: int) -> np.ndarray:
    r = int(radius)
    y, x = np.mgrid[-r : r + 1, -r : r + 1]
    return (x * x + y * y) <= r * r


def tolerance(shape: tuple[int, int], threshold: float = THRESHOLD) -> int:
    return int(threshold) if threshold >= 1 else int(math.ceil(threshold * math.hypot(*shape)))


def boundary_f(truth: np.ndarray, prediction: np.ndarray, threshold: float = THRESHOLD) -> float:
    """The boundary F-measure of one object in one frame."""
    from scipy import ndimage  # here: propagate's start-up, up to its first frame, needs no scipy

    fg, gt = seg2bmap(prediction), seg2bmap(truth)
    structure = disk(tolerance(fg.shape, threshold))
    fg_dil = ndimage.binary_dilation(fg, structure=structure)
    gt_dil = ndimage.binary_dilation(gt, structure=structure)
    n_fg, n_gt = int(fg.sum()), int(gt.sum())
    if n_fg == 0 and n_gt > 0:
        precision, recall = 1.0, 0.0
    elif n_fg > 0 and n_gt == 0:
        precision, recall = 0.0, 1.0
    elif n_fg == 0 and n_gt == 0:
        precision, recall = 1.0, 1.0
    else:
        precision = float((fg & gt_dil).sum() / n_fg)
        recall = float((gt & fg_dil).sum() / n_gt)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def statistics(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, recall, decay) of per-frame values, the repository's ``db_statistics``."""
    v = np.asarray(values, dtype=np.float64)
    mean = float(np.nanmean(v))
    recall = float(np.nanmean(v > 0.5))
    ids = (np.round(np.linspace(1, len(v), 5) + 1e-10) - 1).astype(np.int64)
    bins = [v[ids[i] : ids[i + 1] + 1] for i in range(4)]
    with np.errstate(all="ignore"):
        decay = float(np.nanmean(bins[0]) - np.nanmean(bins[3])) if len(bins[0]) and len(bins[3]) else float("nan")
    return mean, recall, decay


@dataclass
class SequenceScores:
    name: str
    j: np.ndarray  # (object, frame) over the scored frames
    f: np.ndarray

    def rows(self) -> list[dict[str, float | str]]:
        out = []
        for o in range(self.j.shape[0]):
            jm, jr, jd = statistics(self.j[o])
            fm, fr, fd = statistics(self.f[o])
            out.append({"Sequence": f"{self.name}_{o + 1}", "J-Mean": jm, "J-Recall": jr, "J-Decay": jd, "F-Mean": fm, "F-Recall": fr, "F-Decay": fd})
        return out


def score_sequence(name: str, truth: list[np.ndarray], prediction: list[np.ndarray], threshold: float = THRESHOLD) -> SequenceScores:
    """J and F of every object of the first annotation over every frame but the first and the last."""
    if len(truth) != len(prediction):
        raise ValueError(f"{name}: {len(truth)} annotations, {len(prediction)} predictions")
    if len(truth) < 3:
        raise ValueError(f"{name}: {len(truth)} frames leave none to score (the first and last are not)")
    first = np.asarray(truth[0])
    n_objects = int(np.where(first == 255, 0, first).max())
    frames = range(1, len(truth) - 1)
    j = np.zeros((n_objects, len(frames)))
    f = np.zeros((n_objects, len(frames)))
    for col, t in enumerate(frames):
        gt = np.asarray(truth[t])
        gt = np.where(gt == 255, 0, gt)
        pred = np.asarray(prediction[t])
        if pred.shape != gt.shape:
            raise ValueError(f"{name}: frame {t} predicted at {pred.shape}, annotated at {gt.shape}")
        for o in range(n_objects):
            j[o, col] = region_iou(gt == o + 1, pred == o + 1)
            f[o, col] = boundary_f(gt == o + 1, pred == o + 1, threshold)
    return SequenceScores(name, j, f)


GLOBAL_COLUMNS = ("J&F-Mean", "J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay")


def global_row(sequences: list[SequenceScores]) -> dict[str, float]:
    """The repository's global table: means over every object of every sequence."""
    rows = [r for s in sequences for r in s.rows()]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in GLOBAL_COLUMNS[1:]}
    return {"J&F-Mean": (mean["J-Mean"] + mean["F-Mean"]) / 2, **mean}


def davis_palette() -> np.ndarray:
    """(256, 3) uint8: DAVIS's (and PASCAL VOC's) palette, bit-interleaved label colours."""
    out = np.zeros((256, 3), np.uint8)
    for i in range(256):
        c, rgb = i, [0, 0, 0]
        for j in range(8):
            for ch in range(3):
                rgb[ch] |= ((c >> ch) & 1) << (7 - j)
            c >>= 3
        out[i] = rgb
    return out
