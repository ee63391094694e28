"""What ``probe entropy`` and ``probe neighbours`` return: one result per store (``commands/runs.py``
fills it; ``results/tables.entropy`` and ``tables.neighbours`` show it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .outcome import Outcome

if TYPE_CHECKING:
    import xarray as xr

    from ..store.plain import Results


@dataclass
class OverStoresReport(Outcome):
    """One analysis over several stores, by store path, in the order given."""

    name: str
    results: dict[str, xr.Dataset | Results]
    followed: int | None = None  # index of the image whose --patch detail is reported
    payload: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return self.payload
