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


def _compare(found: dict[str, tuple[str | None, set[str] | None, int | None]]) -> str | None:
    """None when the stores' records of one result were measured on the same images, else what
    is known: the image ids themselves decide where every record holds them (their order does
    not matter), the recorded hash of the id list where not; a record without either is said to
    be unchecked, never to differ."""
    sets = {label: ids for label, (_, ids, _) in found.items()}
    if all(ids is not None for ids in sets.values()):
        first = next(iter(sets.values()))
        if all(ids == first for ids in sets.values()):
            return None
        common = len(set.intersection(*sets.values()))
        counts = ", ".join(f"{label}: {len(ids)}" for label, ids in sets.items())
        return (f"the stores were measured on different image sets ({counts}; {common} images in common); "
                "their numbers describe different images and are not compared as equals.")
    unknown = [label for label, (h, _, _) in found.items() if h is None]
    if unknown:
        return f"whether the stores used the same images cannot be checked: {', '.join(unknown)} recorded no image list."
    if len({h for h, _, _ in found.values()}) == 1:
        return None
    counts = ", ".join(f"{label}: {n if n is not None else '?'}" for label, (_, _, n) in found.items())
    return f"the stores were measured on different image sets ({counts}); their numbers describe different images and are not compared as equals."


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
            rows.append([store.label, name, made.get("run_id", "before records"), made.get("toolkit_version") or "?",
                         "?" if images is None else str(images), f"{now['done']} of {now['total']}", status])
            settings.setdefault(name, {})[store.label] = made.get("settings")
            ids = {str(i) for i in ds["image"].values} if "image" in ds.coords else None
            by_result.setdefault(name, {})[store.label] = (record.get("images_sha256"), ids, images)
    if not rows:
        section.missing("No saved results yet.")
        return section
    section.blocks.append(Table(["store", "result", "run", "probe", "images used", "store done now", "status"], rows,
                                "Each store's latest record of each result (probe results STORE lists them all) against its store now; "
                                "a stale result is shown in its section as it was computed."))
    if stale:
        section.blocks.append(Note(f"Stale: {', '.join(stale)}. Rerun those analyses on the finished store before comparing their numbers."))
    same = []
    for name, found in sorted(by_result.items()):
        if len(found) < 2:
            continue
        verdict = _compare(found)
        if verdict is None:
            _, ids, n = next(iter(found.values()))
            same.append(f"{name} ({len(ids) if ids is not None else n} images)")
        else:
            section.blocks.append(Note(f"{name}: {verdict}"))
    if same:
        section.blocks.append(Note(f"Measured on the same images in every store that has them: {', '.join(same)}."))
    for name, found in sorted(settings.items()):
        differ = incomparable(found)
        if differ:
            section.blocks.append(Note(f"{name}: the stores' records differ in {', '.join(differ)}; their numbers come from different settings "
                                       "and are not compared as equals (rerun with the same settings, or pick records with --run)."))
    return section
