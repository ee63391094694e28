"""The report's "Result freshness" section: which saved results still describe their store, and
which comparisons across stores were measured on different images (``store.completion``)."""

from __future__ import annotations

import json

from ..results.records import incomparable
from ..store.completion import completion, staleness
from .content import Note, Section, Table


def _record(ds) -> dict:
    found = ds.attrs.get("computed_on")
    if isinstance(found, str):  # attrs written as JSON text by older writers
        try:
            found = json.loads(found)
        except ValueError:
            found = None
    return found if isinstance(found, dict) else {}


def freshness(ctx) -> Section:
    section = Section("freshness", "Result freshness")
    rows, stale = [], []
    by_result: dict[str, dict[str, tuple[str | None, set[str] | None, int | None]]] = {}
    settings: dict[str, dict[str, dict | None]] = {}
    for store in ctx.stores:
        now = completion(store.path)
        for name, ds in sorted(store.results.items()):
            record = _record(ds)
            why = staleness(store.path, record)
            status = "no record of its images" if not record else (f"STALE: {why}" if why else "current")
            if why:
                stale.append(f"{store.label} {name}")
            images = record.get("images")
            made = ds.attrs.get("record") if isinstance(ds.attrs.get("record"), dict) else {}
            rows.append([store.label, name, made.get("run_id", "before records"), "?" if images is None else str(images), f"{now['done']} of {now['total']}", status])
            settings.setdefault(name, {})[store.label] = made.get("settings")
            ids = {str(i) for i in ds["image"].values} if "image" in ds.coords else None
            by_result.setdefault(name, {})[store.label] = (record.get("images_sha256"), ids, images)
    if not rows:
        section.missing("No saved results yet.")
        return section
    section.blocks.append(Table(["store", "result", "run", "images used", "store done now", "status"], rows,
                                "Each store's latest record of each result (probe results STORE lists them all) against its store now; "
                                "a stale result is shown in its section as it was computed."))
    if stale:
        section.blocks.append(Note(f"Stale: {', '.join(stale)}. Rerun those analyses on the finished store before comparing their numbers."))
    for name, found in sorted(by_result.items()):
        hashes = {h for h, _, _ in found.values()}
        if len(found) > 1 and (len(hashes) > 1 or None in hashes):
            sets = [ids for _, ids, _ in found.values() if ids is not None]
            common = f"; {len(set.intersection(*sets))} images in common" if len(sets) == len(found) else ""
            counts = ", ".join(f"{label}: {n if n is not None else '?'}" for label, (_, _, n) in found.items())
            section.blocks.append(Note(f"{name}: the stores were measured on different image sets ({counts}{common}); "
                                       "their numbers describe different images and are not compared as equals."))
    for name, found in sorted(settings.items()):
        differ = incomparable(found)
        if differ:
            section.blocks.append(Note(f"{name}: the stores' records differ in {', '.join(differ)}; their numbers come from different settings "
                                       "and are not compared as equals (rerun with the same settings, or pick records with --run)."))
    return section
