"""DINO's weighted k-NN classifier on frozen image features, in bounded memory, in numpy or torch.

The rule of facebookresearch/dino ``eval_knn.py`` (``knn_classifier``): features L2-normalised,
cosine similarity to every train image, the k most similar train images vote for their class
with weight exp(cos / T) (T: ``KnnSettings.temperature``, DINO's default); the class with the largest summed weight is the prediction,
top-1 and top-5 accuracy over the test images. Several k are answered in one pass: the running
top-k is kept for the largest k and the smaller k read its first entries (the list is sorted).

Top-5 as the script counts it: the true class among the 5 classes of largest vote, where only
a class some neighbour voted for can count. The script scores 1000 class columns whatever the
panel (``num_classes=1000`` is never passed), so a class without votes sits among hundreds of
empty columns and is not a hit, and with k < 5 at most k classes hold votes (its
``narrow(1, 0, min(5, k))``).

What differs from the script, why, and the effect on the number: ``protocols/knn.py``'s
``differences`` (blocked products with a running top-k, an exact search whose neighbours do not
depend on block sizes, BLAS or device, a stated tie rule, top-5 undefined with 5 classes or
fewer), which the docs, the report and every record carry. By default it runs on numpy, so
``probe knn`` imports no torch; ``--backend torch`` runs the same search in torch
(``analyses.search_torch``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from . import search
from .search import normalise

TEST_BLOCK = 1024
TRAIN_BLOCK = 4096
DEVICE_TEST_BLOCK = 4096  # test rows per task on a GPU: fewer, larger products (the same numbers)
DEVICE_TRAIN_BLOCK = 65536  # train rows per product on a GPU
VOTE_VALUES = 2**20  # (row, class) votes ranked at once (``ranked_votes``): a few tens of MiB whatever the val set


@dataclass
class KnnResult:
    """Accuracies per k (fractions; top-5 NaN with 5 classes or fewer) and the predictions."""

    ks: tuple[int, ...]
    top1: np.ndarray  # (k,)
    top5: np.ndarray  # (k,)
    predictions: np.ndarray  # (k, test) int64 predicted class
    neighbours: np.ndarray  # (test, n) int64 indices of the n most similar train images, best first
    similarity: np.ndarray  # (test, n) float32 their cosines


def nearest(queries: np.ndarray, train_blocks: Callable[[], Iterable[tuple[int, np.ndarray]]], k: int) -> dict[str, np.ndarray]:
    """A block of (unnormalised) test rows → their k most similar train images, best first:
    ``similarity`` (rows, k) float32 cosines and ``neighbour`` (rows, k) int64 train indices
    (``analyses.search``: exact, equal cosines to the lower index). Each row's answer depends on
    that row and the train blocks only, so blocks of rows can be computed anywhere and concatenated."""
    value, index = search.running_topk(normalise(queries), train_blocks, k)
    return {"similarity": value, "neighbour": index}


def ranked_classes(votes: np.ndarray) -> np.ndarray:
    """Classes by decreasing vote, equal votes keeping the lower class first; after the first
    (the prediction, whatever its vote), -1 in place of the classes no neighbour voted for, which
    are never a top-5 hit. (Only a very small --temperature makes exp(cos / T) underflow to 0.)"""
    order = np.argsort(-votes, axis=1, kind="stable")
    voted = np.take_along_axis(votes, order, axis=1) > 0
    voted[:, 0] = True
    return np.where(voted, order, -1)


def _ranked_votes(similarity: np.ndarray, labels: np.ndarray, n_classes: int, temperature: float, ks: Sequence[int], width: int) -> list[np.ndarray]:
    """For every k in ``ks`` (ascending), the ``width`` first ``ranked_classes`` of the summed
    weights exp(cos / T) of the first k neighbours' classes: float32, added in rank order, in one
    pass over the ranks."""
    weights = np.exp(np.asarray(similarity, np.float32) / np.float32(temperature))
    votes = np.zeros((similarity.shape[0], n_classes), np.float32)
    rows = np.arange(similarity.shape[0])
    out, done = [], 0
    for k in ks:
        for rank in range(done, k):
            votes[rows, labels[:, rank]] += weights[:, rank]
        done = k
        out.append(ranked_classes(votes)[:, :width])
    return out


def features(values: np.ndarray, feature: str, norm: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    """Stored rows (class tokens, or patch tokens for ``mean``) → the chosen feature, unnormalised;
    ``norm``: the network's final LayerNorm (``store.parts.FinalNorm``) for ``cls-normed``."""
    values = np.asarray(values, dtype=np.float32)
    if feature == "mean":
        return values.mean(1)
    return norm(values) if norm is not None else values


def nearest_block(values: np.ndarray, *, bank, feature: str, norm, k: int, train_block: int, device: str | None = None) -> dict[str, np.ndarray]:
    """A block of test images' stored rows → their k nearest train images: the unit a runner ships
    to a worker. ``bank`` holds the (train, D) normalised train features (``infra.shared.Shared``:
    read ``train_block`` rows at a time from its file, so a worker holds one block of them).
    ``device`` (``cpu`` or ``cuda``): the search in torch there (``analyses.search_torch``, the
    bank moved to the device once per worker; the same neighbours and cosines); None: numpy."""
    queries = features(values, feature, norm)
    if device is not None:
        from . import search_torch

        on = search_torch.on_device(bank, device, getattr(bank, "sha256", None))
        value, index = search_torch.nearest(normalise(queries), on, k, train_block, device)
        return {"similarity": value, "neighbour": index}
    return nearest(queries, lambda: search.bank_blocks(bank, train_block), k)


def ranked_votes(
    similarity: np.ndarray, neighbour: np.ndarray, train_labels: np.ndarray, n_classes: int, ks: Sequence[int], temperature: float, width: int
) -> np.ndarray:
    """(rows, k, width) the ``width`` classes of largest vote of each row, for every k in ``ks``.

    Rows are voted ``VOTE_VALUES // n_classes`` at a time: a row's votes are a row of (rows,
    classes) arrays, and sorting them whole held about 25 bytes a row and class at once (1.25 GB
    for ImageNet's 50,000 val images and 1,000 classes); each row's numbers are the same."""
    order = sorted(range(len(ks)), key=lambda j: ks[j])
    classes = np.asarray(train_labels, np.int64)
    rows = max(1, VOTE_VALUES // max(n_classes, 1))
    out = np.empty((len(neighbour), len(ks), width), np.int64)
    for a in range(0, len(neighbour), rows):
        labels = classes[np.asarray(neighbour[a : a + rows])]
        ranked = _ranked_votes(similarity[a : a + rows], labels, n_classes, temperature, [ks[j] for j in order], width)
        out[a : a + len(labels)] = np.stack([ranked[order.index(j)] for j in range(len(ks))], axis=1)
    return out


def scored(ks: Sequence[int], ranked: np.ndarray, test_labels: np.ndarray, n_classes: int, neighbour: np.ndarray, similarity: np.ndarray, keep: int = 5) -> KnnResult:
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
    ks: Sequence[int],
    temperature: float,
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
    search.check_search(n_train, ks[-1], train_block)

    def blocks():
        for a in range(0, n_train, train_block):
            yield a, normalise(train(a, min(a + train_block, n_train)))

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
