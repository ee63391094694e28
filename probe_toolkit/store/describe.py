"""``probe info``'s rows for a store: completeness, views, arrays with shapes, manifest fields
(read with zarr alone)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..infra.errors import ProbeError, reading
from . import grids, verify
from .cache import DAMAGED_STORE_FIX, FLAGS, PER_VIEW, manifest, open_store, view_facts

if TYPE_CHECKING:
    import xarray as xr

    from .direct import StoreData


def _describe_view(ds: xr.Dataset | StoreData, meta: dict[str, Any], view: str) -> str:
    """One line for a view: its grid(s), filter, attention, and how many images it holds."""
    facts = view_facts(meta, view)
    try:
        rows, cols = grids.view_grid(ds, view)
    except ProbeError:
        return "no arrays"
    pairs = sorted(set(zip(rows.tolist(), cols.tolist())) - {(0, 0)}, key=lambda rc: rc[0] * rc[1])
    if len(pairs) == 1:
        grid = f"{pairs[0][0]}x{pairs[0][1]} patches"
    elif pairs:
        grid = f"per-image grids {pairs[0][0]}x{pairs[0][1]} to {pairs[-1][0]}x{pairs[-1][1]} (patch dimension {ds.sizes.get(f'patch_{view}')})"
    else:
        grid = "no grid"
    patch = (meta.get("arch") or {}).get("patch")
    parts = [grid + (f" at /{patch}" if patch else "")]
    parts += [f"{key} {facts[key]}" for key in ("resample", "attention") if facts.get(key) not in (None, "none")]
    if f"done_{view}" in ds:
        done = ds[f"done_{view}"].values.astype(bool)
        parts.append(f"{int(done.sum())}/{done.size} done, {int(ds[f'failed_{view}'].values.astype(bool).sum())} failed")
    return "; ".join(parts)


def describe_store(path: str | Path) -> list[tuple[str, str]]:
    """Rows for ``probe info``: completeness, arrays with shapes, manifest fields, results (read with zarr alone).
    A manifest whose fields are damaged (a view's entry not a table) is one line, as ``open_store``'s."""
    with reading(path, "probe store", DAMAGED_STORE_FIX):
        return _rows(path)


def _rows(path: str | Path) -> list[tuple[str, str]]:
    ds = open_store(path, done_only=False, plain=True)
    meta = manifest(ds)
    done = ds["done"].values.astype(bool)
    failed = ds["failed"].values.astype(bool)
    n = len(done)
    rows = [
        ("images", f"{int(done.sum())}/{n} done ({100.0 * done.sum() / max(n, 1):.1f} %), {int(failed.sum())} failed"),
        ("chunks", verify.chunk_summary(path)),  # a stat per chunk: a finished image's missing chunk shows here
        ("checkpoint", f"{meta['checkpoint']['path']} ({meta['checkpoint']['format']}, sha256 {meta['checkpoint']['sha256'][:12]})"),
        ("network", str(meta["network"]) + (" (converted)" if meta["checkpoint"].get("converted") else "")),
        ("arch", ", ".join(f"{k}={v}" for k, v in meta["arch"].items())),
    ]
    rows.append(("views", ", ".join(str(v) for v in meta.get("views", []))))
    for name in ("interpolation", "attention", "dtype", "chunk", "image_source", "image_list_sha256", "toolkit_version", "git_revision", "date"):
        rows.append((name, str(meta.get(name))))
    for view in grids.views_in(ds):
        rows.append((f"view {view}", _describe_view(ds, meta, view)))
    for name, var in sorted(ds.data_vars.items()):
        if name not in FLAGS and not name.startswith(PER_VIEW):
            rows.append((f"array {name}", f"{dict(zip(var.dims, var.shape))} {var.dtype}"))
    return rows
