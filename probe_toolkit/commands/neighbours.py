"""``probe neighbours``: window-neighbour statistics of every store, saved as ``results/neighbours_g<grid>``."""

from __future__ import annotations

from pathlib import Path

from ..store.cache import require
from .runs import Run, finish, over_stores


def run_neighbours(
    stores: list[Path],
    *,
    grid: int = 14,
    k: int = 4,
    top: int = 8,
    wrap: bool = True,
    distance: str = "chebyshev",
    json_path: Path | None = None,
    dask_address: str | None = None,
    seed: int = 0,
    boot: int = 1000,
    partial: bool = False,
    quiet: bool = False,
) -> Run:
    """``probe neighbours``: saved as ``results/neighbours_g<grid>`` (``_nowrap`` without the wrap)."""
    from ..analyses.neighbours import grid_array, neighbours

    array = grid_array(grid)

    def analyse(ds, progress, client):
        return neighbours(require(ds, array), grid, k=k, top=top, wrap=wrap, metric=distance, n_boot=boot, seed=seed, client=client, progress=progress)

    runs = over_stores(stores, analyse, array, quiet, dask_address, partial)
    return finish(f"neighbours_g{grid}" + ("" if wrap else "_nowrap"), "probe neighbours", runs, json_path)
