"""Label-free object masks: a normalized cut on one image's last-block keys.

Per image (keys N × C on its rows × cols grid, N = rows·cols; G × G for the square views),
following TokenCut and MaskCut:

1. Centre (preset ``centred``): subtract the image's mean key. L2-normalise; a zero key stays zero.
2. Graph: W_ij = 1 where cos(k_i, k_j) > τ, else ε (self-loops included, as in TokenCut).
3. Fiedler vector x: second smallest generalized eigenvector of (D − W) x = λ D x. Solved as the
   second largest eigenvector y of 𝒩 = D^-½ W D^-½, whose largest (eigenvalue 1) is known
   exactly, D^½ 1, and is deflated; Lanczos finds y, stopping once the mask below is certified
   (else at machine precision, ARPACK settling y), dense ``eigh`` of 𝒩 is the fallback and the
   solver for small N. Always x = D^-½ y (the pitfall of CutLER #74 is forgetting this).
4. Sign: x is oriented so that x[argmax |x|] > 0 (lowest index on ties), so the solver's sign
   never matters. Bipartition B = {x > mean(x)}, the plain mean as TokenCut.
5. Foreground: rule ``tokencut`` keeps B (the side holding argmax |x|), seed argmax |x|; rule
   ``maskcut`` takes the other side when ≥ 3 of the 4 corner patches lie in B, seeded at
   argmax(−x) (MaskCut's signed seed). MaskCut's own rule depends on the solver's sign in that
   one case; oriented as above it is MaskCut's rule for the sign with a positive seed.
6. Mask: the 4-connected component of the foreground side that holds the seed.

Several masks (``masks`` > 1) run MaskCut's loop: the keys of patches already found are zeroed
(their edges all become ε), the cut is taken again, and the loop stops explicitly when a new
component overlaps the previous one by IoU > 0.5 (stop ``overlap``), covers ≤ 1 % of the patches
(``small``), lies inside earlier masks (``covered``), or ≤ 1 % of the patches remain (``exhausted``).
MaskCut instead blanks that mask and re-solves the unchanged graph, which returns the same cut
and accepts it on the next round (compared then with an empty mask): we stop instead. No CRF.

Exactness: cosines are computed in float32 and every entry within the float32 error bound of τ
is recomputed in float64, so the graph is the float64 graph. A mask is *certified* when the
eigenvector error bound (residual + a dense solver's rounding) / eigengap cannot move any patch
across the mean, flip the sign or move the seed out of the mask; an image with an uncertified
cut or an eigengap below ``gap_tol`` is flagged ``degenerate``. Unflagged masks equal those of
``scipy.linalg.eigh(D − W, D, subset_by_index=[1, 2])`` with TokenCut's post-processing. The
saved Fiedler vector is within that bound of the exact one, λ2 within ``PRECISE`` relative.

Score of a mask, in [0, 1]: (1 − λ2/λ3) · (1 − ncut/2). The relative eigengap says how clearly
the graph prefers this cut to the next one; ncut = cut/vol(M) + cut/vol(rest) ∈ [0, 2] is the
normalized cut of the final mask itself. A cheap, unambiguous cut scores near 1; it is a ranking
for COCO AP (no ties decided by input order), not a calibrated probability. λ3 is Lanczos's
Ritz estimate where the run stopped (within a quarter of the eigengap of the true λ3, as the
certificate requires, and at least ``lambda3_low``): a run stopped early by the certificate
gives it to a few per cent in a clustered spectrum, a run to machine precision exactly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg

from ..infra.errors import ProbeError
from .dsm import dsm
from .grid import components
from .lost import lost

RULES = ("tokencut", "maskcut", "lost", "dsm")
SINGLE = ("lost", "dsm")  # rules that are not a cut: one mask, τ, ε and the mask count unused
PRESETS: dict[str, dict] = {
    # centred keys (each image's mean key subtracted), otherwise TokenCut's graph and rule, τ = 0.2
    "centred": dict(center=True, rule="tokencut", tau=0.2, eps=1e-5, masks=1),
    # TokenCut exactly: uncentred keys, τ = 0.2, ε = 1e-5 (TokenCut README and argparse)
    "tokencut": dict(center=False, rule="tokencut", tau=0.2, eps=1e-5, masks=1),
    # MaskCut: τ = 0.15 (README, submitit script; maskcut.py's argparse says 0.2), N = 3
    "maskcut": dict(center=False, rule="maskcut", tau=0.15, eps=1e-5, masks=3),
    # LOST: raw keys, k = 100 (valeoai/LOST main_lost.py, object_discovery.py); analyses/lost.py
    "lost": dict(center=False, rule="lost", tau=0.0, eps=1e-5, masks=1, k_patches=100),
    # Deep Spectral Methods: unit keys, positive affinity, Fiedler vector > 0 (extract.py, object_discovery.py)
    "dsm": dict(center=False, rule="dsm", tau=0.0, eps=1e-5, masks=1),
}
# the view each preset's numbers were published with (TokenCut/LOST: the image at its own size,
# zero-padded to whole patches, main_tokencut.py / main_lost.py; DSM: cut to whole patches,
# extract/extract.py and object-localization/main.py --eigenseg; MaskCut: squashed to 480 × 480 with LANCZOS)
# TokenCut's saliency table was computed on another view, the whole image resized with LANCZOS to
# round(side/p) patches (unsupervised_saliency_detection/get_saliency.py): native_resized, which
# commands.decode.published_view names for saliency panels
PUBLISHED_VIEW = {"centred": "480", "tokencut": "native", "maskcut": "480 lanczos", "lost": "native", "dsm": "native_crop"}

STOPS = ("count", "overlap", "small", "covered", "exhausted")
SOLVERS = ("lanczos", "arpack", "dense")
DENSE_BELOW = 256  # dense eigh of 𝒩 is faster than ARPACK for small graphs
SETTLED = 1e-15  # Lanczos residual estimate at which ARPACK (tol 0) settles the vector in one short cycle
SETTLE_NCV = 4  # ARPACK's basis for that cycle (a settled vector converges in its first)
PRECISE = 1e-8  # relative accuracy of λ2 (and so of the score) at which a certified cut may stop early


@dataclass(frozen=True)
class Settings:
    """One decoder setting; ``Settings.from_preset`` fills the preset's defaults."""

    preset: str = "centred"
    center: bool = True
    rule: str = "tokencut"
    tau: float = 0.2
    eps: float = 1e-5
    masks: int = 1
    overlap: float = 0.5  # MaskCut: stop when IoU(new, previous) > 0.5
    min_area: float = 0.01  # MaskCut: stop when a new mask covers ≤ 1 % of the patches
    gap_tol: float = 1e-6  # flag an image whose eigengap (on λ ∈ [0, 2]) is below this
    seed: int = 0  # ARPACK's start vector
    k_patches: int = 100  # LOST: lowest-degree patches of the seed expansion
    color_lambda: float = 0.0  # DSM: weight of the KNN colour affinity (0 as published in extract_eigs)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ProbeError(None, f"--preset {self.preset!r} is not one of {', '.join(PRESETS)}", "use --preset centred")
        if self.rule not in RULES:
            raise ProbeError(None, f"rule {self.rule!r} is not one of {', '.join(RULES)}", "use tokencut or maskcut")
        if not -1.0 <= self.tau < 1.0:
            raise ProbeError(None, f"--tau {self.tau} is not a cosine in [-1, 1)", "use e.g. --tau 0.2")
        if not 0.0 < self.eps < 1.0:
            raise ProbeError(None, f"--eps {self.eps} must be in (0, 1) (ε keeps the graph connected)", "use --eps 1e-5")
        if self.masks < 1:
            raise ProbeError(None, f"--masks {self.masks} must be at least 1", "use --masks 1")
        if self.color_lambda and self.rule != "dsm":
            raise ProbeError(None, f"--color-lambda applies to --preset dsm, not {self.preset}", "drop --color-lambda")
        if self.rule in SINGLE and self.masks != 1:
            raise ProbeError(None, f"--preset {self.preset} finds one object per image, not --masks {self.masks}", "drop --masks")

    @classmethod
    def from_preset(cls, preset: str = "centred", **overrides) -> "Settings":
        """The preset's defaults, with every override that is not None applied."""
        if preset not in PRESETS:
            raise ProbeError(None, f"--preset {preset!r} is not one of {', '.join(PRESETS)}", "use --preset centred")
        values = dict(PRESETS[preset], preset=preset)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def as_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)


# ----------------------------------------------------------------------------------------------
# the graph


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
        out[stop:n, start:stop] = a[:, stop - start:].T
    return out


def adjacency(cos: Cosines, tau: float, painted: np.ndarray | None = None) -> np.ndarray:
    """The boolean adjacency cos > τ, exactly as float64 would decide it.

    Patches in ``painted`` have zeroed keys (MaskCut), so their cosines with every patch,
    themselves included, are 0.
    """
    return _decided(cos, tau, painted)[:, : cos.n]


def key_graph(cos: Cosines, tau: float, eps: float, painted: np.ndarray | None = None) -> Graph:
    """TokenCut's binary graph on the keys; the sparse 0/1 matrix of A, or of Ā when A is over half full."""
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


# ----------------------------------------------------------------------------------------------
# the cut


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
    n = op.shape[0]
    try:
        values, vectors = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=start, tol=tol, ncv=min(short, n - 1), maxiter=4)
    except scipy.sparse.linalg.ArpackNoConvergence:
        values, vectors = scipy.sparse.linalg.eigsh(op, k=1, which="LA", v0=start, tol=tol, ncv=min(48, n - 1), maxiter=100)
    return float(values[0]), vectors[:, 0] / np.linalg.norm(vectors[:, 0])


def _lanczos(matvec: Callable[[np.ndarray], np.ndarray], start: np.ndarray, wanted: int,
             settled: Callable[[np.ndarray, np.ndarray, Callable[[int], np.ndarray]], bool], *, least: int = 16,
             most: int = 400) -> tuple[np.ndarray, np.ndarray, int]:
    """The ``wanted`` largest Ritz pairs (values descending, unit vectors as rows) of a symmetric
    operator on the Krylov space of ``start``, and that space's dimension.

    Plain Lanczos with full reorthogonalisation (so no spurious copies) and no restarts:
    nothing the space has learnt is thrown away, as an implicit restart does. The space grows,
    checked every 4 steps and never below ``least`` vectors (what an ARPACK run with 16 vectors
    builds first), until ``settled(values, estimates, ritz)``, the estimates being Lanczos's
    residual norms β·|s_last| and ``ritz(k)`` the first k Ritz vectors (computed on demand), or
    until ``most`` vectors (the caller checks residuals explicitly).
    """
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

            def ritz(k: int) -> np.ndarray:
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
            guess = Cut(x=scale * ritz(1)[0], lambda2=1.0 - t[0], lambda3=1.0 - t[1], lambda3_low=1.0 - t[1] - r[1],
                        residual=float(r[0]), solver="lanczos")
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


def _measured(apply: Callable[[np.ndarray], np.ndarray], first: Callable[[np.ndarray], np.ndarray], top: np.ndarray,
              scale: np.ndarray, mu3: float, ritz: np.ndarray) -> Cut | None:
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


# ----------------------------------------------------------------------------------------------
# from the vector to a mask


def shape_of(grid: int | tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of a grid given as its side G or as (rows, cols)."""
    return (int(grid), int(grid)) if np.isscalar(grid) else (int(grid[0]), int(grid[1]))


def corners(grid: int | tuple[int, int]) -> np.ndarray:
    """The flat indices of the top-left, top-right, bottom-left and bottom-right patches."""
    rows, cols = shape_of(grid)
    n = rows * cols
    return np.array([0, cols - 1, n - cols, n - 1])


def orient(x: np.ndarray) -> np.ndarray:
    """x with x[argmax |x|] > 0 (lowest index on ties): the solver's sign no longer matters."""
    return -x if x[int(np.argmax(np.abs(x)))] < 0 else x


def foreground(x: np.ndarray, grid: int | tuple[int, int], rule: str) -> tuple[np.ndarray, int, bool]:
    """(side, seed, reversed) for an oriented x: B = {x > mean}, then the rule."""
    side = x > x.mean()
    if rule == "maskcut" and int(side[corners(grid)].sum()) >= 3:
        return ~side, int(np.argmax(-x)), True
    return side, int(np.argmax(x)), False


def component(side: np.ndarray, seed: int, grid: int | tuple[int, int]) -> np.ndarray:
    """The 4-connected component of ``side`` (flat, on the grid) that holds ``seed``."""
    labels, _ = components(side.reshape(shape_of(grid)))
    flat = labels.ravel()
    return flat == flat[seed]


def certified(x: np.ndarray, error: np.ndarray, mask: np.ndarray, seed: int, reversed_: bool) -> bool:
    """True when no x within ``error`` of this one (same sign) could give another mask."""
    if not np.isfinite(error).all():
        return False
    mean_shift = error.mean()
    if (np.abs(x - x.mean()) <= error + mean_shift).any():
        return False  # a patch could cross the threshold (corners included)
    peak = int(np.argmax(np.abs(x)))
    rivals = np.abs(x) >= abs(x[peak]) - (error + error[peak])
    if (x[rivals] < 0).any():
        return False  # the orientation could flip
    signed = -x if reversed_ else x
    rivals = signed >= signed[seed] - (error + error[seed])
    return bool(mask[rivals].all())  # another seed candidate would pick the same component


def certified_cut(cut: Cut, scale: np.ndarray, grid: int | tuple[int, int], settings: Settings) -> tuple[np.ndarray, int, np.ndarray, bool]:
    """(oriented x, seed, mask, certified) of one cut under the settings' rule; certified also
    asks an eigengap of at least ``gap_tol``."""
    x = orient(cut.x)
    side, seed, reversed_ = foreground(x, grid, settings.rule)
    found = component(side, seed, grid)
    ok = cut.gap >= settings.gap_tol and certified(x, cut.error(scale), found, seed, reversed_)
    return x, seed, found, ok


def ncut_value(graph: Graph, mask: np.ndarray) -> float:
    """cut(M, M̄)/vol(M) + cut(M, M̄)/vol(M̄) on this graph; 2 (the worst) when M̄ is empty."""
    m = mask.astype(np.float64)
    vol = float(graph.degree @ m)
    rest = float(graph.degree.sum()) - vol
    if vol <= 0 or rest <= 0 or not mask.any() or mask.all():
        return 2.0
    cut = vol - float(m @ graph.matvec(m))
    return max(cut, 0.0) / vol + max(cut, 0.0) / rest


def mask_score(cut: Cut, ncut: float) -> float:
    """(1 − λ2/λ3)·(1 − ncut/2), in [0, 1]; see the module docstring."""
    relative_gap = (cut.lambda3 - cut.lambda2) / cut.lambda3 if cut.lambda3 > 0 else 0.0
    return float(np.clip(relative_gap, 0.0, 1.0) * np.clip(1.0 - ncut / 2.0, 0.0, 1.0))


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0


# ----------------------------------------------------------------------------------------------
# one image, then many


@dataclass
class ImageMasks:
    """The masks of one image (patch level, flat over the G × G grid) and how they were found."""

    masks: np.ndarray  # (M, N) bool, M ≥ 1
    score: np.ndarray  # (M,)
    lambda2: np.ndarray
    lambda3: np.ndarray
    gap: np.ndarray
    ncut: np.ndarray
    solver: list[str]
    degenerate: bool
    stop: str
    cuts: int  # eigenproblems solved (the last may have been rejected)
    fiedler: np.ndarray | None = None  # (N,) the first cut's oriented Fiedler vector x (TokenCut's figure)
    seed: int = -1  # the first cut's seed patch


def grid_of(n: int) -> int:
    g = math.isqrt(n)
    if g * g != n:
        raise ProbeError(None, f"{n} patches are not a square grid", "pass keys of a square view (480 px → 30 × 30)")
    return g


def decode_single(keys: np.ndarray, settings: Settings, grid: tuple[int, int], color=None) -> ImageMasks:
    """One mask by LOST or DSM (``settings.rule``), on a rows × cols grid.

    Score: LOST 1 − d_seed/N (a seed with fewer positive links is more object-like, LOST's
    premise); DSM the relative eigengap (λ3 − λ2)/λ3. Rankings for COCO AP, not probabilities.
    """
    keys = np.asarray(keys, dtype=np.float64)
    if settings.center:
        keys = keys - keys.mean(axis=0)
    nan = np.array([np.nan])
    if settings.rule == "lost":
        r = lost(keys, grid, settings.k_patches)
        score = 1.0 - float(r.degree[r.seed]) / keys.shape[0]
        return ImageMasks(masks=r.mask[None], score=np.array([score]), lambda2=nan, lambda3=nan, gap=nan, ncut=nan,
                          solver=["lost"], degenerate=r.flagged, stop="count", cuts=0)
    d = dsm(keys, grid, color=color, color_lambda=settings.color_lambda, gap_tol=settings.gap_tol)
    lam2, lam3 = float(d.eigenvalues[1]), float(d.eigenvalues[2])
    score = float(np.clip((lam3 - lam2) / lam3, 0.0, 1.0)) if lam3 > 0 else 0.0
    return ImageMasks(masks=d.mask[None], score=np.array([score]), lambda2=np.array([lam2]), lambda3=np.array([lam3]),
                      gap=np.array([lam3 - lam2]), ncut=nan, solver=["dsm"], degenerate=d.flagged, stop="count", cuts=1)


def decode_image(keys: np.ndarray, settings: Settings = Settings(), *, cos: Cosines | None = None, grid: tuple[int, int] | None = None,
                 color=None) -> ImageMasks:
    """Masks of one image from its keys (N × C on a rows × cols grid, square by default); pure.

    ``cos`` may pass the image's cosines already computed with ``settings.center`` (sweeps).
    ``grid`` (rows, cols) is needed only off the square (the own-size views); ``color``
    is DSM's colour affinity of the image at patch resolution (``dsm.knn_color_affinity``).
    """
    n = np.shape(keys)[0]
    if grid is None:
        grid = (grid_of(n), grid_of(n))
    elif int(grid[0]) * int(grid[1]) != n:
        raise ProbeError(None, f"keys of {n} patches do not fill a {grid[0]} × {grid[1]} grid", "pass the image's first rows·cols patches")
    if settings.rule in SINGLE:
        return decode_single(keys, settings, grid, color)
    grid = shape_of(grid)
    if cos is None:
        cos = cosines(keys, center=settings.center, shared=settings.masks > 1)
    painted = np.zeros(n, dtype=bool)
    rows: list[tuple] = []
    previous: np.ndarray | None = None
    degenerate, stop, cuts = False, "count", 0
    first: tuple[np.ndarray, int] | None = None
    for t in range(settings.masks):
        if t > 0 and (~painted).sum() <= settings.min_area * n:
            stop = "exhausted"
            break
        graph = key_graph(cos, settings.tau, settings.eps, painted if t else None)
        scale = 1.0 / np.sqrt(graph.degree)
        cut = normalized_cut(graph, seed=settings.seed, enough=lambda c: certified_cut(c, scale, grid, settings)[-1])
        cuts += 1
        x, seed, found, ok = certified_cut(cut, scale, grid, settings)
        first = first or (x, seed)
        degenerate |= not ok
        if previous is not None:
            if iou(found, previous) > settings.overlap:
                stop = "overlap"
                break
            if found.sum() <= settings.min_area * n:
                stop = "small"
                break
        mask = found & ~painted
        if not mask.any():
            stop = "covered"
            break
        ncut = ncut_value(graph, mask)
        rows.append((mask, mask_score(cut, ncut), cut.lambda2, cut.lambda3, cut.gap, ncut, cut.solver))
        previous = found
        painted |= found
    masks, score, lam2, lam3, gap, ncut, solver = zip(*rows)
    return ImageMasks(
        masks=np.stack(masks),
        score=np.array(score),
        lambda2=np.array(lam2),
        lambda3=np.array(lam3),
        gap=np.array(gap),
        ncut=np.array(ncut),
        solver=list(solver),
        degenerate=bool(degenerate),
        stop=stop,
        cuts=cuts,
        fiedler=None if first is None else first[0].astype(np.float32),
        seed=-1 if first is None else int(first[1]),
    )


@dataclass
class Decoded:
    """Masks of a batch of images, padded to ``slots`` masks per image (unused slots empty/NaN)."""

    masks: np.ndarray  # (image, mask, patch) bool
    score: np.ndarray  # (image, mask) float, NaN where no mask
    lambda2: np.ndarray
    lambda3: np.ndarray
    gap: np.ndarray
    ncut: np.ndarray
    n_masks: np.ndarray  # (image,) int
    degenerate: np.ndarray  # (image,) bool
    stop: np.ndarray  # (image,) int, index into STOPS
    dense_solves: np.ndarray  # (image,) int, cuts solved by the dense fallback
    cuts: np.ndarray  # (image,) int
    settings: Settings = field(default_factory=Settings)
    fiedler: np.ndarray | None = None  # (image, patch) float32, the first cut's oriented Fiedler vector
    seed: np.ndarray | None = None  # (image,) int, the first cut's seed patch
    grids: np.ndarray | None = None  # (image, 2) int rows, cols of a per-image view (native, native_crop, native_resized); None: square
    patch: int = 0  # the patch size in pixels of a per-image view (its masks' geometry)
    view: str = "native"  # which per-image view, named in the saved results

    @property
    def grid(self) -> int:
        if self.grids is not None:
            raise ProbeError(None, f"the masks have a grid per image ({self.view} view)", "read each image's grid from Decoded.grids")
        return grid_of(self.masks.shape[2])


def collate(results: list[ImageMasks], settings: Settings, n: int) -> Decoded:
    """Stack per-image results into padded arrays."""
    b, slots = len(results), settings.masks
    out = Decoded(
        masks=np.zeros((b, slots, n), dtype=bool),
        score=np.full((b, slots), np.nan),
        lambda2=np.full((b, slots), np.nan),
        lambda3=np.full((b, slots), np.nan),
        gap=np.full((b, slots), np.nan),
        ncut=np.full((b, slots), np.nan),
        n_masks=np.zeros(b, dtype=np.int32),
        degenerate=np.zeros(b, dtype=bool),
        stop=np.zeros(b, dtype=np.int8),
        dense_solves=np.zeros(b, dtype=np.int32),
        cuts=np.zeros(b, dtype=np.int32),
        settings=settings,
        fiedler=np.full((b, n), np.nan, dtype=np.float32),
        seed=np.full(b, -1, dtype=np.int32),
    )
    for i, r in enumerate(results):
        p = r.masks.shape[1]  # a per-image grid fills the first rows·cols patches; the rest stays empty/NaN
        if r.fiedler is not None:
            out.fiedler[i, :p], out.seed[i] = r.fiedler, r.seed
        m = r.masks.shape[0]
        out.masks[i, :m, :p] = r.masks
        for name in ("score", "lambda2", "lambda3", "gap", "ncut"):
            getattr(out, name)[i, :m] = getattr(r, name)
        out.n_masks[i] = m
        out.degenerate[i] = r.degenerate
        out.stop[i] = STOPS.index(r.stop)
        out.dense_solves[i] = sum(s == "dense" for s in r.solver)
        out.cuts[i] = r.cuts
    return out


def decode(keys, settings: Settings = Settings()) -> Decoded:
    """Masks of a batch: ``keys`` (image, patch, channel), any array-like (numpy, float16 ok)."""
    keys = np.asarray(keys)
    if keys.ndim != 3:
        raise ProbeError(None, f"keys of shape {keys.shape} are not (image, patch, channel)", "pass keys_480")
    return collate([decode_image(k, settings) for k in keys], settings, keys.shape[1])


def tokencut_dense(keys: np.ndarray, tau: float = 0.2, eps: float = 1e-5, center: bool = False) -> np.ndarray:
    """TokenCut exactly as published, one mask: the reference the fast path is held against.

    float64 cosines, dense W and D, ``scipy.linalg.eigh(D − W, D, subset_by_index=[1, 2])``,
    threshold at the plain mean, the side holding argmax |x|, its 4-connected component. It
    shares no code with ``normalized_cut`` (tests and ``benchmarks/decoder.py`` compare them).
    """
    f = np.asarray(keys, dtype=np.float64)
    if center:
        f = f - f.mean(axis=0)
    f = f / np.linalg.norm(f, axis=1, keepdims=True)
    w = np.where(f @ f.T > tau, 1.0, eps)
    d = np.diag(w.sum(axis=1))
    _, vectors = scipy.linalg.eigh(d - w, d, subset_by_index=[1, 2])
    x = vectors[:, 0]
    seed = int(np.argmax(np.abs(x)))
    side = x > np.sum(x) / len(x)
    if not side[seed]:
        side = ~side
    from scipy import ndimage  # the reference alone: the fast path labels with grid.components

    g = int(round(np.sqrt(len(x))))
    labels, _ = ndimage.label(side.reshape(g, g))
    return (labels == labels.reshape(-1)[seed]).reshape(-1)
