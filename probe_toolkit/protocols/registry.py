"""The protocol registry: every protocol declared once, found by name.

A protocol is one module of this package that builds a ``Protocol`` and calls ``register``:
its settings (a frozen dataclass that validates itself), what it reads (views, labels, panel
kinds), the results it saves, its published references and how it differs from them, the
function that runs it, and its presentation: its command (``Command``: the inputs and options
the command line offers, the progress it shows, the terminal table it prints) and its report
sections. The CLI builds one command per protocol from ``protocols()``; the Python API
(``protocols/api.py``), ``probe list``, the report and the documentation iterate over it too;
adding a protocol never edits them.

The table and the sections are named as ``"module:function"`` strings under ``probe_toolkit``
(``"results.tables:knn"``, ``"report.protocols:knn"``) and imported when used, so that loading
the registry (every ``probe --help``) imports neither rich tables nor matplotlib, and no earlier
stage imports the report.

Like timm's ``@register_model``: nothing else in the toolkit keeps a list of protocol names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..infra.errors import ProbeError
from ..results import differ

# the modules that declare protocols, imported on first use of the registry (each registers itself)
MODULES = ("entropy", "neighbours", "discovery", "linear", "knn", "attention_masks", "propagate", "correspond", "hummingbird", "segment",
           "rank", "position", "similarity", "overcluster")


@dataclass(frozen=True)
class Reference:
    """A published source this protocol follows: the paper and the code file."""

    paper: str
    code: str  # repository and file, e.g. "facebookresearch/dino eval_knn.py"


@dataclass(frozen=True)
class Reads:
    """What a protocol reads: store arrays (by view), and labels (panel kinds) or none."""

    arrays: tuple[str, ...] = ()
    views: tuple[str, ...] = ()
    labels: bool = False
    panel_kinds: tuple[str, ...] = ()
    source: str = "store"  # store, or checkpoint (propagate runs the network on DAVIS frames)
    panel_sibling: bool = False  # a panel's tokens are read from <network>-panel-<panel>.zarr beside the store when the store lacks them


REQUIRED = object()  # an option's default when the command line must give it


@dataclass(frozen=True)
class Option:
    """One command-line option of a protocol's command. ``name`` is the keyword ``run`` receives
    (a setting, an input of the run, or a placement field); the CLI spells its flag (``cli/app.FLAGS``).

    ``kind`` says how the typed text becomes the value: ``str``, ``int``, ``float``, ``bool`` (a
    switch), ``path``, ``strs`` (repeatable), ``ints`` / ``floats`` (comma-separated, ``example``
    being the list the error suggests), ``negated`` (a ``--no-…`` switch: the value is its negation),
    ``either`` (``--x/--no-x``; ``default`` when neither is given), or ``parse`` (text → value, raising a
    ``SettingError`` that names the parameter)."""

    name: str
    help: str
    kind: str = "str"
    default: Any = None
    example: str = ""
    parse: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Command:
    """A protocol's command, built by the CLI: ``probe <name> SOURCE [options]``, one call of ``run``.

    ``options`` are ``Option``s and, as strings, options every command spells alike (the CLI's
    ``SHARED``: ``cache``, ``quiet``, ``workers``, …) or groups of them (``SCORED``, ``SHARDED``,
    ``OVER_STORES``), in the order ``--help`` lists them. ``progress``: (unit, the keyword that
    advances it, task label) of the bar; a unit of None prints each step instead. ``table``:
    ``"module:function"`` taking (report, the keywords given to ``run``) and returning what the
    terminal shows (``results/tables.py``)."""

    help: str
    source: str  # help of the first input (the protocol's ``source``: a store, stores, a checkpoint)
    options: tuple[Option | str, ...]
    table: str | Callable[..., Any]
    progress: tuple[str | None, str, str] | None = None
    name: str | None = None  # the command's name where it is not the protocol's (``probe segment`` runs linear-segmentation)
    explicit: bool = False  # the CLI writes the command's body (several sources or presets: decode, score, decode-sweep); its options still come from here


UNSEAL_VAL = Option("unseal", "Reason to open a sealed test panel as --val (recorded in the ledger).")  # of a train/val protocol


def on_panel(help: str, source: str, panel: str, *options: Option | str, table: str, progress: tuple[str | None, str, str] | None = None,
             explicit: bool = False) -> Command:
    """The command of a protocol scored (or choosing its settings) on one panel (correspond, score,
    decode-sweep): ``--panel`` first, required, then its own options."""
    return Command(help=help, source=source, options=(Option("panel", panel, default=REQUIRED), *options), table=table, progress=progress,
                   explicit=explicit)


def on_train_val(help: str, source: str, train: str, val: str, *options: Option | str, table: str, progress: tuple[str | None, str, str],
                 name: str | None = None) -> Command:
    """The command of a protocol fitted (or voting) on a train panel and scored on a val panel
    (linear, knn, hummingbird): ``--train`` and ``--val`` first, both required, then its own options."""
    return Command(help=help, source=source, options=(Option("train", train, default=REQUIRED), Option("val", val, default=REQUIRED), *options),
                   table=table, progress=progress, name=name)


def written_to(what: str) -> Option:
    """``--json``: where the run's numbers are also written, as JSON."""
    return Option("json_path", what, "path")


def over_stores(help: str, *options: Option, table: str) -> Command:
    """The command of a summary over stores side by side (entropy, neighbours): its own options,
    then those every such summary takes (the CLI's ``OVER_STORES``: --json, --seed, --boot, ...)."""
    return Command(help=help, source="Stores written by probe extract (several: side by side).", options=(*options, "OVER_STORES"), table=table)


@dataclass(frozen=True)
class Protocol:
    name: str
    summary: str
    settings: type
    reads: Reads
    results: tuple[str, ...]  # result names it saves (``<panel>`` and ``<grid>`` stand for the run's)
    references: tuple[Reference, ...]
    differences: str  # what differs from the reference code, and why
    execute: Callable[..., Any]  # (settings, placement, **inputs and options) -> the command's report
    source: str = "store"  # the keyword of its first input: store, stores, checkpoint or masks_file
    command: Command | None = None  # None: reached through another command (decode-stream: decode --images)
    sections: tuple[str | Callable[..., Any], ...] = ()  # its report sections, "module:function" taking the report's context, in report order
    # the placement fields its execution honours; any other given is refused before work (``api.run``)
    placement: tuple[str, ...] = ("workers", "dask_address", "shard", "backend", "device", "threads")

    def make_settings(self, **given: Any):
        return self.settings.build(**given)


_REGISTRY: dict[str, Protocol] = {}
_loaded = False


def register(protocol: Protocol) -> Protocol:
    if protocol.name in _REGISTRY and _REGISTRY[protocol.name] is not protocol:
        raise ValueError(f"protocol {protocol.name!r} registered twice")
    _REGISTRY[protocol.name] = protocol
    differ.SETTINGS[protocol.name] = protocol.settings  # records written before they carried their defaults
    return protocol


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in MODULES:
            importlib.import_module(f"{__package__}.{module}")


def protocols() -> list[Protocol]:
    _load()
    return list(_REGISTRY.values())


def resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """``"results.tables:knn"`` → that function of ``probe_toolkit.results.tables`` (a function stays itself)."""
    if callable(target):
        return target
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(f"probe_toolkit.{module}"), function)


def get(name: str) -> Protocol:
    _load()
    if name not in _REGISTRY:
        raise ProbeError(None, f"no protocol named {name!r}", f"protocols: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]
