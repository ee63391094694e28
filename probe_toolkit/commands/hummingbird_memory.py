"""Hummingbird's memories built in portions: never every augmented view, label map or bank row in memory at once.

A memory of the published sizes is large (1024·10⁴ patches × 384 channels is 15.7 GB of float32
features, and VOC's trainaug label maps about 2 GB decoded), so it is built ``READ_BLOCK`` train
images of one augmentation epoch at a time, in the reference's view order (epoch-major): their
label maps are decoded (``labels.label_maps.LabelMaps``), cut into the memory views' label views,
the bank's rows drawn from them (``analyses.hummingbird.BankDraws``: one generator, view by view,
as if the views came all at once), the chosen patches' stored tokens read from the store, put
through the final norm and normalised, and both the features and the label distributions
appended to files (``infra.shared.spooled``) that the search's workers read block by block.
One memory size at a time: a run of three sizes reads the train tokens three times and holds
one memory's files on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..analyses import hummingbird as hb
from ..infra.memory import reusing_blocks
from ..infra.settings import SettingError
from ..infra.shared import Shared, spooled
from ..store import cache, hbird_views

if TYPE_CHECKING:
    import xarray as xr

READ_BLOCK = 64  # memory views (train images of one epoch) read, labelled and drawn at a time


def memory_name(size: int | None) -> str:
    return "full" if size is None else str(int(size))


def memory_plan(sizes: Sequence[int | None], views: int, grid: int, k: int) -> list[tuple[int, int]]:
    """(patches per view, bank rows) of each memory size (0 per view: every patch), or a
    SettingError naming ``memory`` or ``k`` when a size cannot be built as the reference builds it."""
    plan = []
    for size in sizes:
        if size is None:
            per_view, rows = 0, views * grid * grid
        else:
            if size < views:
                raise SettingError(
                    "memory",
                    f"memory {size} is smaller than the {views} augmented train views (at least one patch each)",
                    f"give at least {views} patches, or full (every patch)",
                )
            per_view = hb.patches_per_view(size, views)
            if per_view > grid * grid:
                raise SettingError(
                    "memory",
                    f"memory {size} asks {per_view} patches of each of the {views} augmented train views, which hold {grid * grid}",
                    f"give at most {views * grid * grid} patches, or full (every patch)",
                )
            rows = per_view * views
        if k > rows:
            raise SettingError("k", f"k {k} exceeds the {rows} bank rows at size {memory_name(size)}", f"use k ≤ {rows}")
        plan.append((per_view, rows))
    return plan


@dataclass
class MemorySource:
    """What every memory of a run is built from: the train images' store and ids (store order),
    their label maps (``maps``, decoded when asked; ``order[j]``: the map of store image j), file
    names (the views' draws are keyed by them), the memory views, the grid and the final norm."""

    ds: xr.Dataset
    ids: list[str]
    maps: Sequence[np.ndarray]
    order: list[int]
    names: list[str]
    views: tuple[str, ...]
    grid: int
    cut: int  # pixels the network reads (512 at /16; the top-left 504 at /14)
    norm: Callable[[np.ndarray], np.ndarray] | None
    n_classes: int

    @property
    def n_views(self) -> int:
        return len(self.ids) * len(self.views)

    def portions(self) -> Iterator[tuple[int, int, int, list[np.ndarray]]]:
        """(epoch, first image, end image, the label views of images [first, end) in that epoch's
        view), in the reference's view order: epoch-major, then image."""
        n = len(self.ids)
        for e, view in enumerate(self.views):
            for a in range(0, n, READ_BLOCK):
                b = min(a + READ_BLOCK, n)
                maps = next(self.maps.portions(self.order[a:b], size=b - a)) if hasattr(self.maps, "portions") else [self.maps[i] for i in self.order[a:b]]
                yield e, a, b, [hbird_views.label_view(y, view, name)[: self.cut, : self.cut] for y, name in zip(maps, self.names[a:b])]


@contextmanager
def built(source: MemorySource, memory_size: int | None, seed: int, folder: Path) -> Iterator[tuple[Shared, Shared, int]]:
    """(the bank's normalised features, its label distributions, patches per view or None) of the
    memory of ``memory_size`` patches (None: every one), drawn from ``seed``, as files in
    ``folder`` (gone when the block ends), built a portion at a time."""
    draws = hb.BankDraws(source.n_views, source.grid, memory_size=memory_size, seed=seed, epochs=len(source.views), n_classes=source.n_classes)
    n = len(source.ids)
    arrays = {view: cache.checked(source.ds, f"tokens_{view}").sel(image=list(source.ids)) for view in source.views}  # at the run's block
    width = int(arrays[source.views[0]].shape[-1])
    with spooled((draws.rows, width), np.float32, folder, "hbird-bank") as bank, spooled((draws.rows, source.n_classes), np.float32, folder, "hbird-labels") as labels:
        with reusing_blocks():  # every portion allocates the same arrays: the heap's pages serve again
            for e, a, b, label_views in source.portions():
                rows = draws.take(label_views)
                tokens = np.asarray(arrays[source.views[e]].isel(image=slice(a, b)).values, np.float32)
                chosen = tokens[rows.view - e * n - a, rows.patch]
                bank.append(hb.normalise(source.norm(chosen) if source.norm is not None else chosen))
                labels.append(rows.labels)
        draws.finish()
        yield bank.shared(), labels.shared(), draws.per_view
