"""Set-level views of the entropy and neighbours results: rich tables (stores side by side) and
plain JSON-ready dicts. Pure: result Datasets in, tables or dicts out; the CLI prints and writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

if TYPE_CHECKING:
    import xarray as xr  # or store.plain.Results, which answers the same questions

# neighbours statistics: label, and whether the value is a share (printed in %)
KEY_NAMES = {-1: "cls", -2: "reg"}  # the non-patch keys of a followed row (analyses.entropy: -1 class token, -2 a register)
NEIGHBOUR_LABELS = {
    "top_in_window": ("top {top} most similar inside the window", True),
    "top_distance": ("their mean grid distance ({distance})", False),
    "topk_in_window": ("top {k} most similar inside the window", True),
    "positive_cosine": ("cosine of window positives (top {k} of 8)", False),
    "other_cosine": ("cosine of the other window candidates", False),
    "wrapped_positive_share": ("window positives through the wrap", True),
    "contrastive_in_window": ("contrastive positives inside the window", True),
    "contrastive_distance": ("contrastive positives' mean grid distance", False),
    "negative_count_mean": ("contrastive negatives per anchor", False),
    "negative_theta": ("crop's low threshold θ ({negative_quantile:g} quantile)", False),
}

ENTROPY_LABELS = {
    "patch_entropy": ("patch rows: entropy (nats)", False),
    "patch_effective": ("patch rows: mean e^H (tokens)", False),
    "patch_share": ("patch rows: mean e^H / T", True),
    "distance": ("mean attention distance (patches)", False),
    "cls_entropy": ("class token row: entropy (nats)", False),
    "cls_effective": ("class token row: mean e^H", False),
    "cls_share": ("class token row: mean e^H / T", True),
}


def store_label(store: str) -> str:
    """A short column title: ``<checkpoint dir>/<network>.zarr``."""
    parts = str(store).rstrip("/").split("/")
    return "/".join(parts[-2:])


def cell(mean: float, low: float, high: float, share: bool) -> str:
    if not np.isfinite([mean, low, high]).all():  # undefined: no image has a value (the candidates --k 8 leaves out)
        return "–"
    if share:
        return f"{100 * mean:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def summary(ds: xr.Dataset) -> dict[str, dict[str, float]]:
    """``{statistic: {mean, low, high}}`` from a result's summary variables (NaN where undefined,
    which ``write_json`` writes as null)."""
    return {
        str(name): {"mean": float(ds.summary_mean.values[i]), "low": float(ds.summary_low.values[i]), "high": float(ds.summary_high.values[i])}
        for i, name in enumerate(ds.statistic.values)
    }


def summary_table(results: dict[str, xr.Dataset], labels: dict[str, tuple[str, bool]], title: str) -> Table:
    """One row per statistic, one column per store: mean [bootstrap interval]."""
    table = Table(title=title)
    table.add_column("statistic")
    for store in results:
        table.add_column(store_label(store), justify="right", overflow="fold")  # at 80 columns a store's name folds, never cut to "…"
    for row in statistic_rows(results, labels):
        table.add_row(*row)
    return table


def statistic_rows(results: dict[Any, xr.Dataset], labels: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """One row per statistic that some result holds, one cell per result (mean [bootstrap
    interval], – where a result lacks it); labels are filled from the first result's attrs.
    The terminal tables and the report's tables show the same cells."""
    sums = [summary(ds) for ds in results.values()]
    first = next(iter(results.values()))
    return [
        [label.format(**first.attrs), *(cell(**s[name], share=share) if name in s else "–" for s in sums)]
        for name, (label, share) in labels.items()
        if any(name in s for s in sums)
    ]


def neighbours_table(results: dict[str, xr.Dataset]) -> Table:
    first = next(iter(results.values()))
    level = int(round(100 * first.attrs["level"]))
    wrap = "wrap" if first.attrs["wrap"] else "no wrap"
    table = summary_table(results, NEIGHBOUR_LABELS, f"Window neighbours, grid {first.attrs['grid']} ({wrap}); mean over images [{level} % bootstrap]")
    row = ["wrapped candidate links"]
    for ds in results.values():
        row.append(f"{int(ds.wrapped_links)} / {int(ds.links)} ({100 * float(ds.wrapped_share):.1f} %)")
    table.add_row(*row)
    table.add_row("images", *[str(ds.attrs["n_images"]) for ds in results.values()])
    return table


def entropy_table(results: dict[str, xr.Dataset]) -> Table:
    first = next(iter(results.values()))
    level = int(round(100 * first.attrs["level"]))
    blocks = {ds.attrs.get("block") for ds in results.values()}
    last = all(ds.attrs.get("last_block", True) for ds in results.values())  # a record without it read the last block
    which = "Last-block" if last or len(blocks) != 1 or None in blocks else f"Block {blocks.pop()} (0-based)"
    table = summary_table(results, ENTROPY_LABELS, f"{which} attention spread; mean over images [{level} % bootstrap]")
    heads = max(ds.sizes["head"] for ds in results.values())
    for head in range(heads):
        row = [f"head {head}: e^H · share · distance"]
        for ds in results.values():
            if head >= ds.sizes["head"]:
                row.append("–")
                continue
            effective = float(ds.set_patch_effective.values[head])
            share = float(ds.set_patch_share.values[head])
            distance = float(ds.set_distance.values[head])
            row.append(f"{effective:.1f} · {100 * share:.1f} % · {distance:.2f}")
        table.add_row(*row)
    table.add_row("keys per row T", *[str(ds.attrs["n_keys"]) for ds in results.values()])
    table.add_row("images", *[str(ds.attrs["n_images"]) for ds in results.values()])
    return table


def _weights(ds: xr.Dataset, prefix: str, index: tuple) -> str:
    keys = ds[f"{prefix}key"].values[index]
    weights = ds[f"{prefix}weight"].values[index]
    return "  ".join(f"{KEY_NAMES.get(int(k), 'prefix') if k < 0 else int(k)}:{w:.3f}" for k, w in zip(keys, weights))


def detail_tables(store: str, ds: xr.Dataset, image: int) -> list[Table]:
    """The followed patch in one image: each head's e^H and five largest weights; then by block."""
    name = str(ds.image.values[image])
    patch = ds.attrs["patch"]
    table = Table(title=f"{store_label(store)}: patch {patch} of {name}, last block")
    table.add_column("head", justify="right")
    table.add_column("e^H", justify="right")
    table.add_column("five largest weights (key:weight)")
    for head in range(ds.sizes["head"]):
        table.add_row(str(head), f"{float(ds.detail_effective.values[image, head]):.1f}", _weights(ds, "detail_", (image, head)))
    tables = [table]
    if "detail_block_effective" in ds:
        by_block = Table(title=f"{store_label(store)}: patch {patch} of {name} through the blocks (e^H per head)")
        by_block.add_column("block", justify="right")
        for head in range(ds.sizes["head"]):
            by_block.add_column(f"head {head}", justify="right")
        for b, block in enumerate(ds.block.values):
            by_block.add_row(str(int(block)), *[f"{float(v):.1f}" for v in ds.detail_block_effective.values[image, b]])
        tables.append(by_block)
    return tables


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def set_level(ds: xr.Dataset, image: int | None = None) -> dict[str, Any]:
    """JSON-ready numbers of a result: settings, the summary, every set-level array; the detail
    arrays of one ``image`` when given (per-image arrays otherwise stay in the store)."""
    out: dict[str, Any] = {"settings": _plain(dict(ds.attrs)), "summary": summary(ds)}
    arrays = {}
    for name, var in ds.data_vars.items():
        if name.startswith("summary_"):
            continue
        if "image" not in var.dims:
            arrays[name] = {"dims": list(var.dims), "values": _plain(var.values)}
        elif image is not None and name.startswith("detail_"):
            arrays[name] = {"image": str(ds.image.values[image]), "dims": list(var.dims[1:]), "values": _plain(var.values[image])}
    out["arrays"] = arrays
    return out
