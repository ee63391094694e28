"""The Python API: ``probe_toolkit.run(name, source, **keywords)`` runs one registered protocol
and returns its ``Run``, the same call the CLI makes.

    import probe_toolkit as probe
    run = probe.run("knn", "cache/dino-1a2b3c4d/teacher.zarr", train="imagenet-train", val="imagenet-val")
    run.records[0].path       # <store>/results/knn/<run id>
    run.report.result.top1    # what the command printed

Keywords are the protocol's settings (checked by its settings class: an error names the
parameter), the placement (``workers``, ``dask_address``, ``shard``, ``backend``, ``device``,
``threads``, or ``placement=Placement(...)``), ``progress`` (a ``context.Progress``), and the
inputs the protocol declares (``panel``, ``train``, ``val``, ``unseal``, ``cache_dir``,
``json_path``, ...). Any other keyword is refused with the valid names listed, before any work.

Every refusal that needs no label and no compute comes here, in this order, before the run
begins: settings, placement (fields the protocol does not honour, a device that is absent),
inputs, the panels (their kinds, a sealed one without a reason), the JSON path, the store's
coverage of each panel. Only then does the protocol read a label (``RunContext.read``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from ..infra.owned import check_output_file
from ..infra.placement import Placement
from ..infra.settings import SettingError, spelled
from ..results import records
from . import selection
from .context import Inputs, Progress, Run, RunContext
from .registry import Protocol, get, resolve

__all__ = ["Run", "run", "sweep", "check_blocks", "prepare", "keywords"]

PLACEMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Placement))
SOURCES = ("store", "stores", "checkpoint", "masks_file")


def keywords(protocol: Protocol) -> list[str]:
    """Every keyword ``run`` takes for this protocol (the source included)."""
    settings = [f.name for f in dataclasses.fields(protocol.settings)]
    inputs = [i.name for i in protocol.inputs]
    return list(dict.fromkeys([protocol.source, *settings, *PLACEMENT_FIELDS, "placement", "progress", *inputs]))


def refuse_unknown(protocol: Protocol, given: dict[str, Any]) -> None:
    """A keyword that is not a setting, a placement field, the source or a declared input is
    refused with the valid names: a misspelt ``bot=0`` would otherwise run with the default."""
    known = keywords(protocol)
    unknown = [k for k in given if k not in known]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise SettingError(unknown[0], f"{protocol.name} takes no keyword {', '.join(unknown)}", f"{hint}valid: {', '.join(known)}")


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
    default = Placement(**protocol.placement_defaults)
    for name in PLACEMENT_FIELDS:
        value = getattr(placement, name)
        if name in protocol.placement or value == getattr(default, name) or (name == "shard" and placement.shard_pair() == (0, 1)):
            continue  # (one shard of one is the whole run)
        if name == "shard":
            origin = "" if name in (given or {}) else ", from torchrun's RANK/WORLD_SIZE"
            spread = " (workers or dask_address spread it)" if "workers" in protocol.placement else ""
            raise SettingError(
                name,
                f"{protocol.name} does not run in shards (shard {value}{origin}): each shard would compute and save a part as if it were the whole",
                f"run it once, without shard or torchrun{spread}",
            )
        raise SettingError(name, f"{protocol.name} does not use {name} (given {value!r}): no part of its run reads it, so it would be ignored", f"drop {name}")


def refuse_panel_kinds(protocol: Protocol, inputs: dict[str, Any]) -> None:
    """A panel of a kind the protocol does not read (``Reads.panel_kinds``) is refused by name
    before any work, not after a fit, when its labels turn out to be of another sort."""
    kinds = protocol.reads.panel_kinds
    names = [(key, inputs.get(key)) for key in ("panel", "train", "val") if isinstance(inputs.get(key), str)]
    if not kinds or not names:
        return
    from ..labels.panels import get_panel, list_panels

    for key, name in names:
        kind = get_panel(name, inputs.get("cache_dir")).kind
        if kind not in kinds:
            fitting = sorted(f"{p.name} ({p.kind}, {p.role})" for p in list_panels(inputs.get("cache_dir")) if p.kind in kinds)
            raise ProbeError(
                name,
                f"is a {kind} panel; {protocol.name} reads {' or '.join(kinds)} panels (as {key})",
                f"pass one: registered, {', '.join(fitting)}"
                if fitting
                else f"register a panel of kind {' or '.join(kinds)} with probe panel add (none is registered; `probe panel list` shows each panel's kind)",
            )


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


def _source(protocol: Protocol, source: Any) -> Any:
    first = protocol.source
    if first == "stores":
        return [Path(s) for s in source] if isinstance(source, (list, tuple)) else [Path(source)]
    return Path(source) if isinstance(source, (str, Path)) else source


def _typed(protocol: Protocol, given: dict[str, Any]) -> Inputs:
    """The declared inputs, each given or its default, paths as ``Path``; a required one missing is refused."""
    values = {}
    for declared in protocol.inputs:
        value = given.get(declared.name)
        value = declared.default if value is None else value  # None: not given (the command line passes every option)
        if value is None and declared.required:
            raise SettingError(declared.name, f"{protocol.name} needs {declared.name}", f"give {declared.name}: {declared.help}")
        if declared.kind in ("path", "checkpoint", "store", "masks") and isinstance(value, str):
            value = Path(value)
        values[declared.name] = value
    return Inputs(values)


def _panels(protocol: Protocol, inputs: Inputs) -> dict:
    """The panel inputs resolved (no label read): a train panel that could leak into the score,
    or a sealed panel to be read without a reason, is refused here."""
    from ..labels.panels import check_readable, get_panel, train_and_val

    declared = {i.name: i for i in protocol.inputs if i.panel and inputs.get(i.name) is not None}
    if not declared:
        return {}
    roles = {i.role: name for name, i in declared.items()}
    found = {}
    if "train" in roles and "val" in roles:
        found[roles["train"]], found[roles["val"]] = train_and_val(
            inputs.get(roles["train"]), inputs.get(roles["val"]), inputs.get("cache_dir"), use=declared[roles["train"]].use
        )
    for name, i in declared.items():
        panel = found.get(name) or get_panel(inputs.get(name), inputs.get("cache_dir"))
        if i.role != "train":
            check_readable(panel, inputs.get("unseal"), inputs.get("cache_dir"))  # a sealed panel without a reason: before any label read
        found[name] = panel
    return {name: found[name] for name in declared}


def prepare(protocol: Protocol, source: Any, placement: Placement | None, progress: Progress | None, given: dict[str, Any], block: int | None = None) -> RunContext:
    """Every refusal that needs no label and no compute, then the run's context."""
    refuse_unknown(protocol, given)
    given_settings, given_placement, inputs = split(protocol, given)
    settings = protocol.settings.build(**given_settings)  # refuses a bad value before any work
    if placement is None:
        placement = Placement.parse(shardable="shard" in protocol.placement, **{**protocol.placement_defaults, **given_placement})
    elif given_placement:
        raise ProbeError(None, f"{', '.join(given_placement)} given beside placement=", "give either a Placement or its fields")
    refuse_unused(protocol, placement, given_placement)
    if "backend" in protocol.placement or "device" in protocol.placement:
        placement.check_device(backend="backend" in protocol.placement)  # a GPU asked for and absent: before any label read
    if source is not None:
        inputs[protocol.source] = _source(protocol, source)
    refuse_panel_kinds(protocol, inputs)
    from ..store.cache import one_opening_each

    with one_opening_each():  # the checks below open the same stores: once each
        pair_inputs(inputs)  # a checkpoint and a store, masks and their store: they belong together, before any work
        read = [v for key in SOURCES for v in (inputs.get(key) if isinstance(inputs.get(key), list) else [inputs.get(key)]) if isinstance(v, (str, Path))]
        check_output_file(inputs.get("json_path"), "json_path", read)  # before any work: never over an input or a user's file
        typed = _typed(protocol, inputs)
        panels = _panels(protocol, typed)
        recorded = {k: _absolute(v) for k, v in typed.as_dict().items() if not callable(v) and k not in ("quiet", "json_path", "allow_partial")}
        if protocol.reads.labels and inputs.get("panel") and inputs.get("store") is not None and protocol.source == "store":
            from .coverage import panel_coverage

            recorded["coverage"] = panel_coverage(
                inputs["store"],
                inputs["panel"],
                inputs.get("cache_dir"),
                bool(inputs.get("allow_partial")),
                sibling=protocol.reads.panel_sibling,
                views=(getattr(settings, "view", None),) if isinstance(getattr(settings, "view", None), str) else protocol.reads.views,
                block=block if isinstance(block, int) and not isinstance(block, bool) else None,
            )  # before any label read
        current(protocol, inputs)  # the photographs behind the stored features are the files the labels describe, before any label read
        chosen = selection.resolve(protocol, inputs, block, _view(settings))  # the block it reads, held by the store: before any label read
    stamp = records.RunStamp(
        protocol=protocol.name,
        settings=settings.as_dict(),
        placement=placement.as_dict(),
        inputs=recorded,
        selection={"block": chosen, "facet": None},
        differences=protocol.difference_list(),
        defaults=protocol.settings.defaults(),
    )
    return RunContext(protocol, settings, placement, typed, stamp, progress or Progress(), block=chosen, panels=panels)


def read_stores(protocol: Protocol, source: Any, keywords: dict[str, Any]) -> list[str | Path]:
    """The stores a run of ``protocol`` reads and never writes, whose whole per-image arrays it may
    keep (``store.group.snapshot``): its source's where that is a store (decode-stream's ``store``
    is the masks store it writes). A protocol whose source is a store writes no array into any
    store (its results go to the store's ``results`` folder), so where this is not empty every
    store the run opens, its panels' siblings too, is opened once (``cache.one_opening_each``)."""
    if protocol.source not in ("store", "stores"):
        return []
    given = [source, *(keywords.get(key) for key in ("store", "stores"))]
    return [v for value in given for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, (str, Path))]


def run(name: str, source: Any = None, *, placement: Placement | None = None, progress: Progress | None = None, block: int | None = None, **keywords: Any) -> Run:
    """Run protocol ``name`` on ``source`` (a store, a list of stores, a checkpoint or a masks file).
    ``block``: the store's block it reads (0-based; None: the last; ``protocols.selection``)."""
    from ..store.cache import one_opening_each, reading_block
    from ..store.group import snapshot

    protocol = get(name)
    read = read_stores(protocol, source, keywords)
    with snapshot(read), one_opening_each() if read else nullcontext():  # their flags read once; each store opened once, checks and run
        context = prepare(protocol, source, placement, progress, keywords, block)
        with records.opened(context.stamp), reading_block(context.block, views=view_choices(context.settings)):
            result = resolve(protocol.run)(context.inputs, context.settings, context)
    if not context.finished:
        raise RuntimeError(f"{name}'s run returned without RunContext.finish: its records and summary were not written")
    return result.run


def view_choices(settings: Any) -> Callable[[str], bool]:
    """Whether a run with ``settings`` could be told to read view ``v`` instead (``--view v``): never
    where its protocol has no view setting (it reads fixed views), else where its settings take ``v``.
    A line naming a missing array offers only such views (``cache.reading_block``)."""
    if not any(f.name == "view" for f in dataclasses.fields(settings)):
        return lambda view: False

    def takes(view: str) -> bool:
        try:
            dataclasses.replace(settings, view=view)
        except (ProbeError, ValueError, TypeError):
            return False
        return True

    return takes


def sweep(name: str, source: Any = None, *, blocks: list[int] | tuple[int, ...], **keywords: Any) -> list[Run]:
    """One run of protocol ``name`` per block of ``blocks`` (``--blocks 3,7,11``): one record each, each naming its block.
    Every block is checked before the first run."""
    check_blocks(name, source, blocks, keywords)
    return [run(name, source, block=block, **keywords) for block in blocks]


def check_blocks(name: str, source: Any, blocks: list[int] | tuple[int, ...], keywords: dict[str, Any]) -> None:
    """Every block of a sweep held by the store (``selection.resolve``), before the first run."""
    protocol = get(name)
    inputs = dict(keywords)
    if source is not None:
        inputs[protocol.source] = _source(protocol, source)
    if not blocks:
        raise SettingError("blocks", "blocks is empty", "pass 0-based block indices, e.g. blocks=[3, 7, 11]")
    view = _view(protocol.settings.build(**split(protocol, keywords)[0]))
    for block in blocks:
        try:
            selection.resolve(protocol, inputs, block, view)
        except SettingError as refused:  # said of the sweep the caller gave (--blocks), not of a --block never given
            if refused.parameter != "block":
                raise
            fix = refused.fix.replace("block=", "blocks=")
            raise SettingError("blocks", f"{refused.problem} (asked in blocks {spelled(list(blocks))})", fix, refused.where or None) from None


def _view(settings: Any) -> str | None:
    """The run's view, where its protocol's settings have one (``selection.wanted``)."""
    view = getattr(settings, "view", None)
    return view if isinstance(view, str) else None
