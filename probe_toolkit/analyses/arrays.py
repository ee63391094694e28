"""The array operations the selection rules are written in, for numpy arrays and torch tensors.

``training/`` runs the rules on torch tensors inside a step (on a GPU); ``probe neighbours`` runs
the very same rules on a store's numpy arrays, in processes that never import torch (its import
is most of that command's start-up). Each operation means the same in both libraries, the
order of ties included, and ``tests/test_selection.py`` holds every rule's numpy result to its
torch result. Only what the rules need is here; the rest (indexing, comparisons, ``&``, ``~``,
``.sum``, ``.any``, ``.reshape``) is spelled alike in both.

    library(x)        the operations for x's library (NUMPY, or the torch ones)
    without_grad(fn)  fn under ``torch.no_grad`` where torch is loaded, as is elsewhere
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

EPS = 1e-12  # torch.nn.functional.normalize's default


def without_grad(fn):
    """``fn`` under ``torch.no_grad()`` once torch is loaded (it holds no numpy call back)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        torch = sys.modules.get("torch")
        if torch is None:
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)

    return run


class Numpy:
    """The operations on numpy arrays (CPU, and nothing imports torch)."""

    def asarray(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def table(self, array: np.ndarray, like: np.ndarray) -> np.ndarray:
        """A numpy table in ``like``'s library and on its device."""
        return array

    def asarray_like(self, value, like: np.ndarray) -> np.ndarray:
        return np.asarray(value, dtype=like.dtype)

    def cosine(self, tokens: np.ndarray) -> np.ndarray:
        """(B, N, N) float32 cosine of L2-normalised rows (norms floored at EPS, as torch's)."""
        x = tokens.astype(np.float32)
        norm = np.sqrt(np.einsum("bnd,bnd->bn", x, x))
        unit = x / np.maximum(norm, np.float32(EPS))[..., None]
        return np.matmul(unit, unit.transpose(0, 2, 1))

    def gather(self, x: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``x`` read at ``index`` along the last axis, ``x`` broadcast over index's leading axes."""
        return np.take_along_axis(np.broadcast_to(x, index.shape[:-1] + x.shape[-1:]), index, axis=-1)

    def fill(self, x: np.ndarray, mask: np.ndarray, value) -> np.ndarray:
        return np.where(mask, np.asarray(value, dtype=x.dtype), x)

    def select(self, values: np.ndarray, n: int, largest: bool) -> np.ndarray:
        """Indices of the n largest (smallest) along the last axis in that order, ties to the lower
        index. Fast path: a partition to the n + 1 smallest keys, sorted stably from index
        order; where the n-th and (n + 1)-th keys differ, the n chosen are the only ones. Rows
        tied across that boundary are sorted whole. Infinite keys are padding, as in torch's."""
        keys = -values if largest else values
        count = keys.shape[-1]
        if n + 1 >= count:
            return np.argsort(keys, axis=-1, kind="stable")[..., :n]
        part = np.sort(np.argpartition(keys, n, axis=-1)[..., : n + 1], axis=-1)
        top = np.take_along_axis(part, np.argsort(np.take_along_axis(keys, part, -1), axis=-1, kind="stable"), -1)
        edge = np.take_along_axis(keys, top[..., n - 1 : n + 1], -1)
        tied = (edge[..., 0] == edge[..., 1]) & np.isfinite(edge[..., 1])
        index = top[..., :n]
        if tied.any():
            index[tied] = np.argsort(keys[tied], axis=-1, kind="stable")[:, :n]
        return index

    def kth(self, values: np.ndarray, k: int) -> np.ndarray:
        """The k-th smallest (1-based) along the last axis."""
        return np.partition(values, k - 1, axis=-1)[..., k - 1]

    def row_min(self, values: np.ndarray) -> np.ndarray:
        return values.min(-1)

    def isfinite(self, x: np.ndarray) -> np.ndarray:
        return np.isfinite(x)

    def where(self, condition, a, b) -> np.ndarray:
        return np.where(condition, a, b)

    def eye(self, n: int, like: np.ndarray) -> np.ndarray:
        return np.eye(n, dtype=bool)

    def cleared(self, mask: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``mask`` with False at ``index`` along the last axis (in place)."""
        np.put_along_axis(mask, index, False, axis=-1)
        return mask

    def upper(self, matrices: np.ndarray) -> np.ndarray:
        """(B, N(N − 1)/2): each matrix's entries above the diagonal, row by row."""
        i, j = np.triu_indices(matrices.shape[-1], k=1)
        return matrices[:, i, j]

    def pad_last(self, x: np.ndarray, width: int, value) -> np.ndarray:
        return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width)], constant_values=value)

    def expand(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(x, shape)

    def copy(self, x: np.ndarray) -> np.ndarray:
        return np.array(x)

    def concat(self, parts) -> np.ndarray:
        return np.concatenate(parts)

    def stack(self, parts) -> np.ndarray:
        return np.stack(parts)

    def ones_bool(self, like: np.ndarray) -> np.ndarray:
        return np.ones(like.shape, dtype=bool)


class Torch:
    """The operations on torch tensors, on the tensor's own device."""

    def __init__(self) -> None:
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F

    def asarray(self, x: Any):
        return self.torch.as_tensor(x)

    def table(self, array: np.ndarray, like):
        return self.torch.as_tensor(array, device=like.device)

    def asarray_like(self, value, like):
        return self.torch.as_tensor(value, dtype=like.dtype, device=like.device)

    def cosine(self, tokens):
        unit = self.F.normalize(tokens.float(), dim=-1, eps=EPS)
        with self.torch.autocast(device_type=unit.device.type, enabled=False):  # float32 even inside autocast
            return self.torch.bmm(unit, unit.transpose(1, 2))

    def gather(self, x, index):
        return self.torch.gather(x.expand(*index.shape[:-1], x.shape[-1]), -1, index)

    def fill(self, x, mask, value):
        return x.masked_fill(mask, value)

    def select(self, values, n: int, largest: bool):
        """As ``Numpy.select``. Fast path: ``torch.topk`` of n + 1 values; when no two finite
        values among them are equal, the n chosen and their order are fully determined by the
        values. Rows with a tie are redone exactly with the unique integer keys of
        ``_order_key``. Infinite values are padding and may come in any order among themselves."""
        count = values.shape[-1]
        found = self.torch.topk(values, min(n + 1, count), dim=-1, largest=largest, sorted=True)
        top = found.values
        tied = ((top[..., 1:] == top[..., :-1]) & self.torch.isfinite(top[..., 1:])).any(-1)
        index = found.indices[..., :n]
        if bool(tied.any()):
            rows = tied.reshape(-1).nonzero().squeeze(1)
            flat = index.reshape(-1, n).clone()
            flat[rows] = self.torch.topk(self._order_key(values.reshape(-1, count)[rows], largest), n, dim=-1).indices
            index = flat.view(index.shape)
        return index

    def _order_key(self, values, largest: bool):
        """Unique int64 keys whose largest come first in the order asked for, ties to the lower index.

        The float's bits are mapped to an int32 of the same order (negative floats have their
        magnitude bits flipped; ``~`` reverses it for ``largest=False``), then scaled by N and
        given N − 1 − index. Every key is unique, so ``torch.topk`` of the keys is exact and
        deterministic, and much cheaper than a stable sort.
        """
        torch = self.torch
        bits = (values.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
        ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)
        if not largest:
            ordered = ~ordered
        n = values.shape[-1]
        return ordered * n + (n - 1 - torch.arange(n, device=values.device))

    def kth(self, values, k: int):
        return self.torch.kthvalue(values, k, dim=-1).values

    def row_min(self, values):
        return values.min(-1).values

    def isfinite(self, x):
        return self.torch.isfinite(x)

    def where(self, condition, a, b):
        return self.torch.where(condition, a, b)

    def eye(self, n: int, like):
        return self.torch.eye(n, dtype=self.torch.bool, device=like.device)

    def cleared(self, mask, index):
        return mask.scatter_(-1, index, False)

    def upper(self, matrices):
        n = matrices.shape[-1]
        i, j = self.torch.triu_indices(n, n, offset=1, device=matrices.device)
        return matrices[:, i, j]

    def pad_last(self, x, width: int, value):
        return self.F.pad(x, (0, width), value=value)

    def expand(self, x, shape):
        return x.expand(*shape)

    def copy(self, x):
        return x.clone()

    def concat(self, parts):
        return self.torch.cat(list(parts))

    def stack(self, parts):
        return self.torch.stack(list(parts))

    def ones_bool(self, like):
        return self.torch.ones_like(like, dtype=self.torch.bool)


NUMPY = Numpy()


@functools.lru_cache(maxsize=1)
def _torch() -> Torch:
    return Torch()


def library(x: Any) -> Numpy | Torch:
    """The operations for ``x``: numpy's for a numpy array (or a list), else torch's."""
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        return NUMPY
    return _torch()
