"""The settings that moved a number: those of a record that differ from its protocol's defaults.

One function for every table, figure caption and CSV row (the report's captions, ``probe
results``, typed tables, ``probe table``): a setting that changes the number (DINOv3's ``keys
rope`` against ``plain`` moves CorLoc from 12.5 to 50.0) is shown wherever the number is, and no
table writes its own settings text, so a setting added to a protocol is shown without an edit.

A record says what it was run with in ``record.json`` (``settings``, and ``selection``: the block
and facet read); a result Dataset carries the same in ``attrs["record"]``, with the protocol's
default settings at the time of the run (``defaults``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

_UNSET = object()


def _meta(found: Any) -> Mapping[str, Any]:
    """record.json's dict from a ``records.Record``, a result Dataset or the dict itself."""
    meta = getattr(found, "meta", None)
    if isinstance(meta, Mapping):
        return meta
    attrs = getattr(found, "attrs", None)
    if isinstance(attrs, Mapping):
        record = attrs.get("record")
        return record if isinstance(record, Mapping) else {}
    return found if isinstance(found, Mapping) else {}


# protocol name -> its settings dataclass; ``protocols/registry.register`` fills it (this stage
# comes before protocols, so it is told rather than asking), for records written before they
# carried their defaults
SETTINGS: dict[str, Any] = {}


def defaults(found: Any) -> dict[str, Any]:
    """The defaults a record was run against: those it recorded (``defaults`` in record.json, so
    a default changed later does not change what an old record says), else its protocol's now."""
    meta = _meta(found)
    if isinstance(meta.get("defaults"), Mapping):
        return dict(meta["defaults"])
    cls = SETTINGS.get(str(meta.get("protocol") or ""))
    try:
        return cls().as_dict() if cls is not None else {}
    except (TypeError, ValueError):  # settings without defaults
        return {}


def settings(found: Any) -> dict[str, Any]:
    """Every setting a record ran with: what it recorded, over its defaults (``defaults``) for a
    setting it did not record (a record older than the setting), so a report reads the run's value
    and never writes a default of its own."""
    recorded = _meta(found).get("settings")
    return {**defaults(found), **(dict(recorded) if isinstance(recorded, Mapping) else {})}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def differing(found: Any) -> dict[str, Any]:
    """The record's settings that differ from its protocol's defaults, by name (spelled as declared; a setting
    declared ``moves_numbers=False``, which only picks what a figure shows, left out), then the block and facet read
    when the record names them (a record of one block of many)."""
    meta = _meta(found)
    settings = meta.get("settings")
    out: dict[str, Any] = {}
    if isinstance(settings, Mapping):
        base = defaults(meta)
        declared = _declared(str(meta.get("protocol") or ""))
        for name in sorted({*base, *settings}):  # record.json keeps its keys sorted: one order, read back or not
            value = settings.get(name, _UNSET)
            said = declared.get(name)
            if value is not _UNSET and not _same(value, base.get(name, _UNSET)) and (said is None or said.moves_numbers):
                out[name] = _spelled(value, said.spell) if said is not None and said.spell is not None else value
    selection = meta.get("selection")
    if isinstance(selection, Mapping):
        if selection.get("block") is not None and selection["block"] != _last_block(meta):
            out["block"] = selection["block"]
        if selection.get("facet") is not None:
            out["facet"] = selection["facet"]
    return out


def _spelled(value: Any, spell: Any) -> Any:
    """A value as its declaration spells it (Hummingbird's memory ``1000,full``, not ``1000,None``)."""
    if isinstance(value, str):  # already text (a record of another writer): as recorded
        return value
    try:
        return spell(tuple(value) if isinstance(value, list) else value)
    except (TypeError, ValueError, AttributeError):
        return value


def _declared(protocol: str) -> dict[str, Any]:
    """Each setting's declaration (``infra.settings.Declared``) of a protocol's settings class, by name."""
    import dataclasses

    from ..infra.settings import declared

    cls = SETTINGS.get(protocol)
    if cls is None or not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: d for f in dataclasses.fields(cls) if (d := declared(f)) is not None}


def _last_block(meta: Mapping[str, Any]) -> int | None:
    """The default block (the store's last) of the store a record was read from, when known."""
    if isinstance(meta.get("selection"), Mapping) and isinstance(meta["selection"].get("last_block"), int):
        return meta["selection"]["last_block"]
    inputs = meta.get("inputs")
    store = inputs.get("store") if isinstance(inputs, Mapping) else None
    return _store_depth(str(store)) - 1 if isinstance(store, str) and _store_depth(str(store)) else None


@lru_cache(maxsize=64)
def _store_depth(store: str) -> int | None:
    from pathlib import Path

    try:
        depth = json.loads((Path(store) / "zarr.json").read_text())["attributes"]["manifest"]["arch"]["depth"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return depth if isinstance(depth, int) else None


def value_text(value: Any) -> str:
    """A setting's value as a table shows it: lists comma-joined, floats as typed (``%g``)."""
    if isinstance(value, (list, tuple)):
        return ",".join(value_text(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def differing_text(found: Any, separator: str = ", ") -> str:
    """``"keys=rope, view=native"``: the settings that differ, as text (``""`` when none does)."""
    return separator.join(f"{name}={value_text(value)}" for name, value in differing(found).items())


def columns(found: Iterable[Any]) -> list[str]:
    """The settings that differ in any of several records, in first-seen order: a CSV's columns
    (each row then gives ``row(record, columns)``)."""
    seen: dict[str, None] = {}
    for one in found:
        seen.update(dict.fromkeys(differing(one)))
    return list(seen)


def row(found: Any, names: Iterable[str]) -> list[str]:
    """One record's values under ``columns(...)``: the default's value where it did not differ."""
    moved = differing(found)
    base = defaults(found)
    return [value_text(moved[n]) if n in moved else value_text(base.get(n, "")) for n in names]
