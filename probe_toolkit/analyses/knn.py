"""DINO's weighted k-NN classifier on frozen image features, in bounded memory.

The rule of facebookresearch/dino ``eval_knn.py`` (``knn_classifier``): features L2-normalised,
cosine similarity to every train image, the k most similar train images vote for their class
with weight exp(cos / T), T = 0.07; the class with the largest summed weight is the prediction,
top-1 and top-5 accuracy over the test images. Several k are answered in one pass: the running
top-k is kept for the largest k and the smaller k read its first entries (the list is sorted).

Top-5 as the script counts it: the true class among the 5 classes of largest vote, where only
a class some neighbour voted for can count. The script scores 1000 class columns whatever the
panel (``num_classes=1000`` is never passed), so a class without votes sits among hundreds of
empty columns and is not a hit, and with k < 5 at most k classes hold votes (its
``narrow(1, 0, min(5, k))``).

What differs from the script, on purpose:

- the similarities are computed in blocks of test × train images with a running top-k, so
  memory is (test block) × (train block + k) whatever the panel sizes (the script holds one
  chunk of ``N_test // 100`` test images × N_train at a time, and fails below 100 test images);
- with 5 classes or fewer, top-5 is reported as NaN: the script gives a number there (the share
  of images whose class got any vote), which says nothing about a ranking;
- ties between classes of equal vote go to the lower class index (a stable sort); train images
  of equal cosine are listed by train index (which of them survive a cut at the k-th place is
  torch.topk's choice, as in the script).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

KS = (10, 20, 100, 200)  # DINO's eval_knn.py default nb_knn
TEMPERATURE = 0.07  # DINO's eval_knn.py default
TEST_BLOCK = 1024
TRAIN_BLOCK = 4096


@dataclass
class KnnResult:
    """Accuracies per k (fractions; top-5 NaN with 5 classes or fewer) and the predictions."""

    ks: tuple[int, ...]
    top1: np.ndarray  # (k,)
    top5: np.ndarray  # (k,)
    predictions: np.ndarray  # (k, test) int64 predicted class
    neighbours: np.ndarray  # (test, n) int64 indices of the n most similar train images, best first
    similarity: np.ndarray  # (test, n) float32 their cosines


def normalise(features: torch.Tensor) -> torch.Tensor:
    return F.normalize(features.float(), dim=1, p=2)


def running_topk(test: torch.Tensor, train_blocks: Callable[[], Iterable[tuple[int, torch.Tensor]]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest cosines of each (normalised) test row over every train block, sorted.

    ``train_blocks()`` yields (offset, normalised block); offsets make the indices global. Only
    (test rows) × (block) values are held at once. Each block's candidates (``_candidates``) are
    merged with the running k best (the k best of a union are among the k best of each part),
    so no block-wide index table or concatenation is ever built.
    """
    best_val = torch.full((test.shape[0], 0), -float("inf"))
    best_idx = torch.zeros((test.shape[0], 0), dtype=torch.int64)
    seen = 0
    for offset, block in train_blocks():
        sim = test @ block.T
        floor = best_val[:, -1] if best_val.shape[1] == k else None
        block_val, block_idx = _candidates(sim, k, floor, k * sim.shape[1] / max(seen, 1))
        seen += sim.shape[1]
        vals = torch.cat([best_val, block_val], dim=1)
        inds = torch.cat([best_idx, block_idx + offset], dim=1)
        top_val, where = vals.topk(min(k, vals.shape[1]), dim=1, largest=True, sorted=True)
        best_val, best_idx = top_val, inds.gather(1, where)
    # equal cosines at any rank: order them by train index (a stable, documented tie-break)
    order = np.lexsort((best_idx.numpy(), -best_val.numpy().astype(np.float64)), axis=1)
    order = torch.from_numpy(order)
    return best_val.gather(1, order), best_idx.gather(1, order)


def _candidates(sim: torch.Tensor, k: int, floor: torch.Tensor | None, expected: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's values (and block-local indices) that can enter each row's running top-k.

    Its own k best, unsorted; or, once the running list is full and its k-th value ``floor``
    leaves few winners (about ``expected`` per row, k × block width / columns seen, were the
    train images in no particular order), its m best for a small m (at least twice that), with
    the k best recomputed for the rows whose m-th value still beats ``floor`` (more than m of
    theirs may: a block of a query's own class, in a set sorted by class). Every value
    above a row's floor is a candidate either way, so the merged top-k holds the same values;
    only which of several equal to the k-th survive is topk's choice, as with one topk over
    the whole row (DINO's script). torch.topk's cost grows with m: on a late block of a large
    train set (ImageNet's 1.28 M images are 313 blocks) this is several times cheaper.
    """
    width = min(k, sim.shape[1])
    m = 16
    while m < 2 * expected:
        m *= 2
    if floor is None or 2 * m >= width:
        return sim.topk(width, dim=1, largest=True, sorted=False)
    small_val, small_idx = sim.topk(m, dim=1, largest=True, sorted=False)
    over = torch.nonzero(small_val.amin(dim=1) > floor).squeeze(1)
    if over.numel() == 0:
        return small_val, small_idx
    full_val, full_idx = sim[over].topk(width, dim=1, largest=True, sorted=False)
    block_val = torch.full((sim.shape[0], width), -float("inf"))
    block_idx = torch.zeros((sim.shape[0], width), dtype=torch.int64)
    block_val[:, :m], block_idx[:, :m] = small_val, small_idx
    block_val[over], block_idx[over] = full_val, full_idx
    return block_val, block_idx


def vote(similarity: torch.Tensor, labels: torch.Tensor, n_classes: int, temperature: float) -> torch.Tensor:
    """(test, classes) summed weights exp(cos / T) of the given neighbours' classes."""
    weights = (similarity / temperature).exp()
    out = torch.zeros(similarity.shape[0], n_classes, dtype=weights.dtype)
    return out.scatter_add_(1, labels, weights)


def ranked_classes(votes: torch.Tensor) -> torch.Tensor:
    """Classes by decreasing vote, equal votes keeping the lower class first; after the first
    (the prediction, whatever its vote), -1 in place of the classes no neighbour voted for, which
    are never a top-5 hit. (Only a very small --temperature makes exp(cos / T) underflow to 0.)"""
    values = votes.numpy()
    order = np.argsort(-values, axis=1, kind="stable")
    voted = np.take_along_axis(values, order, axis=1) > 0
    voted[:, 0] = True
    return torch.from_numpy(np.where(voted, order, -1))


def nearest(queries: np.ndarray, train_blocks: Callable[[], Iterable[tuple[int, torch.Tensor]]], k: int) -> dict[str, np.ndarray]:
    """A block of (unnormalised) test rows → their k most similar train images, best first:
    ``similarity`` (rows, k) float32 cosines and ``neighbour`` (rows, k) int64 train indices.
    Each row's answer depends on that row and the train blocks only, so blocks of rows can be
    computed anywhere and concatenated."""
    top_val, top_idx = running_topk(normalise(torch.as_tensor(np.asarray(queries))), train_blocks, k)
    return {"similarity": top_val.numpy(), "neighbour": top_idx.numpy()}


def features(values: np.ndarray, feature: str, norm: torch.nn.Module | None) -> np.ndarray:
    """Stored rows (class tokens, or patch tokens for ``mean``) → the chosen feature, unnormalised."""
    values = np.asarray(values, dtype=np.float32)
    if feature == "mean":
        return values.mean(1)
    if norm is not None:
        with torch.no_grad():
            return norm(torch.from_numpy(values)).numpy()
    return values


def nearest_block(values: np.ndarray, *, bank, feature: str, norm: torch.nn.Module | None, k: int, train_block: int) -> dict[str, np.ndarray]:
    """A block of test images' stored rows → their k nearest train images: the unit a runner ships
    to a worker. ``bank.value()`` is the (train, D) normalised train features (``runner.Shared``,
    mapped once per worker), taken ``train_block`` rows at a time; one torch thread on a worker."""
    matrix = bank.value()

    def blocks():
        for a in range(0, matrix.shape[0], train_block):
            yield a, torch.from_numpy(np.array(matrix[a:a + train_block]))

    from ..infra.runner import torch_threads

    with torch_threads(1):
        return nearest(features(values, feature, norm), blocks, k)


def ranked_votes(similarity: np.ndarray, neighbour: np.ndarray, train_labels: np.ndarray, n_classes: int, ks: Sequence[int],
                 temperature: float, width: int) -> np.ndarray:
    """(rows, k, width) the ``width`` classes of largest vote of each row, for every k in ``ks``."""
    labels = torch.as_tensor(np.asarray(train_labels), dtype=torch.int64)
    sim, idx = torch.from_numpy(np.ascontiguousarray(similarity)), torch.from_numpy(np.ascontiguousarray(neighbour))
    return np.stack([ranked_classes(vote(sim[:, :k], labels[idx[:, :k]], n_classes, temperature)).numpy()[:, :width] for k in ks], axis=1)


def scored(ks: Sequence[int], ranked: np.ndarray, test_labels: np.ndarray, n_classes: int, neighbour: np.ndarray, similarity: np.ndarray,
           keep: int = 5) -> KnnResult:
    """Accuracies of the ranked classes (``ranked_votes``) against the test rows' classes."""
    targets = np.asarray(test_labels, dtype=np.int64)
    n_test = len(targets)
    five = min(5, n_classes) if n_classes > 5 else 0
    top1 = (ranked[:, :, 0] == targets[:, None]).sum(0) / n_test
    top5 = (ranked[:, :, :five] == targets[:, None, None]).any(2).sum(0) / n_test if five else np.full(len(ks), np.nan)
    return KnnResult(tuple(ks), top1, top5, ranked[:, :, 0].T.astype(np.int64), neighbour[:, :keep], similarity[:, :keep])


def vote_width(n_classes: int) -> int:
    """Classes kept per row for the scores: the top five where top-5 is defined, else the first."""
    return min(5, n_classes) if n_classes > 5 else 1


def classify(
    train: Callable[[int, int], np.ndarray],
    n_train: int,
    train_labels: np.ndarray,
    test: Callable[[int, int], np.ndarray],
    n_test: int,
    test_labels: np.ndarray,
    n_classes: int,
    *,
    ks: Sequence[int] = KS,
    temperature: float = TEMPERATURE,
    test_block: int = TEST_BLOCK,
    train_block: int = TRAIN_BLOCK,
    keep: int = 5,
    progress: Callable[[int], None] | None = None,
) -> KnnResult:
    """Weighted k-NN for every k in ``ks`` in one pass, in this process.

    ``train(a, b)`` and ``test(a, b)`` return rows a..b of the (unnormalised) features, so a
    caller can read them lazily from a store; only one block of each is held at a time.
    ``commands/knn.py`` runs the same functions (``nearest`` per test block) on the runner.
    """
    ks = tuple(sorted(int(k) for k in ks))
    if not ks or ks[0] < 1 or ks[-1] > n_train:
        raise ValueError(f"k must lie in 1..{n_train} (the train images), got {ks}")

    def blocks():
        for a in range(0, n_train, train_block):
            b = min(a + train_block, n_train)
            yield a, normalise(torch.as_tensor(np.asarray(train(a, b))))

    parts = []
    for a in range(0, n_test, test_block):
        b = min(a + test_block, n_test)
        parts.append(nearest(test(a, b), blocks, ks[-1]))
        if progress is not None:
            progress(b - a)
    similarity = np.concatenate([p["similarity"] for p in parts])
    neighbour = np.concatenate([p["neighbour"] for p in parts])
    ranked = ranked_votes(similarity, neighbour, train_labels, n_classes, ks, temperature, vote_width(n_classes))
    return scored(ks, ranked, test_labels, n_classes, neighbour, similarity, min(keep, ks[-1]))
