"""The decoder's eigen-solver: the Fiedler vector of (D − W) x = λ D x on a ``Graph``, through
𝒩 = D^-½ W D^-½ with its known top vector deflated; Lanczos without restarts, stopping early
once the caller's certificate holds, ARPACK settling the vector, dense ``eigh`` for small graphs
and as the fallback. ``Cut`` carries the vector and the bound on its error (``Cut.error``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .decoder_graph import Graph

if TYPE_CHECKING:  # scipy where it is used: a command's main process, which hands the images to workers, never loads it
    import scipy.sparse.linalg

SOLVERS = ("lanczos", "arpack", "dense")
DENSE_BELOW = 256  # dense eigh of 𝒩 is faster than ARPACK for small graphs
SETTLED = 1e-15  # Lanczos residual estimate at which ARPACK (tol 0) settles the vector in one short cycle
SETTLE_NCV = 4  # ARPACK's basis for that cycle (a settled vector converges in its first)
PRECISE = 1e-8  # relative accuracy of λ2 (and so of the score) at which a certified cut may stop early


@dataclass(frozen=True)
class Cut:
    """The Fiedler vector x (D-normalised, xᵀDx = 1, arbitrary sign) and what bounds its error."""

    x: np.ndarray
    lambda2: float
    lambda3: float  # estimate; ``lambda3_low`` is a lower bound
    lambda3_low: float
    residual: float  # ‖𝒩y − μy‖ of the unit vector y = D^½ x
    solver: str
    steps: int = 0  # Lanczos vectors built (0: dense solve)

    @property
    def gap(self) -> float:
        """Distance of λ2 from the rest of the spectrum (λ1 = 0 and λ3)."""
        return min(self.lambda2, self.lambda3_low - self.lambda2)

    @property
    def precise(self) -> bool:
        """λ2 known to ``PRECISE`` relative: the Rayleigh quotient is off by at most ‖r‖²/gap."""
        return self.gap > 0 and self.residual**2 <= PRECISE * self.lambda2 * self.gap

    def error(self, scale: np.ndarray) -> np.ndarray:
        """Per-patch bound on |x̂ − x| against any backward-stable dense solver (Davis–Kahan:
        sin θ ≤ s = noise/gap, so ‖ŷ − y‖ = 2 sin(θ/2) ≤ s·√(2/(1 + √(1 − s²))), 1 + s²/8 + …)."""
        n = self.x.shape[0]
        noise = self.residual + 16.0 * n * float(np.finfo(np.float64).eps)
        gap = self.gap
        if not gap > 0 or not noise < gap:
            return np.full(n, np.inf)
        s = noise / gap
        return scale * (s * math.sqrt(2.0 / (1.0 + math.sqrt(1.0 - s * s))))


def _normalized(graph: Graph) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """D^-½, the known top eigenvector D^½1/‖·‖ of 𝒩, and v ↦ 𝒩v = D^-½WD^-½v through the
    stored 0/1 matrix (A, or Ā = 11ᵀ − A), scaled on the vectors: no N × N matrix is formed."""
    scale = 1.0 / np.sqrt(graph.degree)
    top = np.sqrt(graph.degree)
    top /= np.linalg.norm(top)
    a, eps = graph.adjacency, graph.eps
    if graph.complement:  # W u = Σu − (1 − ε)·Ā u

        def apply(v: np.ndarray) -> np.ndarray:
            u = scale * v
            return scale * (u.sum() - (1.0 - eps) * (a @ u))

    else:  # W u = (1 − ε)·A u + ε·Σu

        def apply(v: np.ndarray) -> np.ndarray:
            u = scale * v
            return scale * ((1.0 - eps) * (a @ u) + eps * u.sum())

    return scale, top, apply


def _dense_cut(graph: Graph, scale: np.ndarray) -> Cut:
    import scipy.linalg

    w = graph.dense()
    normal = scale[:, None] * w * scale[None, :]
    n = graph.n
    values, vectors = scipy.linalg.eigh(normal, subset_by_index=[n - 3, n - 1], driver="evx")  # evx: 3× evr here
    if vectors.shape[1] < 3:  # LAPACK may return fewer pairs on a flat spectrum
        values, vectors = scipy.linalg.eigh(normal, driver="evd")
        values, vectors = values[-3:], vectors[:, -3:]
    y = vectors[:, 1]
    residual = float(np.linalg.norm(normal @ y - values[1] * y))
    lam2, lam3 = 1.0 - values[1], 1.0 - values[0]
    return Cut(x=scale * y, lambda2=lam2, lambda3=lam3, lambda3_low=lam3 - residual, residual=residual, solver="dense")


class _Unsettled(Exception):
    """ARPACK returned, but not the eigenpair we asked for."""


def _largest(op: scipy.sparse.linalg.LinearOperator, start: np.ndarray, tol: float, short: int = 16) -> tuple[float, np.ndarray]:
    """Largest eigenpair by ARPACK: a short Lanczos basis first (it suffices when the eigenvalue
    is well separated), a longer one when that does not converge in a few restarts (clusters).
    A near-degenerate pair may not converge in 100 restarts of the long basis either; the
    caller then falls back to the dense solver."""
    import scipy.sparse.linalg

    n = op.shape[0]
    try:
        values, vectors = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=start, tol=tol, ncv=min(short, n - 1), maxiter=4)
    except scipy.sparse.linalg.ArpackNoConvergence:
        values, vectors = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=start, tol=tol, ncv=min(48, n - 1), maxiter=100)
    return float(values[0]), vectors[:, 0] / np.linalg.norm(vectors[:, 0])


def _lanczos(
    matvec: Callable[[np.ndarray], np.ndarray],
    start: np.ndarray,
    wanted: int,
    settled: Callable[[np.ndarray, np.ndarray, Callable[[int], np.ndarray]], bool],
    *,
    least: int = 16,
    most: int = 400,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The ``wanted`` largest Ritz pairs (values descending, unit vectors as rows) of a symmetric
    operator on the Krylov space of ``start``, and that space's dimension.

    Plain Lanczos with full reorthogonalisation (so no spurious copies) and no restarts:
    nothing the space has learnt is thrown away, as an implicit restart does. The space grows,
    checked every 4 steps and never below ``least`` vectors (what an ARPACK run with 16 vectors
    builds first), until ``settled(values, estimates, ritz)``, the estimates being Lanczos's
    residual norms β·|s_last| and ``ritz(k)`` the first k Ritz vectors (computed on demand), or
    until ``most`` vectors (the caller checks residuals explicitly).
    """
    import scipy.linalg

    n = start.shape[0]
    most = max(wanted + 1, min(most, n - 1))
    basis = np.empty((most + 1, n))
    basis[0] = start / np.linalg.norm(start)
    alpha, beta = np.empty(most), np.empty(most)
    for j in range(most):
        w = matvec(basis[j])
        alpha[j] = basis[j] @ w
        w -= alpha[j] * basis[j]
        if j:
            w -= beta[j - 1] * basis[j - 1]
        q = basis[: j + 1]
        before = np.linalg.norm(w)
        w -= q.T @ (q @ w)  # full reorthogonalisation, again when it removed much (DGKS, as ARPACK)
        beta[j] = np.linalg.norm(w)
        if beta[j] < 0.7071 * before:
            w -= q.T @ (q @ w)
            beta[j] = np.linalg.norm(w)
        last = beta[j] <= 1e-14 or j + 1 == most  # an invariant subspace, or the longest run
        if last and j + 1 < wanted:
            raise _Unsettled  # the start spans an invariant subspace smaller than the pairs wanted
        if j + 1 >= wanted and (last or (j + 1 >= least and (j + 1 - least) % 4 == 0)):
            values, vectors = scipy.linalg.eigh_tridiagonal(alpha[: j + 1], beta[:j], select="i", select_range=(j + 1 - wanted, j))
            values, vectors = values[::-1], vectors[:, ::-1]

            def ritz(k: int, vectors: np.ndarray = vectors, q: np.ndarray = q) -> np.ndarray:
                rows = vectors[:, :k].T @ q
                return rows / np.linalg.norm(rows, axis=1, keepdims=True)

            if last or settled(values, beta[j] * np.abs(vectors[-1]), ritz):
                return values, ritz(wanted), j + 1
        basis[j + 1] = w / beta[j]
    raise AssertionError("unreachable")


def normalized_cut(graph: Graph, *, seed: int = 0, enough: Callable[[Cut], bool] | None = None) -> Cut:
    """Second smallest generalized eigenpair of (D − W, D), via 𝒩 with D^½1 deflated.

    A Lanczos run without restarts (``_lanczos``) brings y to machine precision and gives μ3's
    Ritz pair; ARPACK (tol at machine precision), started from that y, settles μ2 = 1 − λ2 and y
    in one short cycle. μ3 sizes the eigengap: θ3 ≤ μ3 (interlacing), its residual ‖r3‖ with y
    deflated is measured and must be under a quarter of the gap (else a Lanczos run on the
    deflated operator refines it), and the gap's lower bound takes θ3 + ‖r3‖. Dense ``eigh`` of 𝒩 serves
    small graphs and any case ARPACK does not settle (no convergence, or a residual it should
    not have). The start vector comes from ``seed``, so runs repeat exactly.

    ``enough(cut)`` (the caller's certificate) stops the run early: at a check where it holds
    for the Ritz pairs with their residuals measured explicitly (y's, and z's with y deflated,
    under a quarter of the gap) and λ2 is known to ``PRECISE`` relative (Rayleigh quotient error
    ≤ ‖r‖²/gap), that cut is returned (solver ``lanczos``); the error bound of ``Cut.error`` is
    as rigorous at that residual as at machine precision. Where it never holds, the run goes on
    to machine precision as without it.
    """
    import scipy.sparse.linalg

    n = graph.n
    scale, top, apply = _normalized(graph)
    if n <= DENSE_BELOW:
        return _dense_cut(graph, scale)

    def deflated(deflate: list[np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        def matvec(v: np.ndarray) -> np.ndarray:
            v = v.ravel()
            out = apply(v)
            for u in deflate:  # eigenvalue moved to μ − 2 ≤ −1, the bottom of 𝒩's spectrum
                out -= 2.0 * u * (u @ v)
            return out

        return matvec

    start = _start(graph.degree, top, seed)
    first = deflated([top])
    early: list[Cut] = []

    def settled(t: np.ndarray, r: np.ndarray, ritz: Callable[[int], np.ndarray]) -> bool:
        if not r[1] <= 0.25 * (t[0] - t[1]):
            return False  # μ3's Ritz value is not yet within a quarter of the gap
        if enough is not None:
            # first on Lanczos's own estimates (one Ritz vector), then on measured residuals
            guess = Cut(x=scale * ritz(1)[0], lambda2=1.0 - t[0], lambda3=1.0 - t[1], lambda3_low=1.0 - t[1] - r[1], residual=float(r[0]), solver="lanczos")
            if guess.precise and enough(guess):
                cut = _measured(apply, first, top, scale, float(t[1]), ritz(2))
                if cut is not None and cut.precise and enough(cut):
                    early.append(cut)
                    return True
        return r[0] <= SETTLED

    try:
        # one Lanczos run brings y to ARPACK's tolerance and μ3's Ritz pair to a fraction of the gap
        values, vectors, steps = _lanczos(first, start, 2, settled)
        if early:
            return replace(early[0], steps=steps)
        operator = scipy.sparse.linalg.LinearOperator((n, n), matvec=first, dtype=np.float64)
        mu2, y = _largest(operator, vectors[0], 0.0, short=SETTLE_NCV)  # ARPACK settles μ2 from that vector
        residual = float(np.linalg.norm(apply(y) - mu2 * y))
        if residual > 1e-8 or abs(y @ top) > 1e-6:
            raise _Unsettled
        # μ3 only sizes the eigengap μ2 − μ3: its Ritz pair, with y deflated, measured explicitly;
        # a second run on the deflated operator when that residual is not a small fraction of the gap
        below = deflated([top, y])
        mu3, z = float(values[1]), vectors[1] - y * (y @ vectors[1])
        z /= np.linalg.norm(z)
        r3 = float(np.linalg.norm(below(z) - mu3 * z))
        if not r3 <= 0.25 * (mu2 - mu3):
            (mu3,), (z,), more = _lanczos(below, start, 1, lambda t, r, _: r[0] <= 0.25 * (mu2 - t[0]))
            mu3, steps = float(mu3), steps + more
            r3 = float(np.linalg.norm(below(z) - mu3 * z))
    except (scipy.sparse.linalg.ArpackNoConvergence, scipy.sparse.linalg.ArpackError, _Unsettled):
        return _dense_cut(graph, scale)
    return Cut(x=scale * y, lambda2=1.0 - mu2, lambda3=1.0 - mu3, lambda3_low=1.0 - mu3 - r3, residual=residual, solver="arpack", steps=steps)


def _start(degree: np.ndarray, top: np.ndarray, seed: int) -> np.ndarray:
    """Lanczos's start: a random unit vector (from ``seed``) plus the unit degree vector, both
    orthogonal to the top vector. An object is a denser cluster than its background, so the
    degrees lean towards the Fiedler vector (fewer steps); the random half keeps every
    eigenvector's share of the start what it is for a random start alone (a scene whose degree
    vector is orthogonal to the Fiedler vector, e.g. two mirror-image objects, loses nothing)."""
    parts = []
    for v in (np.random.default_rng(seed).standard_normal(degree.shape[0]), degree.copy()):
        v -= top * (top @ v)
        norm = np.linalg.norm(v)
        parts.append(v / norm if norm > 0 else v)
    return parts[0] + parts[1]


def _measured(
    apply: Callable[[np.ndarray], np.ndarray], first: Callable[[np.ndarray], np.ndarray], top: np.ndarray, scale: np.ndarray, mu3: float, ritz: np.ndarray
) -> Cut | None:
    """The cut of the Ritz pairs (y, θ2), (z, θ3) with every residual measured: μ2 as y's Rayleigh
    quotient, ‖𝒩y − μ2y‖, and ‖r3‖ of z with y deflated; None when y is not orthogonal to the
    top vector or z's residual is not under a quarter of the gap."""
    y = ritz[0]
    ny = apply(y)
    mu2 = float(y @ ny)
    residual = float(np.linalg.norm(ny - mu2 * y))
    if abs(y @ top) > 1e-6:
        return None
    z = ritz[1] - y * (y @ ritz[1])
    z /= np.linalg.norm(z)
    r3 = float(np.linalg.norm(first(z) - 2.0 * y * (y @ z) - mu3 * z))
    if not r3 <= 0.25 * (mu2 - mu3):
        return None
    return Cut(x=scale * y, lambda2=1.0 - mu2, lambda3=1.0 - mu3, lambda3_low=1.0 - mu3 - r3, residual=residual, solver="lanczos")
