"""Exact top-k search by cosine over a bank read in blocks: k-NN's train images, Hummingbird's memory.

One definition of the answer, whatever computes it (this module in numpy, ``search_torch`` on
the CPU or a GPU, any block size, any BLAS):

- the **cosine** of a (normalised) query and a bank row is the float32 rounding of their dot
  product taken in float64. The float64 sums of two libraries differ by about D · 2**-53
  relative, which the rounding to float32 removes unless the exact value lies that close to a
  float32 rounding midpoint; a float32 (or TF32) product instead rounds in its kernel's order and
  its last bit changes with the block's shape;
- **ties** have a rule: bank rows of equal cosine rank by row, the lower first, also at the k-th
  place. A neighbour is one uint64 key (``keys``): the cosine's order-preserving bits, inverted,
  above the row; keys are unique and the smaller key is the better neighbour, so a partition of
  keys selects exactly, with no tie to settle.

The numpy search screens each block with a float32 product (numpy's BLAS at float32 speed):
a float32 product of vectors of norms a, b differs from the exact dot product by at most
γ_D · a · b (γ_D = D·u / (1 − D·u), u = 2**-24, whatever the order of summation) and the
cosine from the exact product by u · a · b more, so the running list keeps, beside each row's k
best screened values, every value within twice that slack of the k-th (the true k best are
among them); at the end their cosines are computed in float64 (a second read of the bank's
blocks, a few hundred products per query) and the k best kept. The list is a few entries longer
than k on spread features and longer where values crowd within the slack (many equal rows: on a
collapsed network's features, every row of the bank). Past ``crowded_width(k)`` entries its cosines are
computed at once (one more read of the bank) and from then on each part's candidates as the part
comes (``exact_keys``), the list holding the k best cosines, no more: memory stays bounded
whatever the bank's values, and spread features, whose list never grows so wide, pay nothing.
Each block is multiplied a part at a time: a narrow first part, whose k-th largest per row sets
the floor, then parts of about ``SCREEN_VALUES`` products, which stay in cache (at a small width,
the screening, not the product, is most of the time). Memory is (query rows) × (block rows)
values at most whatever the bank's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

EMPTY = np.uint64(np.iinfo(np.uint64).max)  # a free place in a running list: worse than every key
U32 = 2.0**-24  # float32's unit roundoff
NORM_TOLERANCE = 1e-5  # a bank row's norm may exceed 1 by this much (rounding of ``normalise``)
PAIRS = 4096  # (query, row) pairs settled at once: (PAIRS × D) float64 values
DENSE_GAIN = 16  # a float64 matrix product costs about this much less a pair than gathered dot products
FIRST_COLUMNS = 256  # bank rows of the first product: a partition of each of its rows sets the floor the later parts are screened against
SCREEN_VALUES = 2**20  # products screened at once after the first (query rows × bank rows): a few MiB that stay in cache
MIN_COLUMNS = 1024  # but at least this many bank rows each (fewer, larger matrix products)


def normalise(features: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (at least 1e-12), in float32: torch's ``F.normalize``."""
    x = np.asarray(features, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.float32(1e-12))


def keys(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Keys of cosines (float32) at bank rows (below 2**32)."""
    bits = (np.asarray(values, np.float32) + np.float32(0)).view(np.uint32)  # + 0: -0.0 ranks as 0.0
    ordered = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))  # larger cosine, larger bits
    return ((~ordered).astype(np.uint64) << np.uint64(32)) | np.asarray(index, np.uint64)


def unkey(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, bank rows int64) of keys."""
    ordered = (~(key >> np.uint64(32))).astype(np.uint32)
    bits = np.where(ordered >> np.uint32(31), ordered & np.uint32(0x7FFFFFFF), ~ordered)
    return bits.view(np.float32), (key & np.uint64(0xFFFFFFFF)).astype(np.int64)


def check_search(rows: int, k: int, block: int) -> None:
    """Refuse what an exact top-k search of ``rows`` bank rows cannot answer, in numpy and torch
    alike: k outside the bank, a bank past the keys' 32 bits of row (``keys``), a bad block."""
    if isinstance(k, bool) or not 1 <= k <= rows:
        raise ValueError(f"k must lie in 1..{rows} (the bank's rows), got {k}")
    if rows >= 2**32:
        raise ValueError(f"{rows} bank rows: at most 2**32 - 1")
    if isinstance(block, bool) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block}")


def cosines(queries64: np.ndarray, block: np.ndarray) -> np.ndarray:
    """(rows, block rows) float32: float64 products rounded to float32 (the module's cosine)."""
    return (queries64 @ np.asarray(block, np.float64).T).astype(np.float32)


def _kth_largest(sim: np.ndarray, k: int) -> np.ndarray:
    """Each row's k-th largest value (a partition of the values: a third of an argpartition's cost)."""
    width = sim.shape[1]
    return np.partition(sim, width - k, axis=1)[:, width - k]


def _padded(rows: int, r: np.ndarray, row_keys: np.ndarray) -> np.ndarray:
    """(rows, most per row) keys of row ``r`` each (``r`` ascending), padded with ``EMPTY``."""
    counts = np.bincount(r, minlength=rows)
    out = np.full((rows, int(counts.max(initial=0))), EMPTY, np.uint64)
    out[r, np.arange(len(r)) - (np.cumsum(counts) - counts)[r]] = row_keys
    return out


def _below(values: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """float32 ``values - margin``, rounded down (a threshold that never cuts a value it should keep)."""
    return np.nextafter((values.astype(np.float64) - margin).astype(np.float32), np.float32(-np.inf))


def block_candidates(sim: np.ndarray, offset: int, k: int, floor: np.ndarray | None, margin: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Keys of a block's screened values that can belong to each row's top-k, padded with ``EMPTY``.

    ``margin`` (rows,): how far a screened value may lie from its cosine, twice (the value and
    the row's k-th each); zero where the values are the cosines. Before the running list is full
    (``floor`` None) a row keeps its values within ``margin`` of its own k-th largest; after, its
    values at or above ``floor`` (the running k-th less the margin), and a row with more than k of
    them (a block of its own class, in a set sorted by class) those within ``margin`` of its own k-th.
    """
    rows, width = sim.shape
    if floor is None and width <= k:
        cols = np.broadcast_to(np.arange(width), sim.shape)
        return keys(sim, offset + cols)
    threshold = _below(_kth_largest(sim, k), margin) if floor is None else floor
    flat = np.flatnonzero(np.greater_equal(sim, threshold[:, None], out=mask))  # ``mask``: a bool array of sim's shape to reuse
    r = flat // width
    values = sim.ravel()[flat]
    counts = np.bincount(r, minlength=rows)
    crowded = np.flatnonzero(counts > k) if floor is not None else ()
    if len(crowded):  # those rows keep their values near or above their own k-th largest
        own = np.full(rows, -np.inf, np.float32)
        own[crowded] = _below(_crowded_kth(values, r, counts, crowded, k), margin[crowded])
        keep = values >= own[r]
        flat, r, values = flat[keep], r[keep], values[keep]
    return _padded(rows, r, keys(values, offset + flat - r * width))


def _crowded_kth(values: np.ndarray, r: np.ndarray, counts: np.ndarray, crowded: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest value of each ``crowded`` row among its own ``values`` (row ``r``
    ascending; more than k each): its row's k-th largest, as a row's k best all lie above the
    floor that chose the values. Partitions (crowded rows × their most values), not whole rows."""
    starts = np.cumsum(counts) - counts
    widest = int(counts[crowded].max())
    padded = np.full((len(crowded), widest), -np.inf, np.float32)
    place = np.zeros(len(counts), np.int64)
    place[crowded] = np.arange(len(crowded))
    is_crowded = np.zeros(len(counts), bool)
    is_crowded[crowded] = True
    mine = is_crowded[r]
    rr = r[mine]
    padded[place[rr], np.flatnonzero(mine) - starts[rr]] = values[mine]
    return _kth_largest(padded, k)


def kept(merged: np.ndarray, k: int, margin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the running list, each row's floor): of merged keys (rows, n ≥ k real ones each), the k
    best and those whose value lies within ``margin`` of the row's k-th; the floor is that k-th
    less the margin (the least value a later block must bring to be kept). A row may keep a few
    more (the list is as wide as its widest row): a larger set of candidates gives the same answer."""
    if merged.shape[1] > k:
        merged = np.partition(merged, k - 1, axis=1)  # keys carry their row: the k best first, then the others
    floor = _below(unkey(merged[:, :k].max(1))[0], margin)  # the k-th best key: the worst of the k best
    if merged.shape[1] == k or not margin.any():
        return merged[:, :k], floor
    rest = merged[:, k:]
    extra = int(((rest != EMPTY) & (unkey(rest)[0] >= floor[:, None])).sum(1).max())
    if extra == 0:
        return merged[:, :k], floor
    if extra < rest.shape[1]:  # the smaller keys are the larger values: those kept come first
        rest = np.partition(rest, extra - 1, axis=1)
    return np.concatenate([merged[:, :k], rest[:, :extra]], axis=1), floor


def screen_slack(queries: np.ndarray) -> np.ndarray:
    """(rows,) float64: twice the most a float32 product of each query with a bank row of norm at
    most 1 + ``NORM_TOLERANCE`` may differ from the module's cosine: (γ_D + u) · |q| · |x| for
    each of the two values compared (a candidate's and the row's k-th)."""
    d = queries.shape[1]
    gamma = (d + 1) * U32 / (1 - (d + 1) * U32)
    return 2 * gamma * 1.001 * (1 + NORM_TOLERANCE) * np.linalg.norm(np.asarray(queries, np.float64), axis=1) + 1e-30


def check_normalised(block: np.ndarray, offset: int) -> None:
    """Bank rows of norm at most 1 + ``NORM_TOLERANCE`` (the screen's slack assumes it)."""
    widest = float(np.max(np.einsum("ij,ij->i", block, block, dtype=np.float64), initial=0.0))
    if widest > (1 + NORM_TOLERANCE) ** 2:
        raise ValueError(f"bank rows {offset}..{offset + block.shape[0]} are not normalised (a norm of {np.sqrt(widest):.6g})")


def settle(queries64: np.ndarray, running: np.ndarray, blocks: Iterable[tuple[int, np.ndarray]], k: int) -> np.ndarray:
    """The keys of the running list's k best candidates by their cosines (float64 products of the
    query and its candidates' rows, read again from ``blocks``)."""
    r, c = np.nonzero(running != EMPTY)
    index = unkey(running[r, c])[1]
    order = np.argsort(index, kind="stable")
    r, c, index = r[order], c[order], index[order]
    exact = np.empty(len(index), np.float32)
    for offset, block in blocks:
        start, stop = np.searchsorted(index, [offset, offset + block.shape[0]])
        for a in range(start, stop, PAIRS):
            b = min(a + PAIRS, stop)
            exact[a:b] = np.einsum("ij,ij->i", queries64[r[a:b]], np.asarray(block[index[a:b] - offset], np.float64))
    settled = np.full(running.shape, EMPTY, np.uint64)
    settled[r, c] = keys(exact, index)
    if settled.shape[1] > k:
        settled = np.partition(settled, k - 1, axis=1)[:, :k]
    return settled


def exact_keys(queries64: np.ndarray, found: np.ndarray, part: np.ndarray, offset: int) -> np.ndarray:
    """``found``'s keys (rows of ``part``, which starts at bank row ``offset``; padded with ``EMPTY``)
    with their cosines (``settle``'s, while the part is at hand). Where the pairs fill more than
    1 / ``DENSE_GAIN`` of (queries × the part's rows any query keeps) one float64 matrix product
    of those rows, else the pairs' own dot products."""
    r, c = np.nonzero(found != EMPTY)
    index = unkey(found[r, c])[1]
    local = index - offset
    cols = np.unique(local)  # the part's rows some query keeps
    if len(r) * DENSE_GAIN >= found.shape[0] * len(cols):
        exact = (queries64 @ np.asarray(part[cols], np.float64).T)[r, np.searchsorted(cols, local)].astype(np.float32)
    else:
        exact = np.empty(len(r), np.float32)
        for a in range(0, len(r), PAIRS):
            b = min(a + PAIRS, len(r))
            exact[a:b] = np.einsum("ij,ij->i", queries64[r[a:b]], np.asarray(part[local[a:b]], np.float64))
    out = np.full(found.shape, EMPTY, np.uint64)
    out[r, c] = keys(exact, index)
    return out


def crowded_width(k: int) -> int:
    """Entries of a running list past which its values crowd within the screen's slack: 2k, at least k + 256."""
    return max(2 * k, k + 256)


def running_topk(queries: np.ndarray, blocks: Callable[[], Iterable[tuple[int, np.ndarray]]], k: int, screen: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The k largest cosines of each (normalised) query over every bank block, sorted, equal
    cosines by bank row; (cosines float32, rows int64), each (queries, k).

    ``blocks()`` yields (offset, normalised rows) in increasing offset; offsets make the rows
    global. ``screen``: each block is multiplied in float32 and the running list keeps every
    candidate within the screen's slack (``screen_slack``) of its k-th; at the end their cosines
    are computed in float64 (``settle``, a second pass over the blocks) and the k best kept.
    Without ``screen`` every product is taken in float64 (twice the time). The answer is the same,
    and does not depend on the blocks' sizes.
    """
    q = np.ascontiguousarray(queries, np.float32)
    q64 = q.astype(np.float64)
    margin = screen_slack(q) if screen else np.zeros(q.shape[0])
    none = np.zeros(q.shape[0])
    exact = not screen  # the list's values are cosines (it then keeps the k best, no more)
    best = np.full((q.shape[0], 0), EMPTY, np.uint64)
    floor, seen = None, 0
    step, first = max(SCREEN_VALUES // max(1, q.shape[0]), MIN_COLUMNS, k), max(FIRST_COLUMNS, 2 * k)
    products, mask = np.zeros(0, np.float32), np.zeros(0, bool)  # every part's, reused: never wider than a block (the caller's bound on memory)
    for offset, block in blocks():
        x = np.ascontiguousarray(block, np.float32)
        if screen:
            check_normalised(x, offset)
        need = q.shape[0] * min(max(step, first), x.shape[0])
        if products.size < need:
            products, mask = np.empty(need, np.float32), np.empty(need, bool)
        a = 0
        while a < x.shape[0]:  # a block's rows a part at a time: the first few, then parts whose products stay in cache
            b = min(a + (first if floor is None else step), x.shape[0])
            part, shape = x[a:b], (q.shape[0], b - a)
            sim = np.matmul(q, part.T, out=products[: q.shape[0] * (b - a)].reshape(shape)) if screen else (q64 @ part.astype(np.float64).T).astype(np.float32)
            found = block_candidates(sim, offset + a, k, floor, margin, mask[: sim.size].reshape(shape))
            merged = np.concatenate([best, exact_keys(q64, found, part, offset + a) if exact and screen else found], axis=1)
            seen += b - a
            if seen < k:
                best = merged
            elif exact:
                best = kept(merged, k, none)[0]
                floor = _below(unkey(best.max(1))[0], margin)  # the k-th cosine less the slack: what a screened value must reach
            else:
                best, floor = kept(merged, k, margin)
                if best.shape[1] > crowded_width(k):  # values crowd within the slack: their cosines now, then each part's as it comes
                    best, exact = settle(q64, best, blocks(), k), True
                    floor = _below(unkey(best.max(1))[0], margin)
            a = b
    return unkey(np.sort(best[:, :k] if exact else settle(q64, best, blocks(), k), axis=1))


PRODUCT_BYTES = 16  # host or device bytes a block product needs per (query, bank row): its float32 or float64 value, a copy, a mask


def block_rows(work_memory: int | None, query_rows: int, default: int) -> int:
    """Bank rows per block product so that ``query_rows`` × rows products fit in ``work_memory``
    MiB (``Placement.work_memory``; None: ``default``); at least 256. Any block gives the same answer."""
    if work_memory is None:
        return default
    return max(256, int(work_memory) * 2**20 // (PRODUCT_BYTES * max(1, int(query_rows))))


def bank_blocks(bank, block: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, rows) of a bank ``block`` rows at a time: an array, or a handle with ``shape`` and
    ``rows(a, b)`` (``infra.shared.Shared``: read from its file block by block, never whole)."""
    stop = bank.shape[0] if stop is None else stop
    read = getattr(bank, "rows", None)
    for a in range(start, stop, block):
        b = min(a + block, stop)
        yield a, (read(a, b) if read is not None else np.asarray(bank[a:b]))


def nearest(queries: np.ndarray, bank, k: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, bank rows int64), each (queries, k), best first: the k bank rows most
    similar to each (unnormalised) query, exactly, ``block`` bank rows at a time (``bank_blocks``:
    normalised rows in an array or a ``Shared`` file). Each query's answer depends on that query
    and the bank only, so blocks of queries can be computed anywhere and concatenated."""
    check_search(int(bank.shape[0]), k, block)
    return running_topk(normalise(queries), lambda: bank_blocks(bank, int(block)), int(k))
