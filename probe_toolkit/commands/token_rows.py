"""What the label-free protocols share: one block's class or patch tokens of a view, read a store chunk at a time.

``probe rank``, ``probe similarity`` and ``probe position`` read no panel and no label: only a
store's tokens. A view qualifies when every image has the same grid (any size of a sized family of
``store.views``), so that rows pair up across blocks and checkpoints. A block is read through
``store.cache.require(ds, name, block)``: a store written without blocks holds only the last
one, and asking it for another is one line naming what to extract.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..infra.errors import ProbeError
from ..infra.runner import blocks, store_chunk
from ..infra.settings import SettingError
from ..store import cache, views

KINDS = ("class", "patch")  # which tokens: the class token of each image, or every patch token


def check_view(name: str) -> str:
    """The canonical name of a view whose images all share one grid (any size of a sized family:
    ``224``, ``eval224``, ``short@448``, ``hbird@448``, ...), or a SettingError naming ``view``."""
    spec = views.view(name)  # an unknown name is a SettingError naming the views
    if spec.size is None:
        raise SettingError("view", f"view {name} has each image at its own size: its rows do not pair up", "use one of a fixed size, e.g. view=224 or view=short@448")
    return views.canonical(name)


def array_name(kind: str, view: str) -> str:
    view = views.canonical(view)
    return f"cls_tokens_{view}" if kind == "class" else f"tokens_{view}"


def depth(ds) -> int:
    return int(ds.attrs.get("manifest", {}).get("arch", {}).get("depth", 0))


def last_block(ds) -> int:
    """The 0-based index of the network's last block (what a store without a block coordinate holds)."""
    return max(depth(ds) - 1, 0)


def read(ds, kind: str, view: str, block: int | None = None, instead: tuple[str, str] = ("tokens", "patch")):
    """One block's array of ``kind`` tokens at ``view`` (None: the last block), as ``store.cache.require`` gives it.
    ``instead``: the setting, and its value, that reads patch tokens where a network has no class token
    (rank's ``tokens=patch``, similarity's ``examples=patch``), spelled as the caller's flag in the refusal."""
    name = array_name(kind, view)
    if kind == "class" and not ds.attrs.get("manifest", {}).get("arch", {}).get("class_token", False):
        setting, value = instead
        raise SettingError(setting, "has no class token (its network has none)", f"read its patch rows instead: {setting}={value}", ds.attrs.get("store"))
    return cache.require(ds, name, block=block)


def block_of(array, ds) -> int:
    """The 0-based block an array read by ``read`` holds (its ``block`` attribute, else the last block)."""
    return int(array.attrs.get("block", last_block(ds)))


def held_blocks(ds, kind: str, view: str) -> list[int]:
    """The blocks of ``kind`` tokens the store holds, in order (the last one only, for a store written before blocks)."""
    found = []
    for b in range(depth(ds)):
        try:
            read(ds, kind, view, b)
        except ProbeError:
            continue
        found.append(b)
    return found or [last_block(ds)]


def image_chunks(array, size: int | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """(start, stop, float32 values) of consecutive blocks of images: the store's own chunks by default."""
    n = int(array.shape[0])
    for a, b in blocks(n, size or store_chunk(array)):
        yield a, b, np.asarray(array.isel(image=slice(a, b)).values, np.float32)


def rows_of(values: np.ndarray) -> np.ndarray:
    """(images, …, D) → (rows, D): every patch token (or class token) a row."""
    return values.reshape(-1, values.shape[-1])


def check_finite(store: Any, name: str, values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        raise ProbeError(store, f"holds a value of {name} that is not finite", "extract the store again (`probe verify` names the images)")


def store_of(ds) -> Path:
    return Path(ds.attrs.get("store"))
