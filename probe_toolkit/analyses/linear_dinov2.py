"""DINOv2's linear classification protocol (Oquab et al., 2023), as facebookresearch/dinov2
``dinov2/eval/linear.py`` runs it, on features read from a store instead of a network.

What linear.py does (``run_eval_linear``, ``setup_linear_classifiers``, ``eval_linear``,
``evaluate_linear_classifiers``; read there and written anew here):

- **Features** (``ModelWithIntermediateLayers``: ``get_intermediate_layers(n=4,
  return_class_token=True)``, ``norm=True``): each of the last 4 blocks' outputs through the
  final norm, split into the class token and the patch tokens (registers dropped).
- **Classifiers**: for ``n`` in (1, 4), ``avgpool`` in (False, True), each learning rate of the
  grid (1e-5 … 0.1, 13 rates), one ``nn.Linear``: the input (``create_linear_input``) is the class
  tokens of the last ``n`` blocks concatenated in block order, and with ``avgpool`` the mean of the
  last block's patch tokens after them; weight N(0, 0.01), bias 0. 52 classifiers, trained at once
  on the same batches with the sum of their cross-entropies.
- **Optimisation**: SGD, momentum 0.9, no weight decay, each classifier's rate scaled by
  batch · world / 256 (``scale_lr``), cosine annealing to 0 over ``epochs · epoch_length``
  iterations (10 × 1,250), batch 128, batches drawn by ``ShardedInfiniteSampler`` (seed 0;
  ``dinov2/data/samplers.py``: a ``randperm`` of the train set, then each pass an inside-out
  shuffle of it with the generator re-seeded at ``seed + (pass << 24)``), drop_last.
- **Choice**: every classifier's top-1 accuracy on val; the best is the first of strictly larger
  top-1 in the classifiers' order (a ``ModuleDict`` keyed by ``classifier_{n}_blocks_avgpool_
  {avgpool}_lr_{lr:.5f}``: two rates whose scaled values print alike share a key, and the later
  classifier replaces the earlier in its place; the earlier keeps its optimiser group but, outside
  the ``ModuleDict`` whose items the loss sums, is neither trained nor evaluated). The
  reported number is the best classifier's val accuracy, or, given test sets, its accuracy there.

What differs is declared once, as the protocol's differences (``protocols/linear_dinov2.py``). Pure
torch over arrays: the store, the panels and the record are the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and torch where the numbers are: the registry reads this module's defaults at every start
    import numpy as np

N_LAST_BLOCKS = (1, 4)  # linear.py run_eval_linear n_last_blocks_list
AVGPOOL = (False, True)  # setup_linear_classifiers
LEARNING_RATES = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1)  # get_args_parser learning_rates
EPOCHS = 10  # get_args_parser epochs
EPOCH_LENGTH = 1250  # get_args_parser epoch_length (iterations per epoch)
BATCH_SIZE = 128  # get_args_parser batch_size (per GPU)
SEED = 0  # run_eval_linear: seed = 0 (the train sampler's)
MOMENTUM = 0.9  # run_eval_linear: SGD(momentum=0.9, weight_decay=0)
INIT_STD = 0.01  # LinearClassifier: weight.normal_(mean=0.0, std=0.01), bias zero


def scaled_rate(rate: float, batch_size: int, world: int = 1) -> float:
    """``scale_lr``: the rate times the global batch over 256."""
    return rate * (batch_size * world) / 256.0


def classifier_name(blocks: int, avgpool: bool, scaled: float) -> str:
    """The reference's key of a classifier (``setup_linear_classifiers``)."""
    return f"classifier_{blocks}_blocks_avgpool_{avgpool}_lr_{scaled:.5f}".replace(".", "_")


@dataclass(frozen=True)
class Classifier:
    """One classifier of the grid: its input (``blocks`` class tokens, ``avgpool``) and its rate."""

    blocks: int
    avgpool: bool
    rate: float  # as given, before scaling
    scaled: float  # the rate the optimiser uses
    name: str


def grid(
    blocks: Sequence[int] = N_LAST_BLOCKS, avgpool: Sequence[bool] = AVGPOOL, rates: Sequence[float] = LEARNING_RATES, batch_size: int = BATCH_SIZE, world: int = 1
) -> list[Classifier]:
    """Every classifier in the reference's order (blocks, then avgpool, then rate)."""
    out = []
    for n in blocks:
        for pool in avgpool:
            for rate in rates:
                scaled = scaled_rate(rate, batch_size, world)
                out.append(Classifier(int(n), bool(pool), float(rate), scaled, classifier_name(n, pool, scaled)))
    return out


def evaluated(classifiers: Sequence[Classifier]) -> list[int]:
    """Positions of the classifiers the reference evaluates, in its order: a name repeated keeps
    its first place and its last classifier (a ``ModuleDict`` assignment to an existing key)."""
    place: dict[str, int] = {}
    for i, c in enumerate(classifiers):
        place[c.name] = i
    return list(place.values())


def linear_input(cls_blocks, patch_mean, blocks: int, avgpool: bool):
    """``create_linear_input``: (B, stored blocks, D) class tokens (oldest block first) and (B, D)
    mean patch token of the last block → (B, blocks·D [+ D]) float32."""
    import torch

    out = torch.cat([cls_blocks[:, k] for k in range(cls_blocks.shape[1] - blocks, cls_blocks.shape[1])], dim=-1)
    if avgpool:
        out = torch.cat((out, patch_mean), dim=-1).reshape(out.shape[0], -1)
    return out.float()


def patch_mean(patch_tokens):
    """The last block's patch tokens averaged per image (``torch.mean(..., dim=1)``), float32."""
    import torch

    return torch.mean(torch.as_tensor(patch_tokens).float(), dim=1)


def sampler(count: int, seed: int = SEED) -> Iterator[int]:
    """The train indices ``ShardedInfiniteSampler(shuffle=True, seed=seed)`` yields on one process
    (start 0, step 1): a ``randperm`` of ``count``, then pass after pass an inside-out shuffle of it
    (``_shuffle_tensor_slice``), the generator re-seeded at ``seed + (pass << 24)`` each pass."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed)
    perm = torch.randperm(count, dtype=torch.int32 if count <= 2**31 else torch.int64, generator=generator).tolist()
    passes = 0
    while True:
        generator.manual_seed(seed + (passes << 24))
        result = [0] * count
        for i in range(count):
            j = int(torch.randint(0, i + 1, size=(1,), generator=generator).item()) if i > 0 else 0
            result[i] = result[j]
            result[j] = perm[i]
        yield from result
        passes += 1


@dataclass
class Training:
    """Every classifier of the grid (a replaced one at its initial weights) and the summed loss of
    those the reference trains, every iteration."""

    classifiers: list[Classifier]
    weights: list  # torch.nn.Linear per classifier
    losses: list[float] = field(default_factory=list)


def train(
    cls_blocks,
    means,
    labels,
    classifiers: Sequence[Classifier],
    n_classes: int,
    *,
    epochs: int = EPOCHS,
    epoch_length: int = EPOCH_LENGTH,
    batch_size: int = BATCH_SIZE,
    seed: int = SEED,
    init_seed: int = 0,
    device: str = "cpu",
    on_step: Callable[[int], None] | None = None,
) -> Training:
    """``eval_linear``'s loop on stored features: ``cls_blocks`` (N, blocks, D), ``means`` (N, D),
    ``labels`` (N,) int in [0, n_classes); ``on_step(1)`` after every iteration."""
    import numpy as np
    import torch

    cls_blocks = torch.as_tensor(cls_blocks).float().to(device)
    means = torch.as_tensor(means).float().to(device)
    labels = torch.as_tensor(np.asarray(labels, np.int64)).to(device)
    generator = torch.Generator().manual_seed(init_seed)
    layers, groups = [], []
    for c in classifiers:
        width = linear_input(cls_blocks[:1], means[:1], c.blocks, c.avgpool).shape[1]
        layer = torch.nn.Linear(width, n_classes)  # nn.Linear's initialisation, then the reference's, from our generator
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
            bound = 1 / math.sqrt(width)
            torch.nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
            layer.weight.normal_(mean=0.0, std=INIT_STD, generator=generator)
            layer.bias.zero_()
        layer = layer.to(device)
        layers.append(layer)
        groups.append({"params": layer.parameters(), "lr": c.scaled})
    optimizer = torch.optim.SGD(groups, momentum=MOMENTUM, weight_decay=0)
    iterations = epochs * epoch_length
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, iterations, eta_min=0)
    order = sampler(len(labels), seed)
    out = Training(list(classifiers), layers)
    trained = evaluated(classifiers)  # AllClassifiers.forward runs the ModuleDict's items: a replaced classifier gets no gradient
    for _ in range(iterations):
        batch = torch.tensor([next(order) for _ in range(batch_size)], dtype=torch.int64, device=device)
        x_cls, x_mean, y = cls_blocks[batch], means[batch], labels[batch]
        loss = sum(torch.nn.CrossEntropyLoss()(layers[i](linear_input(x_cls, x_mean, classifiers[i].blocks, classifiers[i].avgpool)), y) for i in trained)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        out.losses.append(float(loss.item()))
        if on_step is not None:
            on_step(1)
    return out


def accuracies(training: Training, cls_blocks, means, labels, device: str = "cpu", chunk: int = 4096) -> np.ndarray:
    """(classifier, 2): top-1 and top-5 accuracy (fractions; MulticlassAccuracy, micro) of every classifier."""
    import numpy as np
    import torch

    labels = torch.as_tensor(np.asarray(labels, np.int64))
    hits = np.zeros((len(training.classifiers), 2), np.int64)
    with torch.no_grad():
        for a in range(0, len(labels), chunk):
            x_cls = torch.as_tensor(cls_blocks[a : a + chunk]).float().to(device)
            x_mean = torch.as_tensor(means[a : a + chunk]).float().to(device)
            y = labels[a : a + chunk].to(device)
            for i, (c, layer) in enumerate(zip(training.classifiers, training.weights)):
                logits = layer(linear_input(x_cls, x_mean, c.blocks, c.avgpool))
                top = logits.topk(min(5, logits.shape[1]), dim=1).indices
                hits[i, 0] += int((top[:, 0] == y).sum())
                hits[i, 1] += int((top == y[:, None]).any(1).sum())
    return hits / max(len(labels), 1)


def best_on_val(classifiers: Sequence[Classifier], top1: np.ndarray) -> int | None:
    """``evaluate_linear_classifiers``' choice: among the evaluated classifiers in order, the first
    of strictly larger top-1 than every earlier one (starting from 0); None when all score 0."""
    best, best_accuracy = None, 0.0
    for i in evaluated(classifiers):
        if float(top1[i]) > best_accuracy:
            best, best_accuracy = i, float(top1[i])
    return best
