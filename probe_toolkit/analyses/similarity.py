"""How alike are two representations of the same examples? Linear CKA and its unbiased minibatch estimator.

Linear CKA (Kornblith et al., *Similarity of Neural Network Representations Revisited*, ICML
2019, Eq. 5 with a linear kernel): for X (n × p) and Y (n × q), columns centred,

    CKA(X, Y) = ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)  =  ⟨HKH, HLH⟩ / (‖HKH‖_F ‖HLH‖_F),  K = XXᵀ, L = YYᵀ.

``FeatureMoments`` accumulates the first form in float64 a block of rows at a time (examples are
rows: patch tokens or class tokens; memory (F·D)² for F feature sets of D channels, not n²);
the shift by the first block's column means keeps the centring exact (ZᵀZ − n·m·mᵀ would lose
digits when the means dwarf the spread, as DINOv2's large channels do). ``ExampleGrams`` takes the
second form for examples that are whole images (their patch tokens flattened, Kornblith's
convention for a feature map): n × n per feature set.

Unbiased minibatch CKA (Nguyen, Raghu & Kornblith, *Do Wide and Deep Networks Learn the Same
Things?*, ICLR 2021, Eq. 2-3): over k minibatches of b examples,

    CKA_mb = Σ_i HSIC₁(K_i, L_i) / sqrt(Σ_i HSIC₁(K_i, K_i) · Σ_i HSIC₁(L_i, L_i)),

HSIC₁ Song et al.'s (2012) unbiased estimator, computed as Google Research's
``do_wide_and_deep_networks_learn_the_same_things/efficient_CKA.py`` does: the inner product of
the U-centred Gram matrices (Székely & Rizzo 2014), which is b(b − 3)·HSIC₁ (the factor cancels,
batches being of one size). Unlike the full estimator, it does not tend to 1 for any two
representations of few examples in many dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def cka_from_products(products: np.ndarray) -> np.ndarray:
    """F × F CKA from F × F inner products ⟨K̄_i, K̄_j⟩ (or their minibatch sums): S_ij / sqrt(S_ii S_jj)."""
    s = np.asarray(products, np.float64)
    norm = np.sqrt(np.clip(np.diag(s), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        return s / norm[:, None] / norm[None, :]


@dataclass
class FeatureMoments:
    """Centred cross-products of F feature sets (each n × D) over rows added a block at a time, float64."""

    widths: tuple[int, ...]
    rows: int = 0
    shift: np.ndarray | None = None
    sums: np.ndarray | None = None
    cross: np.ndarray | None = None

    def add(self, sets: list[np.ndarray]) -> None:
        """One block of rows of every feature set ((rows, D_f) each, rows in the same order)."""
        z = np.concatenate([np.asarray(s, np.float64).reshape(len(s), -1) for s in sets], axis=1)
        if not np.isfinite(z).all():
            raise ValueError("rows hold a value that is not finite")
        if self.shift is None:
            self.shift = z.mean(axis=0)
            self.sums = np.zeros(z.shape[1])
            self.cross = np.zeros((z.shape[1], z.shape[1]))
        z -= self.shift
        self.sums += z.sum(axis=0)
        self.cross += z.T @ z
        self.rows += len(z)

    def products(self) -> np.ndarray:
        """⟨K̄_i, K̄_j⟩ = ‖X̄_iᵀX̄_j‖²_F for every pair of feature sets."""
        mean = self.sums / self.rows
        centred = self.cross - self.rows * np.outer(mean, mean)
        edges = np.cumsum((0, *self.widths))
        f = len(self.widths)
        out = np.empty((f, f))
        for i in range(f):
            for j in range(i, f):
                block = centred[edges[i] : edges[i + 1], edges[j] : edges[j + 1]]
                out[i, j] = out[j, i] = np.sum(block * block)
        return out

    def cka(self) -> np.ndarray:
        return cka_from_products(self.products())


def centred_gram(x: np.ndarray) -> np.ndarray:
    """HKH for K = XXᵀ (rows of X are examples, flattened), float64."""
    z = np.asarray(x, np.float64).reshape(len(x), -1)
    z = z - z.mean(axis=0)
    return z @ z.T


@dataclass
class ExampleGrams:
    """Full linear CKA of F feature sets whose examples are whole images: ⟨HK_iH, HK_jH⟩ on n × n Grams."""

    grams: list[np.ndarray] = field(default_factory=list)

    def add(self, x: np.ndarray) -> None:
        """Every example of one feature set (n, ...), flattened per example."""
        self.grams.append(centred_gram(x))

    def cka(self) -> np.ndarray:
        flat = np.stack([g.ravel() for g in self.grams])
        return cka_from_products(flat @ flat.T)


def u_centred(x: np.ndarray) -> np.ndarray:
    """The U-centred linear Gram matrix of b examples (Székely & Rizzo 2014), zero diagonal, float64."""
    z = np.asarray(x, np.float64).reshape(len(x), -1)
    n = len(z)
    gram = z @ z.T
    np.fill_diagonal(gram, 0.0)
    means = gram.sum(axis=0) / (n - 2)
    means -= means.sum() / (2 * (n - 1))
    gram -= means[:, None]
    gram -= means[None, :]
    np.fill_diagonal(gram, 0.0)
    return gram


@dataclass
class Minibatches:
    """Σ over minibatches of ⟨Ũ_i, Ũ_j⟩ for F feature sets: the unbiased minibatch CKA's sums."""

    sets: int
    batches: int = 0
    products: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.products is None:
            self.products = np.zeros((self.sets, self.sets))

    def add(self, batch: list[np.ndarray]) -> None:
        """One minibatch: the same b examples in every feature set ((b, ...) each), b ≥ 4."""
        if len(batch) != self.sets or len(batch[0]) < 4:
            raise ValueError(f"a minibatch needs {self.sets} feature sets of at least 4 examples")
        flat = np.stack([u_centred(x).ravel() for x in batch])
        self.products += flat @ flat.T
        self.batches += 1

    def cka(self) -> np.ndarray:
        return cka_from_products(self.products)


def minibatch_order(n: int, batch: int, epochs: int, seed: int) -> list[np.ndarray]:
    """Each epoch a seeded permutation of the n examples cut into full batches (a last partial batch is dropped,
    so every batch has b examples and the b(b − 3) factor cancels); each batch sorted for reading."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        order = rng.permutation(n)
        out += [np.sort(order[a : a + batch]) for a in range(0, n - batch + 1, batch)]
    return out
