"""The Python API: ``probe_toolkit.run(name, source, **keywords)`` runs one registered protocol
and returns its ``Run``, the same call the CLI makes.

    import probe_toolkit as probe
    run = probe.run("decode", "cache/dino-1a2b3c4d/teacher.zarr", preset="tokencut", view="native", panel="voc07")
    run.records[0].path       # <store>/results/decoder/<run id>
    run.report.scores.corloc  # what the command printed

Keywords are split three ways, by name: the protocol's settings (validated by its frozen
dataclass, errors naming the parameter), the placement (``workers``, ``dask_address``, ``shard``,
``backend``, ``device``, ``threads``, or ``placement=Placement(...)``), and the run's inputs
and options (``panel``, ``train``, ``val``, ``unseal``, ``cache_dir``, ``json_path``, ...).
Every record the run saves carries one run id, its settings, inputs and placement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from ..infra.owned import check_output_file
from ..infra.placement import Placement
from ..infra.settings import SettingError
from ..results import records
from .registry import Protocol, get

PLACEMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Placement))


@dataclass
class Run:
    """One run of a protocol: what it was asked, where it ran, what it saved, what it reported."""

    protocol: str
    run_id: str
    settings: Any
    placement: Placement
    report: Any
    records: list[records.Record]


def split(protocol: Protocol, keywords: dict[str, Any]) -> tuple[dict, dict, dict]:
    """(settings, placement, inputs) keywords, by name."""
    fields = {f.name for f in dataclasses.fields(protocol.settings)}
    settings = {k: v for k, v in keywords.items() if k in fields}
    placement = {k: v for k, v in keywords.items() if k in PLACEMENT_FIELDS and k not in fields}
    rest = {k: v for k, v in keywords.items() if k not in settings and k not in placement}
    return settings, placement, rest


def _absolute(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value.absolute())
    if isinstance(value, (list, tuple)):
        return [_absolute(v) for v in value]
    return value


def refuse_unused(protocol: Protocol, placement: Placement, given: dict[str, Any] | None = None) -> None:
    """A placement field the protocol's execution does not honour (``Protocol.placement``) and that
    differs from its default is refused before any work: silently ignored, ``workers=8`` or a
    cluster's address would claim a placement the run never had (and its record would say so)."""
    default = Placement()
    for name in PLACEMENT_FIELDS:
        value = getattr(placement, name)
        if name in protocol.placement or value == getattr(default, name) or (name == "shard" and placement.shard_pair() == (0, 1)):
            continue  # (one shard of one is the whole run)
        if name == "shard":
            origin = "" if name in (given or {}) else ", from torchrun's RANK/WORLD_SIZE"
            spread = " (workers or dask_address spread it)" if "workers" in protocol.placement else ""
            raise SettingError(name, f"{protocol.name} does not run in shards (shard {value}{origin}): each shard would compute and save "
                               "a part as if it were the whole", f"run it once, without shard or torchrun{spread}")
        raise SettingError(name, f"{protocol.name} does not use {name} (given {value!r}): no part of its run reads it, so it would "
                           "be ignored", f"drop {name}")


def refuse_panel_kinds(protocol: Protocol, inputs: dict[str, Any]) -> None:
    """A panel of a kind the protocol does not read (``Reads.panel_kinds``) is refused by name
    before any work, not after a fit, when its labels turn out to be of another sort."""
    kinds = protocol.reads.panel_kinds
    names = [(key, inputs.get(key)) for key in ("panel", "train", "val") if isinstance(inputs.get(key), str)]
    if not kinds or not names:
        return
    from ..labels.panels import get_panel

    for key, name in names:
        kind = get_panel(name, inputs.get("cache_dir")).kind
        if kind not in kinds:
            raise ProbeError(name, f"is a {kind} panel; {protocol.name} reads {' or '.join(kinds)} panels (as {key})",
                             f"pass a {' or '.join(kinds)} panel (probe panel list shows each panel's kind)")


def pair_inputs(inputs: dict[str, Any]) -> None:
    """Inputs that must come from one another are checked as a pair (``store/pairing.py``): a
    checkpoint beside a store (the store keeps the record: same file, same network), masks beside
    the store their metadata names (scores are saved there)."""
    from ..store import pairing

    if isinstance(inputs.get("checkpoint"), (str, Path)) and isinstance(inputs.get("store"), (str, Path)):
        pairing.checkpoint_store(inputs["store"], inputs["checkpoint"], inputs.get("network") or "teacher")
    if isinstance(inputs.get("masks_file"), (str, Path)) and Path(inputs["masks_file"]).is_file():
        from ..commands.decode_scores import bound_meta

        pairing.masks_store(inputs["masks_file"], bound_meta(Path(inputs["masks_file"])))


def current(protocol: Protocol, inputs: dict[str, Any]) -> None:
    """Every store a protocol pairs with a panel's labels (``panel``, ``train``, ``val``; and the
    store a masks file was cut from) still holds the features of the panel's files as they are
    now (``coverage.current_photographs``)."""
    if not protocol.reads.labels or protocol.source == "checkpoint":  # a network run on the files themselves pairs nothing stored
        return
    from ..labels.panels import check_readable
    from .coverage import current_photographs

    for key in ("panel", "val"):  # a sealed panel is refused first: nothing of it, not even its images, is looked at without --unseal
        if isinstance(inputs.get(key), str):
            check_readable(inputs[key], inputs.get("unseal"), inputs.get("cache_dir"))

    stores = [inputs.get("store")] if protocol.source != "stores" else list(inputs.get("stores") or [])
    if isinstance(inputs.get("masks_file"), (str, Path)) and Path(inputs["masks_file"]).is_file():
        from ..commands.decode_scores import bound_meta

        stores = [bound_meta(Path(inputs["masks_file"])).get("store")]
    for store in (s for s in stores if isinstance(s, (str, Path)) and (Path(s) / "zarr.json").is_file()):
        for key in ("panel", "train", "val"):
            if isinstance(inputs.get(key), str):
                current_photographs(store, inputs[key], inputs.get("cache_dir"))


def run(name: str, source: Any = None, *, placement: Placement | None = None, **keywords: Any) -> Run:
    """Run protocol ``name`` on ``source`` (a store, a list of stores, a checkpoint or a masks file)."""
    protocol = get(name)
    given_settings, given_placement, inputs = split(protocol, keywords)
    settings = protocol.settings.build(**given_settings)  # refuses a bad value before any work
    if placement is None:
        placement = Placement.parse(**given_placement)
    elif given_placement:
        raise ProbeError(None, f"{', '.join(given_placement)} given beside placement=", "give either a Placement or its fields")
    refuse_unused(protocol, placement, given_placement)
    first = protocol.source
    if source is not None:
        inputs[first] = [Path(s) for s in source] if first == "stores" and isinstance(source, (list, tuple)) else \
            [Path(source)] if first == "stores" else Path(source) if isinstance(source, (str, Path)) else source
    refuse_panel_kinds(protocol, inputs)
    pair_inputs(inputs)  # a checkpoint and a store, masks and their store: they belong together, before any work
    read = [v for key in ("store", "stores", "checkpoint", "masks_file") for v in (inputs.get(key) if isinstance(inputs.get(key), list) else [inputs.get(key)])
            if isinstance(v, (str, Path))]
    check_output_file(inputs.get("json_path"), "--json", read)  # before any work: never over an input or a user's file
    allow_partial = bool(inputs.get("allow_partial", False))  # kept: a scorer of predictions (probe score) applies it too
    recorded = {k: _absolute(v) for k, v in inputs.items() if not callable(v) and k not in ("quiet", "json_path")}
    if protocol.reads.labels and inputs.get("panel") and inputs.get("store") is not None and protocol.source == "store":
        from .coverage import panel_coverage

        recorded["coverage"] = panel_coverage(inputs["store"], inputs["panel"], inputs.get("cache_dir"), allow_partial,  # before any label read
                                              sibling=protocol.reads.panel_sibling)
    current(protocol, inputs)  # the photographs behind the stored features are the files the labels describe, before any label read
    context = records.RunContext(protocol=name, settings=settings.as_dict(), placement=placement.as_dict(), inputs=recorded,
                                 defaults=protocol.settings().as_dict())
    with records.opened(context):
        report = protocol.execute(settings, placement, **inputs)
    return Run(name, context.run_id, settings, placement, report, saved_by(context.run_id, inputs, report))


def saved_by(run_id: str, inputs: dict[str, Any], report: Any) -> list[records.Record]:
    """The records of this run, looked for in every store it read or wrote."""
    candidates: list[Path] = []
    for key in ("store", "stores"):
        value = inputs.get(key)
        candidates += [Path(v) for v in (value if isinstance(value, list) else [value]) if v is not None]
    for attribute in ("store",):
        value = getattr(report, attribute, None)
        if isinstance(value, (str, Path)):
            candidates.append(Path(value))
    for value in (getattr(report, "results", None) or {}) if isinstance(getattr(report, "results", None), dict) else {}:
        candidates.append(Path(value))
    saved = getattr(report, "saved", None)
    if isinstance(saved, Path) and len(saved.parents) > 2:
        candidates.append(saved.parents[2] if saved.parent.parent.name == "results" else saved.parents[1])
    for outcome in getattr(report, "outcomes", None) or []:
        store = getattr(outcome, "store", None)
        if isinstance(store, (str, Path)):
            candidates.append(Path(store))
    found = []
    for store in dict.fromkeys(c.absolute() for c in candidates):
        found += [r for r in records.every_record(store) if r.run_id == run_id]
    return found
