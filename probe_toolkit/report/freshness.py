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
        return (
            f"the stores were measured on different image sets ({counts}; {common} images in common); "
            "their numbers describe different images and are not compared as equals."
        )
    unknown = [label for label, (h, _, _) in found.items() if h is None]
    if unknown:
        return f"whether the stores used the same images cannot be checked: {', '.join(unknown)} recorded no image list."
    if len({h for h, _, _ in found.values()}) == 1:
        return None
    counts = ", ".join(f"{label}: {n if n is not None else '?'}" for label, (_, _, n) in found.items())
    return f"the stores were measured on different image sets ({counts}); their numbers describe different images and are not compared as equals."


def _from_inputs(store, name: str, run_id: str | None, ds, status: str) -> tuple[int | None, str]:
    """(images used, status) of a record without ``computed_on``, from its ``record.json`` inputs: the panel's
    coverage (how many of the panel's images the store held when it ran), the panel images a network read
    itself (NAVI) or the DAVIS sequences it read."""
    from ..results import records
    from .sources import shown_path

    found = records.find(store, name, run_id) if run_id else None
    inputs = (found.meta.get("inputs") or {}) if found is not None else {}
    coverage = inputs.get("coverage") if isinstance(inputs.get("coverage"), dict) else None
    if coverage and coverage.get("held") is not None:
        return int(coverage["held"]), (
            f"panel {coverage.get('panel', inputs.get('panel', '?'))}: {coverage['held']} of its "
            f"{coverage.get('panel_images', '?')} images, as the run found them (a panel's images: not checked against the store)"
        )
    counts, panels = ds.attrs.get("counts") or {}, ds.attrs.get("panels") or {}
    if isinstance(counts, dict) and isinstance(panels, dict) and counts.get("val") is not None and panels.get("val"):
        train = f"{(panels.get('train') or {}).get('name', '?')} ({counts.get('train', '?')} images) → " if panels.get("train") else ""
        return int(counts["val"]), (
            f"panels {train}{panels['val'].get('name', '?')} ({counts['val']} images), as the run read them (panels' images: not checked against the store)"
        )
    panel = ds.attrs.get("panel")
    if isinstance(panel, dict) and panel.get("name") and isinstance(counts, dict) and isinstance(counts.get("images"), int):
        return counts["images"], (f"panel {panel['name']} ({counts['images']} images), as the run read them (the network ran on the panel's own images, not the store's)")
    if inputs.get("davis"):
        sequences = ds.attrs.get("sequences") or []
        return ds.attrs.get("frames"), f"DAVIS {shown_path(inputs['davis'])}: {len(sequences)} sequences (frames, not the store's images)"
    return None, status


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
            made = ds.attrs.get("record") if isinstance(ds.attrs.get("record"), dict) else {}
            status = "no record of its images" if not record else (f"STALE: {why}" if why else "current")
            images = record.get("images")
            if not record or record.get("scope") == "panel-store":  # what it read is in the record's inputs (probe.run writes them)
                images, status = _from_inputs(store.path, name, made.get("run_id"), ds, status)
            if why:
                stale.append(f"{store.label} {name}")
            rows.append(
                [
                    store.label,
                    name,
                    made.get("run_id", "before records"),
                    made.get("toolkit_version") or "?",
                    "?" if images is None else str(images),
                    f"{now['done']} of {now['total']}",
                    status,
                ]
            )
            settings.setdefault(name, {})[store.label] = made.get("settings")
            ids = {str(i) for i in ds["image"].values} if "image" in ds.coords else None
            by_result.setdefault(name, {})[store.label] = (record.get("images_sha256"), ids, images)
    if not rows:
        section.missing("No saved results yet.")
        return section
    section.blocks.append(
        Table(
            ["store", "result", "run", "probe", "images used", "store done now", "status"],
            rows,
            "Each store's latest record of each result (probe results STORE lists them all) against its store now; "
            "a stale result is shown in its section as it was computed.",
        )
    )
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
            section.blocks.append(
                Note(
                    f"{name}: the stores' records differ in {', '.join(differ)}; their numbers come from different settings "
                    "and are not compared as equals (rerun with the same settings, or pick records with --run)."
                )
            )
    return section
