"""Schedules as plain functions of the global step, with DINO's formulas (``utils.cosine_scheduler``).

DINO builds each schedule as an array: ``np.linspace(start_warmup, base, warmup)`` for the
warm-up steps, then ``final + 0.5 (base - final) (1 + cos(pi i / n))`` for i in 0..n-1 over the
remaining n steps. These functions return element ``step`` of that array, so a resumed run reads
the same value at the same step.
"""

from __future__ import annotations

import math


def cosine(step: int, total: int, start: float, end: float, warmup: int = 0, warmup_start: float = 0.0) -> float:
    """Linear warm-up from ``warmup_start`` to ``start`` over ``warmup`` steps, then cosine to ``end``."""
    if step < warmup:
        return warmup_start + (start - warmup_start) * (step / (warmup - 1) if warmup > 1 else 0.0)
    n = total - warmup
    i = min(step - warmup, n - 1) if n > 0 else 0
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * i / n)) if n > 0 else end


def learning_rate(step: int, total: int, warmup: int, peak: float, final: float) -> float:
    """Warm-up from 0 to ``peak``, cosine to ``final``, as DINO's ``cosine_scheduler`` (whose peak is
    5e-4·batch/256; the caller's ``peak`` is taken as given, unscaled)."""
    return cosine(step, total, peak, final, warmup=warmup)


def weight_decay(step: int, total: int, start: float, end: float) -> float:
    """Cosine from ``start`` to ``end`` (DINO/SelfPatch: 0.04 → 0.4), on weights only."""
    return cosine(step, total, start, end)


def teacher_momentum(step: int, total: int, base: float) -> float:
    """EMA momentum, cosine from ``base`` (0.996) to 1."""
    return cosine(step, total, base, 1.0)


def teacher_temperature(epoch: int, warmup_epochs: int, warmup: float, final: float) -> float:
    """The teacher's temperature in ``epoch``: element ``epoch`` of DINO's and SelfPatch's
    ``concatenate(linspace(warmup, final, warmup_epochs), ones(rest) * final)`` (per epoch, not per
    step; numpy's linspace computes ``i * step + start`` and ends exactly on ``final``)."""
    if epoch >= warmup_epochs:
        return final
    if epoch == warmup_epochs - 1 and warmup_epochs > 1:
        return final
    return epoch * ((final - warmup) / (warmup_epochs - 1)) + warmup if warmup_epochs > 1 else warmup
