"""The ledger: an append-only, hash-chained record of every read of labels.

``ledger.jsonl`` in the cache root holds one JSON object per line (keys sorted, no spaces):

    n                   entry number, equal to its line number (1-based)
    time                UTC, ISO 8601
    panel, role         which panel was read (``train``, ``val`` or ``test``)
    annotations         the annotation file's path, and ``annotation_sha256`` of its bytes
    images              how many images' labels were handed out, ``images_sha256`` of their
                        sorted file names (one per line)
    purpose             why (``score``, ``sweep``, ``probe``...), ``command`` the command line
    checkpoint          sha256 of the checkpoint whose outputs the labels will meet (or null)
    unseal              the reason given to open a sealed test panel (or null)
    toolkit_version     the probe that read them (entries written before it have none)
    prev                sha256 of the previous line's bytes (64 zeros for the first line)
    hash                sha256 of this entry without ``hash`` (an edit of the line shows at once)

``ledger.head`` holds ``{"n": lines, "last": sha256 of the last line}`` and is rewritten after every
append, so deleting or editing the last line is detected too. An entry's id, which results
record, is the sha256 of its line. Appends hold an exclusive ``flock`` on ``ledger.lock`` and are
fsynced before the caller gets anything back.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError

LEDGER = "ledger.jsonl"
HEAD = "ledger.head"
ZERO = "0" * 64


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def self_hash(entry: dict[str, Any]) -> str:
    return sha256(canonical({k: v for k, v in entry.items() if k != "hash"}))


@dataclass(frozen=True)
class Entry:
    """One ledger line: its id (sha256 of the line), its number and its fields."""

    id: str
    n: int
    fields: dict[str, Any]


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "ledger.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _lines(path: Path) -> list[bytes]:
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def append(root: str | Path, fields: dict[str, Any]) -> Entry:
    """Append one entry (numbered and chained here) and return it once it is on disk."""
    root = Path(root)
    path = root / LEDGER
    with _locked(root):
        lines = _lines(path)
        entry = dict(fields, n=len(lines) + 1, prev=sha256(lines[-1]) if lines else ZERO)
        entry["hash"] = self_hash(entry)
        line = canonical(entry)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        entry_id = sha256(line)
        tmp = root / f".{HEAD}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({"n": entry["n"], "last": entry_id}))
        os.replace(tmp, root / HEAD)
    return Entry(id=entry_id, n=entry["n"], fields=entry)


def entries(root: str | Path) -> list[Entry]:
    """Every entry, in order (lines that are not JSON are skipped; ``verify`` reports them)."""
    out = []
    for line in _lines(Path(root) / LEDGER):
        try:
            fields = json.loads(line)
        except ValueError:
            continue
        out.append(Entry(id=sha256(line), n=int(fields.get("n", 0)), fields=fields))
    return out


def find(root: str | Path, entry_id: str) -> Entry | None:
    """The entry whose id (or an unambiguous prefix of at least 8 characters) is ``entry_id``."""
    if len(entry_id) < 8:
        return None
    found = [e for e in entries(root) if e.id.startswith(entry_id)]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class Problem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def verify(root: str | Path) -> list[Problem]:
    """Every sign of tampering, each naming a line; an empty list means the chain holds."""
    root = Path(root)
    lines = _lines(root / LEDGER)
    problems: list[Problem] = []
    for i, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict):
                raise ValueError
        except ValueError:
            problems.append(Problem(i, "is not a JSON object (edited)"))
            continue
        if entry.get("hash") != self_hash(entry):
            problems.append(Problem(i, "was edited (its content no longer matches its own hash)"))
        n = entry.get("n")
        if n != i:
            if isinstance(n, int) and n > i:
                problems.append(Problem(i, f"is entry {n}: entries {i}..{n - 1} were deleted before it"))
            else:
                problems.append(Problem(i, f"is entry {n}: a line was inserted here (or copied)"))
            continue
        expected = sha256(lines[i - 2]) if i > 1 else ZERO
        if entry.get("prev") != expected:
            problems.append(Problem(i - 1, f"was edited, or a line was inserted or deleted between lines {i - 1} and {i} (line {i}'s prev hash does not match)"))
    head_path = root / HEAD
    if not lines:
        if head_path.is_file():
            problems.append(Problem(1, "the ledger is empty but ledger.head records entries: lines were deleted"))
        return problems
    try:
        head = json.loads(head_path.read_text())
    except (OSError, ValueError):
        problems.append(Problem(len(lines), "ledger.head is missing or unreadable, so the end of the ledger cannot be checked"))
        return problems
    count = len(lines)
    if head.get("n") != count:
        n = head.get("n")
        if isinstance(n, int) and n > count:
            problems.append(Problem(count + 1, f"lines {count + 1}..{n} were deleted from the end"))
        else:
            problems.append(Problem((n or 0) + 1, f"lines {(n or 0) + 1}..{count} were appended outside probe"))
    elif head.get("last") != sha256(lines[-1]):
        problems.append(Problem(count, "the last line was edited (it no longer matches ledger.head)"))
    return problems


def require_entry(root: str | Path, entry_id: str) -> Entry:
    entry = find(root, entry_id)
    if entry is None:
        raise ProbeError(Path(root) / LEDGER, f"has no entry {entry_id}", "run `probe ledger show` to list entries")
    return entry
