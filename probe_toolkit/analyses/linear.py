"""Linear probes on the frozen tokens at 224 px: how linearly the tokens separate the categories.

A second reading of each checkpoint: one linear layer,
trained with labels after training, on the teacher's last-block tokens of the 224 view. Labels
come only from panels, read through the one ledgered function, the train panel before fitting
and the val panel only after every fit is done.

Two protocols, both fitted to their optimum on cached features rather than trained by SGD with
augmentations (so their numbers are not the published probes': DINOv2's dense probe, Oquab et al.
2023, facebookresearch/dinov2 with mmsegmentation, trains a BatchNorm + 1 × 1 convolution on the
normed tokens with SGD; this one is the convex problem on the pre-norm tokens, with no random
seed or schedule to tune):

- ``patch`` (dense): each patch of the 224 view (196 at /16, 784 at /8, 256 at /14) gets a class from the panel's masks (below), a
  torch linear layer maps a token to class logits (features standardised with the train
  statistics; zero start; full-batch L-BFGS; loss = mean cross-entropy + ``weight_decay``/2 ·
  ‖W‖², the L2-regularised multinomial logistic regression, solved to its optimum). The weight
  decay is chosen on a hold-out of the train panel's images, never on val. Scores: patch mIoU
  and accuracy, and dense mIoU with the logits sampled bilinearly at every original pixel of
  the crop region (the original image's pixels whose centres fall inside the 224 view).
- ``image``: the class token (networks that have one) or the mean of the patch tokens → the
  categories present (multi-label), scikit-learn one-vs-rest LogisticRegression with C chosen
  on the same kind of train hold-out; score: mean average precision.

Patch labels. Instances (COCO polygons or RLE, decoded by pycocotools) are painted into a class
map at the original size: crowd regions first as ignore, then instances by decreasing area so
that small objects lie on top; class 0 is background (no category). The map is carried into
the 224 view by the view's own geometry (nearest: each view pixel takes the label under its
centre), and a patch takes the class (background included) covering most of its p × p
pixels (p the patch size) if that class covers at least ``MAJORITY`` = 50 % of them; otherwise the patch is
ignored (``IGNORE`` = -1), as are patches whose pixels are mostly crowd.

mIoU averages the classes whose union is non-empty (a class absent from val but predicted
counts as 0); accuracy counts non-ignored patches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..store.images import ViewGeometry

IGNORE = -1
BACKGROUND = 0
MAJORITY = 0.5  # the winning class must cover at least half of a patch's pixels
PATCH = 16
VIEW = 224


# ----------------------------------------------------------------------------------------------
# Label space and labels (pure: annotation dicts in, arrays out)


@dataclass(frozen=True)
class LabelSpace:
    """The train panel's categories, in id order; patch class i + 1 is category ``ids[i]``."""

    ids: tuple[int, ...]
    names: tuple[str, ...]

    @classmethod
    def from_categories(cls, categories: Iterable[dict[str, Any]]) -> LabelSpace:
        ordered = sorted(categories, key=lambda c: int(c["id"]))
        return cls(tuple(int(c["id"]) for c in ordered), tuple(str(c.get("name", c["id"])) for c in ordered))

    @property
    def patch_classes(self) -> tuple[str, ...]:
        """Class names at patch level: background first."""
        return ("background", *self.names)

    def patch_class(self, category_id: int) -> int:
        return 1 + self.ids.index(int(category_id))

    def missing(self, other: LabelSpace) -> list[str]:
        """Categories of ``other`` that this space lacks (id:name)."""
        mine = dict(zip(self.ids, self.names))
        return [f"{i}:{n}" for i, n in zip(other.ids, other.names) if mine.get(i) != n]

    def as_dict(self) -> dict[str, list]:
        return {"category_ids": list(self.ids), "category_names": list(self.names)}


def class_map(coco: Any, image_id: int, space: LabelSpace) -> np.ndarray:
    """The class of every original pixel of one panel image (int16): 0 background, i + 1 category
    ``space.ids[i]``, IGNORE under crowd regions.

    ``coco`` is the pycocotools ``COCO`` object ``panels.read_labels`` hands out; its
    ``annToMask`` decodes polygons and RLE at the image's size. Crowd regions are painted first,
    then instances by decreasing area (a stable sort), so a smaller object over a larger one
    keeps its pixels.
    """
    record = coco.imgs[image_id]
    out = np.zeros((int(record["height"]), int(record["width"])), dtype=np.int16)
    masks = [(ann, coco.annToMask(ann).astype(bool)) for ann in coco.imgToAnns.get(image_id, [])]
    for ann, mask in masks:
        if ann.get("iscrowd", 0):
            out[mask] = IGNORE
    solid = [(ann, mask) for ann, mask in masks if not ann.get("iscrowd", 0)]
    for ann, mask in sorted(solid, key=lambda am: -int(am[1].sum())):
        out[mask] = space.patch_class(ann["category_id"])
    return out


def view_labels(classes: np.ndarray, geometry: ViewGeometry) -> np.ndarray:
    """The class map carried into a view (size × size): each view pixel takes the class under its centre."""
    xs, ys = geometry.source_centres()
    height, width = classes.shape
    cols = np.minimum(np.floor(xs).astype(np.int64), width - 1)
    rows = np.minimum(np.floor(ys).astype(np.int64), height - 1)
    return classes[np.ix_(rows, cols)]


def patch_labels(view: np.ndarray, n_classes: int, patch: int = PATCH, majority: float = MAJORITY) -> np.ndarray:
    """Per patch (row-major, patch G·r + c on the G × G grid, G = view // patch), the class covering most of its pixels, or IGNORE.

    Ignore pixels (crowd) count for no class; ties go to the lower class index.
    """
    g = view.shape[0] // patch
    view = view[: g * patch, : g * patch]  # pixels beyond the last whole patch, as the backbone drops them
    blocks = view.reshape(g, patch, g, patch).transpose(0, 2, 1, 3).reshape(g * g, patch * patch)
    counts = np.stack([(blocks == k).sum(1) for k in range(n_classes)], axis=1)
    best = counts.argmax(1)
    enough = counts[np.arange(g * g), best] >= majority * patch * patch
    return np.where(enough, best, IGNORE).astype(np.int16)


def image_categories(coco: Any, image_ids: Sequence[int], space: LabelSpace) -> np.ndarray:
    """Multi-hot (image, category): the categories present in each image (crowd regions included)."""
    out = np.zeros((len(image_ids), len(space.ids)), dtype=bool)
    for i, image_id in enumerate(image_ids):
        for ann in coco.imgToAnns.get(image_id, []):
            out[i, space.patch_class(ann["category_id"]) - 1] = True
    return out


# ----------------------------------------------------------------------------------------------
# Metrics (pure)


def confusion(target: np.ndarray, predicted: np.ndarray, n_classes: int) -> np.ndarray:
    """Counts (class, predicted) over the entries whose target is not IGNORE."""
    target, predicted = np.asarray(target).ravel(), np.asarray(predicted).ravel()
    keep = target != IGNORE
    flat = target[keep].astype(np.int64) * n_classes + predicted[keep].astype(np.int64)
    return np.bincount(flat, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def iou(conf: np.ndarray) -> np.ndarray:
    """Per class: TP / (TP + FP + FN); NaN where the union is empty."""
    tp = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, tp / union, np.nan)


def mean_iou(conf: np.ndarray) -> float:
    values = iou(conf)
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def accuracy(conf: np.ndarray) -> float:
    total = conf.sum()
    return float(np.trace(conf) / total) if total else float("nan")


def average_precision(targets: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per category, scikit-learn's average precision; NaN where val has no positive."""
    from sklearn.metrics import average_precision_score

    out = np.full(targets.shape[1], np.nan)
    for k in range(targets.shape[1]):
        if targets[:, k].any():
            out[k] = average_precision_score(targets[:, k], scores[:, k])
    return out


def dense_confusion(logits: np.ndarray, region_classes: np.ndarray, geometry: ViewGeometry, n_classes: int) -> np.ndarray:
    """Confusion of one image at the original resolution of its crop region.

    ``logits`` (class, G, G) live on the view's patch centres; each original pixel of the
    region (``geometry.source_region()``) samples them bilinearly at its exact position in the
    view (grid_sample, align_corners=False, border padding), and its argmax is compared with
    ``region_classes`` (the class map cut to that region).
    """
    x0, y0, x1, y1 = geometry.source_region()
    (w, h), (nw, nh) = geometry.original, geometry.resized
    left, top = geometry.box[:2]
    u = (np.arange(x0, x1) + 0.5) * nw / w - left  # view coordinates of the pixel centres
    v = (np.arange(y0, y1) + 0.5) * nh / h - top
    grid = np.stack(np.meshgrid(u / geometry.size * 2 - 1, v / geometry.size * 2 - 1, indexing="xy"), axis=-1)
    import torch  # here, not at the top: the label maps above serve probe attention-masks, which needs no torch

    sampled = torch.nn.functional.grid_sample(
        torch.as_tensor(logits, dtype=torch.float32)[None],
        torch.as_tensor(grid, dtype=torch.float32)[None],
        mode="bilinear",
        padding_mode="border",
        align_corners=False,
    )[0]
    return confusion(region_classes, sampled.argmax(0).numpy(), n_classes)


# ----------------------------------------------------------------------------------------------
# The dense probe: one torch linear layer on standardised tokens


class FitSettings(Protocol):
    """How the dense probe is fitted (``protocols.linear.LinearSettings`` declares each field once).

    The objective is convex, so the fit is full-batch L-BFGS from zero to its optimum (what
    scikit-learn's lbfgs solver reaches, in float32 torch); ``epochs`` bounds the iterations,
    each a full pass over the train patches (line-search passes come on top, at most 25 %).
    """

    epochs: int
    weight_decays: tuple[float, ...]  # strongest first: ties keep it
    holdout: float  # share of the train panel's images held out to choose the weight decay
    seed: int  # the hold-out split
    tolerance: float  # stop when every gradient entry of the mean loss is smaller


def fit_record(settings: FitSettings) -> dict[str, Any]:
    """The fit as a record says it: the optimiser and loss beside the settings."""
    return {
        "optimizer": "full-batch L-BFGS (torch, strong Wolfe line search, history 10), zero start",
        "loss": "mean cross-entropy + weight_decay/2 * |W|^2 (bias free)",
        "epochs": settings.epochs,
        "weight_decays": list(settings.weight_decays),
        "holdout": settings.holdout,
        "seed": settings.seed,
        "tolerance": settings.tolerance,
    }


@dataclass(frozen=True)
class PatchProbe:
    """logits = ((x - mean) / scale) @ weight.T + bias, classes background-first."""

    weight: np.ndarray  # (class, channel)
    bias: np.ndarray  # (class,)
    mean: np.ndarray  # (channel,)
    scale: np.ndarray  # (channel,)
    weight_decay: float

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """(..., channel) → (..., class), float32."""
        x = (np.asarray(tokens, dtype=np.float32) - self.mean) / self.scale
        return x @ self.weight.T + self.bias

    def predict(self, tokens: np.ndarray) -> np.ndarray:
        return self.logits(tokens).argmax(-1)


def standardiser(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and spread of the train features (a spread of 0 becomes 1)."""
    x = np.asarray(features, dtype=np.float64)
    mean, scale = x.mean(0), x.std(0)
    return mean.astype(np.float32), np.where(scale > 0, scale, 1.0).astype(np.float32)


# Features (rows × channels) below which a fit runs on one torch thread: a pool's threads then cost more
# than the products they share, and on a busy machine each step waits for the slowest thread's core.
ONE_THREAD_BELOW = 1 << 22


def fit_patch_probe(features: np.ndarray, labels: np.ndarray, n_classes: int, weight_decay: float, settings: FitSettings) -> PatchProbe:
    """Fit the linear layer on (row, channel) features and row labels (IGNORE rows are skipped); a small
    fit on one thread (``ONE_THREAD_BELOW``)."""
    from contextlib import nullcontext

    import torch  # noqa: F401  loaded before the limit, which binds only the libraries already loaded

    from ..infra.runner import task_threads

    with task_threads(1) if np.size(features) < ONE_THREAD_BELOW else nullcontext():
        return _fit_patch_probe(features, labels, n_classes, weight_decay, settings)


def _fit_patch_probe(features: np.ndarray, labels: np.ndarray, n_classes: int, weight_decay: float, settings: FitSettings) -> PatchProbe:
    import torch

    keep = np.asarray(labels) != IGNORE
    x_all = np.asarray(features, dtype=np.float32)[keep]
    channels = x_all.shape[1]
    if not len(x_all):
        return PatchProbe(
            np.zeros((n_classes, channels), np.float32),
            np.zeros(n_classes, np.float32),
            np.zeros(channels, np.float32),
            np.ones(channels, np.float32),
            float(weight_decay),
        )
    mean, scale = standardiser(x_all)
    x = torch.from_numpy((x_all - mean) / scale)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64)[keep])
    weight = torch.zeros(n_classes, channels, requires_grad=True)
    bias = torch.zeros(n_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=settings.epochs,
        history_size=10,
        line_search_fn="strong_wolfe",
        tolerance_grad=settings.tolerance,
        tolerance_change=1e-9,
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(torch.addmm(bias, x, weight.T), y) + 0.5 * weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    if settings.epochs > 0:
        optimizer.step(closure)
    return PatchProbe(weight.detach().numpy().copy(), bias.detach().numpy().copy(), mean, scale, float(weight_decay))


def holdout_split(n_images: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, held-out) image indices: a seeded permutation, at least one image on each side."""
    if n_images < 2:
        raise ValueError("choosing a regularisation needs at least two train images")
    order = np.random.default_rng(seed).permutation(n_images)
    held = min(max(1, int(round(share * n_images))), n_images - 1)
    return np.sort(order[held:]), np.sort(order[:held])


@dataclass(frozen=True)
class PatchFit:
    probe: PatchProbe
    holdout_miou: np.ndarray  # one per settings.weight_decays
    n_fit_patches: int
    n_ignored_patches: int


def fit_patch_level(tokens: np.ndarray, labels: np.ndarray, n_classes: int, settings: FitSettings) -> PatchFit:
    """Choose the weight decay on a hold-out of the train images, then refit on all of them.

    ``tokens`` (image, patch, channel) and ``labels`` (image, patch) are the train panel's only.
    """
    tokens = np.asarray(tokens, dtype=np.float32)
    fit_idx, held_idx = holdout_split(len(tokens), settings.holdout, settings.seed)
    scores = []
    for wd in settings.weight_decays:
        probe = fit_patch_probe(tokens[fit_idx].reshape(-1, tokens.shape[-1]), labels[fit_idx].ravel(), n_classes, wd, settings)
        scores.append(mean_iou(confusion(labels[held_idx], probe.predict(tokens[held_idx]), n_classes)))
    scores_arr = np.asarray(scores, dtype=np.float64)
    best = int(np.nanargmax(scores_arr)) if np.isfinite(scores_arr).any() else 0
    probe = fit_patch_probe(tokens.reshape(-1, tokens.shape[-1]), labels.ravel(), n_classes, settings.weight_decays[best], settings)
    ignored = int((labels == IGNORE).sum())
    return PatchFit(probe, scores_arr, int(labels.size - ignored), ignored)


# ----------------------------------------------------------------------------------------------
# The image-level probe: scikit-learn, one-vs-rest


IMAGE_CS: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # strongest regularisation first


@dataclass(frozen=True)
class ImageFit:
    model: Any  # sklearn Pipeline(StandardScaler, OneVsRestClassifier(LogisticRegression))
    c: float
    holdout_map: np.ndarray  # one per C


def image_classifier(c: float, seed: int, max_iter: int = 1000):
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), OneVsRestClassifier(LogisticRegression(C=c, max_iter=max_iter, random_state=seed)))


def image_scores(model: Any, features: np.ndarray) -> np.ndarray:
    return np.asarray(model.decision_function(np.asarray(features, dtype=np.float64)), dtype=np.float64).reshape(len(features), -1)


def fit_image_level(features: np.ndarray, targets: np.ndarray, *, cs: Sequence[float] = IMAGE_CS, holdout: float = 0.2, seed: int = 0) -> ImageFit:
    """Choose C on a hold-out of the train images (mean AP), then refit on all of them."""
    import warnings

    features = np.asarray(features, dtype=np.float64)
    fit_idx, held_idx = holdout_split(len(features), holdout, seed)
    scores = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a category absent from a split: sklearn's constant predictor
        for c in cs:
            model = image_classifier(c, seed).fit(features[fit_idx], targets[fit_idx])
            ap = average_precision(targets[held_idx], image_scores(model, features[held_idx]))
            scores.append(float(np.nanmean(ap)) if np.isfinite(ap).any() else np.nan)
        scores_arr = np.asarray(scores, dtype=np.float64)
        best = int(np.nanargmax(scores_arr)) if np.isfinite(scores_arr).any() else 0
        model = image_classifier(cs[best], seed).fit(features, targets)
    return ImageFit(model, float(cs[best]), scores_arr)
