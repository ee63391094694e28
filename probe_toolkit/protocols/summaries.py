"""The settings every summary over stores shares (``entropy``, ``neighbours``): the bootstrap
over images that gives each statistic its 95 % interval, and whether a store still being
extracted may be read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..infra.settings import AtLeast, SettingError, Settings, Within, setting

# The fewest resamples a 95 % interval is drawn from. A percentile interval reads each bound from
# the 2.5 % of resampled means in its tail: with B resamples that tail holds 0.025 B of them. Below
# B = 40 it holds none, so the "bounds" are just the most extreme resamples (at 1 or 2 they are one
# or two resamples' means, which easily sit on one side of the estimate: an interval that excludes
# it). At B = 100 each bound is read between the 2nd and 3rd most extreme of 100 means: coarse, but
# a quantile of a tail rather than a single draw. Efron & Tibshirani (An Introduction to the
# Bootstrap) ask for about 1000 for percentile intervals, the default; 100 is the floor.
MIN_BOOT = 100
# The most resamples accepted: each is a pass over the images and a row of means held until the
# quantiles are read; at 100,000 the Monte Carlo error of a 2.5 % bound is already far below the
# three decimals printed.
MAX_BOOT = 100_000


@dataclass(frozen=True)
class Resamples(Within):
    """A resample count between the floor and the ceiling, its refusal saying what the count given would do."""

    def check(self, name: str, value: Any, spell=None, example: Any = 1000) -> None:
        if self.holds(value):
            return
        if isinstance(value, int) and value > self.high:
            why = (
                f"above the ceiling of {MAX_BOOT} resamples (each is a pass over the images, and their means would hold "
                f"~{value * 8 / 1e9:.2g} GB per statistic); more resamples no longer move the printed bounds"
            )
        elif isinstance(value, int) and value > 0:
            why = (
                f"{value} resamples are too few for a 95 % percentile interval (each 2.5 % tail would hold {0.025 * value:g} of them, "
                f"and the interval can exclude the estimate); the floor is {MIN_BOOT}"
            )
        else:
            why = f"there would be no interval; the floor is {MIN_BOOT}"
        raise SettingError(name, requirement=self.text, value=value, example=example, why=why, spell=spell)


BOOT = Resamples(MIN_BOOT, MAX_BOOT, "[]", integer=True)


@dataclass(frozen=True)
class OverStoresSettings(Settings):
    seed: int = setting(0, "Seed of the bootstrap over images.", AtLeast(0))
    boot: int = setting(1000, "Bootstrap resamples for the 95 % intervals.", BOOT)
    partial: bool = setting(False, "Summarise a store still being extracted (its finished images).")
