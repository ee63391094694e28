"""The fast bilateral solver (Barron & Poole, ECCV 2016) as TokenCut refines its saliency masks
(YangtaoWANG95/TokenCut ``unsupervised_saliency_detection/bilateral_solver.py`` and
``get_saliency.py``), the "+ BS" rows of its saliency table.

1. Bilateral grid: each pixel goes to the vertex ⌊(x/σs, y/σs, Y/σl, U/σc, V/σc)⌋ (YUV of the
   RGB image, JPEG's matrix, U and V offset by 128); S splats pixels onto the occupied vertices.
2. Blur B: for each of the 5 dimensions, the vertex's two neighbours ±1 (where occupied), plus
   2·5 times the vertex itself (the [1 2 1] kernel).
3. Bistochastization, 10 iterations: m = S1, n ← √(n·m / Bn); then m = n·Bn.
4. Solve (λ(D_m − D_n B D_n) + diag(S c)) y = S(c·t) by conjugate gradients with the Jacobi
   preconditioner (diagonal clamped at 1e-5), from y₀ = S(c·t)/S(c), at most 25 iterations,
   relative tolerance 1e-5; the output is Sᵀy, a soft mask.

TokenCut's settings: σs 16, σl 16, σc 8 (``get_saliency.py``'s arguments), λ = 256, confidence
0.999 everywhere. TokenCut scores this soft output (not the filled, binarised mask it draws).
Pure: an image array and a mask in, a soft mask out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse

RGB_TO_YUV = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])


@dataclass(frozen=True)
class BilateralSettings:
    sigma_spatial: float = 16.0
    sigma_luma: float = 16.0
    sigma_chroma: float = 8.0
    lam: float = 256.0
    confidence: float = 0.999
    diag_min: float = 1e-5
    cg_tol: float = 1e-5
    cg_maxiter: int = 25
    bistochastic_iters: int = 10


def grid_coordinates(image: np.ndarray, s: BilateralSettings) -> np.ndarray:
    """(pixels, 5) integer bilateral-space coordinates of an (H, W, 3) RGB image (0–255)."""
    rgb = np.asarray(image, dtype=np.float64)
    yuv = rgb @ RGB_TO_YUV.T + np.array([0.0, 128.0, 128.0])
    ys, xs = np.mgrid[: rgb.shape[0], : rgb.shape[1]]
    coords = np.stack([xs / s.sigma_spatial, ys / s.sigma_spatial, yuv[..., 0] / s.sigma_luma, yuv[..., 1] / s.sigma_chroma, yuv[..., 2] / s.sigma_chroma], axis=-1)
    return coords.astype(int).reshape(-1, 5)  # truncation toward zero, as the published code


def splat_and_blur(coords: np.ndarray) -> tuple[scipy.sparse.csr_array, scipy.sparse.csr_array]:
    """S (vertices × pixels) and B (vertices × vertices, [1 2 1] in each dimension)."""
    low = coords.min(axis=0) - 1
    shape = tuple(int(v) for v in coords.max(axis=0) - low + 2)  # one free cell either side: ±1 stays inside
    keys = np.ravel_multi_index((coords - low).T, shape)
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    vertices = coords[first] - low
    nv, npx = len(unique), len(coords)
    splat = scipy.sparse.csr_array((np.ones(npx), (inverse.ravel(), np.arange(npx))), shape=(nv, npx))
    rows, cols = [], []
    for d in range(coords.shape[1]):
        for step in (-1, 1):
            shifted = vertices.copy()
            shifted[:, d] += step
            wanted = np.ravel_multi_index(shifted.T, shape)
            at = np.minimum(np.searchsorted(unique, wanted), nv - 1)
            found = np.flatnonzero(unique[at] == wanted)
            rows.append(found)
            cols.append(at[found])
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    neighbours = scipy.sparse.csr_array((np.ones(len(rows)), (rows, cols)), shape=(nv, nv))
    blur = neighbours + 2 * coords.shape[1] * scipy.sparse.identity(nv, format="csr")
    return splat, scipy.sparse.csr_array(blur)


def _pcg(a, b: np.ndarray, x0: np.ndarray, precond: np.ndarray, tol: float, maxiter: int) -> np.ndarray:
    """Preconditioned conjugate gradients, stopping when ‖r‖ ≤ tol·‖b‖ (scipy's ``cg`` rule)."""
    x = x0.copy()
    r = b - a @ x
    bound = tol * np.linalg.norm(b)
    z = precond * r
    p = z.copy()
    rz = r @ z
    for _ in range(maxiter):
        if np.linalg.norm(r) <= bound:
            break
        ap = a @ p
        alpha = rz / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        z = precond * r
        rz_new = r @ z
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def refine(image: np.ndarray, target: np.ndarray, settings: BilateralSettings = BilateralSettings()) -> np.ndarray:
    """TokenCut's bilateral-solver output for a mask ``target`` (H, W) on ``image`` (H, W, 3)."""
    h, w = target.shape
    if image.shape[:2] != (h, w):
        raise ValueError(f"image {image.shape[:2]} and mask {target.shape} differ in size")
    splat, blur = splat_and_blur(grid_coordinates(image, settings))
    m = splat @ np.ones(h * w)
    n = np.ones(splat.shape[0])
    for _ in range(settings.bistochastic_iters):
        n = np.sqrt(n * m / (blur @ n))
    m = n * (blur @ n)
    t = np.asarray(target, dtype=np.float64).ravel()
    c = np.full(h * w, settings.confidence)
    c_splat = splat @ c
    smooth = scipy.sparse.diags(m) - scipy.sparse.diags(n) @ blur @ scipy.sparse.diags(n)
    a = scipy.sparse.csr_array(settings.lam * smooth + scipy.sparse.diags(c_splat))
    b = splat @ (c * t)
    precond = 1.0 / np.maximum(a.diagonal(), settings.diag_min)
    y = _pcg(a, b, b / c_splat, precond, settings.cg_tol, settings.cg_maxiter)
    return (splat.T @ y).reshape(h, w)
