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
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analyses.decoder_blocks import check_backend, default_workers
from ..analyses.decoder_settings import Settings
from ..infra import provenance
from ..infra.atomic import write_json
from ..infra.errors import ProbeError
from ..infra.placement import Placement, sharded
from ..infra.runner import placed
from ..labels import saliency
from ..labels.masks import decoder_dataset
from ..labels.panels import LabelRead, check_readable, read_labels
from ..labels.scoring import Scores, evaluate
from ..results import records
from ..store import cache
from ..store.completion import computed_on
from .decode_keys import BlockResults, colour_task, decode_keys, decode_with_colour, open_keys
from .decode_scores import check_masks_out, file_sha256, masks_meta_path, refine_bilateral, save_saliency, save_scores
from .decode_shards import decode_shard
from .decode_views import check_view, panel_kind, view_check

SETTINGS_FILE = "decoder-settings.json"


# ----------------------------------------------------------------------------------------------
# settings


def settings_path(cache_dir: str | Path | None) -> Path:
    return cache.cache_root(cache_dir) / SETTINGS_FILE


def _settings_file(path: Path) -> Settings:
    """The settings a ``probe decode-sweep`` wrote (``settings`` and ``chosen_by``), or one line
    naming the file: another summary (an entropy ``--json``), or a value no preset takes (the
    file's, not a flag's: ``--preset`` was not given)."""
    fix = "pass the file `probe decode-sweep --settings-out` wrote, or drop --settings"
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise ProbeError(path, f"is not a decoder settings file (not JSON: {str(error)[:60]})", fix) from None
    stored = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(stored, dict) or not isinstance(data.get("chosen_by"), dict):
        kind = f"a {data['analysis']} summary" if isinstance(data, dict) and isinstance(data.get("analysis"), str) else "another file"
        raise ProbeError(path, f"is not a decoder settings file (no settings chosen by a sweep: it is {kind})", fix)
    try:
        return Settings(**{k: v for k, v in stored.items() if k in Settings.__dataclass_fields__})
    except (ProbeError, ValueError, TypeError) as error:
        problem = error.problem if isinstance(error, ProbeError) else str(error)
        raise ProbeError(path, f"holds settings no decoder takes ({problem})", fix) from None


def resolve_settings(
    *, preset: str | None, overrides: dict[str, Any], settings_file: Path | None, cache_dir: str | Path | None
) -> tuple[Settings, str]:
    """(settings, where they came from): options > settings file > preset defaults."""
    if preset is None:
        path = settings_file or settings_path(cache_dir)
        if settings_file is not None and not path.is_file():
            raise ProbeError(path, "does not exist", "run `probe decode-sweep` or drop --settings")
        if path.is_file():
            base = _settings_file(path)
            changed = {k: v for k, v in overrides.items() if v is not None}
            return base.with_(**changed), f"{path}" + (f" + {sorted(changed)}" if changed else "")
        preset = "centred"
    return Settings.from_preset(preset, **overrides), f"preset {preset}"


# ----------------------------------------------------------------------------------------------
# decoding a store


@dataclass
class DecodeReport:
    store: Path
    settings: Settings
    settings_source: str
    n_images: int
    n_masks: int
    degenerate: int
    dense_solves: int
    seconds: float
    masks_file: Path | None
    scores: Scores | None = None
    ledger_entry: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out = {
            "store": str(self.store),
            "settings": self.settings.as_dict(),
            "settings_source": self.settings_source,
            "images": self.n_images,
            "masks": self.n_masks,
            "degenerate": self.degenerate,
            "dense_solves": self.dense_solves,
            "seconds": round(self.seconds, 3),
            "masks_file": str(self.masks_file) if self.masks_file else None,
            **self.extra,
        }
        if self.scores is not None:
            out.update(scores=self.scores.table(), counts=self.scores.counts, ledger_entry=self.ledger_entry)
        out.update(self.extra)
        return out


def run_decode(
    store: str | Path,
    settings: Settings,
    *,
    settings_source: str = "",
    size: int | str = 480,
    out: str | Path | None = None,
    panel: str | None = None,
    unseal: str | None = None,
    cache_dir: str | Path | None = None,
    on_start: Callable[[int], Callable[[], None]] | None = None,
    refine: str | None = None,
    placement: Placement = Placement(workers=1),
    keys: str = "plain",
) -> DecodeReport:
    """Decode a store (label-free), save ``results/decoder`` and the masks JSON; score on a panel.

    ``refine="bilateral"`` scores a saliency panel on TokenCut's bilateral-solver output of each
    first mask (``analyses/bilateral.py``), computed on the panel's photographs. ``placement.workers``:
    local processes (None: every core); ``placement.dask_address``: a dask.distributed cluster; ``placement.shard``:
    ``i/n``, this process's share (``commands.decode_shards``).
    """
    threads, workers, dask_address, backend, device, shard = (placement.threads, placement.workers, placement.dask_address, placement.backend,
                                                               placement.device, placement.shard)
    if refine not in (None, "bilateral"):
        raise ProbeError(None, f"--refine {refine!r} is not bilateral", "use --refine bilateral or leave it out")
    if refine and panel is None:
        raise ProbeError(None, "--refine bilateral refines masks for saliency scores, so it needs --panel", "pass --panel with a saliency panel")
    if panel is not None:  # an unknown or sealed panel is refused before any work, not after the masks are saved
        check_readable(panel, unseal, cache_dir)
    if out is not None:  # the user's file, or the store's own, is never written over
        check_masks_out(out, store)
    check_backend(backend, device)
    workers = default_workers(workers, device, dask_address)
    check_view(size)
    src = open_keys(store, size, keys)
    tick = on_start(len(src.image_ids)) if on_start else None
    t0 = time.perf_counter()
    encoded = BlockResults(src, settings)
    from contextlib import nullcontext

    from .decode_colour import photographs

    with placed(workers, dask_address) as where, (photographs(src) if settings.color_lambda else nullcontext()) as photos:
        if not sharded(shard):
            if settings.color_lambda:
                decoded = decode_with_colour(src, settings, tick, where=where, photos=photos)
                encoded.add(decoded)
            else:
                decoded = src.with_grids(decode_keys(src.keys, settings, tick, threads, where=where, backend=backend, device=device,
                                                     grids=src.grid_arrays(), each=encoded))
        else:
            task = colour_task(src, settings, photos) if settings.color_lambda else None
            decoded, missing = decode_shard(src, settings, shard, where=where, backend=backend, device=device, threads=threads, on_image=tick, task=task)
            if decoded is None:
                return DecodeReport(store=src.store, settings=settings, settings_source=settings_source, n_images=len(src.image_ids), n_masks=0,
                                    degenerate=0, dense_solves=0, seconds=time.perf_counter() - t0, masks_file=None, extra={"waiting_for_shards": missing})
            encoded.add(decoded)
    seconds = time.perf_counter() - t0
    unit = uuid.uuid4().hex
    records.save(
        src.store,
        "decoder",
        decoder_dataset(decoded, src.image_ids),
        {"manifest": src.manifest, "settings": settings.as_dict(), "settings_source": settings_source, "size": size, "view": src.view, "keys": src.keys_kind,
         "seconds": seconds, "provenance": provenance.stamp(), "unit": unit, "computed_on": computed_on(src.store, src.image_ids),
         "backend": backend},
    )
    masks_file = Path(out) if out else records.results_path(src.store, "decoder-masks.json")
    report = DecodeReport(
        store=src.store, settings=settings, settings_source=settings_source, n_images=len(src.image_ids),
        n_masks=int(decoded.n_masks.sum()), degenerate=int(decoded.degenerate.sum()),
        dense_solves=int(decoded.dense_solves.sum()), seconds=seconds, masks_file=masks_file,
        extra={**view_check(settings.preset, src.view, src.manifest, panel_kind(panel, cache_dir)), "keys": src.keys_kind},
    )
    coco_ids = None
    labels: LabelRead | None = None
    if panel is not None:  # the masks exist and are saved before any label is read
        labels = read_labels(panel, purpose="score", checkpoint=src.checkpoint, images=src.image_ids, unseal=unseal, cache=cache_dir)
        coco_ids = labels.image_map
    results = encoded.entries(coco_ids)
    write_json(masks_file, results)
    write_json(masks_meta_path(masks_file), {"store": str(src.store.resolve()), "checkpoint": src.checkpoint, "settings": settings.as_dict(),
                                        "network": src.manifest.get("network"), "image_list_sha256": src.manifest.get("image_list_sha256"),
                                        "panel": panel, "image_id": "panel COCO id" if panel else "store position", "view": src.view,
                                        "keys": src.keys_kind, "unit": unit, "masks_sha256": file_sha256(masks_file),
                                        "toolkit_version": provenance.__version__, "git_revision": provenance.git_revision()})
    if refine and labels is not None and labels.panel.kind != "saliency":
        raise ProbeError(panel, "is not a saliency panel; --refine bilateral applies to saliency scores (TokenCut's + BS)", "drop --refine or pass a saliency panel")
    if labels is not None and labels.panel.kind == "saliency":
        soft = refine_bilateral(labels, results) if refine else None
        report.scores = saliency.score_results(labels.coco, results, soft)
        report.ledger_entry = labels.entry_id
        save_saliency(src.store, report.scores, labels, settings, src.manifest, refine or "", view=src.view)
    elif labels is not None:
        report.scores = evaluate(labels.coco, results)
        report.ledger_entry = labels.entry_id
        save_scores(src.store, report.scores, labels, settings, src.manifest, masks_file, unit=unit)
    return report


# ----------------------------------------------------------------------------------------------
