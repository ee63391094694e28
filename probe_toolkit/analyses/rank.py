"""How many dimensions do a block's tokens use? RankMe and LiDAR, from float64 second moments.

RankMe (Garrido et al., *RankMe: Assessing the Downstream Performance of Pretrained
Self-Supervised Representations by Their Rank*, ICML 2023, Eq. 1): for an embedding matrix Z
(n rows × D channels, not centred), with singular values σ_1..σ_D,

    p_k = σ_k / ‖σ‖₁ + ε,   RankMe(Z) = exp(−Σ_k p_k log p_k),   ε = 1e-7.

It lies in [1, min(n, D)] (up to ε): D for a spectrum of equal singular values, 1 for one
direction. The singular values come from the R factor of a QR of Z updated a block of rows at
a time in float64 (``Spectrum``: TSQR), so memory is D², not n × D, whatever the store's size,
and the values are an SVD's (``benchmarks/labelfree.py`` compares it with a float64 SVD of Z). NVlabs/RADIO ``examples/ssl_metrics.py``
(``smooth_rank``) drops σ_k = 0 and puts ε in the denominator, p_k = σ_k / (‖σ‖₁ + ε); the two
differ by less than D·ε·|log ε| (6e-4 at D = 384), and ``rankme(..., form="radio")`` gives
RADIO's.

The estimator depends on n: with fewer rows than channels the rank cannot exceed n, and a
sample's spectrum spreads more than the population's (small eigenvalues are under-estimated),
so RankMe grows with n until n ≫ D. ``sample_curve`` measures it on nested seeded subsets.

LiDAR (Thilak et al., *LiDAR: Sensing Linear Probing Performance in Joint Embedding SSL
Architectures*, ICLR 2024), as RADIO's ``calc_lidar`` computes it: for N images seen in V views
each (embeddings e_{n,v}), the between-image covariance Σ_b of the per-image means and the
within-image covariance Σ_w (+ δI, δ = 1e-8), then the smooth rank (RADIO's form) of the
eigenvalues of Σ_w^{-1/2} Σ_b Σ_w^{-1/2} + δI. It needs several augmented views of every image.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

EPS = 1e-7  # Garrido et al. 2023, Eq. 1 (and RADIO ssl_metrics.py smooth_rank)
DELTA = 1e-8  # RADIO ssl_metrics.py DELTA: LiDAR's regulariser
SAMPLE_SIZES = (256, 512, 1024, 2560, 5120, 10240, 25600)  # rows of the sample-size curve
FORMS = ("garrido", "radio")


def rankme(singular_values: np.ndarray, eps: float = EPS, form: str = "garrido") -> float:
    """RankMe of singular values (any order): ``garrido`` p = σ/‖σ‖₁ + ε; ``radio`` p = σ/(‖σ‖₁ + ε) over σ > 0."""
    s = np.asarray(singular_values, np.float64)
    if form == "radio":
        s = s[s > 0]
        p = s / (s.sum() + eps)
    elif form == "garrido":
        total = s.sum()
        p = (s / total if total > 0 else np.zeros_like(s)) + eps
    else:
        raise ValueError(f"form {form!r} is not one of {', '.join(FORMS)}")
    return float(np.exp(-np.sum(p * np.log(p))))


@dataclass
class Spectrum:
    """The singular values of Z from its rows added a block at a time: the R factor of a running
    QR (TSQR: R ← qr([R; Z_block]).R, float64), whose singular values are Z's. Memory D², and as
    accurate as an SVD of Z (ZᵀZ would square the condition number: the eigenvalues of a
    rank-deficient Z's Gram come back as noise of about 1e-8·σ_max, which RankMe counts)."""

    width: int
    rows: int = 0
    r: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.r is None:
            self.r = np.zeros((0, self.width), np.float64)

    def add(self, rows: np.ndarray) -> None:
        z = np.asarray(rows, np.float64).reshape(-1, self.width)
        if not np.isfinite(z).all():
            raise ValueError("rows hold a value that is not finite")
        if len(z):
            self.r = np.linalg.qr(np.concatenate([self.r, z]), mode="r")
            self.rows += len(z)

    def singular_values(self) -> np.ndarray:
        """Descending, min(rows, D) of them."""
        return np.linalg.svd(self.r, compute_uv=False) if len(self.r) else np.zeros(0)

    def rankme(self, form: str = "garrido") -> float:
        return rankme(self.singular_values(), form=form)


def sample_rows(total: int, sizes=SAMPLE_SIZES, seed: int = 0) -> dict[int, np.ndarray]:
    """Nested seeded subsets of ``range(total)``: size n → the first n of one permutation, sorted
    (sizes above ``total`` are left out). Nested, so the curve moves by rows added, not redrawn."""
    order = np.random.default_rng(seed).permutation(total)
    return {int(n): np.sort(order[:n]) for n in sizes if n <= total}


def sample_curve(spectra: dict[int, Spectrum], form: str = "garrido") -> dict[int, float]:
    return {n: g.rankme(form) for n, g in sorted(spectra.items())}


@dataclass
class Views:
    """LiDAR's moments over images seen in V views: per-image means and the within-image scatter."""

    width: int
    means: list[np.ndarray] = field(default_factory=list)
    scatter: np.ndarray = field(default=None)  # type: ignore[assignment]
    rows: int = 0

    def __post_init__(self) -> None:
        if self.scatter is None:
            self.scatter = np.zeros((self.width, self.width), np.float64)

    def add(self, embeddings: np.ndarray) -> None:
        """(images, V, D) embeddings of a block of images."""
        e = np.asarray(embeddings, np.float64)
        mu = e.mean(axis=1)
        centred = (e - mu[:, None]).reshape(-1, self.width)
        self.scatter += centred.T @ centred
        self.means.append(mu)
        self.rows += len(centred)

    def lidar(self, delta: float = DELTA) -> float:
        return lidar_from_moments(np.concatenate(self.means), self.scatter, self.rows, delta)


def lidar_from_moments(means: np.ndarray, scatter: np.ndarray, rows: int, delta: float = DELTA) -> float:
    """LiDAR from per-image means (N, D) and the within-image scatter over ``rows`` = N·V embeddings."""
    mu = means - means.mean(axis=0, keepdims=True)
    cov_b = mu.T @ mu / (len(means) - 1)
    cov_w = scatter / (rows - 1) + delta * np.eye(len(scatter))
    e, v = np.linalg.eigh(cov_w)
    root = (v * np.clip(e, delta, None) ** -0.5) @ v.T
    lda = root @ cov_b @ root + delta * np.eye(len(scatter))
    eig = np.linalg.eigvalsh((lda + lda.T) / 2)
    return rankme(eig, form="radio")


def lidar(embeddings: np.ndarray, delta: float = DELTA) -> float:
    """LiDAR of (N images, V views, D) embeddings, all at once."""
    views = Views(embeddings.shape[-1])
    views.add(embeddings)
    return views.lidar(delta)
