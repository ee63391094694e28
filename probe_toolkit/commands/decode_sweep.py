"""``probe decode-sweep``: decode every setting of a grid without labels, read the panel once,
score every setting, and write the best one as the settings file ``probe decode`` reads.

Results written into the store: ``sweep_<panel>``, one row per setting: the settings' columns and
every score (setting); attrs ``ledger_entry``, ``best``, ``metric``.
"""

from __future__ import annotations

import itertools
import tomllib
from functools import partial
from pathlib import Path

import numpy as np

from ..analyses.decoder import Decoded
from ..analyses.decoder_blocks import as_decoded, group_arrays, sweep_block
from ..analyses.decoder_settings import SINGLE, Settings
from ..infra import lazy_dask, provenance
from ..infra.errors import ProbeError
from ..infra.owned import write_summary
from ..infra.runner import map_images
from ..infra.settings import SettingError
from ..labels.masks import coco_results
from ..labels.panels import read_labels
from ..labels.scoring import evaluate
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.discovery import SweepSettings
from ..results.sweep_report import SweepReport
from ..store.completion import computed_on
from .decode import settings_path
from .decode_keys import _ticks, open_keys
from .decode_shards import sweep_shard
from .decode_views import check_view

# The default sweep: tokencut and maskcut × 2 centrings × 6 τ × 2 ε × 3 mask counts (144), and lost and dsm × 2 centrings (4):
# 148 settings (tests/test_docs_flags.py checks the count the help states).
DEFAULT_GRID: dict[str, list] = {
    "preset": ["tokencut", "maskcut", "lost", "dsm"],  # the rule; centring is its own axis (lost, dsm: 2 settings each)
    "center": [True, False],
    "tau": [0.0, 0.1, 0.15, 0.2, 0.25, 0.3],
    "eps": [1e-5, 1e-3],
    "masks": [1, 2, 3],
}


def load_grid(path: str | Path | None) -> list[Settings]:
    """The settings of a grid file (TOML lists per axis; a missing axis keeps the centred preset's value)."""
    axes = dict(DEFAULT_GRID)
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ProbeError(path, f"is not a readable TOML grid ({error})", "see DEFAULT_GRID in probe_toolkit/commands/decode_sweep.py") from None
        unknown = set(data) - set(DEFAULT_GRID)
        if unknown:
            raise ProbeError(path, f"has unknown axes {sorted(unknown)}", f"use {', '.join(DEFAULT_GRID)}")
        centred = Settings.from_preset("centred")
        axes = {k: list(data[k]) if k in data else [getattr(centred, k) if k != "preset" else "tokencut"] for k in DEFAULT_GRID}
    out = []
    for preset, center, tau, eps, masks in itertools.product(*(axes[k] for k in DEFAULT_GRID)):
        if Settings.from_preset(str(preset)).rule in SINGLE:  # τ, ε and the mask count do not apply: one setting per centring
            s = Settings.from_preset(str(preset), center=bool(center))
        else:
            s = Settings.from_preset(str(preset), center=bool(center), tau=float(tau), eps=float(eps), masks=int(masks))
        if s not in out:
            out.append(s)
    return out


def _prefix(decoded: Decoded, k: int, settings: Settings) -> Decoded:
    """The first k masks of a loop run for more: the loop is deterministic, so they are equal."""
    n = np.minimum(decoded.n_masks, k)
    sl = slice(0, k)
    return Decoded(
        masks=decoded.masks[:, sl],
        score=decoded.score[:, sl],
        lambda2=decoded.lambda2[:, sl],
        lambda3=decoded.lambda3[:, sl],
        gap=decoded.gap[:, sl],
        ncut=decoded.ncut[:, sl],
        n_masks=n,
        degenerate=decoded.degenerate,
        stop=decoded.stop,
        dense_solves=decoded.dense_solves,
        cuts=decoded.cuts,
        settings=settings,
        fiedler=decoded.fiedler,
        seed=decoded.seed,
        degree=decoded.degree,
        expansion=decoded.expansion,
        grids=decoded.grids,
        patch=decoded.patch,
        view=decoded.view,
    )


def run(inputs: Inputs, settings: SweepSettings, context: RunContext) -> SweepReport:
    """Decode every setting of the grid (label-free), read the panel once, score every setting. A
    shard decodes its share of the images under every setting; the shard that finds every share
    saved scores (the others return ``waiting``)."""
    store, grid, metric, settings_out = inputs.store, settings.grid, settings.metric, settings.settings_out
    panel = context.panel("panel")
    backend, device, threads = context.decoder()
    size = int(settings.view) if settings.view == "480" else settings.view
    settings_list = load_grid(grid)
    from ..infra.owned import check_output_file

    check_output_file(settings_out, "settings_out", [store])  # before any work: never over the store read, nor a user's file
    check_view(size)
    src = open_keys(store, size, settings.keys)
    # one decode per (rule, centring, τ, ε), run for the most masks any setting of the group asks
    groups: dict[tuple, int] = {}
    for s in settings_list:
        key = (s.preset, s.center, s.tau, s.eps)
        groups[key] = max(groups.get(key, 0), s.masks)
    group_settings = [Settings.from_preset(key[0], center=key[1], tau=key[2], eps=key[3], masks=most) for key, most in groups.items()]
    tick = context.task("sweep", len(src.image_ids))
    with context.placed() as where:
        if not context.sharded:
            fn = partial(sweep_block, groups=group_settings, backend=backend, device=device)
            arrays = map_images(fn, {"keys": src.keys, **src.grid_arrays()}, where=where, threads=threads, progress=_ticks(tick))
            per_group = [src.with_grids(as_decoded(group_arrays(arrays, g), s)) for g, s in enumerate(group_settings)]
        else:
            per_group, missing = sweep_shard(src, group_settings, context.shard(), where=where, backend=backend, device=device, threads=threads, on_image=tick)
            if per_group is None:
                return context.finish(SweepReport(table=[], best=None, best_row={}, metric=metric, ledger_entry="", settings_file=None, waiting=missing))
    decoded = dict(zip(groups, per_group))
    # every mask exists before the labels are read, once, for the whole grid
    labels = context.read("panel", read_labels, purpose=f"sweep of {len(settings_list)} decoder settings", checkpoint=src.checkpoint, images=src.image_ids)
    full_results = {key: coco_results(d, src.image_ids, src.heights, src.widths, labels.image_map) for key, d in decoded.items()}
    table = []
    for s in settings_list:
        key = (s.preset, s.center, s.tau, s.eps)
        results = [r for r in full_results[key] if r["mask"] < s.masks]
        scores = evaluate(labels.coco, results)
        d = _prefix(decoded[key], s.masks, s)
        table.append(
            {
                "preset": s.preset,
                "rule": s.rule,
                "center": s.center,
                "tau": s.tau,
                "eps": s.eps,
                "masks": s.masks,
                **scores.table(),
                "degenerate": int(d.degenerate.sum()),
                "mean_masks": float(d.n_masks.mean()),
            }
        )
    values = np.array([row[metric] for row in table], dtype=np.float64)
    if not np.isfinite(values).any():  # e.g. segm AP on a box-only VOC panel: no setting can be chosen by it
        raise SettingError(
            "metric", f"metric {metric} is undefined on panel {panel.name} for every setting (a box-only panel has no mask scores)", "use metric corloc or a bbox metric"
        )
    best_index = int(np.nanargmax(values))  # first of equals: grid order
    best = settings_list[best_index]
    settings_file = Path(settings_out) if settings_out else settings_path(context.cache_dir)
    write_summary(
        settings_file,
        {
            "settings": best.as_dict(),
            "chosen_by": {
                "panel": labels.panel.name,
                "role": labels.panel.role,
                "ledger_entry": labels.entry_id,
                "metric": metric,
                "value": table[best_index][metric],
                "grid_size": len(settings_list),
                "store": str(src.store.resolve()),
                "checkpoint": src.checkpoint,
                "date": provenance.now(),
            },
        },
    )
    columns = list(table[0])
    sweep = lazy_dask.xarray().Dataset(
        {c: ("setting", np.asarray([row[c] for row in table], dtype=object if c in ("preset", "rule") else None)) for c in columns},
        coords={"setting": np.arange(len(table))},
    )
    attrs = {
        "ledger_entry": labels.entry_id,
        "metric": metric,
        "best": best_index,
        "manifest": src.manifest,
        "keys": src.keys_kind,
        "provenance": provenance.stamp(),
        "computed_on": computed_on(src.store, src.image_ids),
    }
    return context.finish(
        SweepReport(table=table, best=best, best_row=table[best_index], metric=metric, ledger_entry=labels.entry_id, settings_file=settings_file),
        Saving(src.store, f"sweep_{labels.panel.name}", sweep, attrs),
    )
