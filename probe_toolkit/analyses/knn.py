"""DINO's weighted k-NN classifier on frozen image features, in bounded memory, in numpy.

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
``differences`` (blocked products with a running top-k, a stated tie rule, top-5 undefined with
5 classes or fewer), which the docs, the report and every record carry. It runs on numpy
(float32 products by BLAS, as the script's float32 matmul), so ``probe knn`` imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

TEST_BLOCK = 1024
TRAIN_BLOCK = 4096
EMPTY = np.uint64(np.iinfo(np.uint64).max)  # a free place in a running list: worse than every key


@dataclass
class KnnResult:
    """Accuracies per k (fractions; top-5 NaN with 5 classes or fewer) and the predictions."""

    ks: tuple[int, ...]
    top1: np.ndarray  # (k,)
    top5: np.ndarray  # (k,)
    predictions: np.ndarray  # (k, test) int64 predicted class
    neighbours: np.ndarray  # (test, n) int64 indices of the n most similar train images, best first
    similarity: np.ndarray  # (test, n) float32 their cosines


def normalise(features: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (at least 1e-12), in float32: torch's ``F.normalize``."""
    x = np.asarray(features, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.float32(1e-12))


# A neighbour is one uint64 key: the cosine's order-preserving bits, inverted, above the train
# index. Keys are unique and the smaller key is the better neighbour (larger cosine; on equal
# cosines, the lower index), so a partition of keys selects exactly, with no tie to settle.

def keys(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Keys of cosines (float32) at train indices (below 2**32)."""
    bits = (np.asarray(values, np.float32) + np.float32(0)).view(np.uint32)  # + 0: -0.0 ranks as 0.0
    ordered = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))  # larger cosine, larger bits
    return ((~ordered).astype(np.uint64) << np.uint64(32)) | np.asarray(index, np.uint64)


def unkey(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, train indices int64) of keys."""
    ordered = (~(key >> np.uint64(32))).astype(np.uint32)
    bits = np.where(ordered >> np.uint32(31), ordered & np.uint32(0x7FFFFFFF), ~ordered)
    return bits.view(np.float32), (key & np.uint64(0xFFFFFFFF)).astype(np.int64)


def check_search(rows: int, k: int, block: int) -> None:
    """Refuse what an exact top-k search of ``rows`` bank rows cannot answer, in Hummingbird's
    numpy and torch searches alike (``hummingbird.py``, ``hummingbird_torch.py``): k outside the
    bank, a bank past the keys' 32 bits of row (``keys``), a bad block."""
    if isinstance(k, bool) or not 1 <= k <= rows:
        raise ValueError(f"k must lie in 1..{rows} (the bank's rows), got {k}")
    if rows >= 2**32:
        raise ValueError(f"{rows} bank rows: at most 2**32 - 1")
    if isinstance(block, bool) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block}")


def _kth_largest(sim: np.ndarray, k: int) -> np.ndarray:
    """Each row's k-th largest value (a partition of the values: a third of an argpartition's cost)."""
    width = sim.shape[1]
    return np.partition(sim, width - k, axis=1)[:, width - k]


def block_candidates(sim: np.ndarray, offset: int, k: int, floor: np.ndarray | None) -> np.ndarray:
    """Keys of a block's values that can enter each row's running top-k, padded with ``EMPTY``.

    After the running list is full, only values above the row's k-th running cosine ``floor``
    can enter (an equal one has a higher train index, so it ranks below); a late block of a large
    set holds few of them per row (k × block width / images seen, were the set in no particular
    order). A row with more than k of them (a block of its own class, in a set sorted by class),
    and every row before the list is full (``floor`` None), takes its values at or above its own
    k-th largest: its k best, and any equal to the k-th (their indices settle the cut, in the merge).
    """
    rows, width = sim.shape
    if floor is None and width <= k:
        cols = np.broadcast_to(np.arange(width), sim.shape)
        return keys(sim, offset + cols)
    threshold = _kth_largest(sim, k) if floor is None else floor
    flat = np.flatnonzero(sim >= threshold[:, None] if floor is None else sim > threshold[:, None])
    r = flat // width
    counts = np.bincount(r, minlength=rows)
    crowded = np.flatnonzero(counts > k) if floor is not None else ()
    if len(crowded):  # those rows keep their values at or above their own k-th largest
        own = np.full(rows, -np.inf, np.float32)
        own[crowded] = _kth_largest(sim[crowded], k)
        flat = flat[sim.ravel()[flat] >= own[r]]
        r = flat // width
        counts = np.bincount(r, minlength=rows)
    out = np.full((rows, int(counts.max(initial=0))), EMPTY, np.uint64)
    out[r, np.arange(len(r)) - (np.cumsum(counts) - counts)[r]] = keys(sim.ravel()[flat], offset + flat - r * width)
    return out


def running_topk(test: np.ndarray, train_blocks: Callable[[], Iterable[tuple[int, np.ndarray]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest cosines of each (normalised) test row over every train block, sorted, equal
    cosines by train index; (cosines float32, train indices int64), each (rows, k).

    ``train_blocks()`` yields (offset, normalised block) in increasing offset; offsets make the
    indices global. Only (test rows) × (block) values are held at once: each block's candidates
    (``block_candidates``) are merged with the running k best.
    """
    best = np.full((test.shape[0], k), EMPTY, np.uint64)
    seen = 0
    for offset, block in train_blocks():
        sim = test @ np.asarray(block, np.float32).T
        floor = unkey(best.max(1))[0] if seen >= k else None
        merged = np.concatenate([best, block_candidates(sim, offset, k, floor)], axis=1)
        best = np.partition(merged, k - 1, axis=1)[:, :k] if merged.shape[1] > k else merged  # keys carry their index
        seen += sim.shape[1]
    return unkey(np.sort(best, axis=1))


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


def nearest(queries: np.ndarray, train_blocks: Callable[[], Iterable[tuple[int, np.ndarray]]], k: int) -> dict[str, np.ndarray]:
    """A block of (unnormalised) test rows → their k most similar train images, best first:
    ``similarity`` (rows, k) float32 cosines and ``neighbour`` (rows, k) int64 train indices.
    Each row's answer depends on that row and the train blocks only, so blocks of rows can be
    computed anywhere and concatenated."""
    value, index = running_topk(normalise(queries), train_blocks, k)
    return {"similarity": value, "neighbour": index}


def features(values: np.ndarray, feature: str, norm: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    """Stored rows (class tokens, or patch tokens for ``mean``) → the chosen feature, unnormalised;
    ``norm``: the network's final LayerNorm (``store.parts.FinalNorm``) for ``cls-normed``."""
    values = np.asarray(values, dtype=np.float32)
    if feature == "mean":
        return values.mean(1)
    return norm(values) if norm is not None else values


def nearest_block(values: np.ndarray, *, bank, feature: str, norm, k: int, train_block: int) -> dict[str, np.ndarray]:
    """A block of test images' stored rows → their k nearest train images: the unit a runner ships
    to a worker. ``bank.value()`` is the (train, D) normalised train features (``infra.shared.Shared``,
    mapped once per worker), taken ``train_block`` rows at a time (the runner's one BLAS thread)."""
    matrix = bank.value()

    def blocks():
        for a in range(0, matrix.shape[0], train_block):
            yield a, np.asarray(matrix[a:a + train_block])

    return nearest(features(values, feature, norm), blocks, k)


def ranked_votes(similarity: np.ndarray, neighbour: np.ndarray, train_labels: np.ndarray, n_classes: int, ks: Sequence[int],
                 temperature: float, width: int) -> np.ndarray:
    """(rows, k, width) the ``width`` classes of largest vote of each row, for every k in ``ks``."""
    labels = np.asarray(train_labels, np.int64)[np.asarray(neighbour)]
    order = sorted(range(len(ks)), key=lambda j: ks[j])
    ranked = _ranked_votes(similarity, labels, n_classes, temperature, [ks[j] for j in order], width)
    return np.stack([ranked[order.index(j)] for j in range(len(ks))], axis=1)


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
    if n_train >= 2**32:
        raise ValueError(f"{n_train} train images: at most 2**32 - 1")

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
