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

The parts live beside this module, one job each: ``decoder_settings`` (presets, ``Settings``),
``decoder_graph`` (cosines and the graph), ``decoder_cut`` (the eigen-solver), ``decoder_masks``
(vector to mask, its certificate and score). This module decodes one image and a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..infra.errors import ProbeError
from .decoder_cut import normalized_cut
from .decoder_graph import Cosines, cosines, key_graph
from .decoder_masks import certified_cut, iou, mask_score, ncut_value, shape_of
from .decoder_settings import SINGLE, Settings
from .dsm import dsm
from .lost import lost

STOPS = ("count", "overlap", "small", "covered", "exhausted")


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
    degree: np.ndarray | None = None  # (N,) LOST's degree of each patch (analyses/lost.py)
    expansion: np.ndarray | None = None  # (N,) LOST's seed expansion M


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
    if settings.rule == "lost":
        return lost_masks(lost(keys, grid, settings.k_patches, settings.ties))
    return dsm_masks(dsm(keys, grid, color=color, color_lambda=settings.color_lambda, gap_tol=settings.gap_tol))


def lost_masks(r) -> ImageMasks:
    """An image's ``ImageMasks`` from its ``lost.LostResult``."""
    nan = np.array([np.nan])
    score = 1.0 - float(r.degree[r.seed]) / len(r.degree)
    return ImageMasks(
        masks=r.mask[None],
        score=np.array([score]),
        lambda2=nan,
        lambda3=nan,
        gap=nan,
        ncut=nan,
        solver=["lost"],
        degenerate=r.flagged,
        stop="count",
        cuts=0,
        seed=int(r.seed),
        degree=r.degree,
        expansion=r.expansion,
    )


def dsm_masks(d) -> ImageMasks:
    """An image's ``ImageMasks`` from its ``dsm.DsmResult``."""
    lam2, lam3 = float(d.eigenvalues[1]), float(d.eigenvalues[2])
    score = float(np.clip((lam3 - lam2) / lam3, 0.0, 1.0)) if lam3 > 0 else 0.0
    return ImageMasks(
        masks=d.mask[None],
        score=np.array([score]),
        lambda2=np.array([lam2]),
        lambda3=np.array([lam3]),
        gap=np.array([lam3 - lam2]),
        ncut=np.array([np.nan]),
        solver=["dsm"],
        degenerate=d.flagged,
        stop="count",
        cuts=1,
        fiedler=np.asarray(d.fiedler, dtype=np.float32),
    )  # DSM splits by sign: no seed patch


def decode_image(keys: np.ndarray, settings: Settings = Settings(), *, cos: Cosines | None = None, grid: tuple[int, int] | None = None, color=None) -> ImageMasks:
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
        cut = normalized_cut(graph, seed=settings.seed, enough=lambda c, scale=scale: certified_cut(c, scale, grid, settings)[-1])
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
    degree: np.ndarray | None = None  # (image, patch) float32, LOST's degree of each patch (NaN: another rule, or padding)
    expansion: np.ndarray | None = None  # (image, patch) float32, LOST's seed expansion M (NaN likewise)
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
        degree=np.full((b, n), np.nan, dtype=np.float32),
        expansion=np.full((b, n), np.nan, dtype=np.float32),
    )
    for i, r in enumerate(results):
        p = r.masks.shape[1]  # a per-image grid fills the first rows·cols patches; the rest stays empty/NaN
        if r.fiedler is not None:
            out.fiedler[i, :p] = r.fiedler
        out.seed[i] = r.seed
        if r.degree is not None:  # LOST's maps, for the report's seed and degree figure
            out.degree[i, :p] = r.degree
            out.expansion[i, :p] = r.expansion
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
    import scipy.linalg  # the reference alone

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
