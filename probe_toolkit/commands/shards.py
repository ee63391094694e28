"""``--shard i/n`` (or torchrun's RANK/WORLD_SIZE) for a per-image analysis: this process's share,
and the one place where the last shard assembles the parts.

Shard i of n computes a contiguous range of whole blocks (``share``: ``runner.shard_range``) and
saves it as a part with an identity (the settings and the images). The shard that finds all n
parts present with the same identity assembles them (``collect``) and goes on to score and save;
the others report which shards they wait for. A rerun of a shard replaces its part. A store's
analyses keep their parts as records, ``results/<name>-part-<i>-of-<n>`` (``gather``, concatenated
in image order, so the arrays equal a one-process run bit for bit); ``probe propagate`` keeps
its shares in its output folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..infra.runner import shard_range
from ..results import records

if TYPE_CHECKING:
    import xarray as xr

    from ..store.plain import Results


def share(shard: tuple[int, int] | None, n_images: int, block: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(i, n) of this process (``RunContext.shard()``; None: not sharded, (0, 1)) and its images
    [start, stop): whole blocks, so its blocks are the one-process run's."""
    which = shard or (0, 1)
    return which, shard_range(n_images, block, which)


def images_sha256(ids: Iterable[str]) -> str:
    """The identity of the image list the shards split (a hash: an attribute stays small)."""
    from ..infra.provenance import list_hash

    return list_hash(ids)


def collect(shard: tuple[int, int], save: Callable[[], Any], load: Callable[[int], Any], matches: Callable[[Any], bool]) -> tuple[list, list[int]]:
    """Save this shard's part (``save()``), then read every shard's (``load(j)``: None when absent);
    (every part, []) once all n are in and ``matches`` this run's identity, else (the parts found,
    the shards still missing)."""
    save()
    parts, missing = [], []
    for j in range(shard[1]):
        part = load(j)
        if part is None or not matches(part):
            missing.append(j)
        else:
            parts.append(part)
    return parts, missing


def exchange(store: str | Path, name: str, shard: tuple[int, int], part: xr.Dataset | Results, identity: dict[str, Any]) -> tuple[list, list[int]]:
    """Save this shard's part (``results/<name>-part-<i>-of-<n>``, its own slot); (every part, in
    shard order, []) once all with this ``identity`` are in, else (the parts found, the shards still missing)."""
    i, n = shard
    return collect(
        shard,
        lambda: records.save(store, f"{name}-part-{i}-of-{n}", part, identity),
        lambda j: records.load(store, f"{name}-part-{j}-of-{n}"),
        lambda saved: {k: saved.attrs.get(k) for k in identity} == identity,
    )


def gather(store: str | Path, name: str, shard: tuple[int, int], part: xr.Dataset | Results, identity: dict[str, Any]) -> tuple[xr.Dataset | None, list[int]]:
    """Save this shard's part; (every part concatenated along ``image``, []) once all are in, else
    (None, the shards still missing)."""
    parts, missing = exchange(store, name, shard, part, identity)
    if missing:
        return None, missing
    filled = [p for p in parts if p.sizes.get("image", 0)]
    if not filled:
        return parts[0], []
    from ..infra.lazy_dask import xarray

    return xarray().concat(filled, dim="image"), []
