"""What ``probe entropy`` and ``probe neighbours`` share: open every store, measure, save, report.

The measurements themselves are pure (``analyses.entropy``, ``analyses.neighbours``: arrays in,
datasets out); this module opens each store (refusing an unfinished one unless ``partial``),
runs the measurement block by block through the one runner (``infra/runner.py``: every local
core, or a dask.distributed scheduler, as the placement says), saves the
result in the store's results group with where it came from, and writes the numbers as JSON
when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..infra import provenance
from ..infra.owned import write_summary
from ..infra.placement import Placement
from ..infra.progress import bar
from ..infra.runner import placed
from ..results import records, summaries
from ..store.cache import open_store, require
from ..store.completion import computed_on

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreData
    from ..store.plain import Results


@dataclass(frozen=True)
class OverStores:
    """What a summary over stores takes besides its own settings: the bootstrap over images,
    whether a store still being extracted may be read, where the blocks run, and the outputs."""

    seed: int = 0
    boot: int = 1000
    partial: bool = False
    placement: Placement = Placement()
    json_path: Path | None = None
    quiet: bool = False

    @classmethod
    def of(cls, settings, placement: Placement, json_path: Path | None, quiet: bool) -> OverStores:
        """From a protocol's settings (``seed``, ``boot``, ``partial``) and the run's placement."""
        return cls(seed=settings.seed, boot=settings.boot, partial=settings.partial, placement=placement, json_path=json_path, quiet=quiet)


@dataclass
class Run:
    """One analysis over several stores, by store path, in the order given."""

    name: str
    results: dict[str, xr.Dataset | Results]
    followed: int | None = None  # index of the image whose --patch detail is reported
    payload: dict = field(default_factory=dict)


def result_provenance(ds: xr.Dataset | StoreData, command: str) -> dict:
    """What a saved result says about where it came from: this run, and the store it read."""
    meta = ds.attrs.get("manifest", {})
    store = {key: meta.get(key) for key in ("checkpoint", "network", "arch", "views", "interpolation", "dtype", "image_list_sha256", "git_revision", "n_images")}
    return {"command": command, **provenance.stamp(), "store_manifest": store, "images_read": int(ds.sizes.get("image", 0)),
            "computed_on": computed_on(ds.attrs["store"], ds["image"].values) if ds.attrs.get("store") else {}}


def over_stores(stores: list[Path], analyse: Callable, needs: str, over: OverStores) -> dict[str, tuple[StoreData, xr.Dataset | Results]]:
    """Open every store (with zarr alone: ``store.direct``) and check it holds ``needs`` first, then
    run ``analyse(ds, progress, where)``, ``where`` the runner's placement (``runner.Where``)."""
    opened = {str(store): open_store(store, allow_partial=over.partial, arrays=needs, plain=True) for store in dict.fromkeys(stores)}
    for ds in opened.values():
        require(ds, needs)
    runs = {}
    with placed(over.placement.workers, over.placement.dask_address) as where, bar("images", over.quiet) as progress:
        for store, ds in opened.items():
            task = progress.add_task(store, total=ds.sizes.get("image", 0))
            runs[store] = (ds, analyse(ds, lambda n, task=task: progress.advance(task, n), where))
    return runs


def finish(name: str, command: str, runs: dict, json_path: Path | None, followed: int | None = None, names: dict[str, str] | None = None) -> Run:
    """Save each store's result (under ``names[store]`` where stores differ, e.g. by grid) and the JSON."""
    names = names or {}
    payload = {"analysis": name, "stores": {}}
    for store, (ds, result) in runs.items():
        records.save(store, names.get(store, name), result, result_provenance(ds, command))
        payload["stores"][store] = summaries.set_level(result, followed)
        if store in names:
            payload["stores"][store]["result"] = names[store]
    if json_path is not None:
        write_summary(json_path, payload, indent=1)
    return Run(name, {store: result for store, (_, result) in runs.items()}, followed, payload)
