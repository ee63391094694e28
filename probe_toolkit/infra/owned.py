"""Output folders: probe replaces or deletes only the files its own manifest lists.

A folder a command writes into (``probe report --out DIR``, ``probe demo --out DIR``) carries
``.probe-output.json``: every file probe wrote there, as a path relative to the folder, grouped
by the command that wrote it (a path ending in ``/`` stands for a whole folder probe made, such
as the demo's ``work/``). The rule, in one place:

- a folder that does not exist, or is empty (temporary names of killed runs aside), is taken;
- a folder with probe's manifest is taken; anything in it the manifest does not list (a figure
  or a note the user added, even inside ``figures/``) is the user's and is never touched;
- a non-empty folder without the manifest is the user's: refused with one line (pick a new
  ``--out`` or empty it), before any work;
- a file of the user's standing where probe would write is refused the same way.

``Output.replace`` moves a finished set of files (written elsewhere first, e.g. into a hidden
temporary folder inside the target) into place: the manifest first grows to list both the old
and the new files, then each file is renamed into place (atomic, one filesystem), then the old
files the new set no longer has are deleted and the manifest shrinks to the new set. At every
moment each of probe's files in the folder is listed, so an interrupted run never makes one of
probe's files look like the user's, nor a user's file look like probe's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import litter
from .atomic import write_json
from .errors import ProbeError
from .settings import SettingError

MANIFEST = ".probe-output.json"
SUMMARY_MARK = "written_by"  # the key every summary file probe writes opens with
KIND = "probe-output"


def _entries(folder: Path) -> list[str]:
    """What the folder holds besides probe's manifest and temporary names of killed runs."""
    return sorted(e.name for e in folder.iterdir() if e.name != MANIFEST and not litter.is_litter(e.name))


@dataclass
class Output:
    """A folder probe may write into, and what its manifest says probe wrote there."""

    folder: Path
    parameter: str = "out"  # the keyword that names the folder (the command line's --out)
    groups: dict[str, list[str]] = field(default_factory=dict)

    @property
    def manifest(self) -> Path:
        return self.folder / MANIFEST

    def owns(self, name: str) -> bool:
        """Whether ``name`` (relative, '/'-separated) is one of probe's files (or inside one of its folders)."""
        for listed in (n for names in self.groups.values() for n in names):
            if name == listed.rstrip("/") or (listed.endswith("/") and name.startswith(listed)):
                return True
        return False

    def check(self, names: Iterable[str]) -> None:
        """Refuse (one line) a file or folder of the user's standing where probe would write one of ``names``."""
        for name in names:
            path = self.folder / name
            if (path.exists() or path.is_symlink()) and not self.owns(name):
                raise SettingError(
                    self.parameter,
                    f"is not a file probe wrote here (not listed in {MANIFEST}) and would be replaced",
                    f"move it elsewhere, or pick a new {self.parameter} folder",
                    path,
                )
            for parent in Path(name).parents:  # a user's file where probe needs a folder
                if str(parent) != "." and (self.folder / parent).exists() and not (self.folder / parent).is_dir():
                    raise SettingError(
                        self.parameter, "is a file where probe writes a folder", f"move it elsewhere, or pick a new {self.parameter} folder", self.folder / parent
                    )

    def _write(self) -> None:
        groups = {g: sorted(set(n)) for g, n in sorted(self.groups.items()) if n}
        write_json(self.manifest, {"kind": KIND, "note": "files probe wrote in this folder; probe replaces or deletes only these", "files": groups}, indent=1)

    def adopt(self, group: str, names: Sequence[str]) -> None:
        """List ``names`` (files, or folders as ``name/``) as ``group``'s before probe writes them
        there itself (``probe demo`` keeps its cache in ``work/``); refused if the user's stand there."""
        self.check(n.rstrip("/") for n in names)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.groups[group] = sorted({*self.groups.get(group, []), *names})
        self._write()

    def replace(self, group: str, staged: Path, names: Sequence[str]) -> None:
        """Move ``staged/<name>`` to ``folder/<name>`` for every name (in the given order), and
        delete ``group``'s old files that ``names`` no longer has; nothing else is touched."""
        names = list(dict.fromkeys(names))
        self.check(names)
        old = list(self.groups.get(group, []))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.groups[group] = sorted({*old, *names})
        self._write()  # from here on, every file of probe's in the folder is listed
        for name in names:
            target = self.folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged / name, target)
        for name in sorted(set(old) - set(names)):
            path = self.folder / name
            if not name.endswith("/") and (path.is_file() or path.is_symlink()):
                path.unlink()
        self.groups[group] = sorted(names)
        self._write()


def claim(folder: str | Path, parameter: str = "out") -> Output:
    """The folder as probe's output (it writes nothing yet): refused, with one line, when it is a
    file, when its manifest is not probe's, or when it holds anything and has no manifest
    (``parameter``: the keyword naming it, spelled as its flag on the command line)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise SettingError(parameter, f"is a file, not a folder ({parameter})", f"pass {parameter} a new folder path", folder)
    if not folder.is_dir():
        return Output(folder, parameter)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        held = _entries(folder)
        if held:
            raise SettingError(
                parameter,
                f"is not empty and not probe's output folder (no {MANIFEST}; it holds {held[0]!r}{f' and {len(held) - 1} more' if len(held) > 1 else ''})",
                f"pick a new {parameter} folder, or empty this one",
                folder,
            )
        return Output(folder, parameter)
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        files = data["files"] if isinstance(data, dict) and data.get("kind") == KIND else None
        if not isinstance(files, dict) or not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in files.values()):
            raise ValueError("not a probe-output manifest")
    except (OSError, ValueError, KeyError, TypeError):
        raise SettingError(parameter, "is not a manifest probe wrote", f"pick a new {parameter} folder, or empty this one", manifest) from None
    for names in files.values():  # a listed path must stay inside the folder
        for name in names:
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise SettingError(parameter, f"lists {name!r}, outside its folder", f"pick a new {parameter} folder, or empty this one", manifest)
    return Output(folder, parameter, {str(g): list(v) for g, v in files.items()})


def refuse_existing(path: str | Path, force: bool, what: str = "file") -> Path:
    """A single output file (``probe make-checkpoint OUT``, ``probe convert SRC OUT``): an existing
    one is replaced only with ``--force``; a folder there never is."""
    path = Path(path)
    if path.is_dir():
        raise ProbeError(path, f"is a folder, not a {what}", "pass a file path")
    if path.exists() and not force:
        raise ProbeError(path, "already exists", "pass --force to replace it, or choose another path")
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (another spelling, a symlink, a hard link)."""
    a, b = Path(a), Path(b)
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet)
        return a.resolve() == b.resolve()


def check_output_file(path: str | Path | None, parameter: str, inputs: Iterable[str | Path] = ()) -> None:
    """A summary file a command writes (``--json``), before any work: never inside a store or
    folder the command reads (its own input: a store's ``zarr.json`` once lost a store so), never
    a folder, and an existing file only where it is a summary an earlier run wrote (a JSON object
    carrying ``write_summary``'s mark), not the user's own JSON or notes, a checkpoint or anything else probe did not write."""
    if path is None:
        return
    path = Path(path)
    target = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if target == source:
            raise SettingError(parameter, f"is the file this command reads ({parameter})", f"write {parameter} to another path", path)
        if source in target.parents:
            raise SettingError(parameter, f"lies inside {source.name}, which this command reads ({parameter})", f"write {parameter} outside it", path)
    if path.is_dir():
        raise SettingError(parameter, f"is a folder, not a file ({parameter})", f"pass {parameter} a file path", path)
    if path.exists():
        try:
            written = json.loads(path.read_text(encoding="utf-8"))
            ours = isinstance(written, dict) and str(written.get(SUMMARY_MARK, "")).startswith("probe ")
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise SettingError(parameter, f"exists and is not a JSON summary probe wrote ({parameter})", f"choose another {parameter} path, or move the file", path)


def write_summary(path: str | Path, summary: dict, indent: int | None = None) -> Path:
    """A summary file (``--json``, ``--settings-out``), marked as probe's so that a later run may
    replace it and nothing else: ``check_output_file`` replaces only a JSON object carrying the mark."""
    from .._version import __version__

    return write_json(path, {SUMMARY_MARK: f"probe {__version__}", **summary}, indent=indent)
