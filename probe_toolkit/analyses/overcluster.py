"""Overclustering: k-means on a set's patch tokens, clusters matched to classes, mIoU.

As vpariza/NeCo ``experiments/overcluster/eval_overcluster.py`` and ``experiments/utils.py``
run it (Leopart's protocol, Ziegler & Asano, CVPR 2022): every patch token of the val images
(through the network's final norm), standardised per channel over all tokens (scikit-learn's
``StandardScaler``: population variance, a channel of zero variance divided by 1), projected
on its first 50 principal components (``faiss.PCAMatrix``), clustered by ``faiss.Kmeans`` (100
iterations, 5 restarts keeping the best, seeds 0..4, each seed a clustering), each image's
cluster map upsampled nearest to 100 × 100 and compared with its label map resized nearest to
100 × 100, 255 ignored. Matching: with k = the number of classes, Hungarian (one-to-one,
``linear_sum_assignment`` on 1 − IoU; unmatched clusters become background); with more
clusters than classes, many-to-one: each cluster goes to the class of highest precision
(ties to the lower class). mIoU is the mean over every class of TP / (TP + FP + FN), a class
without a pixel counting 0, and the run's figure the mean over seeds.

The standardisation makes the final norm's affine part irrelevant (a per-channel scale and
shift that standardising removes), so tokens through the norm and through a norm without its
weights give the same clusters; probe applies the stored norm anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

K_VALUES = (100, 300, 500)  # NeCo's overclustering table (K = 500 in Leopart's)
PCA_DIM = 50  # configs/*: pca_dim
SEEDS = 5  # configs/*: num_seeds (seeds 0..4)
ITERATIONS = 100  # utils.py cluster(): niter
RESTARTS = 5  # nredo
MASK_SIDE = 100  # eval_overcluster.py mask_eval_size
IGNORE = 255


def standardise(x: np.ndarray) -> np.ndarray:
    """Per-channel (x − mean) / std over all rows (std with ddof 0; 1 where it is 0), float32 as NeCo's arrays."""
    x64 = np.asarray(x, np.float64)
    mean = x64.mean(axis=0)
    std = x64.std(axis=0)
    std[std == 0] = 1.0
    return ((x64 - mean) / std).astype(np.float32)


def project(x: np.ndarray, dim: int = PCA_DIM) -> np.ndarray:
    """The rows on their first ``dim`` principal components (faiss.PCAMatrix trained on them)."""
    import faiss

    x = np.ascontiguousarray(x, np.float32)
    pca = faiss.PCAMatrix(x.shape[1], dim)
    pca.train(x)
    return pca.apply_py(x)


def kmeans(x: np.ndarray, k: int, seed: int, iterations: int = ITERATIONS, restarts: int = RESTARTS) -> np.ndarray:
    """faiss.Kmeans' assignment of every row (its defaults otherwise: at most 256 training rows per centroid, sampled by ``seed``)."""
    import faiss

    x = np.ascontiguousarray(x, np.float32)
    model = faiss.Kmeans(x.shape[1], k, niter=iterations, nredo=restarts, seed=seed, verbose=False, gpu=False, spherical=False)
    model.train(x)
    _, assigned = model.index.search(x, 1)
    return assigned[:, 0].astype(np.int64)


def nearest(maps: np.ndarray, side: int) -> np.ndarray:
    """(n, h, w) → (n, side, side) as ``F.interpolate(mode='nearest')`` (``store.hbird_views.resize_nearest``, the one rule)."""
    from ..store.hbird_views import resize_nearest

    return np.stack([resize_nearest(m, (side, side)) for m in np.asarray(maps)])


def confusion(truth: np.ndarray, predicted: np.ndarray, classes: int, clusters: int) -> np.ndarray:
    """(classes, clusters) pixel counts over the pixels whose truth is not 255."""
    t, p = np.asarray(truth).ravel(), np.asarray(predicted).ravel()
    keep = t != IGNORE
    t, p = t[keep].astype(np.int64), p[keep].astype(np.int64)
    if len(t) and (t.max() >= classes or t.min() < 0):
        raise ValueError(f"a label {int(t.max())} lies outside the {classes} classes")
    return np.bincount(t * clusters + p, minlength=classes * clusters).reshape(classes, clusters)


@dataclass
class Matched:
    miou: float
    iou: np.ndarray  # (classes,)
    assignment: np.ndarray  # (clusters,): the class each cluster became
    matching: str  # hungarian or many-to-one


def _iou(conf: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    classes = conf.shape[0]
    merged = np.zeros((classes, classes), np.int64)  # truth × class predicted after the matching
    for c in range(classes):
        merged[:, c] = conf[:, assignment == c].sum(axis=1)
    tp = np.diag(merged).astype(np.float64)
    fp = merged.sum(axis=0) - tp
    fn = merged.sum(axis=1) - tp
    return tp / np.maximum(tp + fp + fn, 1e-8)


def match(conf: np.ndarray) -> Matched:
    """NeCo's ``PredsmIoU.compute``: Hungarian when clusters = classes, else many-to-one by precision."""
    from scipy.optimize import linear_sum_assignment

    classes, clusters = conf.shape
    conf = np.asarray(conf, np.int64)
    truth_total, cluster_total = conf.sum(axis=1), conf.sum(axis=0)
    if clusters == classes:
        iou = conf / np.maximum(truth_total[:, None] + cluster_total[None, :] - conf, 1e-8)
        rows, cols = linear_sum_assignment(1 - iou)
        assignment = np.zeros(clusters, np.int64)  # unmatched clusters merge into background (class 0)
        assignment[cols] = rows
        kind = "hungarian"
    else:
        precision = conf / np.maximum(cluster_total[None, :], 1e-8)
        assignment = np.argmax(precision, axis=0)  # the first (lowest) class on ties, as the strict > of the reference
        kind = "many-to-one"
    iou = _iou(conf, assignment)
    return Matched(float(iou.mean()), iou, assignment, kind)
