"""A JSON object in probe's cache read a member at a time, never decoded whole into Python objects.

The label-hygiene files (``hash_files``' index, ``hash_memo``'s memo) grow with every panel read:
ImageNet's training set makes them hundreds of MB of text. In the compact form ``write_json`` gives
them they are read ``BLOCK`` characters at a time (``Blocks``, ``plain_chunks``), and ``NotPlain``
sends any other form (written by hand or by another tool) to the reading of its whole text member
by member (``members``, ``walk``: ``json.decoder.scanstring`` for keys, ``JSONDecoder.raw_decode``
for values), which gives the answers ``json.loads`` would.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from json.decoder import WHITESPACE, scanstring
from pathlib import Path
from typing import Any, BinaryIO

DECODER = json.JSONDecoder()
CHUNK = 1024  # members decoded before their digests join the arrays
BLOCK = 1 << 20  # characters of a cache file read at a time
LONGEST = 1 << 16  # a member longer than this sends the file to the whole-text reading
TEXT = r'"([^"\\\x00-\x1f]*)"'  # a JSON string without escapes
INT = r"(-?(?:0|[1-9][0-9]*))"


def after_blank(text: str, i: int) -> int:
    """Where the whitespace at ``text[i]`` ends."""
    return WHITESPACE.match(text, i).end()


def members(text: str, i: int) -> Iterator[tuple[str, int]]:
    """Each member of the JSON object starting at ``text[i]``: (key, where its value starts). The
    caller hands back where the value ended (``send``); ValueError where the text is not JSON."""
    i = after_blank(text, i)
    if text[i : i + 1] != "{":
        raise ValueError("not an object")
    i = after_blank(text, i + 1)
    if text[i : i + 1] == "}":
        return i + 1
    while True:
        if text[i : i + 1] != '"':
            raise ValueError("a key is not a string")
        key, i = scanstring(text, i + 1)
        i = after_blank(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("no colon")
        end = yield key, after_blank(text, i + 1)
        i = after_blank(text, end)
        if text[i : i + 1] == "}":
            return i + 1
        if text[i : i + 1] != ",":
            raise ValueError("no comma")
        i = after_blank(text, i + 1)


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
    if after_blank(text, end) != len(text):
        raise ValueError("extra data")


def plain_members(pattern: re.Pattern, text: str, i: int, take) -> int | None:
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


@functools.cache
def _separated(pattern: re.Pattern) -> re.Pattern:
    """``pattern`` followed by its member's separator (the last group: a comma, or the closing brace)."""
    return re.compile(f"(?:{pattern.pattern})([,}}])", pattern.flags)


def plain_chunks(blocks: Blocks, pattern: re.Pattern, size: int = CHUNK) -> Iterator[list[re.Match]]:
    """The members of the object at ``blocks.pos``, ``size`` matches at a time, where it is only
    ``pattern``'s members written compact (``NotPlain`` otherwise); leaves ``pos`` after its "}".
    Each chunk's matches (and ``blocks.base``) refer to the text as it is when the chunk comes: use
    them before asking for the next. The members of a block are found by one ``finditer`` (each
    must start where the last one's separator ended); one cut by the block's end is read again
    with the next block."""
    blocks.expect("{")
    if blocks.peek() == "}":
        blocks.pos += 1
        return
    separated = _separated(pattern)
    last = separated.groups
    chunk: list[re.Match] = []
    while True:
        pos = blocks.pos
        for found in separated.finditer(blocks.text, pos):
            if found.start() != pos:
                break
            chunk.append(found)
            pos = found.end()
            if found[last] == "}":
                blocks.pos = pos
                yield chunk
                return
            if len(chunk) >= size:
                blocks.pos = pos
                yield chunk
                chunk = []
        blocks.pos = pos  # no member here: one cut by the block's end, or another form
        if len(blocks.text) - pos > LONGEST:
            raise NotPlain
        if chunk:
            yield chunk
            chunk = []
        if not blocks.more():
            raise NotPlain


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
