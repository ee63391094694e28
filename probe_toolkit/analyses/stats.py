"""Set-level summaries of per-image statistics: the mean and a bootstrap interval over images.

Images are the unit of resampling (anchors of one image are not independent). The interval is
the percentile bootstrap: resample the images with replacement ``n_boot`` times from a seeded
generator, take the mean each time, and read the (1 ± level)/2 quantiles of those means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..infra.errors import ProbeError
from ..infra.settings import SettingError

# The fewest resamples ``probe entropy`` and ``probe neighbours`` accept for their 95 % intervals.
# A percentile interval reads each bound from the 2.5 % of resampled means in its tail: with B
# resamples that tail holds 0.025 B of them. Below B = 40 it holds none, so the "bounds" are
# just the most extreme resamples (at --boot 1 or 2 they are one or two resamples' means, which
# easily sit on one side of the estimate: an interval that excludes it). At B = 100 each bound is
# read between the 2nd and 3rd most extreme of 100 means: coarse, but a quantile of a tail rather
# than a single draw. Efron & Tibshirani (An Introduction to the Bootstrap) ask for about 1000
# for percentile intervals, the default kept here; 100 is the floor, not a recommendation.
MIN_BOOT = 100
# The most resamples accepted. Each resample is a pass over the images and a row of means held
# until the quantiles are read, so --boot 100000000 would run for hours and hold 0.8 GB per
# statistic; at 100,000 resamples the Monte Carlo error of a 2.5 % bound is already a small
# fraction of the bootstrap's own standard error, far below the three decimals printed.
MAX_BOOT = 100_000


def check_boot(n_boot: int, option: str = "boot") -> None:
    """Refuse a resample count too small for a meaningful 95 % percentile interval (``MIN_BOOT``),
    before any work, naming the parameter (the CLI says ``--boot``)."""
    from ..infra.settings import SettingError

    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < MIN_BOOT:
        counted = not isinstance(n_boot, bool) and isinstance(n_boot, (int, np.integer)) and n_boot > 0
        tail = f"each 2.5 % tail would hold {0.025 * n_boot:g} of them, and the interval can exclude the estimate" if counted else "there would be no interval"
        raise SettingError(option, f"{option} {n_boot!r}: {n_boot!r} resamples are too few for a 95 % percentile interval ({tail}); the floor is {MIN_BOOT}",
                           f"use {option}={MIN_BOOT} or more (default 1000)")
    if n_boot > MAX_BOOT:
        raise SettingError(option, f"{option} {n_boot!r}: above the ceiling of {MAX_BOOT} resamples (each is a pass over the images, and their means "
                           f"would hold ~{n_boot * 8 / 1e9:.2g} GB per statistic); more resamples no longer move the printed bounds",
                           f"use {option}={MAX_BOOT} or fewer (default 1000)")


class Interval(NamedTuple):
    mean: np.ndarray  # (S,) the mean over images
    low: np.ndarray  # (S,) lower bound of the interval
    high: np.ndarray  # (S,) upper bound


def bootstrap_mean(values: np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                   progress: Callable[[int], None] | None = None) -> Interval:
    """Mean of ``values`` (image, S) over images with a percentile-bootstrap interval per column;
    ``progress(k)`` after each pass of k resamples (the same numbers with or without it)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        values = values[:, None]
    n = values.shape[0]
    if n == 0:
        raise ProbeError(None, "no images to summarise", "run the analysis on a store with finished images")
    if n_boot < 1:
        raise SettingError("n_boot", f"n_boot must be at least 1, got {n_boot!r}", "use e.g. n_boot=1000")
    if not 0 < level < 1:
        raise SettingError("level", f"level must lie in (0, 1), got {level!r}", "use e.g. level=0.95")
    rng = np.random.default_rng(seed)
    means = np.empty((n_boot, values.shape[1]))
    step = max(1, 500_000 // max(n, 1))  # resampled index rows per pass: bounded memory at any n
    for start in range(0, n_boot, step):
        stop = min(start + step, n_boot)
        picks = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = values[picks].mean(axis=1)
        if progress is not None:
            progress(stop - start)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    return Interval(values.mean(axis=0), low, high)


@dataclass(frozen=True)
class Bootstrap:
    """How a result's per-image statistics become its set-level summary (``bootstrap_mean``): one
    object that every bootstrapping analysis takes, summarises with and records the same way.
    ``progress(k)`` after each pass of k resamples (it does not change the numbers)."""

    n_boot: int = 1000
    seed: int = 0
    level: float = 0.95
    progress: Callable[[int], None] | None = field(default=None, compare=False)

    def summary(self, source, table: np.ndarray) -> tuple[dict, np.ndarray, dict]:
        """For ``table`` (image, statistic) computed from ``source`` (an array with an image axis
        first): the interval's variables (``summary_mean``/``_low``/``_high`` over ``statistic``),
        the image coordinate, and the attributes that say what was resampled and how."""
        interval = bootstrap_mean(table, n_boot=self.n_boot, seed=self.seed, level=self.level, progress=self.progress)
        images = source.coords["image"].values if "image" in source.coords else np.arange(source.shape[0])
        data = {"summary_mean": ("statistic", interval.mean), "summary_low": ("statistic", interval.low), "summary_high": ("statistic", interval.high)}
        attrs = {"array": str(source.name), "n_images": int(len(images)), "n_boot": self.n_boot, "seed": self.seed, "level": self.level}
        return data, images, attrs
