"""Fewer full garbage collections while a command imports its libraries.

Importing torch and timm creates a few hundred thousand objects that live as long as the
process. CPython (3.11) sweeps its oldest generation whenever ten middle-generation sweeps have
run and that generation has grown by a quarter, which during those imports is six times, each
walking everything imported so far: a measurable share of the imports' CPU
(``benchmarks/startup.py --collections``).

Asking for a hundred middle-generation sweeps instead of ten leaves none of those full sweeps
during the imports, and at most one per ~700,000 container allocations later (the quarter rule
still applies): a long run's cycles are still freed. The young generations are swept exactly as
before, so short-lived cycles go as soon as they did. Nothing computed depends on when
collection runs.
"""

from __future__ import annotations

import gc

OLDEST = 100  # middle-generation sweeps per full sweep (CPython's default: 10)


def fewer_full_collections() -> tuple[int, ...]:
    """Raise the oldest generation's threshold (never lower it); returns the thresholds now in force."""
    young, middle, oldest, *rest = gc.get_threshold()
    if oldest < OLDEST:
        gc.set_threshold(young, middle, OLDEST, *rest)
    return gc.get_threshold()
