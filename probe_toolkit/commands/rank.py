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
    attrs: view, block, width, eps, form, seed, lidar_views, lidar_note, provenance
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..analyses import rank
from ..infra.errors import ProbeError
from ..infra.runner import task_threads
from ..results import records
from ..store import cache, hbird_views
from . import token_rows
from .runs import result_provenance

RESULT = "rank"


@dataclass
class StoreRank:
    store: Path
    block: int
    rankme: dict[str, float]
    rows: dict[str, int]
    curve: dict[str, dict[int, float]]
    lidar: float
    lidar_note: str
    width: int
    saved: Path | None = None


@dataclass
class RankReport:
    view: str
    stores: list[StoreRank] = field(default_factory=list)

    @property
    def results(self) -> dict[str, Path]:
        return {str(s.store): s.store for s in self.stores}


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


def lidar_views(ds) -> tuple[tuple[str, ...], str]:
    """The hbird512 views of the same images the store holds (the query view and its augmented ones), and why not."""
    held = tuple(v for v in hbird_views.VIEWS if f"cls_tokens_{v}" in ds)
    if hbird_views.VAL not in held or len(held) < 2:
        views = ",".join(hbird_views.VIEWS)
        return (), f"LiDAR needs several views of each image; the store holds {len(held)} of them: probe extract CKPT --views {views}"
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


def run_rank(stores: list[Path], settings, *, block: int | None = None, json_path: Path | None = None, progress=None,
             command: str = "probe rank") -> RankReport:
    """RankMe (and LiDAR) of each store's tokens at ``settings.view``; one record per store."""
    from ..infra.owned import write_summary

    kinds = tuple(settings.tokens)
    opened = {}
    for store in dict.fromkeys(Path(s) for s in stores):  # every store checked before any is measured
        ds = cache.open_store(store, allow_partial=settings.partial, arrays=[token_rows.array_name(k, settings.view) for k in kinds], plain=True)
        for kind in kinds:
            token_rows.read(ds, kind, settings.view, block)
        opened[store] = ds
    report = RankReport(settings.view)
    for store, ds in opened.items():
        with task_threads(1):  # one BLAS thread: the same bits on any machine (and no spinning threads on a busy one)
            measured = measure(ds, kinds, settings.view, block, tuple(settings.sizes), settings.seed, progress)
            held, note = lidar_views(ds) if settings.lidar and "class" in kinds else ((), "not asked" if not settings.lidar else "needs class tokens")
            lidar = measure_lidar(ds, held, block) if held else float("nan")
        resolved = token_rows.block_of(token_rows.read(ds, kinds[0], settings.view, block), ds)
        report.stores.append(save(store, ds, measured, lidar, held, note, settings, resolved, command))
    if json_path is not None:
        write_summary(json_path, summary(report), indent=1)
    return report


def save(store: Path, ds, measured: dict, lidar: float, held: tuple[str, ...], note: str, settings, block: int, command: str) -> StoreRank:
    import xarray as xr

    kinds = list(measured)
    width = measured[kinds[0]][0].width
    sizes = [int(n) for n in settings.sizes]
    values = {k: measured[k][0].singular_values() for k in kinds}
    curve = {k: {n: g.rankme() for n, g in sorted(measured[k][1].items())} for k in kinds}
    result = xr.Dataset(
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
    attrs = {"view": settings.view, "block": int(block), "width": int(width), "eps": rank.EPS, "form": "garrido",
             "seed": int(settings.seed), "lidar_views": list(held), "lidar_note": note, "lidar_delta": rank.DELTA,
             "source": "Garrido et al. 2023 Eq. 1; NVlabs/RADIO examples/ssl_metrics.py (calc_rank_me, calc_lidar)",
             "provenance": result_provenance(ds, command)}
    saved = records.save(store, RESULT, result, attrs)
    return StoreRank(store, int(block), {k: float(result.rankme.sel(tokens=k)) for k in kinds},
                     {k: int(measured[k][0].rows) for k in kinds}, curve, lidar, note, int(width), saved)


def summary(report: RankReport) -> dict:
    return {"analysis": RESULT, "view": report.view,
            "stores": {str(s.store): {"block": s.block, "rankme": s.rankme, "rows": s.rows, "width": s.width,
                                      "curve": {k: {str(n): v for n, v in c.items()} for k, c in s.curve.items()},
                                      "lidar": None if not np.isfinite(s.lidar) else s.lidar, "lidar_note": s.lidar_note}
                       for s in report.stores}}


def check_view(view: str) -> None:
    if view not in token_rows.token_views():
        raise ProbeError(None, f"view {view!r} has no tokens of one grid for every image", f"pick one of {', '.join(token_rows.token_views())}")
