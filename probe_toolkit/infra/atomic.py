"""Files appear whole or not at all: write to a temporary name beside the target, then rename."""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import ProbeError


def undefined_as_null(obj: Any) -> Any:
    """``obj`` with every non-finite float (an undefined value: segm AP on a panel of boxes, a
    mean over nothing) as None, so it is written as JSON null: Python's NaN token is not JSON,
    and other readers (jq, JavaScript's JSON.parse) refuse the whole file. A container that holds
    no undefined value is ``obj`` itself, not a copy (a data set's index of file digests is
    written without a second dict of it)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        changed = {k: n for k, v in obj.items() if (n := undefined_as_null(v)) is not v}
        return {k: changed[k] if k in changed else v for k, v in obj.items()} if changed else obj
    if isinstance(obj, (list, tuple)):
        items = [undefined_as_null(v) for v in obj]
        return items if any(n is not v for n, v in zip(items, obj)) else obj
    return obj


def json_text(obj: Any, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    """Strict JSON: undefined values as null (``undefined_as_null``)."""
    return json.dumps(undefined_as_null(obj), indent=indent, separators=separators, allow_nan=False)


def json_parts(obj: Any, indent: int | None = None, separators: tuple[str, str] | None = None) -> Iterator[str]:
    """``json_text``'s text in the encoder's pieces (the same characters), never the whole at once."""
    return json.JSONEncoder(indent=indent, separators=separators, allow_nan=False).iterencode(undefined_as_null(obj))


def umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``; else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish(tmp: Path, out: Path) -> Path:
    """Move a finished temporary file into place, with the mode every file probe writes has: the
    umask's (``0666 & ~umask``), whatever mode the library that wrote it chose (safetensors'
    ``save_file`` makes 0600 files)."""
    os.chmod(tmp, 0o666 & ~umask())
    os.replace(tmp, out)
    return out


def write_json(path: str | Path, obj: Any, indent: int | None = None) -> Path:
    """JSON written atomically (temp name, then ``os.replace``), undefined values as null; the
    text goes to the file piece by piece (a data set's index of digests is tens of MB of text)."""
    separators = None if indent else (",", ":")
    return write_json_parts(path, itertools.chain(json_parts(obj, indent, separators), ["\n"]))


def write_json_list(path: str | Path, items: Iterable[str]) -> Path:
    """A JSON list written atomically from its items' texts, each ``json_text`` of an item (or of
    several, comma-joined, their brackets dropped; an empty text adds nothing): the bytes
    ``write_json`` writes for the whole list, with one item's text in memory at a time."""

    def parts() -> Iterator[str]:
        yield "["
        first = True
        for text in items:
            if text:
                yield text if first else "," + text
                first = False
        yield "]\n"

    return write_json_parts(path, parts())


def write_json_object(path: str | Path, members: Iterable[str]) -> Path:
    """A JSON object written atomically from its members' texts (``"key":value``, each as
    ``write_json`` writes it): the bytes ``write_json`` writes for the whole object, with one
    member's text in memory at a time."""

    def parts() -> Iterator[str]:
        yield "{"
        for i, text in enumerate(members):
            yield text if i == 0 else "," + text
        yield "}\n"

    return write_json_parts(path, parts())


def write_json_parts(path: str | Path, parts: Iterable[str]) -> Path:
    """Text written atomically from its pieces, one at a time (the caller's pieces make the JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            for part in parts:
                handle.write(part)
        publish(tmp, path)
    except BaseException as error:  # a full disk or Ctrl-C leaves neither a half file nor the temp name
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise ProbeError(path, f"could not be written ({error.strerror or error})", "pass a file path (not a folder) on a disk with free space") from None
        raise
    return path
