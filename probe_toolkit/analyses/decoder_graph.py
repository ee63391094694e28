"""The decoder's graph on one image's keys: unit keys and their float32 cosines with a proven
error band (``cosines``), and TokenCut's binary graph W_ij = 1 where cos > τ, else ε, decided
exactly as float64 would (``adjacency``, ``key_graph``), stored sparse as A or its complement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..infra.errors import ProbeError

if TYPE_CHECKING:  # scipy where it is used: a command's main process, which hands the images to workers, never loads it
    import scipy.sparse


@dataclass(frozen=True)
class Cosines:
    """Unit keys in float64 and float32, and the proven error ``band`` of a float32 cosine;
    ``approx`` holds every float32 cosine when several graphs share them (sweeps, MaskCut's
    rounds), else each graph computes its row blocks of them as it decides them."""

    unit: np.ndarray  # (N, C) float64
    single: np.ndarray  # (N, C) float32
    band: float
    approx: np.ndarray | None = None  # (N, N) float32, or None

    @property
    def n(self) -> int:
        return self.unit.shape[0]


def cosines(keys: np.ndarray, *, center: bool, shared: bool = False) -> Cosines:
    """Centre (optionally) and L2-normalise the keys; float32 cosines (exact near τ later),
    all of them computed now when ``shared`` (several graphs on the same keys)."""
    keys = np.asarray(keys, dtype=np.float64)
    if keys.ndim != 2 or keys.shape[0] < 4:
        raise ProbeError(None, f"keys of shape {keys.shape} are not (patch ≥ 4, channel)", "pass one image's keys")
    if not np.isfinite(keys).all():
        raise ProbeError(None, "keys hold NaN or inf", "re-extract the image (its row in the store is unfinished?)")
    if center:
        keys = keys - keys.mean(axis=0)
    norm = np.linalg.norm(keys, axis=1, keepdims=True)
    unit = np.divide(keys, norm, out=np.zeros_like(keys), where=norm > 0)
    f32 = unit.astype(np.float32)
    # |float32 dot − float64 dot| ≤ (C + 2)·u32 for unit vectors: rounding of the inputs and a
    # C-term float32 accumulation (Higham's γ_C bound with Cauchy–Schwarz), with 2× headroom
    band = 2.0 * (keys.shape[1] + 2) * float(np.finfo(np.float32).eps)
    return Cosines(unit=unit, single=f32, band=band, approx=f32 @ f32.T if shared else None)


@dataclass(frozen=True)
class Graph:
    """W = (1 − ε)·A + ε·11ᵀ with A the 0/1 adjacency (cos > τ), stored as a sparse 0/1 matrix:
    A itself, or its complement Ā = 11ᵀ − A when A is more than half full (``complement``), so
    the stored matrix holds at most half the entries and every product with W stays sparse."""

    adjacency: scipy.sparse.csr_array  # float64 0/1: A, or Ā when ``complement``
    eps: float
    degree: np.ndarray  # (N,) = row sums of W
    complement: bool = False

    @property
    def n(self) -> int:
        return self.degree.shape[0]

    def matvec(self, v: np.ndarray) -> np.ndarray:
        """W @ v (v of shape (N,) or (N, k)); with Ā stored, W v = Σv − (1 − ε)·Ā v."""
        if self.complement:
            return v.sum(axis=0) - (1.0 - self.eps) * (self.adjacency @ v)
        return (1.0 - self.eps) * (self.adjacency @ v) + self.eps * v.sum(axis=0)

    def dense(self) -> np.ndarray:
        a = self.adjacency.toarray() > 0
        return np.where(a != self.complement, 1.0, self.eps)


ROWS = 256  # cosine rows computed and decided at once (a float32 product of this height runs at full speed)


def _decided(cos: Cosines, tau: float, painted: np.ndarray | None) -> np.ndarray:
    """cos > τ as float64 decides it, into an (N, 2^k ≥ N) bool array whose padding columns are
    False (a power-of-two row stride makes column indices a bit mask).

    Row block by row block, the upper triangle only (its cosines by one float32 product per
    block, or read from ``cos.approx``), each block's decisions copied to the lower triangle:
    the decisions are exact, hence symmetric. Outside ±band of τ the float32 cosine decides;
    inside, the float64 dot of the unit keys (the same products either way round).
    Patches in ``painted`` have zeroed keys (MaskCut): their cosines, self included, are 0.
    """
    n = cos.n
    stride = 1 << max(n - 1, 1).bit_length()
    # float32 thresholds one ulp outside τ ± band: every entry not between them is decided by float32
    above = np.nextafter(np.float32(tau + cos.band), np.float32(np.inf))
    below = np.nextafter(np.float32(tau - cos.band), np.float32(-np.inf))
    out = np.zeros((n, stride), dtype=bool)
    scratch = np.empty(min(ROWS, n) * n, dtype=np.float32) if cos.approx is None else None
    near = np.empty(min(ROWS, n) * n, dtype=bool)
    zero = 0.0 > tau  # the decision for a painted patch's cosines
    painted = painted if painted is not None and painted.any() else None
    for start in range(0, n, ROWS):
        stop = min(start + ROWS, n)
        shape = (stop - start, n - start)
        if scratch is None:
            block = cos.approx[start:stop, start:]
        else:
            block = np.matmul(cos.single[start:stop], cos.single[start:].T, out=scratch[: shape[0] * shape[1]].reshape(shape))
        a, m = out[start:stop, start:n], near[: shape[0] * shape[1]].reshape(shape)
        np.greater(block, above, out=a)
        np.greater_equal(block, below, out=m)
        m ^= a  # below ≤ approx ≤ above
        if painted is not None:
            cols = painted[start:]
            a[:, cols], m[:, cols] = zero, False
            rows = painted[start:stop]
            a[rows], m[rows] = zero, False
        hit = np.flatnonzero(m)
        if hit.size:
            r, c = hit // shape[1], hit % shape[1]
            a[r, c] = np.einsum("ij,ij->i", cos.unit[start + r], cos.unit[start + c]) > tau
        out[stop:n, start:stop] = a[:, stop - start :].T
    return out


def adjacency(cos: Cosines, tau: float, painted: np.ndarray | None = None) -> np.ndarray:
    """The boolean adjacency cos > τ, exactly as float64 would decide it.

    Patches in ``painted`` have zeroed keys (MaskCut), so their cosines with every patch,
    themselves included, are 0.
    """
    return _decided(cos, tau, painted)[:, : cos.n]


def key_graph(cos: Cosines, tau: float, eps: float, painted: np.ndarray | None = None) -> Graph:
    """TokenCut's binary graph on the keys; the sparse 0/1 matrix of A, or of Ā when A is over half full."""
    import scipy.sparse

    a = _decided(cos, tau, painted)
    n, stride = a.shape
    flat = np.flatnonzero(a)  # sorted, so each row's entries lie between multiples of the stride
    edges = np.arange(n + 1, dtype=np.int64) * stride
    indptr = np.searchsorted(flat, edges)
    count = np.diff(indptr)
    degree = count + eps * (n - count)
    complement = bool(flat.size > 0.5 * n * n)
    if complement:
        a[:, :n] ^= True
        flat = np.flatnonzero(a)
        indptr = np.searchsorted(flat, edges)
    cols = np.bitwise_and(flat, stride - 1, out=flat).astype(np.int32)
    matrix = scipy.sparse.csr_array((np.ones(cols.size), cols, indptr.astype(np.int32)), shape=(n, n))
    return Graph(adjacency=matrix, eps=float(eps), degree=degree.astype(np.float64), complement=complement)
