"""Results as records: every run writes a new folder, ``<store>/results/<result>/<run id>/``, and
never replaces another run's.

A record is the result group xarray writes (``zarr.json`` and its arrays) plus ``record.json``:
the run id, the protocol and result it belongs to, when it was made, the toolkit's version and
git revision, and what the run said about its settings, inputs and placement. Run ids sort in
the order the runs were made (UTC time to the microsecond, then a per-process counter), so the
latest record of a result is the last id.

A run of one protocol may save several results (``probe decode --panel`` saves ``decoder`` and
``scores_<panel>``): inside ``opened(...)`` every result the run saves takes the same run id, so
the report can tell they belong together.

Shard parts (``<result>-part-<i>-of-<n>``) are a run's working state, not records: a rerun of a
shard replaces its part (``commands/shards.py``), so they keep one slot each.

Migration: stores written before records held one slot per result (``results/<result>/zarr.json``).
Such a slot reads as the result's oldest record (run id ``legacy``); the first new record of that
result moves it into ``results/<result>/legacy/`` so that nothing is lost.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import itertools
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..infra import litter

if TYPE_CHECKING:
    import xarray as xr

    from ..store.plain import Results

RECORD = "record.json"
LEGACY = "legacy"
PART = re.compile(r"-part-\d+-of-\d+$")
RUN_ID = re.compile(r"^(?:\d{8}-\d{6}-\d{6}-\d{2}[0-9a-f]{2}|legacy)$")

_counter = itertools.count()
_last: _dt.datetime | None = None  # the last run id's time in this process


def is_part(name: str) -> bool:
    """A shard's part (working state of one run, replaced by a rerun of that shard)."""
    return PART.search(name) is not None


def new_run_id(now: _dt.datetime | None = None) -> str:
    """``YYYYMMDD-HHMMSS-ffffff-<counter><pid>``: UTC, sorts by creation time; the counter and the
    process id's last hex digits keep two runs of one microsecond apart."""
    global _last
    now = now or _dt.datetime.now(_dt.UTC)
    if _last is not None and now <= _last:  # a clock set back never makes a later run sort first (in this process)
        now = _last + _dt.timedelta(microseconds=1)
    _last = now
    return f"{now:%Y%m%d-%H%M%S-%f}-{next(_counter) % 100:02d}{os.getpid() & 0xFF:02x}"


@dataclass(frozen=True)
class RunStamp:
    """What one run of a protocol says about itself; every record it saves carries it: its
    settings, inputs and placement, the block and facet it read (``selection``), and how the
    protocol differs from its published reference (``differences``: what, why, effect)."""

    protocol: str
    run_id: str = field(default_factory=new_run_id)
    settings: dict[str, Any] = field(default_factory=dict)
    placement: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)
    differences: list[dict[str, str]] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)  # the protocol's default settings: tables show what differs (``results/differ.py``)


_current: contextvars.ContextVar[RunStamp | None] = contextvars.ContextVar("probe_run", default=None)


@contextlib.contextmanager
def opened(context: RunStamp) -> Iterator[RunStamp]:
    """Inside this block every record saved takes ``context``'s run id, settings and placement."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def current() -> RunStamp | None:
    return _current.get()


@dataclass(frozen=True)
class Record:
    """One saved run of one result: where it lies and what ``record.json`` says."""

    store: Path
    result: str
    run_id: str
    path: Path
    meta: dict[str, Any]

    @property
    def protocol(self) -> str:
        return str(self.meta.get("protocol") or protocol_of(self.result))

    @property
    def created(self) -> str:
        return str(self.meta.get("created") or "")


def protocol_of(result: str) -> str:
    """The protocol a result name belongs to (for records written before records named it)."""
    for prefix, protocol in (
        ("scores_", "score"),
        ("saliency_", "score"),
        ("sweep_", "decode-sweep"),
        ("neighbours_", "neighbours"),
        ("linear_", "linear"),
        ("decoder", "decode"),
        ("attention_masks", "attention-masks"),
        ("davis", "propagate"),
    ):
        if result.startswith(prefix):
            return protocol
    return result


def results_path(store: str | Path, name: str) -> Path:
    """``<store>/results/<name>``: a result's folder of records (or a file beside them)."""
    return Path(store) / "results" / name


def _is_group(folder: Path) -> bool:
    return (folder / "zarr.json").is_file()


def runs(store: str | Path, result: str) -> list[Record]:
    """Every record of ``result`` in ``store``, oldest first (a legacy slot first of all)."""
    folder = results_path(store, result)
    if not folder.is_dir():
        return []
    if _is_group(folder):  # a slot: a shard's part, or a result written before records
        return [Record(Path(store), result, LEGACY, folder, _legacy_meta(result, folder))]
    found = []
    for entry in sorted(folder.iterdir(), key=lambda p: (p.name != LEGACY, p.name)):
        if entry.is_dir() and RUN_ID.match(entry.name) and _is_group(entry):
            found.append(Record(Path(store), result, entry.name, entry, _read_meta(entry, result)))
    return found


def find(store: str | Path, result: str, run: str | None = None) -> Record | None:
    """The latest record of ``result`` (or the one whose run id is or starts with ``run``)."""
    found = runs(store, result)
    if run is None:
        return found[-1] if found else None
    matching = [r for r in found if r.run_id == run] or [r for r in found if r.run_id.startswith(run)]
    return matching[-1] if len(matching) == 1 else None


def results(store: str | Path) -> list[str]:
    """The names of the results a store holds at least one record of."""
    root = Path(store) / "results"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not litter.is_litter(p.name) and runs(store, p.name))


def every_record(store: str | Path) -> list[Record]:
    """Every record of every result (shard parts left out), oldest first."""
    found = [r for name in results(store) if not is_part(name) for r in runs(store, name)]
    return sorted(found, key=lambda r: (r.run_id != LEGACY, r.run_id, r.result))


def target(store: str | Path, result: str) -> tuple[Path, dict[str, Any]]:
    """Where the next record of ``result`` goes and what its ``record.json`` says.

    A shard part keeps its slot (``results/<part>``). A legacy slot is first moved into its own
    record folder (``legacy``), so the new run never replaces it."""
    folder = results_path(store, result)
    if is_part(result):
        return folder, {}
    if _is_group(folder):
        migrate(store, result)
    context = current()
    run_id = context.run_id if context is not None else new_run_id()
    from .._version import __version__
    from ..infra import provenance

    meta = {
        "run_id": run_id,
        "result": result,
        "protocol": context.protocol if context else protocol_of(result),
        "created": provenance.now(),
        "toolkit_version": __version__,
        "git_revision": provenance.git_revision(),
    }
    if context is not None:
        meta.update(settings=context.settings, placement=context.placement, inputs=context.inputs, selection=context.selection, differences=context.differences)
        if context.defaults:
            meta["defaults"] = context.defaults
    return folder / run_id, meta


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """``record.json`` inside the (still temporary) record folder, before it takes its name."""
    if meta:
        (path / RECORD).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")


def migrate(store: str | Path, result: str) -> Path | None:
    """Move a slot written before records (``results/<result>/zarr.json``) into
    ``results/<result>/legacy/``; nothing is rewritten, only renamed. Returns the new place."""
    folder = results_path(store, result)
    if not _is_group(folder) or is_part(result):
        return None
    moving = folder.with_name(f".{result}.old-{os.getpid()}")
    folder.rename(moving)
    folder.mkdir()
    moving.rename(folder / LEGACY)
    return folder / LEGACY


def record_at(store: str | Path, result: str, path: Path) -> Record:
    """The record just written at ``path`` (what ``save`` returned)."""
    return Record(Path(store), result, path.name, path, _read_meta(path, result))


def _read_meta(folder: Path, result: str) -> dict[str, Any]:
    path = folder / RECORD
    if path.is_file():
        try:
            meta = json.loads(path.read_bytes())
        except (OSError, ValueError):
            meta = None
        if isinstance(meta, dict):
            return meta  # (anything else is no record.json probe wrote: read as a record of unknown settings)
    return _legacy_meta(result, folder)


def _legacy_meta(result: str, folder: Path) -> dict[str, Any]:
    """What a slot written before records says of itself (its attributes' date and version)."""
    attrs: dict[str, Any] = {}
    try:
        attrs = json.loads((folder / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        pass
    return {
        "run_id": LEGACY,
        "result": result,
        "protocol": protocol_of(result),
        "created": attrs.get("date", ""),
        "toolkit_version": attrs.get("toolkit_version", ""),
        "git_revision": attrs.get("git_revision", ""),
        "legacy": True,
    }


# --- writing and reading a record's result group ---


def save(store: str | Path, name: str, results: xr.Dataset | Results, attrs: dict[str, Any] | None = None) -> Path:
    """Write one run's result as a new record, ``<store>/results/<name>/<run id>``, atomically
    (temp, rename); no other run's record is touched. A shard's part keeps its slot.
    A ``store.plain.Results`` is written without xarray, in the layout xarray gives a Dataset."""
    from ..infra.errors import ProbeError, os_fix
    from ..store.cache import consolidate

    path, meta = target(store, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    for folder in {path.parent, results_path(store, "")}:
        litter.sweep(folder)  # what killed runs left (their process is gone) goes first
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    results = results.copy()
    results.attrs.update(attrs or {})
    if meta:
        results.attrs["record"] = {k: meta[k] for k in ("run_id", "protocol", "created", "toolkit_version", "settings", "defaults", "selection") if k in meta}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if hasattr(results, "to_zarr"):
                results.to_zarr(tmp, mode="w", consolidated=False, zarr_format=3)
            else:
                from ..store.plain import write

                write(results, tmp)
        if meta:
            meta["files"] = _digests(tmp)  # checked by ``load``: a deleted or changed file is one line, not fill values
        write_meta(tmp, meta)
    except BaseException as error:  # a full disk, Ctrl-C: no half-written result stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):
            raise ProbeError(path, f"could not be written ({error.strerror or error})", os_fix(error, "rerun the analysis; the previous result is kept")) from None
        raise
    if path.exists():  # the same run saving a result again, or a shard rerun replacing its part
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old)
    else:
        tmp.rename(path)
    consolidate(store)
    return path


def _digests(folder: Path) -> dict[str, str]:
    """Each file of a record's result group (its chunks and metadata) with its sha256. Result
    groups skip all-fill chunks and carry no checksums, so the record lists what it wrote."""
    from ..infra.provenance import file_sha256

    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != RECORD}


def check_files(found: Record) -> None:
    """Every file ``record.json`` lists is there with the bytes the run wrote (records written
    before they listed their files are read as they are)."""
    from ..infra.errors import IntegrityError
    from ..infra.provenance import file_sha256

    listed = found.meta.get("files")
    if not isinstance(listed, dict):
        return
    for relative, digest in listed.items():
        path = found.path / relative
        why = "is missing" if not path.is_file() else "has changed" if file_sha256(path) != digest else None
        if why:
            raise IntegrityError(
                path,
                f"{why} since run {found.run_id} of {found.result} wrote it",
                f"rerun `probe {found.protocol}` on the store (a new record is written beside this one), or restore the file",
            )


def load(store: str | Path, name: str, run: str | None = None) -> xr.Dataset | None:
    """The latest record of result ``name`` in a store (or run ``run``'s), or None when none exists."""
    found = find(store, name, run)
    if found is None:
        return None
    check_files(found)
    from ..infra import lazy_dask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # no dask: it would import dask.array and distributed
        return lazy_dask.xarray().open_dataset(found.path, engine="zarr", consolidated=False, chunks=None).load()


def incomparable(settings: dict[str, dict[str, Any] | None]) -> list[str]:
    """The settings on which records of one result (by label) differ: two records share a table
    only where this is empty. Records that did not record their settings (written before records,
    or saved outside ``api.run``) are left out: nothing is claimed of them."""
    settings = {k: v for k, v in settings.items() if isinstance(v, dict)}
    if len(settings) < 2:
        return []
    keys = sorted(set().union(*(v.keys() for v in settings.values())))
    return [k for k in keys if len({json.dumps(v.get(k), sort_keys=True, default=str) for v in settings.values()}) > 1]
