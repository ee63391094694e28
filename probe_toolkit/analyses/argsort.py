"""The order torch's unstable ``argsort`` gives on the CPU, ties included, without torch.

``torch.argsort(x)`` (``stable=False``, the default) sorts on the CPU with ``std::sort`` over
(value, index) pairs compared by value alone (ATen ``native/cpu/SortingKernel.cpp``:
``KeyValueCompAsc`` / ``KeyValueCompDesc``), so equal values come out in the order libstdc++'s
introsort leaves them: not by index. LOST (valeoai/LOST ``object_discovery.py``
``patch_scoring``) ranks patches by ``torch.argsort(-degree, descending=True)`` and many patches
share a degree, so its seed and its k patches follow that order. ``argsort`` below is libstdc++'s
``std::sort`` (``bits/stl_algo.h``, ``bits/stl_heap.h``) written out over a key list: introsort
with the median of three moved to the front, an unguarded Hoare partition, heapsort beyond depth
2⌊log₂ n⌋, and a final insertion sort of runs of 16. ``x < y`` on the keys is the comparison,
so ascending ``argsort(d)`` is ``torch.argsort(-d, descending=True)`` on the CPU element for
element. The test suite checks it against the installed torch; CUDA's sort (bitonic below 4,096
elements in PyTorch 1.7, LOST's version) orders ties another way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

THRESHOLD = 16  # libstdc++ _S_threshold: runs this short are left to the final insertion sort


def argsort(keys: Sequence[float] | np.ndarray) -> np.ndarray:
    """Indices that sort ``keys`` ascending, ties in the order ``std::sort`` leaves them (int64)."""
    key = [float(k) for k in np.asarray(keys).ravel()]
    index = list(range(len(key)))
    n = len(key)
    if n > 1:
        _introsort(key, index, 0, n, 2 * (n.bit_length() - 1))
        _final_insertion_sort(key, index, 0, n)
    return np.asarray(index, dtype=np.int64)


def _swap(key: list, index: list, a: int, b: int) -> None:
    key[a], key[b] = key[b], key[a]
    index[a], index[b] = index[b], index[a]


def _introsort(key: list, index: list, first: int, last: int, depth: int) -> None:
    while last - first > THRESHOLD:
        if depth == 0:
            _heapsort(key, index, first, last)
            return
        depth -= 1
        cut = _partition_pivot(key, index, first, last)
        _introsort(key, index, cut, last, depth)
        last = cut


def _partition_pivot(key: list, index: list, first: int, last: int) -> int:
    """``__unguarded_partition_pivot``: the median of (first + 1, middle, last - 1) moved to
    ``first``, then the range after it partitioned about it."""
    mid = first + (last - first) // 2
    a, b, c = first + 1, mid, last - 1
    if key[a] < key[b]:
        median = b if key[b] < key[c] else c if key[a] < key[c] else a
    else:
        median = a if key[a] < key[c] else c if key[b] < key[c] else b
    _swap(key, index, first, median)
    pivot = key[first]
    lo, hi = first + 1, last
    while True:
        while key[lo] < pivot:
            lo += 1
        hi -= 1
        while pivot < key[hi]:
            hi -= 1
        if not lo < hi:
            return lo
        _swap(key, index, lo, hi)
        lo += 1


def _final_insertion_sort(key: list, index: list, first: int, last: int) -> None:
    if last - first > THRESHOLD:
        _insertion_sort(key, index, first, first + THRESHOLD)
        for i in range(first + THRESHOLD, last):
            _linear_insert(key, index, i)
    else:
        _insertion_sort(key, index, first, last)


def _insertion_sort(key: list, index: list, first: int, last: int) -> None:
    for i in range(first + 1, last):
        if key[i] < key[first]:  # below the first: shift the whole run up by one
            k, v = key[i], index[i]
            key[first + 1 : i + 1], index[first + 1 : i + 1] = key[first:i], index[first:i]
            key[first], index[first] = k, v
        else:
            _linear_insert(key, index, i)


def _linear_insert(key: list, index: list, last: int) -> None:
    """``__unguarded_linear_insert``: move element ``last`` down past every larger one."""
    k, v = key[last], index[last]
    j = last - 1
    while k < key[j]:
        key[j + 1], index[j + 1] = key[j], index[j]
        j -= 1
    key[j + 1], index[j + 1] = k, v


def _heapsort(key: list, index: list, first: int, last: int) -> None:
    """``__partial_sort(first, last, last)``: ``__make_heap`` then ``__sort_heap``."""
    n = last - first
    if n >= 2:
        for parent in range((n - 2) // 2, -1, -1):
            _adjust_heap(key, index, first, parent, n, key[first + parent], index[first + parent])
    while last - first > 1:
        last -= 1
        k, v = key[last], index[last]
        key[last], index[last] = key[first], index[first]
        _adjust_heap(key, index, first, 0, last - first, k, v)


def _adjust_heap(key: list, index: list, first: int, hole: int, n: int, k: float, v: int) -> None:
    top = hole
    child = hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if key[first + child] < key[first + child - 1]:
            child -= 1
        key[first + hole], index[first + hole] = key[first + child], index[first + child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        key[first + hole], index[first + hole] = key[first + child - 1], index[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and key[first + parent] < k:  # __push_heap
        key[first + hole], index[first + hole] = key[first + parent], index[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    key[first + hole], index[first + hole] = k, v
