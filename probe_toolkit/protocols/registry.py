"""The protocol registry: every protocol declared once, found by name.

A protocol is one module of this package that builds a ``Protocol`` and calls ``register``:
its settings (a frozen dataclass that validates itself), what it reads (views, labels, panel
kinds), the results it saves, its published references and how it differs from them, and the
function that runs it. The CLI, the Python API (``probe_toolkit.api``), ``probe list`` and the
documentation iterate over ``protocols()``; adding a protocol never edits them.

Like timm's ``@register_model``: nothing else in the toolkit keeps a list of protocol names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ..infra.errors import ProbeError

# the modules that declare protocols, imported on first use of the registry (each registers itself)
MODULES = ("entropy", "neighbours", "discovery", "linear", "knn", "attention_masks", "propagate", "correspond", "hummingbird", "segment")


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

    def make_settings(self, **given: Any):
        return self.settings.build(**given)


_REGISTRY: dict[str, Protocol] = {}
_loaded = False


def register(protocol: Protocol) -> Protocol:
    if protocol.name in _REGISTRY and _REGISTRY[protocol.name] is not protocol:
        raise ValueError(f"protocol {protocol.name!r} registered twice")
    _REGISTRY[protocol.name] = protocol
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


def get(name: str) -> Protocol:
    _load()
    if name not in _REGISTRY:
        raise ProbeError(None, f"no protocol named {name!r}", f"protocols: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]
