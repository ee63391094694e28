"""A store planned from the protocols that will read it (``probe extract --for``, ``probe plan``).

Each protocol declares what it reads of a store (its registry entry's ``Reads.stores``: array names
at the last block, ``attention_stats_<view>`` for the attention statistics); the plan is their
union, retargeted onto the views given (``--views eval@448`` moves an ``eval224`` array to
``eval@448``; Hummingbird's memory views follow their query view's size), at the blocks asked.
Nothing else is stored: a k-NN plan holds the class token and the normed class token, no patch
array. A class-token array asked of a network without a class token becomes its patch array (the
mean of the patch tokens is then the feature, as ``probe knn --feature mean``).

``rows`` tells, before any image is read, what each array will take: bytes per image, on disk for
N images (uncompressed: zstd only shrinks it), and in memory while a chunk of images is written;
and what the forward pass's attention takes (explicit maps: heads × T² per image and block; the
statistics: one tile of queries, ``store.attention_stats``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from . import arrays, layout, views
from .architectures import Arch

STATS = "attention_stats"  # a plan's kind for every block's attention statistics


def retarget(name: str, given: Iterable[str]) -> str:
    """``name`` moved onto the given view of its family (``tokens_eval224`` with ``eval@448`` → ``tokens_eval@448``), else as it is."""
    found = layout.parse(name)
    spec = views.view(found.view)
    for view in given:
        other = views.view(view)
        if other.family == spec.family and other.epoch is None and spec.fixed:
            moved = views.canonical(f"{other.family}@{other.size}" + (f"_aug{spec.epoch}" if spec.epoch is not None else ""))
            return layout.ArrayName(found.kind, moved, found.block).name
        if other.family == spec.family and not spec.fixed:
            return name
    return name


def wanted(stores: Iterable[str], given: Iterable[str] = ()) -> tuple[str, ...]:
    """The plan's array names: every protocol's ``stores``, once each, moved onto the ``given`` views."""
    given = [views.canonical(v) for v in given]
    return tuple(dict.fromkeys(retarget(name, given) for name in stores))


@dataclass(frozen=True)
class Row:
    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    per_image: int  # bytes

    def disk(self, images: int) -> int:
        return self.per_image * images


def rows(plan: dict[str, arrays.Spec], dtype: str) -> list[Row]:
    """Each planned array's size (its dims and shape after ``image``)."""
    out = []
    for name, (dims, shape, *more) in plan.items():
        kind = (more[0] if more else {}).get("dtype", dtype)
        out.append(Row(name, tuple(dims), tuple(int(s) for s in shape), kind, int(np.prod(shape, dtype=np.int64)) * np.dtype(kind).itemsize))
    return out


def forward_bytes(request: arrays.Request, arch: Arch, patches: int, batch: int) -> dict[str, int]:
    """What the forward pass's attention takes beside the network, per batch: the explicit maps
    kept (float32, heads × T² per image and block), and the statistics' tile of float64 scores
    (and the exponentials beside them)."""
    tokens = patches + arch.prefix
    out = {}
    if request.maps != "none":
        blocks = arch.depth if request.maps == "all" else 1
        out["explicit maps"] = batch * blocks * arch.heads * tokens * tokens * 4
    if request.stats:
        from . import attention_stats  # (torch: imported only where statistics are planned, not by every refused option)

        tile = attention_stats.query_tile(batch, arch.heads, tokens)
        out["statistics' tile"] = 2 * batch * arch.heads * tile * tokens * 8  # the float64 scores and their exponentials
    return out


def size_text(n: float) -> str:
    """Bytes in binary units (what ``free -h`` and ``du -h`` print)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True)
class Plan:
    """What a store will hold (``rows``) and what its forward pass's attention takes (``forward``: what → bytes per batch)."""

    rows: list[Row]
    forward: dict[str, int]
    images: int
    chunk: int
    batch: int


def describe(arch: Arch, settings, images: int, own_patches: dict[str, int] | None = None, batch: int = 16) -> Plan:
    """The plan of ``settings`` (``extract_plan.Settings``) for ``images`` images of a network of ``arch``."""
    from .extract_plan import patch_counts, plan_arrays

    planned = plan_arrays(arch, settings, own_patches)
    requests = settings.requests(arch)
    forward: dict[str, int] = {}
    for view, patches in patch_counts(arch, settings, own_patches).items():
        for what, need in forward_bytes(requests[view], arch, patches, batch).items():
            forward[f"{what} ({view})"] = need
    return Plan(rows(planned, settings.dtype), forward, images, settings.chunk, batch)
