"""The run context: what ``probe.run`` hands a protocol's run besides its inputs and settings.

``api.run`` builds one ``RunContext`` after every refusal that needs no label and no compute
(settings, placement, inputs, panels' kinds and seals, the store's coverage of each panel, the
JSON path), so a protocol's run begins where the work begins:

    def run(inputs, settings: KnnSettings, context: RunContext) -> KnnReport:
        train = context.read("train", read_classes, purpose="knn: neighbours' classes", checkpoint=sha)
        with context.placed() as where:                  # the runner's placement, checked already
            ...map_images(..., where=where, progress=context.task("k-NN", total))
        return context.finish(KnnReport(...), Saving(store, "knn", dataset, attrs))

``read`` gives a panel's labels through its reader (which logs the ledger entry before it
returns them) in the order the protocol declares its panel inputs; ``finish`` writes the run's
records (every one under the run's id, settings, inputs, placement, selection and differences)
and the JSON summary, and returns the typed result holding the ``Run`` that says so. The
``block`` and ``facet`` a run reads are the context's (``plan`` resolves them).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..infra.placement import Placement
from ..results import records
from ..results.outcome import Inputs, Outcome, Run

if TYPE_CHECKING:
    from ..infra.runner import Where
    from ..labels.panels import Panel
    from .registry import Protocol

__all__ = ["Decoding", "Inputs", "Outcome", "Progress", "Run", "RunContext", "Saving"]  # Inputs, Outcome, Run: from results/, where tables read them

R = TypeVar("R")


def _nothing(n: int = 1) -> None:
    return None


class Progress:
    """How a run speaks to its caller: ``task(label, total)`` starts a count and returns its
    ``advance(n)``; ``step(text)`` says what the run does now; ``note(text)`` says what the caller
    should know of the numbers (on stderr), its parameters spelled by ``spell``. This one shows
    no progress and names parameters as the Python API does; the command line's draws bars and
    names flags (``cli/protocols.py``)."""

    def task(self, label: str | None = None, total: int | None = None) -> Callable[[int], None]:
        return _nothing

    def step(self, text: str) -> None:
        return None

    def spell(self, parameter: str) -> str:
        return parameter

    def note(self, text: str) -> None:
        import sys

        print(text, file=sys.stderr)


class Decoding(NamedTuple):
    """Where a decoder runs (``RunContext.decoder``)."""

    backend: str
    device: str
    threads: int


class Saving(NamedTuple):
    """One record a run writes at its end: ``<store>/results/<result>/<run id>``."""

    store: str | Path
    result: str
    data: Any  # an xarray Dataset, or a store.plain.Results
    attrs: dict[str, Any] | None = None


@dataclass
class RunContext:
    """Everything a protocol's run is handed besides its inputs and settings (see the module's text)."""

    protocol: Protocol
    settings: Any
    placement: Placement
    inputs: Inputs
    stamp: records.RunStamp
    progress: Progress = field(default_factory=Progress)
    block: int | None = None  # the block read (0-based, resolved; None: the store's last), filled by plan's --block
    facet: str | None = None  # the facet read where the protocol lets the user pick one
    panels: dict[str, Panel] = field(default_factory=dict)  # the panel inputs, resolved and checked before the run
    records: list[records.Record] = field(default_factory=list)
    finished: bool = False
    _read: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.stamp.run_id

    @property
    def cache_dir(self) -> Path | None:
        return self.inputs.get("cache_dir")

    @property
    def unseal(self) -> str | None:
        return self.inputs.get("unseal")

    @property
    def command(self) -> str:
        """The command that runs this protocol, as records' provenance names it."""
        spec = self.protocol.command
        return f"probe {spec.name or self.protocol.name}" if spec is not None else f"probe {self.protocol.name}"

    def panel(self, name: str) -> Panel:
        """The panel of input ``name``, resolved (no label read)."""
        return self.panels[name]

    def read(self, name: str, reader: Callable[..., R], *, purpose: str, **options: Any) -> R:
        """The labels of panel input ``name`` through ``reader`` (``labels/panels.read_classes``, a
        layout's ``read_label_maps``: each logs its ledger entry before it returns the labels), in
        the order the protocol declares its panels: reading one after a later one is a bug."""
        order = [i.name for i in self.protocol.inputs if i.panel]
        later = [n for n in self._read if order.index(n) > order.index(name)]
        if later:
            raise RuntimeError(f"{self.protocol.name} read panel {later[0]!r} before {name!r}: its inputs declare {', '.join(order)}")
        self._read.append(name)
        role = self.protocol.input(name).role
        return reader(self.panel(name), purpose=purpose, unseal=None if role == "train" else self.unseal, cache=self.cache_dir, **options)

    @contextlib.contextmanager
    def placed(self, device: str | None = None) -> Iterator[Where]:
        """The runner's ``Where`` for this run's placement (local workers or the cluster's client,
        closed after); the placement was checked before the run began. ``device``: the device the
        run resolved ``auto`` to (a GPU's run is one process)."""
        from ..infra.runner import placed

        with placed(self.placement if device is None else dataclasses.replace(self.placement, device=device)) as where:
            yield where

    def device(self, auto: str | None = None) -> Any:
        """The placement's device as torch takes it (``auto``: a GPU when one is visible, or the
        device ``auto`` names where a protocol keeps it on the CPU; a named one was checked before
        the run began, ``Placement.check_device``)."""
        from ..store.extract_forward import resolve_device

        asked = self.placement.device
        return resolve_device(auto if asked == "auto" and auto is not None else asked)

    def gpu_asked(self) -> bool:
        """Whether the caller named a GPU (``auto`` and ``cpu`` do not)."""
        return self.placement.device not in ("cpu", "auto")

    def search_device(self) -> str | None:
        """The device an exact search runs on: the placement's with backend torch, None (numpy) with scipy."""
        return self.placement.device if self.placement.backend == "torch" else None

    def search_block(self, query_rows: int, default: int) -> int:
        """Bank rows per block of a search of ``query_rows`` rows: sized to the placement's
        ``work_memory`` (``default`` where none is given); never changes a number."""
        from ..analyses.search import block_rows

        return block_rows(self.placement.work_memory, query_rows, default)

    def decoder(self) -> Decoding:
        """Where the decoder runs: the placement's backend, device and BLAS threads per task."""
        return Decoding(self.placement.backend, self.placement.device, self.placement.threads)

    @property
    def sharded(self) -> bool:
        """Whether this process runs one shard of n (``shard``, or torchrun's)."""
        return self.placement.sharded

    def shard(self) -> tuple[int, int] | None:
        """(i, n) of this process's shard (``shard``, or torchrun's); None when the run is not sharded."""
        return self.placement.shard_pair() if self.placement.sharded else None

    def loaders(self, default: int = 2) -> Any:
        """A thread pool that prepares the next batches while this one trains: the placement's
        ``workers`` threads (``default`` where none is given), closed by its ``with`` block."""
        from concurrent.futures import ThreadPoolExecutor

        return ThreadPoolExecutor(max_workers=self.placement.workers or default)

    def task(self, label: str | None = None, total: int | None = None) -> Callable[[int], None]:
        return self.progress.task(label, total)

    def step(self, text: str) -> None:
        self.progress.step(text)

    def note(self, template: str) -> None:
        """``template`` with each ``{parameter}`` spelled for the caller (``ks`` from Python, ``--k`` on the command line)."""
        names = {f.name for f in dataclasses.fields(self.settings)} | {i.name for i in self.protocol.inputs}
        for name in names:
            template = template.replace("{" + name + "}", self.progress.spell(name))
        self.progress.note(template)

    def save(self, store: str | Path, result: str, data: Any, attrs: dict[str, Any] | None = None) -> records.Record:
        """Write one record of this run now (``finish`` writes the last ones)."""
        path = records.save(store, result, data, attrs)
        found = records.record_at(store, result, path)
        self.records.append(found)
        return found

    def finish(self, result: R, *saving: Saving) -> R:
        """The run's one ending: each record written, the JSON summary written (``--json``), and
        the result returned holding the ``Run`` (its settings, inputs and the records written)."""
        for s in saving:
            self.save(s.store, s.result, s.data, s.attrs)
        result.run = Run(self.protocol.name, self.run_id, self.settings, self.placement, result, list(self.records), self.inputs)
        json_path = self.inputs.get("json_path")
        if json_path is not None and not result.pending:
            from ..infra.owned import write_summary

            write_summary(json_path, result.summary(), indent=1)
        self.finished = True
        return result
