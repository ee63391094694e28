"""The protocol registry: every protocol declared once, found by name.

A protocol is one module of this package that builds a ``Protocol`` and calls ``register``:
its settings (a frozen dataclass whose fields declare their default, help and constraint:
``infra.settings.setting``), its inputs (``Input``: the source, the panels in the order their
labels are read, the outputs), what it reads (views, labels, panel kinds), the results it saves
and its result type, its published references and how it differs from them (``Difference``),
the function that runs it (``run(inputs, settings, context)``, ``protocols/context.py``), and its
presentation: its command (``Command``: the order of the options ``--help`` lists, the progress
it shows, the terminal table it prints) and its report sections. The CLI builds one command per protocol from ``protocols()``; the Python API
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
from dataclasses import dataclass, field
from typing import Any

from ..infra.errors import ProbeError
from ..results import differ

# the modules that declare protocols, imported on first use of the registry (each registers itself)
MODULES = (
    "entropy",
    "neighbours",
    "discovery",
    "linear",
    "linear_dinov2",
    "knn",
    "attention_masks",
    "propagate",
    "correspond",
    "hummingbird",
    "segment",
    "rank",
    "position",
    "similarity",
    "overcluster",
    "depth",
)


@dataclass(frozen=True)
class Reference:
    """A published source this protocol follows: the paper and the code file."""

    paper: str
    code: str  # repository and file, e.g. "facebookresearch/dino eval_knn.py"


@dataclass(frozen=True)
class Difference:
    """One way a protocol departs from its published reference: what differs, why, and its
    effect on the number (rendered into the docs, the report and every record)."""

    what: str
    why: str
    effect: str

    def as_dict(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why, "effect": self.effect}

    def text(self) -> str:
        return f"{self.what} ({self.why}); {self.effect}"


@dataclass(frozen=True)
class Input:
    """One input of a run besides its settings and placement, declared once: the Python API's
    keyword (``name``), the command line's option or argument (its flag from ``infra/spelling.py``),
    and its help. ``kind``: ``store``, ``stores``, ``checkpoint``, ``masks`` (the source, first),
    ``panel`` (a registered panel; ``role`` train, val or panel; the order of a protocol's panel
    inputs is the order their labels are read, ``RunContext.read``), ``path``, ``str``, ``int``,
    ``strs`` (repeatable) or ``bool``."""

    name: str
    help: str
    kind: str = "str"
    required: bool = False
    role: str | None = None
    default: Any = None
    use: str = "be fitted on"  # a train panel: what it does, as the refusal of a sealed one says ("hold the neighbours")

    @property
    def panel(self) -> bool:
        return self.kind == "panel"


CACHE = Input("cache_dir", "Cache root (default: $PROBE_CACHE or ./cache).", "path")
UNSEAL = Input("unseal", "Reason to open a sealed test panel (recorded in the ledger).")
ALLOW_PARTIAL = Input("allow_partial", "Score a store holding only part of the panel's images (the record says how many).", "bool", default=False)


def json_input(what: str) -> Input:
    """``--json``: where the run's numbers are also written, as JSON (``RunContext.finish``)."""
    return Input("json_path", what, "path")


def train_val(train: str, val: str, use: str = "be fitted on") -> tuple[Input, Input]:
    """The panels of a protocol fitted (or voting) on a train panel and scored on a val panel, in
    the order their labels are read (``use``: what the train panel does)."""
    return Input("train", train, "panel", True, "train", use=use), Input("val", val, "panel", True, "val")


@dataclass(frozen=True)
class Reads:
    """What a protocol reads: store arrays (by view), and labels (panel kinds) or none."""

    arrays: tuple[str, ...] = ()
    views: tuple[str, ...] = ()
    labels: bool = False
    panel_kinds: tuple[str, ...] = ()
    source: str = "store"  # store, or checkpoint (propagate runs the network on DAVIS frames)
    panel_sibling: bool = False  # a panel's tokens are read from <network>-panel-<panel>.zarr beside the store when the store lacks them
    # what `probe extract --for <protocol>` stores for it: array names at the last block (store.plan; ``attention_stats_<view>``: every
    # block's attention statistics); None: ``arrays`` (where ``arrays`` lists alternatives, the one it needs is named here)
    stores: tuple[str, ...] | None = None
    blocks: str | None = None  # the blocks `probe extract --for` stores them at where --blocks is not given (``last4``: DINOv2's linear protocol); None: the last

    @property
    def planned(self) -> tuple[str, ...]:
        """The arrays a store planned for this protocol holds (none where it reads a checkpoint or masks)."""
        if self.source != "store":
            return ()
        return self.arrays if self.stores is None else self.stores


REQUIRED = object()  # an option's default when the command line must give it


@dataclass(frozen=True)
class Option:
    """A command-line option of a protocol's command that no field declares: it rewords the help of
    a setting, an input or a placement field named ``name`` (their default, type and flag still
    come from their declaration), or declares an option of the command alone (``decode --size``,
    ``decode-sweep --top``). The CLI spells its flag (``infra/spelling.py``).

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

    ``options`` name, in the order ``--help`` lists them, the protocol's settings, inputs and
    placement fields (each option derived from its declaration), options every command spells
    alike (the CLI's ``SHARED``: ``cache``, ``quiet``) or groups of them (``SCORED``, ``SHARDED``,
    ``OVER_STORES``, ``PLACEMENT``), and ``Option``s. ``progress``: (unit, task label) of the bar;
    a unit of None prints each step as a line instead. ``table``: ``"module:function"`` taking the
    protocol's result and returning what the terminal shows (``results/tables.py``)."""

    help: str
    options: tuple[Option | str, ...] = ()
    table: str | Callable[..., Any] = ""
    progress: tuple[str | None, str] | None = None
    name: str | None = None  # the command's name where it is not the protocol's (``probe segment`` runs linear-segmentation)
    explicit: bool = False  # the CLI writes the command's body (several sources or presets: decode, score, decode-sweep); its options still come from here


def over_stores(help: str, *options: Option | str, table: str) -> Command:
    """The command of a summary over stores side by side (entropy, neighbours): its own options,
    then those every such summary takes (the CLI's ``OVER_STORES``: --json, --seed, --boot, ...)."""
    return Command(help=help, options=(*options, "OVER_STORES"), table=table)


@dataclass(frozen=True)
class Protocol:
    name: str
    summary: str
    settings: type
    reads: Reads
    results: tuple[str, ...]  # result names it saves (``<panel>`` and ``<grid>`` stand for the run's)
    references: tuple[Reference, ...]
    differences: tuple[Difference, ...]  # what differs from the reference code, why, and its effect
    source: str = "store"  # the keyword of its first input: store, stores, checkpoint or masks_file
    command: Command | None = None  # None: reached through another command (decode-stream: decode --images)
    sections: tuple[str | Callable[..., Any], ...] = ()  # its report sections, "module:function" taking the report's context, in report order
    # the placement fields its execution honours; any other given is refused before work (``api.run``)
    placement: tuple[str, ...] = ("workers", "dask_address", "shard", "backend", "device", "threads")
    inputs: tuple[Input, ...] = ()  # its inputs, the source first (``Input``); the Python API refuses any other keyword
    run: Callable[..., Any] | str | None = None  # (inputs, settings, context) -> its result (``result``), "module:function" imported when run
    result: str | type | None = None  # its result type ("module:Class"), which its table and ``RunContext.finish`` take
    placement_defaults: dict[str, Any] = field(default_factory=dict)  # a placement field's default for this protocol (propagate: device auto)

    def __post_init__(self) -> None:
        if self.inputs and self.source != self.inputs[0].name:  # the source is the first input declared
            object.__setattr__(self, "source", self.inputs[0].name)

    def make_settings(self, **given: Any):
        return self.settings.build(**given)

    def input(self, name: str) -> Input | None:
        return next((i for i in self.inputs if i.name == name), None)

    def difference_list(self) -> list[dict[str, str]]:
        """The differences as records keep them."""
        return [d.as_dict() for d in self.differences]


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
