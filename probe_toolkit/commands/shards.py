"""``--shard i/n`` (or torchrun's RANK/WORLD_SIZE) for a per-image analysis of a store.

Shard i of n computes a contiguous range of whole store chunks (``runner.shard_range``) and
saves it as ``results/<name>-part-<i>-of-<n>`` with an identity (the settings and the images).
The shard that finds all n parts present with the same identity concatenates them in image
order (so the arrays equal a one-process run bit for bit) and goes on to score and save; the
others report which shards they wait for. A rerun of a shard replaces its part.
``decode_shards`` is the decoder's own version (its parts carry the masks JSON's unit).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..infra.runner import shard_range
from ..store import cache
from ..results import records

if TYPE_CHECKING:
    import xarray as xr

    from ..store.plain import Results


def sharded(shard: str | None) -> bool:
    """Whether this run is one shard: ``--shard`` given, or started by torchrun."""
    return shard is not None or "WORLD_SIZE" in os.environ


def parse(shard: str | None) -> tuple[int, int]:
    from ..store.extract_plan import parse_shard  # here: it brings torch

    return parse_shard(shard)


def image_range(shard: tuple[int, int], n_images: int, chunk: int) -> tuple[int, int]:
    """Images [start, stop) of this shard: whole chunks, so its blocks are the one-process run's."""
    return shard_range(n_images, chunk, shard)


def images_sha256(ids: list[str]) -> str:
    """The identity of the image list the shards split (a hash: an attribute stays small)."""
    import hashlib

    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def gather(store: str | Path, name: str, shard: tuple[int, int], part: xr.Dataset | Results, identity: dict[str, Any]) -> tuple[xr.Dataset | None, list[int]]:
    """Save this shard's part; (every part concatenated along ``image``, []) once all are in,
    else (None, the shards still missing)."""
    i, n = shard
    records.save(store, f"{name}-part-{i}-of-{n}", part, identity)
    parts, missing = [], []
    for j in range(n):
        saved = records.load(store, f"{name}-part-{j}-of-{n}")
        if saved is None or {k: saved.attrs.get(k) for k in identity} != identity:
            missing.append(j)
        else:
            parts.append(saved)
    if missing:
        return None, missing
    filled = [p for p in parts if p.sizes.get("image", 0)]
    if not filled:
        return parts[0], []
    from ..infra.lazy_dask import xarray

    return xarray().concat(filled, dim="image"), []
