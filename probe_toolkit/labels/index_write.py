"""``panel-images.json`` written back with one panel's entry replaced, a member at a time.

A panel's first read adds its entry to the index of every panel's content hashes: 1.28 M
digests and names for ImageNet's training set. Decoding the whole index into dicts to add the
entry (and building the entry itself as a dict) held several times the file's text; here the
other panels are copied as ``hash_files.Index`` reads their text again (from the old file, by
blocks, while the new one is written beside it), or re-encoded member by member from the text it
kept, and the new entry is written from the digest arrays, so the bytes are those ``write_json`` writes for
``{**index, panel: entry}`` with one member's text in memory at a time. An index this cannot
re-encode member by member (a panel whose hashes repeat a key or are not all digests → names,
text that is not an object of panels) is left to the whole-dict writing (``write_panel`` says
False before writing anything).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from ..infra.atomic import json_text, write_json_parts
from .hash_files import ContentHashes, Index, Panel


def _compact(value: object) -> str:
    return json_text(value, separators=(",", ":"))


def _hashes(pairs: Iterator[tuple[str, object]]) -> Iterator[str]:
    yield "{"
    for i, (digest, name) in enumerate(pairs):
        yield f"{',' if i else ''}{json.dumps(digest)}:{_compact(name)}"
    yield "}"


def _panel(index: Index, panel: Panel) -> Iterator[str]:
    """An unchanged panel's value as ``write_json`` writes it once decoded (its keys where they first
    appear, each one's last value)."""
    yield "{"
    for i, key in enumerate(panel.order):
        yield f"{',' if i else ''}{json.dumps(key)}:"
        if key == "hashes":
            as_read = index.hashes_text(panel)
            yield from as_read if as_read is not None else _hashes(index.pairs(panel))
        else:
            yield _compact(panel.fields[key])
    yield "}"


def _merged(index: Index, kept: Panel | None, hashes: ContentHashes) -> Iterator[tuple[str, object]]:
    """``{**kept hashes, **hashes}``'s pairs: the kept ones in their order, each digest this read holds
    under this read's name, then this read's other digests in ``hashes``' order."""
    used = np.zeros(len(hashes), bool)
    if kept is not None:
        for digest, name in index.pairs(kept):
            at = hashes.position(bytes.fromhex(digest))
            if at is None:
                yield digest, name
            else:
                used[at] = True
                yield digest, hashes.name(at)
    yield from hashes.items(skip=used)


def _writable(index: Index) -> bool:
    """Whether every panel of ``index`` can be re-encoded member by member."""
    return index.readable and not any(p.has_hashes and not p.plain for p in index.panels.values())


def _write(path, index: Index, names: list[str], own: str | None = None, entry: Iterator[str] | None = None) -> None:
    """The index of ``names``' panels in that order: each as read, but ``own``, whose value ``entry`` gives."""

    def parts() -> Iterator[str]:
        yield "{"
        for i, name in enumerate(names):
            yield f"{',' if i else ''}{json.dumps(name)}:"
            if name == own and entry is not None:
                yield from entry
            else:
                yield from _panel(index, index.panels[name])
        yield "}\n"

    write_json_parts(path, parts())


def write_panel(path, index: Index, panel_name: str, role: str, annotation_sha256: str, hashes: ContentHashes) -> bool:
    """Write the index with ``panel_name``'s entry {role, annotation_sha256, hashes} (its old hashes
    kept where role and annotation are unchanged, as ``hygiene.check_overlap`` always did); False,
    with nothing written, where the index must be decoded whole instead."""
    if not _writable(index):
        return False
    own = index.panels.get(panel_name)
    keep = own is not None and own.has_hashes and own.fields.get("annotation_sha256") == annotation_sha256 and own.fields.get("role") == role

    def entry() -> Iterator[str]:
        yield f'{{"role":{json.dumps(role)},"annotation_sha256":{json.dumps(annotation_sha256)},"hashes":'
        yield from _hashes(_merged(index, own if keep else None, hashes))
        yield "}"

    _write(path, index, list(index.panels) if own is not None else [*index.panels, panel_name], panel_name, entry())
    return True


def write_without(path, index: Index, panel_name: str) -> bool:
    """Write the index without ``panel_name``'s entry (``probe panel add --replace`` forgets it); False,
    with nothing written, where the index must be decoded whole instead."""
    if not _writable(index):
        return False
    _write(path, index, [name for name in index.panels if name != panel_name])
    return True
