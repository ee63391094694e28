"""Scoring decoded masks on a panel (``probe score``, and ``probe decode --panel`` after its masks
are saved): COCO AP, CorLoc and mean best IoU, or TokenCut's saliency scores, saved as
``results/scores_<panel>`` / ``results/saliency_<panel>``; and the binding of a masks file to
the metadata written beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..analyses.decoder_settings import Settings
from ..infra import lazy_dask, provenance
from ..infra.errors import IntegrityError, ProbeError
from ..infra.provenance import file_sha256  # a mebibyte at a time: a masks file grows with the store
from ..infra.settings import SettingError
from ..labels import saliency
from ..labels.panels import LabelRead, read_labels
from ..labels.scoring import METRICS, Scores, evaluate
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.discovery import ScoreSettings
from ..results.score_report import ScoreReport
from ..store import cache
from ..store.completion import computed_on
from ..store.plain import Results
from .decode_views import view_check


def masks_meta_path(masks_file: Path) -> Path:
    return masks_file.with_name(masks_file.name.removesuffix(".json") + ".meta.json")


def check_masks_out(out: str | Path, store: str | Path) -> Path:
    """``decode --out FILE`` before any work: never a file of the store it reads (its own input),
    never a folder, and an existing file only where it is a masks file (its ``.meta.json`` beside
    it, or COCO results left by a killed run): probe replaces only what it wrote."""
    import json

    out = Path(out)
    inside = Path(store).resolve() in out.resolve().parents
    if inside and Path(store).resolve() / "results" not in out.resolve().parents:
        raise SettingError(
            "out", "lies inside the store being decoded (its own input)", "choose an out path outside the store, or give none (the masks go to results/)", out
        )
    for path in (out, masks_meta_path(out)):
        if path.is_dir():
            raise SettingError("out", "is a folder, not a masks file (out)", "give out a .json file path", path)
    if out.exists():
        meta = masks_meta_path(out)
        try:
            ours = meta.is_file() and "masks_sha256" in json.loads(meta.read_text())
            if not ours:
                data = json.loads(out.read_text())
                ours = isinstance(data, list) and all(isinstance(e, dict) and "segmentation" in e and "file_name" in e for e in data)
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise SettingError("out", "exists and is not a masks file probe wrote (out)", "choose another out path, or move the file", out)
    elif masks_meta_path(out).exists():
        raise SettingError("out", "exists beside the out path, where probe writes the masks' metadata", "choose another out path, or move the file", masks_meta_path(out))
    return out


# The decoder's outputs are one unit: ``results/decoder`` and the masks' metadata carry one
# ``unit`` id, and the metadata holds the sha256 of the masks file, written last. A run killed
# between the writes leaves a masks file whose hash its metadata does not hold, which
# ``probe score`` refuses, so masks are never scored under another run's settings.


def bound_meta(masks_file: Path) -> dict[str, Any]:
    """The metadata of a masks file, checked against the file (``{}`` for foreign masks files)."""
    meta_path = masks_meta_path(masks_file)
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as error:
        raise IntegrityError(meta_path, f"is not readable JSON ({error})", "rerun `probe decode` to write the masks again") from None
    if meta.get("masks_sha256") != file_sha256(masks_file):
        raise IntegrityError(
            masks_file,
            f"does not match {meta_path.name} (the two come from different `probe decode` runs, one interrupted)",
            "rerun `probe decode` to write the masks and their settings again",
        )
    return meta


def scores_dataset(scores: Scores, labels: LabelRead) -> Results:
    """Scores as results (dims metric, image, object; ids are store ids where known), written
    without xarray (``store.plain``: the layout a Dataset's ``to_zarr`` gives, read back by xarray)."""
    inverse = {v: k for k, v in labels.image_map.items()}
    files = {i: labels.coco.imgs[i].get("file_name", str(i)) for i in scores.image_ids}
    name = lambda i: inverse.get(i, files.get(i, str(i)))  # noqa: E731
    return Results(
        {
            "segm": ("metric", [scores.segm[m] for m in METRICS]),
            "bbox": ("metric", [scores.bbox[m] for m in METRICS]),
            "corloc": ((), scores.corloc),
            "mean_best_iou": ((), scores.mean_best_iou),
            "corloc_hit": ("image", scores.corloc_hit),
            "first_box_iou": ("image", scores.first_box_iou),
            "coco_image_id": ("image", np.asarray(scores.image_ids, dtype=np.int64)),
            "best_iou": ("object", scores.best_iou),
            "object_image": ("object", np.asarray([name(int(i)) for i in scores.object_images], dtype=object)),
        },
        coords={
            "metric": np.asarray(METRICS, dtype=object),
            "image": np.asarray([name(i) for i in scores.image_ids], dtype=object),
            "object": scores.object_ids,
        },
    )


def scores_record(
    store: Path, scores: Scores, labels: LabelRead, settings: Settings | dict | None, manifest: dict | None, masks_file: Path | None, unit: str | None = None
) -> Saving:
    """``results/scores_<panel>``: COCO AP, CorLoc and mean best IoU of one masks file on one panel."""
    attrs = {
        "unit": unit or "",
        "computed_on": computed_on(store, sorted(labels.image_map), scope="panel"),
        "ledger_entry": labels.entry_id,
        "panel": labels.panel.name,
        "role": labels.panel.role,
        "settings": settings.as_dict() if isinstance(settings, Settings) else (settings or {}),
        "manifest": manifest or {},
        "counts": scores.counts,
        "masks_file": str(masks_file) if masks_file else "",
        "units": "fractions in [0, 1]",
        "provenance": provenance.stamp(),
        **_benchmark_attrs(labels),
    }
    return Saving(store, f"scores_{labels.panel.name}", scores_dataset(scores, labels), attrs)


def _benchmark_attrs(labels: LabelRead) -> dict[str, Any]:
    """Which published benchmark the panel is (report/discovery.py puts the published numbers beside it)."""
    from ..labels.kinds import COCO20K_SIZE, benchmark

    out: dict[str, Any] = {"kind": labels.panel.kind, "benchmark": benchmark(labels.panel), "no_hard": labels.panel.no_hard}
    if labels.panel.kind == "coco20k":
        out["coco20k_images"] = f"{labels.coco.dataset.get('coco20k_found', 0)} of {COCO20K_SIZE}"
    if labels.panel.kind == "saliency":
        out["grey_ground_truth"] = labels.coco.dataset.get("saliency_grey", {"masks": 0, "pixels": 0})  # counted as foreground
    return out


def refine_bilateral(labels: LabelRead, results: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """TokenCut's bilateral-solver output of each image's first mask, on the panel's photograph."""
    from ..analyses.bilateral import refine
    from ..labels.masks import decode_rle
    from ..store.images import load_image

    first: dict[int, dict[str, Any]] = {}
    for r in results:
        if int(r["image_id"]) not in first or r.get("mask", 0) < first[int(r["image_id"])].get("mask", 0):
            first[int(r["image_id"])] = r
    out = {}
    for image_id, r in first.items():
        photo = np.asarray(load_image(labels.panel.images / labels.coco.imgs[image_id]["file_name"]).convert("RGB"))
        out[image_id] = refine(photo, decode_rle(r["segmentation"]))
    return out


def saliency_record(
    store: Path, scores: saliency.SaliencyScores, labels: LabelRead, settings: Settings, manifest: dict | None, refine: str = "", view: str | None = None
) -> Saving:
    """``results/saliency_<panel>``: the headline scores, the Fβ curve and each image's IoU;
    ``view``: the view the masks were cut on, where known (TokenCut's table is native_resized's)."""
    ds = lazy_dask.xarray().Dataset(
        {
            **{k: ((), v) for k, v in scores.table().items()},
            "f_curve": ("threshold", scores.f_curve),
            "image_iou": ("image", scores.per_image_iou),
            "coco_image_id": ("image", np.asarray(scores.image_ids, dtype=np.int64)),
        },
        coords={"threshold": np.arange(saliency.BINS) / saliency.BINS, "image": np.arange(len(scores.image_ids))},
    )
    attrs = {
        "ledger_entry": labels.entry_id,
        "panel": labels.panel.name,
        "role": labels.panel.role,
        "settings": settings.as_dict(),
        "refine": refine,
        "manifest": manifest or {},
        "counts": scores.counts,
        "units": "fractions in [0, 1]",
        "provenance": provenance.stamp(),
        **_benchmark_attrs(labels),
        **({"view": view} if view else {}),
    }
    return Saving(store, f"saliency_{labels.panel.name}", ds, attrs)


def run(inputs: Inputs, settings: ScoreSettings, context: RunContext) -> ScoreReport:
    """Score a masks JSON on a panel; images are matched by the entries' ``file_name``: masks of
    none of the panel's images are refused, and so are masks of only some without ``allow_partial``.
    The scores are saved into the store the masks came from, when it is there."""
    masks_file = inputs.masks_file
    try:
        results = json.loads(masks_file.read_bytes())
    except (OSError, ValueError) as error:
        raise ProbeError(masks_file, f"is not a COCO results JSON ({type(error).__name__}: {str(error)[:80]})", "pass the file `probe decode --out` wrote") from None
    meta = bound_meta(masks_file)
    from ..labels.schema import header_size, result_problems

    images = context.panel("panel").images
    # field by field, and each mask's size against its image's header, before any label is read: a wrong type is one line,
    # not a traceback in the evaluator
    found = result_problems(results, header_size(Path(images)) if images else None)
    if found:
        more = f" ({len(found) - 1} more problems)" if len(found) > 1 else ""
        raise ProbeError(masks_file, f"is not a COCO results JSON probe can score: {found[0]}{more}", "score masks written by `probe decode`")
    names = sorted({r["file_name"] for r in results})
    labels = context.read(
        "panel",
        read_labels,
        purpose="score",
        checkpoint=meta.get("checkpoint"),
        images=names,  # masks of none, or without
        cover="some" if inputs.allow_partial else "all",
        given=f"the masks of {masks_file.name}",
    )  # allow_partial some: refused
    mapped = [dict(r, image_id=labels.image_map[r["file_name"]]) for r in results if r["file_name"] in labels.image_map]
    _same_sizes(mapped, labels.coco, masks_file)
    store = Path(meta["store"]) if meta.get("store") else None
    in_store = store is not None and (store / "zarr.json").is_file()
    if labels.panel.kind == "saliency":
        scores = saliency.score_results(labels.coco, mapped)
        decoder = Settings(**{k: v for k, v in (meta.get("settings") or {}).items() if k in Settings.__dataclass_fields__})
        manifest = cache.manifest(store) if in_store else {}
        warnings = view_check(decoder.preset, meta["view"], manifest, "saliency")["warnings"] if meta.get("view") else []
        saving = [saliency_record(store, scores, labels, decoder, manifest, view=meta.get("view"))] if in_store else []
        return context.finish(ScoreReport(scores, labels.entry_id, warnings), *saving)
    scores = evaluate(labels.coco, mapped)
    saving = [scores_record(store, scores, labels, meta.get("settings"), cache.manifest(store), masks_file, unit=meta.get("unit"))] if in_store else []
    return context.finish(ScoreReport(scores, labels.entry_id), *saving)


def _same_sizes(mapped: list[dict], coco: Any, masks_file: Path) -> None:
    """Each mask is its image's size as the panel records it, and a well-formed compressed RLE (the
    evaluator would compare another mask with the image's objects and print a number): the check
    behind the header check, for images whose file was not found under the name the mask gives."""
    from ..labels.schema import result_mask_problems

    for n, result in enumerate(mapped):
        image = coco.imgs.get(result["image_id"], {})
        if "height" in image and "width" in image:
            found = result_mask_problems(f"result [{n}] ({result['file_name']})", result["segmentation"], image["height"], image["width"])
            if found:
                raise ProbeError(
                    masks_file, f"is not a COCO results JSON probe can score: {found[0]}", "score masks decoded from a store of this panel's images (`probe decode`)"
                )


# ----------------------------------------------------------------------------------------------
# the sweep
