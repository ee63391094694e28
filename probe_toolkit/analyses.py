"""The store side of ``probe entropy`` and ``probe neighbours``: open, measure, save, report.

``entropy.py`` and ``neighbours.py`` are pure (arrays in, datasets out); this module opens each
store (refusing an unfinished one unless ``partial``), runs the measurement chunk by chunk
(locally or on a dask.distributed scheduler), saves the result in the store's results group
with where it came from, and writes the numbers as JSON when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import xarray as xr

from . import provenance, summaries
from .atomic import write_json
from .cache import open_store, require, save_results
from .chunked import connect
from .errors import ProbeError
from .progress import bar


@dataclass
class Run:
    """One analysis over several stores, by store path, in the order given."""

    name: str
    results: dict[str, xr.Dataset]
    followed: int | None = None  # index of the image whose --patch detail is reported
    payload: dict = field(default_factory=dict)


def result_provenance(ds: xr.Dataset, command: str) -> dict:
    """What a saved result says about where it came from: this run, and the store it read."""
    meta = ds.attrs.get("manifest", {})
    store = {key: meta.get(key) for key in ("checkpoint", "network", "arch", "views", "interpolation", "dtype", "image_list_sha256", "git_revision", "n_images")}
    return {"command": command, **provenance.stamp(), "store_manifest": store, "images_read": int(ds.sizes.get("image", 0))}


def _over_stores(stores: list[Path], analyse: Callable, needs: str, quiet: bool, dask_address: str | None, partial: bool) -> dict[str, tuple[xr.Dataset, xr.Dataset]]:
    """Open every store and check it holds ``needs`` first, then run ``analyse(ds, progress, client)``."""
    opened = {str(store): open_store(store, allow_partial=partial) for store in dict.fromkeys(stores)}
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


def _finish(name: str, command: str, runs: dict, json_path: Path | None, followed: int | None = None) -> Run:
    payload = {"analysis": name, "stores": {}}
    for store, (ds, result) in runs.items():
        save_results(store, name, result, result_provenance(ds, command))
        payload["stores"][store] = summaries.set_level(result, followed)
    if json_path is not None:
        write_json(json_path, payload, indent=1)
    return Run(name, {store: result for store, (_, result) in runs.items()}, followed, payload)


def run_entropy(
    stores: list[Path],
    *,
    patch: int | None = None,
    image: str | None = None,
    json_path: Path | None = None,
    dask_address: str | None = None,
    seed: int = 0,
    boot: int = 1000,
    partial: bool = False,
    quiet: bool = False,
) -> Run:
    """``probe entropy``: saved as ``results/entropy`` in each store."""
    from .entropy import entropy

    def analyse(ds, progress, client):
        arch = ds.attrs["manifest"].get("arch", {})
        blocks = ds["attention_blocks_224"] if "attention_blocks_224" in ds else None
        return entropy(
            require(ds, "attention_224"), class_token=bool(arch.get("class_token", False)), blocks=blocks, patch=patch,
            n_boot=boot, seed=seed, client=client, progress=progress,
        )

    runs = _over_stores(stores, analyse, "attention_224", quiet, dask_address, partial)
    followed = None
    if patch is not None:
        followed = 0
        for store, (_, result) in runs.items():
            ids = [str(i) for i in result.image.values]
            if image is not None and image not in ids:
                raise ProbeError(store, f"has no finished image {image!r}", "pass an id from the store's image list")
            followed = ids.index(image) if image is not None else 0
    return _finish("entropy", "probe entropy", runs, json_path, followed)


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
    from .neighbours import grid_array, neighbours

    array = grid_array(grid)

    def analyse(ds, progress, client):
        return neighbours(require(ds, array), grid, k=k, top=top, wrap=wrap, metric=distance, n_boot=boot, seed=seed, client=client, progress=progress)

    runs = _over_stores(stores, analyse, array, quiet, dask_address, partial)
    return _finish(f"neighbours_g{grid}" + ("" if wrap else "_nowrap"), "probe neighbours", runs, json_path)
