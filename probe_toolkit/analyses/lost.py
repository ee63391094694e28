"""LOST (Siméoni et al., BMVC 2021; valeoai/LOST ``object_discovery.py``): one object per image from
the keys' similarity graph, without a cut.

On one image's keys K (N × C, **not** normalised, CLS dropped) on a rows × cols grid:

1. A = K Kᵀ (raw dot products).
2. Degree d_i = #{j ≠ i : A_ij > 0} (LOST's ``patch_scoring``: diagonal zeroed, negatives clamped).
3. Patches sorted by increasing degree; the seed s is the first. Equal degrees are common, and
   ``ties`` says how they rank: ``argsort`` (the ``lost`` preset) as LOST's own
   ``torch.argsort(-degree, descending=True)`` leaves them on the CPU (``analyses/argsort.py``:
   libstdc++'s introsort, not by index), ``lowest-index`` by patch index (a stable sort: probe's
   rule before it followed LOST's, kept as an option).
4. Seed expansion: P = the first ``k`` = 100 patches of that order; S = {p ∈ P : A_sp > 0}
   (s itself, as A_ss = ‖k_s‖² > 0); M_j = Σ_{p ∈ S} A_pj.
5. Mask: the 4-connected component of {M > 0} that holds s (``scipy.ndimage.label``'s default, as ``grid.components`` finds it).
   M_s > 0 whenever k_s ≠ 0 (every p in S has A_sp > 0); a zero seed key empties S, where LOST
   raises ``ValueError``; here that image gets an empty mask and is flagged, so it counts as a
   CorLoc miss instead of stopping the run.

The box is the component's patch-aligned extent (``labels/masks.py``), LOST's ``detect_box``.
Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..infra.errors import ProbeError
from .argsort import argsort
from .decoder_settings import TIES
from .grid import components

K_PATCHES = 100


@dataclass(frozen=True)
class LostResult:
    mask: np.ndarray  # (N,) bool, the seed's component (empty when flagged)
    seed: int
    degree: np.ndarray  # (N,) int
    expansion: np.ndarray  # (N,) M, the summed similarity of the seed's similar patches
    flagged: bool  # the seed fell outside {M > 0} (LOST raises)


def lost(keys: np.ndarray, grid: tuple[int, int], k: int = K_PATCHES, ties: str = "argsort") -> LostResult:
    """LOST's mask of one image: ``keys`` (rows·cols, C), ``grid`` (rows, cols); ``ties`` one of ``TIES``."""
    rows, cols = grid
    keys = np.asarray(keys, dtype=np.float64)
    n = keys.shape[0]
    if keys.ndim != 2 or n != rows * cols:
        raise ProbeError(None, f"keys of shape {keys.shape} do not fill a {rows} × {cols} grid", "pass one image's patch keys")
    if k < 1:
        raise ProbeError(None, f"k = {k} patches for the seed expansion must be at least 1", "use LOST's k = 100")
    if ties not in TIES:
        raise ProbeError(None, f"ties {ties!r} is not one of {', '.join(TIES)}", "use ties='argsort' (LOST's order)")
    a = keys @ keys.T
    positive = a > 0
    np.fill_diagonal(positive, False)
    degree = positive.sum(axis=1)
    seed, potentials = seed_and_potentials(degree, k, ties)
    similar = potentials[a[seed, potentials] > 0]
    return result(a[similar].sum(axis=0), seed, degree, grid)


def seed_and_potentials(degree: np.ndarray, k: int, ties: str) -> tuple[int, np.ndarray]:
    """(the seed: the first patch by increasing degree, the first ``k`` patches of that order),
    equal degrees ranked by ``ties`` (steps 3 and 4)."""
    order = argsort(degree) if ties == "argsort" else np.argsort(degree, kind="stable")
    return int(order[0]), order[:k]


def result(expansion: np.ndarray, seed: int, degree: np.ndarray, grid: tuple[int, int]) -> LostResult:
    """The seed's 4-connected component of {M > 0} (step 5), from the expansion M."""
    rows, cols = grid
    labels, _ = components((expansion > 0).reshape(rows, cols))
    flat = labels.ravel()
    if flat[seed] == 0:
        return LostResult(np.zeros(len(expansion), dtype=bool), seed, degree, expansion, True)
    return LostResult(flat == flat[seed], seed, degree, expansion, False)
