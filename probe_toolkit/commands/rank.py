"""``probe rank STORE...``: RankMe of a block's class and patch tokens (and LiDAR where the store
holds augmented views of its images), saved as ``results/rank`` in each store.

Reads no panel and no label. Each store is read once, a chunk of images at a time: the running
QR of every row (``analyses.rank.Spectrum``, float64) and, for the sample-size curve, those of
nested seeded subsets of the rows. Result ``results/rank``:

    rankme            (tokens)             RankMe of every row (tokens: class, patch)
    rows              (tokens)             rows measured (images; images × patches)
    singular_values   (tokens, component)  descending (zeros past min(rows, width))
    curve             (tokens, n)          RankMe of the first n rows of a seeded permutation (NaN where n exceeds the rows)
    lidar             ()                   LiDAR of the class tokens over the hbird512 views (NaN without them)
    attrs: view, block, width, eps, form, seed, lidar_views, lidar_note, and the provenance (command, versions, computed_on: the images read)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analyses import rank
from ..infra.runner import task_threads
from ..protocols.context import Inputs, RunContext, Saving
from ..results.rank_report import RESULT, RankReport, StoreRank
from ..store import cache, hbird_views, views
from . import token_rows
from .runs import result_provenance


def measure(ds, kinds: tuple[str, ...], view: str, block: int | None, sizes: tuple[int, ...], seed: int, progress=None) -> dict:
    """Every row's spectrum and the curve's subsets' of each kind of tokens, one pass over the store."""
    out = {}
    for kind in kinds:
        array = token_rows.read(ds, kind, view, block)
        width = int(array.shape[-1])
        per_image = 1 if kind == "class" else int(array.shape[1])
        total = int(array.shape[0]) * per_image
        subsets = rank.sample_rows(total, sizes, seed)
        whole, grams = rank.Spectrum(width), {n: rank.Spectrum(width) for n in subsets}
        for a, b, values in token_rows.image_chunks(array):
            z = token_rows.rows_of(values)
            token_rows.check_finite(ds.attrs.get("store"), array.name, z)
            whole.add(z)
            for n, rows in subsets.items():
                mine = rows[(rows >= a * per_image) & (rows < b * per_image)] - a * per_image
                if len(mine):
                    grams[n].add(z[mine])
            if progress:
                progress(b - a)
        out[kind] = (whole, grams)
    return out


def lidar_views(ds, block: int | None = None) -> tuple[tuple[str, ...], str]:
    """The Hummingbird views of the same images the store holds at one size (the query view and its
    augmented ones; 512 px first) at ``block`` (None: the run's, ``cache.holds``), and why not."""
    from ..store import layout

    named = [layout.parse(str(name)) for name in ds]
    sizes = sorted({views.view(a.view).size for a in named if a.kind == "cls_tokens" and a.view.startswith("hbird")}, key=lambda s: s != 512)
    for size in sizes:
        held = tuple(v for v in views.hbird_views(size) if cache.holds(ds, f"cls_tokens_{v}", block))
        if held and held[0] == views.hbird_views(size)[0] and len(held) >= 2:
            break
    else:
        wanted = ",".join(hbird_views.VIEWS)
        other = block is not None and block != token_rows.last_block(ds)  # the last block is every store's: no flag adds it
        fix = cache.extract_into(ds, wanted, extra=["--blocks", str(block)] if other else [])
        at = f" at block {block}" if other else ""
        return (), f"LiDAR needs several views of each image; the store holds no Hummingbird view with its augmented views{at}: {fix}"
    order = {cache.view_facts(ds.attrs.get("manifest") or {}, v).get("augmentation", "8-bit crop jittered (before 2026-12)") for v in held[1:]}
    return held, f"{len(held)} views of each image: {', '.join(held)}, augmented as {'; '.join(sorted(order))} (RADIO: 1 + 99 RandAugment views)"


def measure_lidar(ds, held: tuple[str, ...], block: int | None) -> float:
    arrays = [token_rows.read(ds, "class", v, block) for v in held]
    views = rank.Views(int(arrays[0].shape[-1]))
    for a, b, _ in token_rows.image_chunks(arrays[0]):
        stacked = np.stack([np.asarray(x.isel(image=slice(a, b)).values, np.float32) for x in arrays], axis=1)
        token_rows.check_finite(ds.attrs.get("store"), "cls_tokens_hbird512*", stacked)
        views.add(stacked)
    return views.lidar()


def run(inputs: Inputs, settings, context: RunContext) -> RankReport:
    """RankMe (and LiDAR) of each store's tokens at ``settings.view`` and the context's block; one record per store."""
    kinds = tuple(settings.tokens)
    view = views.canonical(settings.view)
    opened = {}
    for store in dict.fromkeys(Path(s) for s in inputs.stores):  # every store checked before any is measured
        ds = cache.open_store(store, allow_partial=settings.partial, arrays=[token_rows.array_name(k, view) for k in kinds], plain=True)
        for kind in kinds:
            token_rows.read(ds, kind, view, context.block)
        opened[store] = ds
    report, saving = RankReport(view), []
    for store, ds in opened.items():
        with task_threads(1):  # one BLAS thread: the same bits on any machine (and no spinning threads on a busy one)
            measured = measure(ds, kinds, view, context.block, tuple(settings.sizes), settings.seed, context.task(str(store), ds.sizes.get("image", 0)))
            held, note = lidar_views(ds, context.block) if settings.lidar and "class" in kinds else ((), "not asked" if not settings.lidar else "needs class tokens")
            lidar = measure_lidar(ds, held, context.block) if held else float("nan")
        block = token_rows.block_of(token_rows.read(ds, kinds[0], view, context.block), ds)
        found, data, attrs = result(store, ds, measured, lidar, held, note, settings, view, block, context.command)
        report.stores.append(found)
        saving.append(Saving(store, RESULT, data, attrs))
    return context.finish(report, *saving)


def result(store: Path, ds, measured: dict, lidar: float, held: tuple[str, ...], note: str, settings, view: str, block: int, command: str):
    """(the store's row of the report, the record's dataset, its attributes)."""
    import xarray as xr

    kinds = list(measured)
    width = measured[kinds[0]][0].width
    sizes = [int(n) for n in settings.sizes]
    values = {k: measured[k][0].singular_values() for k in kinds}
    curve = {k: {n: g.rankme() for n, g in sorted(measured[k][1].items())} for k in kinds}
    data = xr.Dataset(
        {
            "rankme": ("tokens", [measured[k][0].rankme() for k in kinds]),
            "rankme_radio": ("tokens", [measured[k][0].rankme(form="radio") for k in kinds]),
            "rows": ("tokens", np.asarray([measured[k][0].rows for k in kinds], np.int64)),
            "singular_values": (("tokens", "component"), np.stack([np.pad(values[k], (0, width - len(values[k]))) for k in kinds])),
            "curve": (("tokens", "n"), np.asarray([[curve[k].get(n, np.nan) for n in sizes] for k in kinds], np.float64)),
            "lidar": ((), lidar),
        },
        coords={"tokens": kinds, "n": sizes, "component": np.arange(width)},
    )
    attrs = {
        "view": view,
        "block": int(block),
        "width": int(width),
        "eps": rank.EPS,
        "form": "garrido",
        "seed": int(settings.seed),
        "lidar_views": list(held),
        "lidar_note": note,
        "lidar_delta": rank.DELTA,
        "source": "Garrido et al. 2023 Eq. 1; NVlabs/RADIO examples/ssl_metrics.py (calc_rank_me, calc_lidar)",
        **result_provenance(ds, command),
    }  # computed_on at the top: the report checks the record against the store now
    found = StoreRank(
        store, int(block), {k: float(data.rankme.sel(tokens=k)) for k in kinds}, {k: int(measured[k][0].rows) for k in kinds}, curve, lidar, note, int(width)
    )
    return found, data, attrs
