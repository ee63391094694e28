"""What ``probe entropy`` and ``probe neighbours`` share: open every store, measure, save, report.

The measurements themselves are pure (``analyses.entropy``, ``analyses.neighbours``: arrays in,
datasets out); this module opens each store (refusing an unfinished one unless ``partial``),
runs the measurement block by block through the one runner (``infra/runner.py``: every local
core, or a dask.distributed scheduler, as the placement says), and ends the run with one record
per store and the JSON summary (``RunContext.finish``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..infra import provenance
from ..protocols.context import RunContext, Saving
from ..results import summaries
from ..results.over_stores_report import OverStoresReport
from ..store.cache import open_store, require
from ..store.completion import computed_on

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreData
    from ..store.plain import Results


def result_provenance(ds: xr.Dataset | StoreData, command: str) -> dict:
    """What a saved result says about where it came from: this run, and the store it read."""
    meta = ds.attrs.get("manifest", {})
    store = {key: meta.get(key) for key in ("checkpoint", "network", "arch", "views", "interpolation", "dtype", "image_list_sha256", "git_revision", "n_images")}
    return {
        "command": command,
        **provenance.stamp(),
        "store_manifest": store,
        "images_read": int(ds.sizes.get("image", 0)),
        "computed_on": computed_on(ds.attrs["store"], ds["image"].values) if ds.attrs.get("store") else {},
    }


def over_stores(
    stores: list[Path], analyse: Callable, needs: str | Callable[[Path], str], partial: bool, context: RunContext
) -> dict[str, tuple[StoreData, xr.Dataset | Results]]:
    """Open every store (with zarr alone: ``store.direct``) and check it holds ``needs`` (an array, or
    the array of each store) first, then run ``analyse(ds, advance, where)``, ``where`` the runner's
    placement (``runner.Where``)."""
    need = needs if callable(needs) else (lambda store: needs)
    opened = {str(store): open_store(store, allow_partial=partial, arrays=need(store), plain=True) for store in dict.fromkeys(stores)}
    for store, ds in opened.items():
        require(ds, need(store))
    runs = {}
    with context.placed() as where:
        for store, ds in opened.items():
            runs[store] = (ds, analyse(ds, context.task(store, ds.sizes.get("image", 0)), where))
    return runs


def finish(name: str, runs: dict, context: RunContext, followed: int | None = None, names: dict[str, str] | None = None) -> OverStoresReport:
    """The run's end: each store's result saved (under ``names[store]`` where stores differ, e.g. by grid), and the JSON."""
    names = names or {}
    payload = {"analysis": name, "stores": {}}
    saving = []
    for store, (ds, result) in runs.items():
        saving.append(Saving(store, names.get(store, name), result, result_provenance(ds, context.command)))
        payload["stores"][store] = summaries.set_level(result, followed)
        if store in names:
            payload["stores"][store]["result"] = names[store]
    return context.finish(OverStoresReport(name, {store: result for store, (_, result) in runs.items()}, followed, payload), *saving)
