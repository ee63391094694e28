"""The label-hygiene index (``panel-images.json``) read without a Python object per image and
without its text: at ImageNet's 1.28 M training images the index is about 125 MB of text, which
``json.loads`` turned into several times that in dicts, and which holding whole (to look names up
later) still kept in every labelled command. The file keeps its format (``hygiene`` writes it as
before). In the compact form ``write_json`` gives it, it is read ``BLOCK`` characters at a time
(``Blocks``) and kept as sorted arrays of 32-byte digests, each with the byte offset of its name,
so a name is read again from the file when asked for. An index of any other layout is decoded one
member at a time from its whole text (``json.decoder.scanstring`` for keys,
``JSONDecoder.raw_decode`` for values), with the same answers. The memo of hashed files
(``panel-hashes.json``) is ``hash_memo``'s, which shares the block reading and the patterns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from json.decoder import WHITESPACE, scanstring
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..infra import provenance

DECODER = json.JSONDecoder()
CHUNK = 1024  # members decoded before their digests join the arrays
BLOCK = 1 << 20  # characters of a cache file read at a time
LONGEST = 1 << 16  # a member longer than this sends the file to the whole-text reading
_HEX = frozenset("0123456789abcdef")
TEXT = r'"([^"\\\x00-\x1f]*)"'  # a JSON string without escapes
INT = r"(-?(?:0|[1-9][0-9]*))"
_HASH_MEMBER = re.compile(r'"([0-9a-f]{64})":' + TEXT)


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


def _skip(text: str, i: int) -> int:
    return WHITESPACE.match(text, i).end()


def members(text: str, i: int) -> Iterator[tuple[str, int]]:
    """Each member of the JSON object starting at ``text[i]``: (key, where its value starts). The
    caller hands back where the value ended (``send``); ValueError where the text is not JSON."""
    i = _skip(text, i)
    if text[i : i + 1] != "{":
        raise ValueError("not an object")
    i = _skip(text, i + 1)
    if text[i : i + 1] == "}":
        return i + 1
    while True:
        if text[i : i + 1] != '"':
            raise ValueError("a key is not a string")
        key, i = scanstring(text, i + 1)
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("no colon")
        end = yield key, _skip(text, i + 1)
        i = _skip(text, end)
        if text[i : i + 1] == "}":
            return i + 1
        if text[i : i + 1] != ",":
            raise ValueError("no comma")
        i = _skip(text, i + 1)


def walk(text: str, i: int, each) -> int:
    """Call ``each(key, value_start)`` (which returns where the value ended) for every member of the
    object at ``text[i]``; return where the object ends."""
    it = members(text, i)
    try:
        key, start = next(it)
        while True:
            key, start = it.send(each(key, start))
    except StopIteration as stop:
        return stop.value


def whole(text: str, end: int) -> None:
    """Refuse text after the top-level value, as ``json.loads`` does."""
    if _skip(text, end) != len(text):
        raise ValueError("extra data")


def _plain(pattern: re.Pattern, text: str, i: int, take) -> int | None:
    """Where the object at ``text[i]`` ends when it is only ``pattern``'s members, written compact
    (as ``write_json`` writes them), handing ``take`` the matches a chunk at a time; None where it
    has another form (the caller then undoes what it took and reads it member by member)."""
    if text[i : i + 1] != "{":
        return None
    pos = i + 1
    if text[pos : pos + 1] == "}":
        return pos + 1
    chunk: list[re.Match] = []
    for found in pattern.finditer(text, pos):
        if found.start() != pos:
            return None
        chunk.append(found)
        pos = found.end()
        if text[pos : pos + 1] == "}":
            take(chunk)
            return pos + 1
        if text[pos : pos + 1] != ",":
            return None
        pos += 1
        if len(chunk) >= CHUNK:
            take(chunk)
            chunk = []
    return None


class NotPlain(Exception):
    """The file is not in the compact form ``write_json`` gives it: read it whole instead."""


class Blocks:
    """A cache file's text read ``block`` characters at a time from byte ``start``, decoded as ASCII
    (``write_json`` escapes every other character), so that the character at ``pos`` sits at byte
    ``base + pos`` and can be read again later; other bytes raise ``NotPlain``."""

    def __init__(self, handle: BinaryIO, block: int, start: int = 0):
        handle.seek(start)
        self.handle, self.block, self.base, self.text, self.pos, self.eof = handle, block, start, "", 0, False
        self.more()

    def more(self) -> bool:
        """Drop the text before ``pos`` and read another block; False at the end of the file."""
        if self.eof:
            return False
        extra = self.handle.read(self.block)
        self.eof = not extra
        try:
            added = extra.decode("ascii")
        except UnicodeDecodeError:
            raise NotPlain from None
        self.base += self.pos
        self.text, self.pos = self.text[self.pos :] + added, 0
        return not self.eof

    def peek(self) -> str:
        """The next character ('' at the end of the file)."""
        while self.pos >= len(self.text) and self.more():
            pass
        return self.text[self.pos : self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise NotPlain
        self.pos += 1

    def decoded(self, decode: Callable[[str, int], tuple[Any, int]]) -> Any:
        """The value ``decode(text, pos)`` gives, the text read further while the value may be cut
        by the block's end (a number is whole only where a character follows it)."""
        while True:
            try:
                value, end = decode(self.text, self.pos)
                if end < len(self.text) or self.eof:
                    self.pos = end
                    return value
            except ValueError:
                if self.eof:
                    raise NotPlain from None
            if len(self.text) - self.pos > LONGEST:
                raise NotPlain
            self.more()

    def key(self) -> str:
        """A member's key and its colon."""
        if self.peek() != '"':
            raise NotPlain
        key = self.decoded(lambda text, at: scanstring(text, at + 1))
        self.expect(":")
        return key

    def walk(self, each: Callable[[str], None]) -> None:
        """``each(key)`` (which reads the value) for every member of the compact object at ``pos``."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            each(self.key())
            after = self.peek()
            self.pos += 1
            if after == "}":
                return
            if after != ",":
                raise NotPlain

    def rest_blank(self) -> None:
        """Refuse anything but whitespace after the top-level value, as ``json.loads`` does."""
        while True:
            if WHITESPACE.match(self.text, self.pos).end() != len(self.text):
                raise NotPlain
            self.pos = len(self.text)
            if not self.more():
                return


def plain_chunks(blocks: Blocks, pattern: re.Pattern, size: int = CHUNK) -> Iterator[list[re.Match]]:
    """The members of the object at ``blocks.pos``, ``size`` matches at a time, where it is only
    ``pattern``'s members written compact (``NotPlain`` otherwise); leaves ``pos`` after its "}".
    Each chunk's matches (and ``blocks.base``) refer to the text as it is when the chunk comes: use
    them before asking for the next."""
    blocks.expect("{")
    if blocks.peek() == "}":
        blocks.pos += 1
        return
    chunk: list[re.Match] = []
    while True:
        found = pattern.match(blocks.text, blocks.pos)
        if found is None or found.end() >= len(blocks.text):  # not a member, or cut by the block's end
            if found is None and len(blocks.text) - blocks.pos > LONGEST:
                raise NotPlain
            if chunk:
                yield chunk
                chunk = []
            if blocks.more():
                continue
            raise NotPlain
        chunk.append(found)
        after = blocks.text[found.end()]
        blocks.pos = found.end() + 1
        if after == "}":
            break
        if after != ",":
            raise NotPlain
        if len(chunk) >= size:
            yield chunk
            chunk = []
    yield chunk


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object kept in the cache root, decoded whole; an unreadable one only costs its rebuilding."""
    try:
        found = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def read_text(path: Path) -> str | None:
    try:
        return path.read_text() if path.is_file() else None
    except ValueError:  # undecodable bytes: json.loads of the text would have failed too
        return None


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


class Index:
    """``panel-images.json`` read panel by panel into digest arrays: by blocks where it is in the
    compact form ``write_json`` gives it (``text`` is then None and names are read from the file
    again), else decoded from its whole text, which is kept for the names asked for."""

    def __init__(self, path: Path, block: int = BLOCK):
        self.path, self.block = path, block
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
                self._streamed_hashes(panel, blocks)
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
        rows = _rows(np.frombuffer(digests, np.uint8).reshape(-1, 32))
        order = np.argsort(rows, kind="stable")
        panel.sorted = rows[order]
        del rows, digests
        panel.starts = np.frombuffer(starts, np.int64)[order]
        if (panel.sorted[1:] == panel.sorted[:-1]).any():
            raise NotPlain  # a repeated digest: the text reading keeps the last

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

        if self.text[_skip(self.text, start) : _skip(self.text, start) + 1] != "{":
            raise ValueError("a panel is not an object")
        return walk(self.text, start, field)

    def _hashes(self, panel: Panel, at: int) -> int:
        parts: list[bytes] = []
        starts: list[np.ndarray] = []

        def take(chunk: list[re.Match]) -> None:
            parts.append(bytes.fromhex("".join(m[1] for m in chunk)))
            starts.append(np.fromiter((m.start(2) - 1 for m in chunk), np.int64, len(chunk)))

        end = _plain(_HASH_MEMBER, self.text, at, take)
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
        if self.text is not None:
            return DECODER.raw_decode(self.text, int(panel.starts[position]))[0]
        with open(self.path, "rb") as handle:
            return Blocks(handle, min(self.block, 4096), int(panel.starts[position])).decoded(lambda text, at: scanstring(text, at + 1))

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
