"""What ``probe entropy`` and ``probe neighbours`` share: open every store, measure, save, report.

The measurements themselves are pure (``analyses.entropy``, ``analyses.neighbours``: arrays in,
datasets out); this module opens each store (refusing an unfinished one unless ``partial``),
runs the measurement chunk by chunk (locally or on a dask.distributed scheduler), saves the
result in the store's results group with where it came from, and writes the numbers as JSON
when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..infra import provenance
from ..infra.atomic import write_json
from ..infra.chunked import connect
from ..infra.progress import bar
from ..store.cache import open_store, require
from ..results import records
from ..store.completion import computed_on
from ..results import summaries

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreData
    from ..store.plain import Results


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


def over_stores(stores: list[Path], analyse: Callable, needs: str, quiet: bool, dask_address: str | None,
                partial: bool) -> dict[str, tuple[StoreData, xr.Dataset | Results]]:
    """Open every store (with zarr alone: ``store.direct``) and check it holds ``needs`` first, then
    run ``analyse(ds, progress, client)``."""
    opened = {str(store): open_store(store, allow_partial=partial, arrays=needs, plain=True) for store in dict.fromkeys(stores)}
    for ds in opened.values():
        require(ds, needs)
    runs = {}
    client = connect(dask_address)
    try:
        with bar("images", quiet) as progress:
            for store, ds in opened.items():
                task = progress.add_task(store, total=ds.sizes.get("image", 0))
                runs[store] = (ds, analyse(ds, lambda n, task=task: progress.advance(task, n), client))
    finally:
        if client is not None:
            client.close()
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
        write_json(json_path, payload, indent=1)
    return Run(name, {store: result for store, (_, result) in runs.items()}, followed, payload)
