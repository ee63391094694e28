"""Hummingbird dense in-context evaluation (Balažević et al., NeurIPS 2023) on frozen patch tokens.

The rule of vpariza/open-hummingbird-eval 2.0 (commit 5e79da2), ``hbird/hbird_eval.py``
(``HbirdEvaluation``), read there and written anew here:

- **Memory bank.** Every train view's patch features, L2-normalised, each with its patch-level
  label distribution: the share of the patch's pixels of each class, the label map being at the
  input size (``_patchify_gt`` + ``one_hot(...).mean``). Before that, the train label's 255
  (VOC's boundary/ignore) is mapped to class 0, background (``y[y == 255] = 0``).
- **Bounded bank** (``memory_size`` set): ``patches per view = max(1, memory_size // views)``,
  views = train images × augmentation epochs. In each view a patch's score is the sum, over the
  classes present in it, of the number of the view's patches holding that class; the score is
  multiplied by a uniform draw in [0, 1) (one draw per non-empty patch, in patch order; an empty
  patch scores 1e6), and the ``n`` patches of smallest score are kept (``_sample_features``,
  ``torch.topk(largest=False)``, ascending). Patches of rare classes are therefore favoured.
- **Retrieval.** The k = 30 bank rows of largest dot product with each query patch (faiss
  ``IndexFlatIP`` or ScaNN); the bank is normalised, so this ranks by cosine.
- **Label transfer** (``_cross_attention``): softmax over the k neighbours of cos / β, β = 0.02,
  weighting their label distributions; reshaped to the patch grid, upsampled bilinearly
  (``F.interpolate(mode="bilinear")``, align_corners False) to the label's size, argmax.
- **Score** (``hbird/utils/eval_metrics.py`` ``PredsmIoU``): one confusion matrix accumulated
  over all val pixels whose label is not 255 (and within 0..C-1); IoU_c = TP / max(TP + FP + FN,
  1e-8) and mIoU the mean over **all** C classes (a class absent from truth and prediction counts
  0). ``compute()`` is called with its defaults, so a Hungarian matching (scipy
  ``linear_sum_assignment`` on 1 − IoU) permutes the predicted classes first.
- Defaults of ``hbird_evaluation``: ``n_neighbours=30``, ``memory_size=None`` (unbounded),
  ``augmentation_epoch=1``, ``ignore_index=255``; eval.py seeds 123. The README's VOC table uses
  512 px views for DINO (504 for DINOv2), 2 augmentation epochs, ScaNN and memories of
  1024·10², 1024·10³ and 1024·10⁴ patches (``PUBLISHED_MEMORY_SIZES``); DINO ViT-S/16
  37.2 / 43.1 / 46.6 mIoU.
- The labels the reference scores are the val label maps **resized to the input size** (nearest,
  ``hbird/utils/image_transformations.py``), and the prediction is upsampled to that size;
  ``resize_nearest`` is that resize (torch's legacy nearest: source = floor(dst · in / out)).

Views (the caller's, listed here so that a command can reproduce them; ``hbird/utils/transforms.py``
and ``image_transformations.py``, ``store/hbird_views.py``): a train view is, in ``CombTransforms``'
order, colour jitter of the whole image (brightness, contrast, saturation, hue 0.1, each applied
with probability 0.5), ``ToTensor`` and normalisation, then ``RandomResizedCrop`` of the float
tensor and of its label together to input × input (scale (0.5, 2.0), ratio (3/4, 4/3),
torchvision's ``get_params``: a draw of scale above 1 cannot fit the image and is drawn again, up
to ten tries before it takes the whole image centre-cropped to the ratio range, so crops cover
50-100 % of the image), image bilinear with antialias, label nearest; val views squash image and
label to input × input (bilinear with antialias / nearest). Normalisation mean (0.485, 0.456,
0.406), std **(0.229, 0.224, 0.255)** (0.255 for blue, not ImageNet's 0.225). eval.py's features:
the backbone's ``forward_features`` patch tokens (timm: after the final norm), class token dropped.

What differs from the reference, why, and the effect on the number: ``protocols/hummingbird.py``'s
``differences`` (exact retrieval, numpy's seeded draws, both mIoUs, the 1e-12 norm floor, ...),
which the docs, the report and every record carry.

Pure: arrays in, arrays or dataclasses out. Views, augmentations and label files are the
caller's (``labels/voc_segmentation.py`` reads the label maps through the ledger).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from . import search
from .hummingbird_published import (  # noqa: F401
    AUGMENTATION_EPOCHS,
    EMPTY_SCORE,
    IGNORE_INDEX,
    INPUT_SIZE,
    MATCHINGS,
    PATCH_SIZE,
    PUBLISHED,
    PUBLISHED_MEMORY_SIZES,
    PUBLISHED_SOURCE,
    SEED,
    TEMPERATURE,
    VOC_CLASSES,
    K,
)
from .search import normalise

BANK_BLOCK = 65536  # bank rows per product block (any value gives the same result)


@dataclass(frozen=True)
class Evaluation:
    """The arguments of the reference's ``hbird_evaluation`` as this module's functions take them
    whole (``build_bank``, ``segment``), checked at construction; errors name the parameter. The
    protocol declares its settings once (``protocols.hummingbird.Evaluation``) and hands
    the bank's draws their values (``BankDraws``).

    ``memory_size`` None keeps every patch of every train view (the reference's default);
    ``augmentation_epochs`` is how many augmented views of each train image the caller extracted
    (it enters only through the number of views). ``matching`` chooses the headline mIoU.
    """

    k: int = K
    temperature: float = TEMPERATURE
    memory_size: int | None = None
    augmentation_epochs: int = 1  # hbird_evaluation augmentation_epoch
    seed: int = SEED
    input_size: int = INPUT_SIZE
    patch_size: int = PATCH_SIZE
    n_classes: int = VOC_CLASSES
    ignore_index: int = IGNORE_INDEX
    matching: str = "identity"

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in ("k", "augmentation_epochs", "input_size", "patch_size", "n_classes"):
            positive(name)
        if self.memory_size is not None:
            positive("memory_size")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float, np.floating)) or not np.isfinite(t) or t <= 0:
            raise ValueError(f"temperature must be > 0, got {t!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size must be a multiple of patch_size ({self.patch_size}), got {self.input_size}")
        if isinstance(self.ignore_index, bool) or not isinstance(self.ignore_index, (int, np.integer)) or 0 <= self.ignore_index < self.n_classes:
            raise ValueError(f"ignore_index must be an integer outside 0..{self.n_classes - 1} (the classes), got {self.ignore_index!r}")
        if self.matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {', '.join(MATCHINGS)}, got {self.matching!r}")

    @property
    def grid(self) -> int:
        return self.input_size // self.patch_size


# ----------------------------------------------------------------------------------------------
# the memory bank


def patch_distributions(label_map: np.ndarray, patch_size: int, n_classes: int, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """(patches, classes) float32 share of each patch's pixels per class, patches in row-major
    grid order; ``ignore_index`` counts as class 0 (the reference's ``y[y == 255] = 0``)."""
    y = np.asarray(label_map)
    y = y if y.dtype.kind in "ui" and y.dtype != np.uint64 else y.astype(np.int64)  # counted in its own dtype (a PNG's uint8: no 8-byte copies)
    h, w = y.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"label map of {h}x{w} is not a whole number of {patch_size}-pixel patches")
    y = np.where(y == ignore_index, 0, y)
    if y.min(initial=0) < 0 or y.max(initial=0) >= n_classes:
        raise ValueError(f"label map holds values outside 0..{n_classes - 1} and {ignore_index}")
    gh, gw = h // patch_size, w // patch_size
    cells = y.reshape(gh, patch_size, gw, patch_size).transpose(0, 2, 1, 3).reshape(gh * gw, patch_size * patch_size)
    counts = np.bincount((np.arange(gh * gw)[:, None] * n_classes + cells).ravel(), minlength=gh * gw * n_classes)
    return (counts.reshape(gh * gw, n_classes) / cells.shape[1]).astype(np.float32)


def patches_per_view(memory_size: int, views: int) -> int:
    """Patches each train view gives a bounded bank: max(1, memory_size // views) (the reference's
    ``num_sampled_features``; views = train images × augmentation epochs)."""
    return max(1, int(memory_size) // max(1, int(views)))


def sample_patches(distribution: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the ``n`` patches a view gives the bounded bank, in the reference's order
    (ascending score).

    Score of a patch = sum over its present classes of how many of the view's patches hold that
    class, times one uniform draw per non-empty patch (drawn in patch order); empty patches score
    ``EMPTY_SCORE``. Equal scores keep the lower patch index.
    """
    presence = np.asarray(distribution) > 0
    if n > presence.shape[0]:
        raise ValueError(f"{n} patches per view asked, but a view has {presence.shape[0]}")
    frequency = presence.sum(0).astype(np.float32)
    score = presence.astype(np.float32) @ frequency
    filled = presence.any(1)
    score[~filled] = EMPTY_SCORE
    score[filled] *= rng.random(int(filled.sum()), dtype=np.float32)
    return np.argsort(score, kind="stable")[:n]


@dataclass
class BankRows:
    """Which train patches a bank holds and their label distributions: the part of the bank
    decided by labels and the seed alone (features play no part in the choice)."""

    view: np.ndarray  # (rows,) int64 the train view
    patch: np.ndarray  # (rows,) int64 the patch within it (row-major)
    labels: np.ndarray  # (rows, classes) float32 label distributions
    per_view: int | None  # patches per view of a bounded bank (None: all)


@dataclass
class MemoryBank:
    """The bank: normalised features, label distributions, and where each row came from."""

    features: np.ndarray  # (rows, D) float32, L2-normalised
    labels: np.ndarray  # (rows, classes) float32 label distributions
    view: np.ndarray  # (rows,) int64 the train view
    patch: np.ndarray  # (rows,) int64 the patch within it (row-major)
    per_view: int | None


def _tile(label_map: np.ndarray, grid: int) -> int:
    """The patch size at which a square ``grid`` tiles a label map."""
    h, w = np.shape(label_map)
    if h != w or h % grid:
        raise ValueError(f"a label map of {h}x{w} does not tile a {grid}x{grid} patch grid")
    return h // grid


class BankDraws:
    """The rows a bank of ``views`` train views takes, drawn view by view in view order, so the
    views may come a portion at a time (``take``) and only that portion's label maps be held.

    Unbounded (``memory_size`` None): every patch of every view. Bounded: ``patches_per_view``
    patches of each view by ``sample_patches``, from one generator seeded ``seed`` and drawn view
    by view; rows in view order.
    """

    def __init__(self, views: int, grid: int, *, memory_size: int | None, seed: int, epochs: int, n_classes: int, ignore_index: int = IGNORE_INDEX) -> None:
        if views % epochs:
            raise ValueError(f"{views} train views are not {epochs} augmentation epochs of the same images")
        self.per_view = None
        if memory_size is not None:
            if memory_size < views:
                raise ValueError(f"memory_size must be at least the number of train views ({views}), got {memory_size}")
            self.per_view = patches_per_view(memory_size, views)
        self.views, self.grid, self.n_classes, self.ignore_index = views, grid, n_classes, ignore_index
        self.rng = np.random.default_rng(seed)
        self.seen = 0

    @property
    def rows(self) -> int:
        """Rows of the whole bank."""
        return self.views * (self.grid * self.grid if self.per_view is None else self.per_view)

    def take(self, label_maps: Iterable[np.ndarray]) -> BankRows:
        """The rows of the next views (their label maps at the view's size, in view order)."""
        view, patch, labels = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros((0, self.n_classes), np.float32)]
        for y in label_maps:
            d = patch_distributions(y, _tile(y, self.grid), self.n_classes, self.ignore_index)
            rows = np.arange(d.shape[0]) if self.per_view is None else sample_patches(d, self.per_view, self.rng)
            view.append(np.full(len(rows), self.seen, np.int64))
            patch.append(rows.astype(np.int64))
            labels.append(d[rows])
            self.seen += 1
        if self.seen > self.views:
            raise ValueError(f"{self.seen} label maps for {self.views} views")
        return BankRows(np.concatenate(view), np.concatenate(patch), np.concatenate(labels), self.per_view)

    def finish(self) -> None:
        if self.seen != self.views:
            raise ValueError(f"{self.seen} label maps for {self.views} views")


def bank_rows(label_maps: Iterable[np.ndarray], views: int, grid: int, settings: Evaluation) -> BankRows:
    """The rows of the bank of ``views`` train views, from their label maps (views, H, W) at the
    view's size (H = ``grid`` × patch size), read once, in view order (an iterator will do):
    ``BankDraws`` in one portion."""
    draws = BankDraws(
        views,
        grid,
        memory_size=settings.memory_size,
        seed=settings.seed,
        epochs=settings.augmentation_epochs,
        n_classes=settings.n_classes,
        ignore_index=settings.ignore_index,
    )
    rows = draws.take(label_maps)
    draws.finish()
    return rows


def build_bank(features: np.ndarray, label_maps: Sequence[np.ndarray], settings: Evaluation) -> MemoryBank:
    """The memory bank of train views held in memory: ``features`` (views, patches, D) patch
    tokens (patches a square grid, row-major) and their ``label_maps`` (``bank_rows``); the
    chosen rows' features L2-normalised. A caller reading a store picks ``bank_rows`` first and
    then reads only those rows' features."""
    x = np.asarray(features, np.float32)
    if x.ndim != 3:
        raise ValueError(f"features must be (views, patches, channels), got shape {x.shape}")
    grid = int(round(np.sqrt(x.shape[1])))
    if grid * grid != x.shape[1]:
        raise ValueError(f"{x.shape[1]} patches are not a square grid")
    if len(label_maps) != x.shape[0]:
        raise ValueError(f"{len(label_maps)} label maps for {x.shape[0]} views")
    rows = bank_rows(label_maps, x.shape[0], grid, settings)
    return MemoryBank(normalise(x[rows.view, rows.patch]), rows.labels, rows.view, rows.patch, rows.per_view)


# ----------------------------------------------------------------------------------------------
# retrieval and label transfer


def nearest(queries: np.ndarray, bank_features, k: int, block: int = BANK_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, bank rows int64), each (queries, k), best first: the k bank rows most
    similar to each query patch, exactly (``analyses.search``: the float32 rounding of float64
    products, equal cosines by bank row, the lower first; the answer does not depend on ``block``).
    ``bank_features`` are normalised rows (an array, or a ``Shared`` file read ``block`` rows at a
    time); queries are normalised here."""
    return search.nearest(queries, bank_features, int(k), int(block))


def transfer(similarity: np.ndarray, neighbour: np.ndarray, bank_labels: np.ndarray, temperature: float = TEMPERATURE) -> np.ndarray:
    """(queries, classes) float32 soft labels: softmax over the neighbours of cos / temperature,
    weighting their label distributions (the reference's ``_cross_attention``)."""
    logits = np.asarray(similarity, np.float32) / np.float32(temperature)
    weights = np.exp(logits - logits.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    labels = np.asarray(bank_labels, np.float32)[np.asarray(neighbour)]  # (queries, k, classes)
    return np.einsum("qk,qkc->qc", weights, labels).astype(np.float32)


def _bilinear_axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices and weights of torch's bilinear resize along one axis (align_corners False)."""
    src = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * np.float32(n_in / n_out) - np.float32(0.5)
    src = np.maximum(src, np.float32(0))
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (src - lo).astype(np.float32)


def _width_pass(s: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(each source row resized along the width (gh, W, C): torch's first step, once per source row; the height's (y0, y1, wy))."""
    (y0, y1, wy), (x0, x1, wx) = _bilinear_axis(s.shape[0], size[0]), _bilinear_axis(s.shape[1], size[1])
    return (1 - wx)[:, None] * s[:, x0] + wx[:, None] * s[:, x1], (y0, y1, wy)


def upsample(scores: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(classes, H, W) float32: (gh, gw, classes) grid scores resized bilinearly to ``size``
    (half-pixel centres, edges clamped: ``F.interpolate(mode="bilinear", align_corners=False)``;
    equal to torch's within a float32 rounding or two, as its kernel rounds its sums in another way)."""
    rows, (y0, y1, wy) = _width_pass(np.asarray(scores, np.float32), size)  # then between the two source rows
    return np.ascontiguousarray(((1 - wy)[:, None, None] * rows[y0] + wy[:, None, None] * rows[y1]).transpose(2, 0, 1))


def predict(soft_labels: np.ndarray, grid: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """(H, W) int64 label map of one image: its patches' soft labels (patches row-major) reshaped
    to ``grid``, upsampled to ``size``, argmax over classes (equal scores: the lower class):
    ``upsample``'s arithmetic one class plane at a time (in cache) with a running maximum (a NaN: ``upsample``'s argmax)."""
    s = np.asarray(soft_labels, np.float32)
    if s.shape[0] != grid[0] * grid[1]:
        raise ValueError(f"{s.shape[0]} patches do not fill a {grid[0]}x{grid[1]} grid")
    s = s.reshape(grid[0], grid[1], -1)
    if not np.isfinite(s).all():
        return upsample(s, size).argmax(0).astype(np.int64)
    rows, (y0, y1, wy) = _width_pass(s, size)
    planes, top, bottom = np.ascontiguousarray(rows.transpose(2, 0, 1)), (1 - wy)[:, None], wy[:, None]  # (C, gh, W)
    best, plane, lower, gathered = (np.empty(size, np.float32) for _ in range(4))  # reused: no temporary per class
    label, better = np.zeros(size, np.int64), np.empty(size, bool)
    for c in range(len(planes)):
        np.multiply(top, np.take(planes[c], y0, axis=0, out=gathered, mode="clip"), out=best if c == 0 else plane)
        np.multiply(bottom, np.take(planes[c], y1, axis=0, out=gathered, mode="clip"), out=lower)
        if c == 0:
            best += lower
            continue
        plane += lower
        np.greater(plane, best, out=better)
        np.copyto(label, c, where=better)
        np.maximum(best, plane, out=best)
    return label


def resize_nearest(label_map: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A label map resized to ``size`` by torch's legacy nearest rule (source = floor(dst · in /
    out)), as the reference resizes the label tensors of its views."""
    y = np.asarray(label_map)
    rows = np.minimum(np.floor(np.arange(size[0]) * (y.shape[0] / size[0])).astype(np.int64), y.shape[0] - 1)
    cols = np.minimum(np.floor(np.arange(size[1]) * (y.shape[1] / size[1])).astype(np.int64), y.shape[1] - 1)
    return y[rows[:, None], cols[None, :]]


# ----------------------------------------------------------------------------------------------
# the score


def confusion(truth: np.ndarray, prediction: np.ndarray, n_classes: int, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """(classes, classes) int64 counts, rows the true class, columns the predicted one, of one
    image's pixels whose truth is not ``ignore_index`` and both values lie in 0..classes-1
    (``PredsmIoU.update``). Sum it over images."""
    t = np.asarray(truth).astype(np.int64, copy=False).ravel()
    p = np.asarray(prediction).astype(np.int64, copy=False).ravel()
    if t.shape != p.shape:
        raise ValueError(f"truth and prediction differ in size ({np.asarray(truth).shape} and {np.asarray(prediction).shape})")
    keep = (t != ignore_index) & (t >= 0) & (t < n_classes) & (p >= 0) & (p < n_classes)
    return np.bincount(t[keep] * n_classes + p[keep], minlength=n_classes * n_classes).reshape(n_classes, n_classes).astype(np.int64)


@dataclass
class MiouResult:
    """Per-class IoU and its mean over every class (absent classes count 0), with no matching
    and with the reference's Hungarian matching of predicted to true classes."""

    iou: np.ndarray  # (classes,) float64, identity
    miou: float
    iou_hungarian: np.ndarray  # (classes,) float64, after the reference's matching
    miou_hungarian: float
    matching: np.ndarray  # (classes,) int64 the true class each predicted class was matched to
    pixels: int  # pixels scored


def _iou(c: np.ndarray) -> np.ndarray:
    tp = np.diag(c).astype(np.float64)
    return tp / np.maximum(c.sum(1) + c.sum(0) - tp, 1e-8)


def miou(confusion_matrix: np.ndarray) -> MiouResult:
    """Scores of a summed confusion matrix, as ``PredsmIoU.compute`` computes them."""
    from scipy.optimize import linear_sum_assignment

    c = np.asarray(confusion_matrix, np.int64)
    n = c.shape[0]
    total = c.astype(np.float64)
    pair = total / np.maximum(total.sum(1, keepdims=True) + total.sum(0, keepdims=True) - total, 1e-8)
    rows, cols = linear_sum_assignment(1.0 - pair)
    mapping = np.zeros(n, np.int64)  # unmatched predicted classes go to class 0, as the reference
    mapping[cols] = rows
    folded = np.zeros_like(c)
    np.add.at(folded.T, mapping, c.T)  # folded[:, j] = sum of c[:, p] over p matched to j
    identity, matched = _iou(c), _iou(folded)
    return MiouResult(identity, float(identity.mean()), matched, float(matched.mean()), mapping, int(c.sum()))


def headline(result: MiouResult, settings: Evaluation) -> float:
    """The mIoU ``settings.matching`` names."""
    return result.miou_hungarian if settings.matching == "hungarian" else result.miou


def segment(queries: np.ndarray, bank: MemoryBank, settings: Evaluation, size: tuple[int, int], block: int = BANK_BLOCK) -> np.ndarray:
    """One val view's (patches, D) tokens → its (H, W) predicted label map at ``size``."""
    similarity, neighbour = nearest(queries, bank.features, settings.k, block)
    g = settings.grid
    return predict(transfer(similarity, neighbour, bank.labels, settings.temperature), (g, g), size)


def soft_labels_block(values: np.ndarray, *, bank, labels, norm, k: int, temperature: float, block: int = BANK_BLOCK, device: str | None = None) -> dict[str, np.ndarray]:
    """A block of query views' stored patch tokens (views, patches, D) → their patches' soft labels
    (views, patches, classes) float32: the unit a runner ships to a worker. ``bank.value()`` is the
    bank's normalised features (``infra.shared.Shared``, read ``block`` rows at a time, or an array)
    and ``labels.value()`` its label distributions; ``norm`` the network's final norm or None.
    Each patch's answer depends on its own row alone, so blocks of any size give the same soft
    labels. ``device`` (``cpu`` or ``cuda``): the search in torch there (``analyses.search_torch``,
    the same neighbours and cosines); None: numpy."""
    x = np.asarray(values, np.float32)
    n, p, d = x.shape
    queries = x.reshape(n * p, d)
    if norm is not None:
        queries = norm(queries)
    if device is not None:
        from . import search_torch

        on = search_torch.on_device(bank, device, getattr(bank, "sha256", None))
        similarity, neighbour = search_torch.nearest(normalise(queries), on, k, block, device)
    else:
        similarity, neighbour = nearest(queries, bank, k, block)
    return {"soft": transfer(similarity, neighbour, labels.value(), temperature).reshape(n, p, -1)}
