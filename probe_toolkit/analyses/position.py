"""How much do a block's patch tokens know of where they are? A linear probe on their position.

As NVlabs/RADIO ``examples/position_predictor.py`` trains it: each patch token, L2-normalised
(``F.normalize`` over channels), goes through one linear map with bias (its 1 × 1 convolution,
``nn.Conv2d(D, 2, 1)``, initialised as torch initialises it) to two numbers, trained against the
token's normalised position, x = ``linspace(-1, 1, cols)[col]`` and y = ``linspace(-1, 1,
rows)[row]``, with ``SmoothL1Loss`` (β = 1, mean over every coordinate of the batch) and Adam at
learning rate 1e-2, one step per batch of 32 images in order (no shuffling), 5 epochs; the
reported figure is the held-out images' loss. probe reports that loss and, beside it, the L1
error (the mean |prediction − target| over coordinates, in the same [-1, 1] units).

Chance level: a probe that learns nothing predicts the best constant, the median, and its L1
error is the mean |t − median(t)| over the grid's targets: G / (2(G − 1)) for an even G
(0.538 at 14 × 14), → 0.5 as G grows (``chance_l1``). A trained ViT's tokens reach about 0.02
(RADIO's figure for its models).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

LR = 1e-2  # position_predictor.py --learning-rate
EPOCHS = 5  # --num-epochs
BATCH = 32  # --batch-size (images)


def targets(rows: int, cols: int) -> np.ndarray:
    """(rows·cols, 2) of (y, x) per patch, row-major: linspace(-1, 1) along each side, float32 as torch builds them."""
    y = np.linspace(-1, 1, rows, dtype=np.float32) if rows > 1 else np.array([-1.0], np.float32)
    x = np.linspace(-1, 1, cols, dtype=np.float32) if cols > 1 else np.array([-1.0], np.float32)
    return np.stack(np.meshgrid(y, x, indexing="ij"), axis=-1).reshape(-1, 2)


def chance_l1(rows: int, cols: int) -> float:
    """L1 error of the best constant (the median) on the grid's targets, averaged over both coordinates."""
    t = targets(rows, cols).astype(np.float64)
    return float(np.mean(np.abs(t - np.median(t, axis=0))))


@dataclass
class PositionResult:
    loss: float  # held-out SmoothL1 (RADIO's "Average validation loss")
    l1: float  # held-out mean |prediction − target|
    l1_row: float
    l1_col: float
    train_loss: list[float]  # mean training loss of each epoch
    chance: float
    weight: np.ndarray  # (2, D): the (y, x) rows of the map
    bias: np.ndarray


def _normalise(tokens):
    import torch

    return torch.nn.functional.normalize(torch.as_tensor(np.asarray(tokens, np.float32)), dim=-1)


def train_probe(
    batches: Callable[[int], Iterable[np.ndarray]],
    held_out: Iterable[np.ndarray],
    width: int,
    rows: int,
    cols: int,
    *,
    epochs: int = EPOCHS,
    lr: float = LR,
    seed: int = 0,
) -> PositionResult:
    """Fit the map on ``batches(epoch)`` (each (images, rows·cols, D) tokens, in order) and score ``held_out``.

    Deterministic: the map's initial weights come from a torch Generator seeded by ``seed``; one thread of torch
    keeps the sums in one order whatever the machine (``infra.runner.task_threads``)."""
    import torch

    from ..infra.runner import task_threads

    with task_threads(1):
        generator = torch.Generator().manual_seed(seed)
        head = torch.nn.Linear(width, 2)  # RADIO's 1 × 1 convolution, as a map of each token
        with torch.no_grad():  # torch's default init of that convolution (kaiming_uniform_, a = √5): U(−1/√D, 1/√D), its bias too
            bound = 1.0 / np.sqrt(width)
            head.weight.uniform_(-bound, bound, generator=generator)
            head.bias.uniform_(-bound, bound, generator=generator)
        target = torch.as_tensor(targets(rows, cols))
        optimiser = torch.optim.Adam(head.parameters(), lr=lr)
        loss_fn = torch.nn.SmoothL1Loss()
        train_loss = []
        for epoch in range(epochs):
            total, count = 0.0, 0
            for tokens in batches(epoch):
                x = _normalise(tokens)
                loss = loss_fn(head(x), target.expand(len(x), -1, -1))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                total += float(loss.detach()) * len(x)
                count += len(x)
            train_loss.append(total / max(count, 1))
        loss_sum, l1_sum, images = 0.0, np.zeros(2), 0
        with torch.no_grad():
            for tokens in held_out:
                x = _normalise(tokens)
                predicted = head(x)
                loss_sum += float(loss_fn(predicted, target.expand(len(x), -1, -1))) * len(x)
                l1_sum += (predicted - target).abs().double().mean(dim=(0, 1)).numpy() * len(x)
                images += len(x)
        l1 = l1_sum / images
        return PositionResult(
            loss_sum / images,
            float(l1.mean()),
            float(l1[0]),
            float(l1[1]),
            train_loss,
            chance_l1(rows, cols),
            head.weight.detach().numpy().copy(),
            head.bias.detach().numpy().copy(),
        )


def split(ids: list[str], held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) image indices, each in store order: a seeded choice of round(held_out · n) held-out images."""
    n = len(ids)
    k = round(held_out * n)
    chosen = np.sort(np.random.default_rng(seed).permutation(n)[:k])
    mask = np.zeros(n, bool)
    mask[chosen] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)
