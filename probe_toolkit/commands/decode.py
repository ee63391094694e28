"""The decode pipeline behind ``probe decode``: read the store, decode without labels, write
masks, and only then read a panel's labels through the ledger (``decode_scores``). The store
side is ``decode_keys``, the published views ``decode_views``, the sweep ``decode_sweep``.

Results written into the store (``records.save``):

- ``decoder``: the patch masks and their numbers, and each image's first Fiedler vector and
  seed (``masks.decoder_dataset``), attrs ``manifest``,
  ``settings``, ``settings_source``, ``size``, ``seconds``, ``provenance``.
- ``scores_<panel>``: ``segm``/``bbox`` (metric), ``corloc``, ``mean_best_iou``, ``corloc_hit`` and
  ``first_box_iou`` (image), ``best_iou`` and ``object_image`` (object); attrs ``ledger_entry``,
  ``panel``, ``role``, ``settings``, ``manifest``, ``counts``.

Settings resolution for ``probe decode``: options given on the command line, over the settings
file (``--settings``, else ``<cache>/decoder-settings.json`` written by the sweep, unless
``--preset`` is given), over the preset's defaults.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..analyses.decoder_settings import Settings
from ..infra import provenance
from ..infra.atomic import write_json
from ..infra.errors import ProbeError
from ..infra.settings import SettingError
from ..labels import saliency
from ..labels.masks import decoder_dataset
from ..labels.panels import LabelRead, read_labels
from ..labels.scoring import evaluate
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.discovery import DecodeSettings
from ..results import records
from ..results.decode_report import DecodeReport
from ..store import cache
from ..store.completion import computed_on
from .decode_keys import BlockResults, SavedRows, colour_task, decode_keys, decode_with_colour, open_keys
from .decode_scores import check_masks_out, file_sha256, masks_meta_path, refine_bilateral, saliency_record, scores_record
from .decode_shards import decode_shard
from .decode_views import check_view, view_check

SETTINGS_FILE = "decoder-settings.json"


# ----------------------------------------------------------------------------------------------
# settings


def settings_path(cache_dir: str | Path | None) -> Path:
    return cache.cache_root(cache_dir) / SETTINGS_FILE


def _settings_file(path: Path) -> Settings:
    """The settings a ``probe decode-sweep`` wrote (``settings`` and ``chosen_by``), or one line
    naming the file: another summary (an entropy ``--json``), or a value no preset takes (the
    file's, not a flag's: ``--preset`` was not given)."""
    fix = "pass the file `probe decode-sweep --settings-out` wrote, or drop settings_file"
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise SettingError("settings_file", f"is not a decoder settings file (not JSON: {str(error)[:60]})", fix, path) from None
    stored = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(stored, dict) or not isinstance(data.get("chosen_by"), dict):
        kind = f"a {data['analysis']} summary" if isinstance(data, dict) and isinstance(data.get("analysis"), str) else "another file"
        raise SettingError("settings_file", f"is not a decoder settings file (no settings chosen by a sweep: it is {kind})", fix, path)
    try:
        return Settings(**{k: v for k, v in stored.items() if k in Settings.__dataclass_fields__})
    except (ProbeError, ValueError, TypeError) as error:
        problem = error.problem if isinstance(error, ProbeError) else str(error)
        raise SettingError("settings_file", f"holds settings no decoder takes ({problem})", fix, path) from None


def resolve_settings(*, preset: str | None, overrides: dict[str, Any], settings_file: Path | None, cache_dir: str | Path | None) -> tuple[Settings, str]:
    """(settings, where they came from): options > settings file > preset defaults."""
    if preset is None:
        path = settings_file or settings_path(cache_dir)
        if settings_file is not None and not path.is_file():
            raise SettingError("settings_file", "does not exist", "run `probe decode-sweep`, or drop settings_file", path)
        if path.is_file():
            base = _settings_file(path)
            changed = {k: v for k, v in overrides.items() if v is not None}
            return base.with_(**changed), f"{path}" + (f" + {sorted(changed)}" if changed else "")
        preset = "centred"
    return Settings.from_preset(preset, **overrides), f"preset {preset}"


# ----------------------------------------------------------------------------------------------
# decoding a store


def run(inputs: Inputs, settings: DecodeSettings, context: RunContext) -> DecodeReport:
    """Decode a store (label-free), save ``results/decoder`` and the masks JSON; score on a panel.

    ``refine="bilateral"`` scores a saliency panel on TokenCut's bilateral-solver output of each
    first mask (``analyses/bilateral.py``), computed on the panel's photographs. The images run
    where the context places them (local processes, a dask.distributed cluster, or this process's
    shard of them: ``commands.decode_shards``).
    """
    store, panel, out, refine = inputs.store, inputs.panel, inputs.out, settings.refine
    chosen, source = resolve_settings(preset=settings.preset, overrides=settings.overrides(), settings_file=settings.settings_file, cache_dir=context.cache_dir)
    if refine and panel is None:
        raise SettingError("refine", "refine bilateral refines masks for saliency scores, so it needs panel", "pass a saliency panel", others=("panel",))
    if out is not None:  # the user's file, or the store's own, is never written over
        check_masks_out(out, store)
    report = decode_store(store, chosen, source, settings.view, settings.keys, context, scored=panel is not None)
    if report.masks_file is None:  # a shard done before the others
        return context.finish(report)
    return context.finish(report, *score_masks(report, panel, out, refine, context))


def decode_store(store: Path, settings: Settings, settings_source: str, view: str, keys: str, context: RunContext, scored: bool = True) -> DecodeReport:
    """The masks of every image of the store (label-free), as the report's ``decoded`` and ``encoded``;
    ``scored`` False: no panel will score them, so ``encoded`` keeps the masks JSON's text only."""
    backend, device, threads = context.decoder()
    size = int(view) if view == "480" else view
    check_view(size)
    src = open_keys(store, size, keys)
    tick = context.task("decode", len(src.image_ids))
    t0 = time.perf_counter()
    encoded = BlockResults(src, settings, as_text=not scored)
    from contextlib import nullcontext

    from .decode_colour import photographs

    rows: SavedRows | None = None
    folder = rows_folder(src.store)
    made = [p for p in (folder.parent, folder.parent.parent) if not p.exists()]  # results/decoder/ of a first record: this run's until saved
    try:
        with context.placed() as where, photographs(src) if settings.color_lambda else nullcontext() as photos:
            if not context.sharded:
                if settings.color_lambda:
                    decoded = decode_with_colour(src, settings, tick, where=where, photos=photos)
                    encoded.add(decoded)
                else:  # each block's arrays written as it comes (SavedRows): no image's arrays are kept
                    rows = SavedRows(src, settings, folder, also=encoded)
                    decode_keys(src.keys, settings, tick, threads, where=where, backend=backend, device=device, grids=src.grid_arrays(), each=rows, keep=False)
            else:
                task = colour_task(src, settings, photos) if settings.color_lambda else None
                decoded, missing = decode_shard(src, settings, context.shard(), where=where, backend=backend, device=device, threads=threads, on_image=tick, task=task)
                if decoded is None:
                    return DecodeReport(
                        store=src.store,
                        settings=settings,
                        settings_source=settings_source,
                        n_images=len(src.image_ids),
                        n_masks=0,
                        degenerate=0,
                        dense_solves=0,
                        seconds=time.perf_counter() - t0,
                        masks_file=None,
                        extra={"waiting_for_shards": missing},
                    )
                encoded.add(decoded)
        seconds = time.perf_counter() - t0
        unit = uuid.uuid4().hex
        if rows is not None:
            counts = (rows.n_masks, rows.degenerate, rows.dense_solves)
            saved = rows.written()
        else:
            counts = (int(decoded.n_masks.sum()), int(decoded.degenerate.sum()), int(decoded.dense_solves.sum()))
            saved = decoder_dataset(decoded, src.image_ids)
        context.save(
            src.store,
            "decoder",
            saved,
            {
                "manifest": src.manifest,
                "settings": settings.as_dict(),
                "settings_source": settings_source,
                "size": size,
                "view": src.view,
                "keys": src.keys_kind,
                "seconds": seconds,
                "provenance": provenance.stamp(),
                "unit": unit,
                "computed_on": computed_on(src.store, src.image_ids),
                "backend": backend,
            },
        )
    finally:  # saved: the folder was moved into the record; stopped: nothing half written stays
        shutil.rmtree(folder, ignore_errors=True)
        for path in made:
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    report = DecodeReport(
        store=src.store,
        settings=settings,
        settings_source=settings_source,
        n_images=len(src.image_ids),
        n_masks=counts[0],
        degenerate=counts[1],
        dense_solves=counts[2],
        seconds=seconds,
        masks_file=records.results_path(src.store, "decoder-masks.json"),
        extra={"settings_source": settings_source, "keys": src.keys_kind},
        source=src,
        encoded=encoded,
        unit=unit,
    )
    return report


def rows_folder(store: Path) -> Path:
    """Where a run writes its decoder arrays block by block before ``records.save`` moves them into
    the record: a temporary name of this process (``infra.litter``: removed by the next run if it is killed)."""
    return records.results_path(store, "decoder") / f".rows.tmp-{os.getpid()}"


def score_masks(report: DecodeReport, panel: str | None, out: Path | None, refine: str | None, context: RunContext) -> list[Saving]:
    """The masks JSON written (every mask exists and is saved before any label is read), then the
    panel's labels read and the masks scored (COCO or saliency): the records to write."""
    src, encoded, settings = report.source, report.encoded, report.settings
    report.masks_file = Path(out) if out else report.masks_file
    report.extra.update(view_check(settings.preset, src.view, src.manifest, context.panel("panel").kind if panel else None))
    labels: LabelRead | None = None
    if panel is not None:
        labels = context.read("panel", read_labels, purpose="score", checkpoint=src.checkpoint, images=src.image_ids)
    if labels is not None:
        results = encoded.entries(labels.image_map)
        write_json(report.masks_file, results)
    else:
        encoded.write(report.masks_file)  # no scores: the entries kept as the file's text
    write_json(
        masks_meta_path(report.masks_file),
        {
            "store": str(src.store.resolve()),
            "checkpoint": src.checkpoint,
            "settings": settings.as_dict(),
            "panel": panel,
            "network": src.manifest.get("network"),
            "image_list_sha256": src.manifest.get("image_list_sha256"),  # the store they pair with (store/pairing)
            "image_id": "panel COCO id" if panel else "store position",
            "view": src.view,
            "keys": src.keys_kind,
            "unit": report.unit,
            "masks_sha256": file_sha256(report.masks_file),
            "toolkit_version": provenance.__version__,
            "git_revision": provenance.git_revision(),
        },
    )
    if labels is None:
        return []
    if refine and labels.panel.kind != "saliency":
        raise SettingError(
            "refine", "is not a saliency panel; refine='bilateral' applies to saliency scores (TokenCut's + BS)", "drop refine, or pass a saliency panel", panel
        )
    report.ledger_entry = labels.entry_id
    if labels.panel.kind == "saliency":
        soft = refine_bilateral(labels, results) if refine else None
        report.scores = saliency.score_results(labels.coco, results, soft)
        return [saliency_record(src.store, report.scores, labels, settings, src.manifest, refine or "", view=src.view)]
    report.scores = evaluate(labels.coco, results)
    return [scores_record(src.store, report.scores, labels, settings, src.manifest, report.masks_file, unit=report.unit)]


# ----------------------------------------------------------------------------------------------
