"""A COCO panel's image classes (``panels.read_classes``), read entry by entry.

k-NN and the linear probes need one class per image (the category covering the largest
annotated area) and its file name, not a ``COCO`` index of every object: ``json.loads`` of a
100,000-image annotation file holds about 60 MiB of Python dicts, then the clipped copy of every
annotation. Here the top-level arrays are decoded one entry at a time (``json.JSONDecoder.raw_decode``),
each entry checked by the same functions as ``schema.problems`` and ``hygiene.clip_geometry``,
and kept as a few columns (ids, categories, areas) before the next one is decoded.

A file this reader cannot take as it comes (any problem of ``schema``, a layout it does not walk:
repeated keys, an array that is not a list of entries, ids beyond 64 bits, an object without a
class) goes through ``panels.read_labels`` whole, which refuses a bad file with the very line it
always has; either way the checks, the ledger entry and the classes are the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..infra.errors import ProbeError
from . import hygiene, schema
from .matching import clean_name

RULE = "largest annotated category (summed area)"
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
SIZES_AT_ONCE = 4096  # images whose files' headers ``hygiene.check_sizes`` reads per call


class _Whole(Exception):
    """The file goes through ``panels.read_labels`` whole."""


@dataclass
class Columns:
    """What k-NN reads of a COCO file: per image (file order) and per annotation (file order)."""

    image_id: np.ndarray  # int64
    file_name: list[str]
    width: np.ndarray  # int64, the recorded or the file's size (what clipping used)
    height: np.ndarray
    ann_image: np.ndarray  # int64 image id
    ann_category: np.ndarray  # int64 category id, -1 where an annotation names none
    ann_area: np.ndarray  # float64, 0 where absent
    ann_crowd: np.ndarray  # bool
    categories: list[tuple[int, str]]  # (id, name) in file order
    clipped: int = 0  # annotations clipping changed (the ledger entry's ``clipped``)


def _space(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()


def _value_end(text: str, i: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, i)
    except ValueError:
        raise _Whole from None


def _entries(text: str, i: int, each: Callable[[int, Any], None]) -> int:
    """Decode the array at ``text[i]`` one entry at a time, calling ``each(n, entry)``; its end."""
    if text[i : i + 1] != "[":
        raise _Whole
    i, n = _space(text, i + 1), 0
    if text[i : i + 1] == "]":
        return i + 1
    while True:
        entry, i = _value_end(text, i)
        each(n, entry)
        n, i = n + 1, _space(text, i)
        if text[i : i + 1] == "]":
            return i + 1
        if text[i : i + 1] != ",":
            raise _Whole
        i = _space(text, i + 1)


def _fields(text: str) -> dict[str, int]:
    """Where each top-level field's value starts; every value decoded once and dropped."""
    i = _space(text, 0)
    if text[i : i + 1] != "{":
        raise _Whole
    at: dict[str, int] = {}
    i = _space(text, i + 1)
    if text[i : i + 1] == "}":
        raise _Whole
    while True:
        key, i = _value_end(text, i)
        i = _space(text, i)
        if not isinstance(key, str) or key in at or text[i : i + 1] != ":":
            raise _Whole
        at[key] = i = _space(text, i + 1)
        i = _entries(text, i, lambda n, entry: None) if text[i : i + 1] == "[" else _value_end(text, i)[1]
        i = _space(text, i)
        if text[i : i + 1] == "}":
            break
        if text[i : i + 1] != ",":
            raise _Whole
        i = _space(text, i + 1)
    if _space(text, i + 1) != len(text) or not {"images", "annotations"} <= set(at):
        raise _Whole
    return at


def text_of(raw: bytes) -> str | None:
    """The file's text as ``json.loads`` decodes its bytes (None where it cannot)."""
    try:
        return raw.decode(json.detect_encoding(raw), "surrogatepass")
    except (UnicodeDecodeError, LookupError):
        return None


def scan(text: str, image_size: Callable[[str], tuple[int, int] | None]) -> Columns | None:
    """The columns of a sound COCO file (checked entry by entry as ``schema.problems`` checks the
    whole), or None when the file must be read whole (a problem, or a layout not walked here)."""
    try:
        return _scan(text, image_size)
    except (_Whole, ProbeError, OverflowError):
        return None


def _scan(text: str, image_size: Callable[[str], tuple[int, int] | None]) -> Columns:
    at = _fields(text)
    sizes: dict[int, tuple[int, int] | None] = {}
    shared: dict[tuple[int, int], tuple[int, int]] = {}  # one tuple per distinct size
    ids, names, widths, heights = array("q"), [], array("q"), array("q")

    def image(n: int, entry: Any) -> None:
        if schema.image_problems(n, entry, sizes, image_size):
            raise _Whole
        size = sizes[entry["id"]]
        if size is None:  # an unreadable file: check_sizes names it
            raise _Whole
        sizes[entry["id"]] = size = shared.setdefault(size, size)
        ids.append(entry["id"]), names.append(entry["file_name"]), widths.append(size[0]), heights.append(size[1])

    categories: list[tuple[int, str]] = []
    category_ids: set[int] = set()

    def category(n: int, entry: Any) -> None:
        if schema.category_problems(n, entry, category_ids):
            raise _Whole
        categories.append((entry["id"], str(entry.get("name", entry["id"]))))

    _entries(text, at["images"], image)
    if not ids:
        raise _Whole  # empty: schema's line
    if "categories" in at:
        _entries(text, at["categories"], category)
    if not categories:
        raise _Whole  # no category to name a class
    seen: set[int] = set()
    image_of, category_of, area, crowd = array("q"), array("q"), array("d"), array("b")
    clipped = [0]

    def annotation(n: int, entry: Any) -> None:
        if schema.annotation_problems(n, entry, sizes, category_ids, seen):
            raise _Whole
        if not entry.get("iscrowd", 0) and entry.get("category_id") is None:
            raise _Whole  # an object of no category: read_labels' path says so
        changed = hygiene.clipped_to(entry, *sizes[entry["image_id"]])
        clipped[0] += hygiene.moved(entry, changed)
        cid = entry.get("category_id")
        image_of.append(entry["image_id"]), category_of.append(-1 if cid is None else cid)
        area.append(float(entry.get("area", 0.0))), crowd.append(bool(entry.get("iscrowd", 0)))

    _entries(text, at["annotations"], annotation)
    if not image_of:
        raise _Whole
    sizes.clear(), seen.clear()
    as_np = np.frombuffer
    return Columns(
        as_np(ids, np.int64).copy(),
        names,
        as_np(widths, np.int64).copy(),
        as_np(heights, np.int64).copy(),
        as_np(image_of, np.int64).copy(),
        as_np(category_of, np.int64).copy(),
        as_np(area, np.float64).copy(),
        as_np(crowd, np.int8).astype(bool),
        categories,
        clipped[0],
    )


def columns_of(dataset: dict[str, Any], clipped: int) -> Columns:
    """The same columns from a dataset read whole (``read_labels``' ``COCO`` object)."""
    images, anns = dataset["images"], dataset["annotations"]
    categories = [(int(c["id"]), str(c.get("name", c["id"]))) for c in dataset.get("categories", [])]
    return Columns(
        np.asarray([int(im["id"]) for im in images], np.int64),
        [str(im.get("file_name", "")) for im in images],
        np.zeros(len(images), np.int64),
        np.zeros(len(images), np.int64),
        np.asarray([int(a["image_id"]) for a in anns], np.int64),
        np.asarray([int(a["category_id"]) if a.get("category_id") is not None else -1 for a in anns], np.int64),
        np.asarray([float(a.get("area", 0.0)) for a in anns], np.float64),
        np.asarray([bool(a.get("iscrowd", 0)) for a in anns], bool),
        categories,
        clipped,
    )


def largest(columns: Columns, where: Path) -> tuple[list[str], np.ndarray, list[str], int]:
    """(file names, class indices, class names, images dropped): each image (by id) the category
    covering the largest non-crowd area, summed in file order; equal areas go to the lower
    category id; an image with no non-crowd object is dropped."""
    cats = sorted(c for c, _ in columns.categories)
    if not cats:
        raise ProbeError(where, "lists no categories, so its objects name no class", "give the file its categories list")
    index = {c: n for n, c in enumerate(cats)}
    names = dict(columns.categories)
    order = np.argsort(columns.image_id, kind="stable")
    position = np.searchsorted(columns.image_id[order], columns.ann_image)
    by_image = np.argsort(position, kind="stable")  # each image's objects, in file order
    bounds = np.searchsorted(position[by_image], np.arange(len(order) + 1)).tolist()
    crowd, category, area = columns.ann_crowd.tolist(), columns.ann_category.tolist(), columns.ann_area.tolist()
    objects = by_image.tolist()
    ids, labels, dropped = [], [], 0
    for k, n in enumerate(order.tolist()):
        summed: dict[int, float] = {}
        for a in objects[bounds[k] : bounds[k + 1]]:
            if not crowd[a]:
                summed[category[a]] = summed.get(category[a], 0.0) + area[a]
        if not summed:
            dropped += 1
            continue
        best = min(summed, key=lambda c: (-summed[c], c))
        if best not in index:
            raise ProbeError(where, f"has objects of category {best}, which its categories list lacks", schema.FIX)
        ids.append(clean_name(columns.file_name[n]))
        labels.append(index[best])
    if len({*labels}) < 2:
        raise ProbeError(where, f"gives its images {len({*labels})} distinct largest categories", "a classification panel needs at least two classes")
    return ids, np.asarray(labels, np.int64), [names[c] for c in cats], dropped


def _check_sizes(panel, columns: Columns) -> None:
    """The recorded sizes against the files' headers, as ``read_labels`` checks them, a few thousand at a time."""
    for a in range(0, len(columns.file_name), SIZES_AT_ONCE):
        part = zip(columns.file_name[a : a + SIZES_AT_ONCE], columns.width[a : a + SIZES_AT_ONCE].tolist(), columns.height[a : a + SIZES_AT_ONCE].tolist())
        hygiene.check_sizes(panel.annotations, panel.images, [{"id": 0, "file_name": name, "width": w, "height": h} for name, w, h in part])


def read(panel, *, purpose: str, checkpoint: str | None, unseal: str | None, cache, command: str | None):
    """``read_classes`` of a COCO panel: checked, hashed, logged in the ledger, then handed out."""
    from ..store.cache import cache_root
    from . import panels

    panel = panels.check_readable(panel, unseal, cache)
    if not purpose:
        raise ProbeError(None, "a read of labels needs a purpose", "pass purpose='score' (or train, sweep, probe: why the labels are read)")
    raw, _ = panels.annotation_bytes(panel)
    annotation_sha256, text = hashlib.sha256(raw).hexdigest(), text_of(raw)
    del raw  # the text alone while the entries are decoded
    columns = scan(text, schema.header_size(panel.images)) if text else None
    del text
    if columns is None:
        read = panels.read_labels(panel, purpose=purpose, checkpoint=checkpoint, unseal=unseal, cache=cache, command=command)
        entry_id, columns = read.entry_id, columns_of(read.coco.dataset, int(read.entry.get("clipped", 0)))
        del read
    else:
        schema.names_present(columns.file_name, panel)
        _check_sizes(panel, columns)
        entry_id = panels.log_coco_read(
            cache_root(cache), panel, annotation_sha256, columns.file_name, columns.clipped, purpose=purpose, command=command, checkpoint=checkpoint, unseal=unseal
        ).id
    ids, labels, classes, dropped = largest(columns, panel.annotations)
    return panels.ClassLabels(ids, labels, classes, entry_id, panel, RULE, dropped)
