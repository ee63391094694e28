"""Deep Spectral Methods, single-object discovery (Melas-Kyriazi et al., CVPR 2022;
lukemelas/deep-spectral-segmentation ``extract/extract.py: extract_eigs`` with its published
defaults, then ``object-localization/object_discovery.py: get_bbox_from_patch_mask``).

On one image's keys (N × C, CLS dropped) on a rows × cols grid:

1. F = keys / ‖keys‖ (``normalize=True``); W = max(F Fᵀ, 0) (``threshold_at_zero``), W ← W / max W.
2. Optional colour term: W ← W + λ·W_colour, W_colour the KNN affinity of the image at patch
   resolution (``knn_color_affinity``; DSM's ``image_color_lambda``, 0 by default in
   ``extract_eigs``, so off by default here too).
3. D = diag(row sums), entries below 1e-12 set to 1. Generalized problem (D − W) v = λ D v; DSM
   uses ARPACK shift-invert (``eigsh(k=K, sigma=0, M=D)``), here dense ``eigh`` of the
   symmetric D^-½ W D^-½ with v = D^-½ y (the same eigenpairs; tests hold one to the other).
4. v₁, the Fiedler vector (the second smallest λ). Its sign: flipped when the share of positive
   entries lies in (0.5, 1), so the positive side is the smaller one. DSM leaves an exact
   half-half split to the solver's sign; here v₁ is first oriented with v₁[argmax |v₁|] > 0
   (lowest index on ties), so the side holding the largest entry wins that tie.
5. Patch mask {v₁ > 0}; when it is empty the whole image. Keep its **largest** connected
   component, 8-connected (``skimage.measure.label``'s default for 2-D), the lowest label on
   ties in size (``np.argmax`` over the counts); the box is that component's extent.

An image whose λ₂ and λ₃ coincide within ``gap_tol`` has no well-defined v₁ and is flagged.
Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from .grid import components

if TYPE_CHECKING:  # scipy where it is used: a command's main process, which hands the images to workers, never loads it
    import scipy.sparse


@dataclass(frozen=True)
class DsmResult:
    mask: np.ndarray  # (N,) bool, the largest component of {v₁ > 0}
    fiedler: np.ndarray  # (N,) v₁ after DSM's sign rule (D-normalised)
    eigenvalues: np.ndarray  # λ₁ ≈ 0, λ₂, λ₃
    flagged: bool  # λ₃ − λ₂ below gap_tol: v₁ is not determined


def affinity(keys: np.ndarray, color: np.ndarray | scipy.sparse.spmatrix | None = None, color_lambda: float = 0.0) -> np.ndarray:
    """DSM's W: positive cosines of the keys scaled to a maximum of 1, plus λ·W_colour."""
    import scipy.sparse

    keys = np.asarray(keys, dtype=np.float64)
    norm = np.linalg.norm(keys, axis=1, keepdims=True)
    f = np.divide(keys, norm, out=np.zeros_like(keys), where=norm > 0)
    w = f @ f.T
    w *= w > 0
    top = w.max()
    if top > 0:
        w /= top
    if color_lambda:
        if color is None:
            raise SettingError("color_lambda", "color_lambda was given without the image's colour affinity", "pass the image's colour, or drop color_lambda")
        w = w + color_lambda * (color.toarray() if scipy.sparse.issparse(color) else np.asarray(color))
    return w


def knn_color_affinity(image: np.ndarray, neighbors: tuple[int, ...] = (20, 10), weights: tuple[float, ...] = (2.0, 0.1)) -> scipy.sparse.csr_array:
    """DSM's ``knn_affinity`` of an (h, w, 3) image in [0, 1]: for each (k, weight), link every pixel
    to its k nearest in (r, g, b, weight·x, weight·y), x and y in [0, 1]; symmetric, duplicates summed."""
    import scipy.sparse
    import scipy.spatial  # only the colour term needs it; decode's start-up does not

    h, w = image.shape[:2]
    n = h * w
    rgb = np.asarray(image, dtype=np.float64).reshape(n, 3)
    x = np.tile(np.linspace(0, 1, w), h)
    y = np.repeat(np.linspace(0, 1, h), w)
    rows, cols = [], []
    for k, weight in zip(neighbors, weights):
        feats = np.column_stack([rgb, weight * x, weight * y]).astype(np.float32)
        _, idx = scipy.spatial.cKDTree(feats).query(feats, k=min(k, n))
        idx = idx.reshape(n, -1)
        rows.append(np.repeat(np.arange(n), idx.shape[1]))
        cols.append(idx.ravel())
    i = np.concatenate(rows + cols)
    j = np.concatenate(cols + rows)
    return scipy.sparse.csr_array((np.ones(i.size), (i, j)), shape=(n, n))


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected component of a 2-D mask (lowest label on ties), flat."""
    labels, count = components(mask, eight=True)
    if count == 0:
        return np.zeros(mask.size, dtype=bool)
    sizes = np.bincount(labels.ravel())[1:]
    return (labels == int(np.argmax(sizes)) + 1).ravel()


def dsm(keys: np.ndarray, grid: tuple[int, int], *, color: np.ndarray | None = None, color_lambda: float = 0.0, gap_tol: float = 1e-9) -> DsmResult:
    """DSM's single-object mask of one image: ``keys`` (rows·cols, C), ``grid`` (rows, cols)."""
    import scipy.linalg

    rows, cols = grid
    keys = np.asarray(keys)
    if keys.ndim != 2 or keys.shape[0] != rows * cols or keys.shape[0] < 3:
        raise ProbeError(None, f"keys of shape {keys.shape} do not fill a {rows} × {cols} grid", "pass one image's patch keys")
    w = affinity(keys, color, color_lambda)
    d = w.sum(axis=1)
    d[d < 1e-12] = 1.0
    scale = 1.0 / np.sqrt(d)
    normal = scale[:, None] * w * scale[None, :]
    n = w.shape[0]
    mu, y = scipy.linalg.eigh(normal, subset_by_index=[n - 3, n - 1])
    return oriented(scale * y[:, 1], 1.0 - mu[::-1], grid, gap_tol)


def oriented(v: np.ndarray, lam: np.ndarray, grid: tuple[int, int], gap_tol: float) -> DsmResult:
    """Steps 4 and 5 from v₁ = D^-½ y (any sign) and λ₁ ≤ λ₂ ≤ λ₃: DSM's sign rule, the mask, the flag."""
    rows, cols = grid
    if v[int(np.argmax(np.abs(v)))] < 0:
        v = -v
    if 0.5 < np.mean(v > 0) < 1.0:
        v = -v
    patch = v > 0
    if not patch.any():
        patch = np.ones(len(v), dtype=bool)
    mask = largest_component(patch.reshape(rows, cols))
    return DsmResult(mask=mask, fiedler=v, eigenvalues=lam, flagged=bool(lam[2] - lam[1] < gap_tol))
