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


class Interval(NamedTuple):
    mean: np.ndarray  # (S,) the mean over images
    low: np.ndarray  # (S,) lower bound of the interval
    high: np.ndarray  # (S,) upper bound


def bootstrap_mean(values: np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95, progress: Callable[[int], None] | None = None) -> Interval:
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
