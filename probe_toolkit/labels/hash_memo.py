"""``panel-hashes.json``, the memo of image files already hashed (absolute path text → [size,
mtime_ns, sha256 hex]), read and extended a block of its text at a time.

The memo holds every path of every panel ever read from one cache root: about 150 bytes of text
an image, so 190 MB for ImageNet's training set. Reading it whole (its text, then a dict of
lists) kept several times that in every labelled command; a first read, which adds the panel's
files, decoded it whole once more to write it back. Here a memo in the compact form ``write_json``
gives it is read ``BLOCK`` characters at a time, its members matched as they come, and written
back member by member (``write_memo``) with the bytes ``write_json`` would write for
``{**old, **fresh}``. A memo of any other layout (written by hand, or by another tool) is decoded
whole as before, with the same answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..infra.atomic import write_json, write_json_object
from ..infra.names import as_keys
from . import hash_files, json_members

BLOCK = json_members.BLOCK
_MEMBER = re.compile(json_members.TEXT + r":\[" + json_members.INT + "," + json_members.INT + r',"([0-9a-f]{64})"\]')


def _plain_chunks(path: Path, block: int) -> Iterator[list[re.Match]]:
    """The memo's members, a few thousand matches at a time, read ``block`` characters at a time;
    ``json_members.NotPlain`` where the text is not one object of ``_MEMBER``'s members written
    compact, then only whitespace (``json.loads``' rule). Each chunk's matches refer to the text
    read so far: use them before asking for the next."""
    with open(path, "rb") as handle:
        blocks = json_members.Blocks(handle, block)
        yield from json_members.plain_chunks(blocks, _MEMBER)
        blocks.rest_blank()


def _lookup(ordered: np.ndarray, chunk: list[re.Match]) -> tuple[np.ndarray, np.ndarray]:
    """For each match of ``chunk``: where its key's run starts and ends in ``ordered``."""
    got = as_keys([m[1] for m in chunk])
    return np.searchsorted(ordered, got, "left"), np.searchsorted(ordered, got, "right")


def memo_entries(path: Path, wanted: Sequence[str], block: int = BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each path text in ``wanted``: size and mtime_ns (int64), found (bool) and an (n, 32) digest
    array, from the memo's members of the form [int, int, sha256 hex] (the last where a key repeats);
    a path with no such member is not ``found``. An unreadable memo finds nothing (as before)."""
    n = len(wanted)
    keys = as_keys(wanted)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    del keys
    size, mtime, found = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    digests = np.zeros((n, 32), np.uint8)
    if not n or not path.is_file():
        return size, mtime, found, digests
    try:
        for chunk in _plain_chunks(path, block):
            lo, hi = _lookup(ordered, chunk)
            for j in np.flatnonzero(hi > lo):
                match, at = chunk[j], order[lo[j] : hi[j]]
                small = all(-(2**63) <= int(v) < 2**63 for v in match.group(2, 3))
                found[at] = small
                if small:
                    size[at], mtime[at] = int(match[2]), int(match[3])
                    digests[at] = np.frombuffer(bytes.fromhex(match[4]), np.uint8)
        return size, mtime, found, digests
    except json_members.NotPlain:  # another layout, or bytes that are not ASCII text
        found[:] = False
    _whole_entries(path, ordered, order, size, mtime, found, digests)
    return size, mtime, found, digests


def _whole_entries(path: Path, ordered, order, size, mtime, found, digests) -> None:
    """``memo_entries`` for a memo of another layout: its whole text, member by member."""
    text = json_members.read_text(path)
    if text is None:
        return
    pending: list[tuple[str, Any]] = []

    def flush() -> None:
        got = as_keys([k for k, _ in pending])
        lo, hi = np.searchsorted(ordered, got, "left"), np.searchsorted(ordered, got, "right")
        for j in np.flatnonzero(hi > lo):
            value = pending[j][1]
            at = order[lo[j] : hi[j]]
            usable = isinstance(value, list) and len(value) == 3 and all(type(v) is int and -(2**63) <= v < 2**63 for v in value[:2])
            digest = hash_files.digest_bytes(value[2]) if usable else None
            found[at] = digest is not None
            if digest is not None:
                size[at], mtime[at] = value[0], value[1]
                digests[at] = np.frombuffer(digest, np.uint8)
        pending.clear()

    def each(key: str, start: int) -> int:
        value, end = json_members.DECODER.raw_decode(text, start)
        pending.append((key, value))
        if len(pending) >= json_members.CHUNK:
            flush()
        return end

    try:
        json_members.whole(text, json_members.walk(text, 0, each))
        if pending:
            flush()
    except (ValueError, IndexError):
        found[:] = False


class Fresh:
    """The memo entries ``hygiene.content_hashes`` made afresh, as arrays: for each of ``positions``
    (into ``paths``, the panel's path texts, in its order) the file's size, mtime_ns and sha256."""

    def __init__(self, paths: Sequence[str], positions: np.ndarray, size: np.ndarray, mtime: np.ndarray, digests: np.ndarray):
        self.paths, self.positions, self.size, self.mtime, self.digests = paths, positions, size, mtime, digests

    def __len__(self) -> int:
        return len(self.positions)

    def items(self) -> Iterator[tuple[str, list]]:
        """(path text, [size, mtime_ns, sha256 hex]) in the panel's order: the dict this replaced."""
        for j, p in enumerate(self.positions):
            yield self.paths[int(p)], [int(self.size[j]), int(self.mtime[j]), self.digests[j].tobytes().hex()]

    def member(self, j: int) -> str:
        """Entry ``j`` as ``write_json`` writes it inside the memo's object."""
        return f'{json.dumps(self.paths[int(self.positions[j])])}:[{int(self.size[j])},{int(self.mtime[j])},"{self.digests[j].tobytes().hex()}"]'


def write_memo(path: Path, fresh: Fresh, block: int = BLOCK) -> None:
    """Write the memo as ``{**old, **fresh}`` (the bytes ``write_json`` writes for that dict: old
    keys in their order with fresh values in their place, then the new keys in the panel's order),
    the old memo read ``block`` characters at a time; one of another layout is decoded whole."""
    if not len(fresh):
        return
    keys = as_keys([fresh.paths[int(p)] for p in fresh.positions])
    distinct, first = np.unique(keys, return_index=True)  # a name listed twice: its first entry, as a dict keeps it
    del keys
    used = np.zeros(len(distinct), bool)

    def members() -> Iterator[str]:
        if path.is_file():
            for chunk in _plain_chunks(path, block):
                lo, hi = _lookup(distinct, chunk)
                for j, match in enumerate(chunk):
                    if hi[j] > lo[j]:  # a key of fresh: its entry in the old key's place (once, as a dict holds it)
                        if not used[lo[j]]:
                            used[lo[j]] = True
                            yield fresh.member(int(first[lo[j]]))
                    else:
                        yield f'{json.dumps(match[1])}:[{int(match[2])},{int(match[3])},"{match[4]}"]'
        for j in np.sort(first[~used]):
            yield fresh.member(int(j))

    try:
        write_json_object(path, members())
    except json_members.NotPlain:  # another layout (nothing was written): the whole memo decoded, as before
        write_json(path, {**json_members.read_json(path), **dict(fresh.items())})
