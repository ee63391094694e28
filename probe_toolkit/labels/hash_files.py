"""The label-hygiene index (``panel-images.json``) read without a Python object per image and
without its text: at ImageNet's 1.28 M training images the index is about 125 MB of text, which
``json.loads`` turned into several times that in dicts, and which holding whole (to look names up
later) still kept in every labelled command. The file keeps its format (``hygiene`` writes it as
before). In the compact form ``write_json`` gives it, it is read ``BLOCK`` characters at a time
(``json_members.Blocks``) and kept as sorted arrays of 32-byte digests, each with the byte offset of its name,
so a name is read again from the file when asked for. A read that only asks how much each other
panel shares with one set of digests (``against``) keeps none of those panels' arrays: each is
matched against the set as it is read, keeping 8 bytes a digest to find a repeated one (``Passed``).
An index of any other layout is decoded one
member at a time from its whole text (``json.decoder.scanstring`` for keys,
``JSONDecoder.raw_decode`` for values), with the same answers. The memo of hashed files
(``panel-hashes.json``) is ``hash_memo``'s; both read their text with ``json_members``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from json.decoder import scanstring
from pathlib import Path
from typing import Any

import numpy as np

from ..infra import provenance
from ..infra.errors import ProbeError
from .json_members import BLOCK, CHUNK, DECODER, Blocks, NotPlain, after_blank, members, plain_chunks, plain_members, read_text, walk, whole

_HEX = frozenset("0123456789abcdef")
_HASH_MEMBER = re.compile(r'"([0-9a-f]{64})":"([ !#-\[\]-~]*)"')  # a name json.dumps writes as it is: printable ASCII


def digest_bytes(text: Any) -> bytes | None:
    """The 32 bytes of a lowercase sha256 hex text, as ``file_sha256`` writes it; else None."""
    if isinstance(text, str) and len(text) == 64 and _HEX.issuperset(text):
        return bytes.fromhex(text)
    return None


def _rows(digests: np.ndarray) -> np.ndarray:
    """(n, 32) uint8 digests as one void value each (sorted bytewise, as their hex texts sort)."""
    return np.ascontiguousarray(digests, dtype=np.uint8).view("V32").ravel()


class ContentHashes:
    """What ``hygiene.content_hashes`` found: each distinct content's sha256 → the file name holding
    it (the last of several copies, as a dict filled in name order keeps), held as a sorted (m, 32)
    digest array and an index into ``names``."""

    def __init__(self, digests: np.ndarray, names: Sequence[str]):
        rows = _rows(digests)
        self._names = names
        last_first = rows[::-1]
        self.sorted, at = np.unique(last_first, return_index=True)  # sorted distinct digests
        self._last = len(rows) - 1 - at  # the last name holding each
        self._first = np.unique(rows, return_index=True)[1]  # where each first appears (a dict's order)

    def __len__(self) -> int:
        return len(self.sorted)

    def name(self, position: int) -> str:
        """The file name of the ``position``-th digest in sorted order."""
        return self._names[int(self._last[position])]

    def hex(self, position: int) -> str:
        return self.sorted[position].tobytes().hex()

    def list_hash(self) -> str:
        """``provenance.list_hash(sorted(digests as hex))``: the images' content identity."""
        return provenance.list_hash(self.hex(i) for i in range(len(self.sorted)))

    def as_dict(self) -> dict[str, str]:
        """The dict ``content_hashes`` used to return (first-seen order, last name): only for writing."""
        return dict(self.items())

    def items(self, skip: np.ndarray | None = None) -> Iterator[tuple[str, str]]:
        """``as_dict``'s (sha256 hex, name) pairs one at a time, leaving out the digests whose
        ``position`` is True in ``skip``."""
        for i in np.argsort(self._first, kind="stable"):
            if skip is None or not skip[i]:
                yield self.hex(int(i)), self.name(int(i))

    def position(self, digest: bytes) -> int | None:
        """Where a 32-byte digest sits among ``sorted``; None if this set lacks it."""
        row = np.frombuffer(digest, np.uint8).view("V32")
        at = int(np.searchsorted(self.sorted, row)[0])
        return at if at < len(self.sorted) and self.sorted[at] == row[0] else None


class Panel:
    """One panel of ``panel-images.json`` as read: its role and annotation hash (as decoded, or
    absent), whether it has other fields, its digests sorted (``sorted``) with where each one's name
    starts (in the file read by blocks, else in the text), and whether its hashes were all [sha256 hex → name text] without repeats."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.sorted = np.zeros(0, "V32")
        self.starts = np.zeros(0, np.int64)
        self.plain = True  # hashes: an object of distinct hex digests → strings
        self.has_hashes = False
        self.order: list[str] = []  # its keys, "hashes" among them, where each first appears (json.loads' order)
        self.hashes_at = 0  # where the (last) hashes object starts (as ``starts``)
        self.hashes_end = 0  # where it ends, in a file read by blocks
        self.passed: Passed | None = None  # matched against ``Index.against`` as read, its arrays not kept


class Passed:
    """What a panel read past shares with ``Index.against``: how many digests, and for the first of
    them in sorted order its position in ``against`` and the byte offset of this panel's name for it."""

    def __init__(self) -> None:
        self.count = 0
        self.first: tuple[int, int] | None = None  # (position in against, name offset)

    def take(self, against: np.ndarray, rows: np.ndarray, starts: Callable[[int], int]) -> None:
        """Count the ``rows`` (digests as read) that ``against`` holds; ``starts(j)``: row ``j``'s name offset."""
        if not len(against) or not len(rows):
            return
        at = np.searchsorted(against, rows)
        hit = np.flatnonzero(against[np.minimum(at, len(against) - 1)] == rows)
        if not len(hit):
            return
        self.count += len(hit)
        j = int(hit[np.argmin(at[hit])])
        if self.first is None or at[j] < self.first[0]:
            self.first = (int(at[j]), starts(j))


class Index:
    """``panel-images.json`` read panel by panel into digest arrays: by blocks where it is in the
    compact form ``write_json`` gives it (``text`` is then None and names are read from the file
    again), else decoded from its whole text, which is kept for the names asked for.

    ``against`` (sorted ``V32`` digests): read by blocks, every panel but ``own`` is only matched
    against these (``Panel.passed``; ``overlap`` answers for it) and keeps no arrays: a set's check
    beside ImageNet's training panel held that panel's 40 bytes an image."""

    def __init__(self, path: Path, block: int = BLOCK, *, own: str | None = None, against: np.ndarray | None = None):
        self.path, self.block = path, block
        self.own, self.against = own, against
        self.panels: dict[str, Panel] = {}
        self.text: str | None = None
        self.readable = True  # False: text that is not an object of panels (json.loads may still read it)
        if not path.is_file():
            return
        try:
            with open(path, "rb") as handle:
                blocks = Blocks(handle, block)
                blocks.walk(lambda name: self._streamed_panel(name, blocks))
                blocks.rest_blank()
            return
        except NotPlain:
            self.panels = {}
        self.text = read_text(path) or ""
        if not self.text:
            return
        try:
            whole(self.text, walk(self.text, 0, self._panel))
        except (ValueError, IndexError):
            self.panels, self.readable = {}, False  # an unreadable index is rebuilt from the reads that follow (as before)

    def _streamed_panel(self, name: str, blocks: Blocks) -> None:
        panel = self.panels[name] = Panel()  # a repeated panel: the last one counts, as json.loads keeps it

        def field(key: str) -> None:
            if key not in panel.order:
                panel.order.append(key)
            if key == "hashes":
                panel.has_hashes, panel.hashes_at = True, blocks.base + blocks.pos
                if self.against is None or name == self.own:
                    self._streamed_hashes(panel, blocks)
                else:
                    self._passed_hashes(panel, blocks, self.against)
            else:
                panel.fields[key] = blocks.decoded(DECODER.raw_decode)

        blocks.walk(field)

    @staticmethod
    def _streamed_hashes(panel: Panel, blocks: Blocks) -> None:
        """The digests of a hashes object of distinct [sha256 hex → name text] members, sorted, each
        with its name's byte offset; ``NotPlain`` for any other hashes object."""
        digests, starts = bytearray(), bytearray()
        for chunk in plain_chunks(blocks, _HASH_MEMBER):
            digests += bytes.fromhex("".join(m[1] for m in chunk))
            starts += np.fromiter((blocks.base + m.start(2) - 1 for m in chunk), np.int64, len(chunk)).tobytes()
        panel.hashes_end = blocks.base + blocks.pos
        rows = _rows(np.frombuffer(digests, np.uint8).reshape(-1, 32))
        order = np.argsort(rows, kind="stable")
        panel.sorted = rows[order]
        del rows, digests
        panel.starts = np.frombuffer(starts, np.int64)[order]
        if (panel.sorted[1:] == panel.sorted[:-1]).any():
            raise NotPlain  # a repeated digest: the text reading keeps the last

    @staticmethod
    def _passed_hashes(panel: Panel, blocks: Blocks, against: np.ndarray) -> None:
        """A hashes object of distinct [sha256 hex → name text] members matched against ``against``
        as it is read (``NotPlain`` for any other): 8 bytes a digest are kept, to find a repeat; two
        digests that share them send the index to the text reading, which keeps them whole."""
        passed, prefixes = Passed(), bytearray()
        for chunk in plain_chunks(blocks, _HASH_MEMBER):
            digests = np.frombuffer(bytes.fromhex("".join(m[1] for m in chunk)), np.uint8).reshape(-1, 32)
            prefixes += digests[:, :8].tobytes()
            passed.take(against, _rows(digests), lambda j, base=blocks.base, chunk=chunk: base + chunk[j].start(2) - 1)
        panel.hashes_end = blocks.base + blocks.pos
        seen = np.frombuffer(prefixes, np.uint64)
        seen.sort()  # in place, in the bytes grown as read: one copy of the prefixes
        if (seen[1:] == seen[:-1]).any():
            raise NotPlain
        panel.passed = passed

    def _panel(self, name: str, start: int) -> int:
        panel = self.panels[name] = Panel()  # a repeated panel: the last one counts, as json.loads keeps it

        def field(key: str, at: int) -> int:
            if key not in panel.order:
                panel.order.append(key)
            if key == "hashes":
                panel.has_hashes, panel.hashes_at = True, at
                if self.text[at : at + 1] == "{":
                    return self._hashes(panel, at)
                panel.plain = False
            value, end = DECODER.raw_decode(self.text, at)
            panel.fields[key] = value
            return end

        if self.text[after_blank(self.text, start) : after_blank(self.text, start) + 1] != "{":
            raise ValueError("a panel is not an object")
        return walk(self.text, start, field)

    def _hashes(self, panel: Panel, at: int) -> int:
        parts: list[bytes] = []
        starts: list[np.ndarray] = []

        def take(chunk: list[re.Match]) -> None:
            parts.append(bytes.fromhex("".join(m[1] for m in chunk)))
            starts.append(np.fromiter((m.start(2) - 1 for m in chunk), np.int64, len(chunk)))

        end = plain_members(_HASH_MEMBER, self.text, at, take)
        if end is not None:
            self._keep(panel, b"".join(parts), np.concatenate(starts) if starts else np.zeros(0, np.int64))
            return end
        return self._hashes_slowly(panel, at)

    def _keep(self, panel: Panel, digests: bytes, starts: np.ndarray) -> None:
        rows = np.frombuffer(digests, np.uint8).reshape(-1, 32)
        distinct, where = np.unique(_rows(rows)[::-1], return_index=True)  # a repeated key: the last counts
        if len(distinct) != len(starts):
            panel.plain = False
        panel.sorted = distinct
        panel.starts = starts[::-1][where]

    def _hashes_slowly(self, panel: Panel, at: int) -> int:
        digests: list[bytes] = []
        starts: list[int] = []

        def each(key: str, start: int) -> int:
            digest = digest_bytes(key)
            if digest is None or self.text[start : start + 1] != '"':
                panel.plain = False
            if digest is not None:
                digests.append(digest)
                starts.append(start)
            return DECODER.raw_decode(self.text, start)[1]

        end = walk(self.text, at, each)
        self._keep(panel, b"".join(digests), np.asarray(starts, np.int64))
        return end

    def name(self, panel: Panel, position: int) -> Any:
        """The name (as decoded) of the ``position``-th of ``panel``'s sorted digests."""
        return self._name_at(int(panel.starts[position]))

    def _name_at(self, start: int) -> Any:
        """The name (as decoded) whose text starts at ``start`` (in the text, or the file read by blocks)."""
        if self.text is not None:
            return DECODER.raw_decode(self.text, start)[0]
        with open(self.path, "rb") as handle:
            return Blocks(handle, min(self.block, 4096), start).decoded(lambda text, at: scanstring(text, at + 1))

    def overlap(self, panel: Panel, against: np.ndarray) -> tuple[int, tuple[int, Any] | None]:
        """How many of ``against``'s digests (sorted ``V32``, distinct) ``panel`` holds, and for the first
        of them in sorted order: its position in ``against`` and ``panel``'s name for it."""
        if panel.passed is not None:
            if against is not self.against:
                raise ValueError("a panel read past was matched against another set of digests")
            first = panel.passed.first
            return panel.passed.count, None if first is None else (first[0], self._name_at(first[1]))
        shared, mine, theirs = np.intersect1d(against, panel.sorted, assume_unique=True, return_indices=True)
        return len(shared), (int(mine[0]), self.name(panel, int(theirs[0]))) if len(shared) else None

    def chunks(self, panel: Panel, size: int = CHUNK) -> Iterator[list[tuple[str, Any]]]:
        """``panel``'s hashes as (key, decoded value) pairs in the file's order, ``size`` at a time."""
        if self.text is None:
            with open(self.path, "rb") as handle:
                for chunk in plain_chunks(Blocks(handle, self.block, panel.hashes_at), _HASH_MEMBER, size):
                    yield [m.group(1, 2) for m in chunk]
            return
        walker, pairs = members(self.text, panel.hashes_at), []
        try:
            key, start = next(walker)
            while True:
                value, end = DECODER.raw_decode(self.text, start)
                pairs.append((key, value))
                if len(pairs) >= size:
                    yield pairs
                    pairs = []
                key, start = walker.send(end)
        except StopIteration:
            yield pairs

    def hashes_text(self, panel: Panel) -> Iterator[str] | None:
        """``panel``'s hashes object as written in a file read by blocks, a block at a time: the text
        ``write_json`` writes for it once decoded (compact, distinct digests, names of printable
        ASCII other than quote and backslash, which ``json.dumps`` leaves as they are); None for
        an index kept as text."""
        if self.text is not None:
            return None

        def read() -> Iterator[str]:
            with open(self.path, "rb") as handle:
                handle.seek(panel.hashes_at)
                left = panel.hashes_end - panel.hashes_at
                while left > 0:
                    block = handle.read(min(self.block, left))
                    if not block:
                        raise ProbeError(str(self.path), "was cut short while probe read it (another program writes it?)", "run the command again")
                    left -= len(block)
                    yield block.decode("ascii")

        return read()

    def pairs(self, panel: Panel) -> Iterator[tuple[str, Any]]:
        """``panel``'s hashes as (key, decoded value) pairs in the file's order, one at a time (read
        a few dozen at a time: the index is written while they are read)."""
        for chunk in self.chunks(panel, 64):
            yield from chunk

    def same_names(self, panel: Panel, hashes: ContentHashes) -> bool:
        """Whether ``panel`` holds every digest of ``hashes`` under the same name."""
        at = np.searchsorted(panel.sorted, hashes.sorted)
        inside = at < len(panel.sorted)
        if not inside.all() or not (panel.sorted[at[inside]] == hashes.sorted).all():
            return False
        if self.text is not None:
            return all(self.name(panel, int(a)) == hashes.name(i) for i, a in enumerate(at))
        if not len(hashes):
            return True
        for chunk in self.chunks(panel):  # distinct digests on both sides: each of hashes' is met once
            rows = _rows(np.frombuffer(bytes.fromhex("".join(key for key, _ in chunk)), np.uint8).reshape(-1, 32))
            where = np.minimum(np.searchsorted(hashes.sorted, rows), len(hashes.sorted) - 1)
            for j in np.flatnonzero(hashes.sorted[where] == rows):
                if chunk[j][1] != hashes.name(int(where[j])):
                    return False
        return True
