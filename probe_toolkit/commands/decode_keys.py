"""The store side of ``probe decode``: open a view's keys (and an own-size view's per-image
grids, checked against each image's size), decode them block by block through the runner, and
encode each block's masks as the runner hands it over."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analyses.decoder import Decoded
from ..analyses.decoder_blocks import ARRAYS, as_decoded, decode_block
from ..analyses.decoder_settings import Settings
from ..infra.atomic import json_text, write_json, write_json_list
from ..infra.errors import IntegrityError, ProbeError
from ..infra.runner import Where, map_images
from ..infra.settings import SettingError
from ..labels.masks import coco_results, decoder_attrs, decoder_coords, decoder_variables
from ..store import cache, own_size
from ..store.grids import view_grid
from ..store.plain_rows import Rows, Written
from ..store.views import keys_array
from .decode_views import OWN_SIZE, check_view

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreArray, StoreData


@dataclass
class StoreKeys:
    store: Path
    manifest: dict[str, Any]
    image_ids: list[str]
    heights: np.ndarray
    widths: np.ndarray
    keys: StoreArray  # (image, patch, channel), lazy, read with zarr alone (store.direct)
    checkpoint: str | None
    view: str = "480"
    grids: np.ndarray | None = None  # (image, 2) rows, cols of an own-size view; None for the square views
    patch: int = 0  # the own-size view's patch size in pixels
    data: StoreData | None = None  # the opened store, for the runner inputs read beside the keys
    keys_kind: str = "plain"  # plain: keys_<view>; rope: DINOv3's keys_rope_<view> (store.views.keys_array)

    def store_array(self, name: str) -> StoreArray:
        """Another array of the store at the keys' images, as a runner input (a cluster worker reads it by name)."""
        return cache.require(self.data, name)

    def grid_arrays(self) -> dict[str, StoreArray]:
        """The per-image grid as runner inputs (``rows``, ``cols`` beside ``keys``); none for square views.
        They are the store's arrays, whose values ``native_grids`` checked."""
        if self.grids is None:
            return {}
        return {"rows": self.store_array(f"grid_rows_{self.view}"), "cols": self.store_array(f"grid_cols_{self.view}")}

    def with_grids(self, decoded: Decoded, start: int = 0, stop: int | None = None) -> Decoded:
        """``decoded`` (images [start, stop) of the store) carrying this view's per-image grid and
        patch size (its masks' geometry)."""
        if self.grids is not None:
            decoded.grids, decoded.patch, decoded.view = self.grids[start:stop], self.patch, self.view
        return decoded


def own_size_grid(heights: np.ndarray, widths: np.ndarray, patch: int, view: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) an own-size view must have (``own_size.cells``): ⌈H/p⌉ × ⌈W/p⌉ padded (native,
    as TokenCut's and LOST's code), ⌊H/p⌋ × ⌊W/p⌋ cut (native_crop, as DSM's extract.py),
    round(H/p) × round(W/p) resized (native_resized, as TokenCut's saliency code)."""
    return own_size.cells(heights, patch, view), own_size.cells(widths, patch, view)


def native_grids(store: str | Path, ds: xr.Dataset | StoreData, heights: np.ndarray, widths: np.ndarray, view: str = "native") -> tuple[np.ndarray, int]:
    """(image, 2) rows, cols of an own-size view and its patch, checked against the image's size
    (``own_size_grid``): a store whose grids disagree was not cut as its view says."""
    meta = cache.manifest(ds)
    patch = int(((meta.get("per_view") or {}).get(view) or {}).get("patch") or (meta.get("arch") or {}).get("patch") or 0)
    if patch < 1:
        raise ProbeError(store, f"does not record the {view} view's patch size", "extract the store again with this version")
    rows, cols = view_grid(ds, view)
    want_rows, want_cols = own_size_grid(heights, widths, patch, view)
    bad = np.flatnonzero((rows != want_rows) | (cols != want_cols))
    if bad.size:
        i = int(bad[0])
        edge = own_size.VERB[own_size.rule(view)]
        raise IntegrityError(
            store,
            f"image {ds['image'].values[i]}'s {view} grid {rows[i]} × {cols[i]} is not its {heights[i]} × {widths[i]} pixels {edge} to /{patch} ({bad.size} such images)",
            f"extract the {view} view again",
        )
    return np.stack([rows, cols], axis=1), patch


def refused_keys(where: Any, keys: str, why: str) -> SettingError:
    """Keys a store or network cannot give, said per caller: ``keys='plain'`` from Python, ``--keys plain`` on the command line."""
    return SettingError("keys", where=where, requirement="plain here", value=keys, example="plain", why=why)


def open_keys(store: str | Path, size: int | str = 480, keys: str = "plain") -> StoreKeys:
    """The store's keys of one view: before RoPE (``plain``) or, on a DINOv3 store, after it (``rope``)."""
    view = check_view(size)
    ds = cache.open_store(store, arrays=f"keys_{view}", plain=True)  # one view: the same done flags for either kind
    meta = cache.manifest(ds)
    try:
        name = keys_array(meta.get("arch") or {}, view, keys)
    except ValueError as error:
        raise refused_keys(store, keys, str(error)) from None
    if name not in ds and f"keys_{view}" in ds:
        raise refused_keys(store, keys, f"it was extracted before keys after RoPE were stored (it has no {name}: a new store has them)")
    values = cache.require(ds, name)
    if ds.sizes.get("image", 0) == 0:
        raise ProbeError(store, "has no finished images", "run `probe extract` to completion first")
    heights, widths = ds["image_height"].values.astype(np.int64), ds["image_width"].values.astype(np.int64)
    grids, patch = native_grids(store, ds, heights, widths, view) if view in OWN_SIZE else (None, 0)
    return StoreKeys(
        store=Path(store),
        manifest=meta,
        image_ids=[str(v) for v in ds["image"].values],
        heights=heights,
        widths=widths,
        keys=values,
        checkpoint=(meta.get("checkpoint") or {}).get("sha256"),
        view=view,
        grids=grids,
        patch=patch,
        data=ds,
        keys_kind=keys,
    )


def _ticks(on_image: Callable[[], None] | None) -> Callable[[int], None] | None:
    """A per-image tick as the runner's per-block progress."""
    if on_image is None:
        return None
    return lambda n: [on_image() for _ in range(n)]


def decode_keys(
    keys: xr.DataArray | StoreArray,
    settings: Settings,
    on_image: Callable[[], None] | None = None,
    threads: int = 1,
    *,
    where: Where = Where(),
    backend: str = "scipy",
    device: str = "cpu",
    grids: dict[str, StoreArray] | None = None,
    each: Callable[[int, int, dict[str, np.ndarray]], None] | None = None,
    keep: bool = True,
) -> Decoded | None:
    """Decode every image of a lazy (image, patch, channel) array, block by block, through the runner.

    Each image is computed alone with one BLAS thread (``threads`` when this process computes):
    one image's problems are small, and a busy machine makes multi-threaded OpenBLAS spin (60×
    slower measured on the shared 2-core box). Results do not depend on ``where``. ``grids``: an
    own-size view's ``rows`` and ``cols`` (``StoreKeys.grid_arrays``), read block by block beside the keys.
    ``each``: the runner's per-block hook (``BlockResults``, ``SavedRows``); ``keep`` False: the blocks go
    to ``each`` only and None is returned (memory holds a few blocks, whatever the images).
    """
    fn = partial(decode_block, settings=settings, backend=backend, device=device)
    arrays = map_images(fn, {"keys": keys, **(grids or {})}, where=where, threads=threads, progress=_ticks(on_image), each=each, keep=keep)
    return as_decoded(arrays, settings) if keep else None


def colour_task(src: StoreKeys, settings: Settings, photos: tuple) -> tuple[Callable[..., dict[str, np.ndarray]], dict[str, Any]]:
    """DSM with its colour term as a runner task (``commands.decode_colour``): the block function
    and its arrays; each block reads its images' photographs from ``photos`` (``decode_colour.photographs``:
    the store's ``image_source``, absolute, and each photograph's sha256, checked by whoever reads it)."""
    from .decode_colour import colour_block

    source, digests = photos
    fn = partial(colour_block, settings=settings, source=source, patch=src.patch, padded=own_size.EDGE.get(src.view) == own_size.PAD, photos=digests)
    return fn, {"keys": src.keys, "names": src.store_array("image"), **src.grid_arrays()}


def decode_with_colour(src: StoreKeys, settings: Settings, on_image: Callable[[], None] | None = None, *, where: Where = Where(), photos: tuple) -> Decoded:
    """DSM with its colour term, through the runner, every image of the store."""
    fn, arrays = colour_task(src, settings, photos)
    arrays = map_images(fn, arrays, where=where, progress=_ticks(on_image), torch_free=True)  # PIL and scipy: workers may be forked
    return src.with_grids(as_decoded(arrays, settings))


class BlockResults:
    """The masks JSON's entries, encoded block by block as the runner hands the blocks over: this
    process draws and RLE-encodes one block's masks while the workers decode the next ones,
    instead of encoding every mask after the last block. Entries are kept by store position;
    ``entries`` gives them as ``labels.masks.coco_results`` does for the whole set. ``as_text``
    (no panel will be scored: the entries are only written) spools each block's entries, as the
    masks JSON's text, to an anonymous temporary file, one line a block (the text holds no newline),
    which ``write`` copies into the masks JSON a block at a time: the command's memory stays flat
    in the number of images (``benchmarks/scale.py``)."""

    def __init__(self, src: StoreKeys, settings: Settings, as_text: bool = False) -> None:
        self.src, self.settings, self.as_text = src, settings, as_text
        self.parts: list[tuple[int, list[dict[str, Any]]]] = []
        self.spool = tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n") if as_text else None  # unlinked at once: gone with the process

    def __call__(self, a: int, b: int, arrays: dict[str, np.ndarray]) -> None:
        block = self.src.with_grids(as_decoded(arrays, self.settings), a, b)
        found = coco_results(block, self.src.image_ids[a:b], self.src.heights[a:b], self.src.widths[a:b])
        if self.spool is not None:  # the masks JSON's items for these images, under their store positions
            self.spool.write(json_text([dict(r, image_id=a + r["image_id"]) for r in found], None, (",", ":"))[1:-1] + "\n")
        else:
            self.parts.append((a, found))

    def add(self, decoded: Decoded) -> None:
        """A whole decode at once (the colour term's and the shards' paths)."""
        self(0, len(self.src.image_ids), {name: getattr(decoded, name) for name in ARRAYS})

    def entries(self, coco_ids: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """Every entry in image order; with ``coco_ids`` only that map's images, under their COCO ids."""
        if self.as_text:
            raise ValueError("entries kept as text are written (write), not read back")
        if coco_ids is None:
            return [dict(r, image_id=a + r["image_id"]) for a, part in self.parts for r in part]
        return [dict(r, image_id=int(coco_ids[r["file_name"]])) for _, part in self.parts for r in part if r["file_name"] in coco_ids]

    def write(self, path: Path) -> None:
        """The masks JSON of every entry under its store position (``write_json``'s bytes, from the text kept)."""
        if self.spool is None:
            write_json(path, self.entries())
            return
        self.spool.seek(0)
        write_json_list(path, (line.rstrip("\n") for line in self.spool))
        self.spool.close()


class SavedRows:
    """The runner's per-block hook that writes each block's ``results/decoder`` arrays as it comes
    (``store.plain_rows.Rows``, in a temporary folder of the results that ``records.save`` moves into the
    record) and keeps only each image's counts: memory stays flat in the number of images. The
    saved arrays are ``labels.masks.decoder_dataset``'s, bit for bit. ``also``: another hook
    handed every block too (``BlockResults``)."""

    def __init__(self, src: StoreKeys, settings: Settings, folder: Path, also: Callable[[int, int, dict[str, np.ndarray]], None] | None = None) -> None:
        self.src, self.settings, self.also = src, settings, also
        self.rows = Rows(folder, len(src.image_ids))
        self.n_masks = self.degenerate = self.dense_solves = 0
        self.finite_degree = False
        self.last: Decoded | None = None  # a block's decode, for the masks' geometry

    def __call__(self, a: int, b: int, arrays: dict[str, np.ndarray]) -> None:
        if self.also is not None:
            self.also(a, b, arrays)
        block = self.src.with_grids(as_decoded(arrays, self.settings), a, b)
        self.rows.add(decoder_variables(block))
        self.n_masks += int(block.n_masks.sum())
        self.degenerate += int(block.degenerate.sum())
        self.dense_solves += int(block.dense_solves.sum())
        self.finite_degree |= block.degree is not None and bool(np.isfinite(block.degree).any())
        self.last = block

    def written(self) -> Written:
        """Every block in: the results to save (``RunContext.save``)."""
        drop = () if self.finite_degree else ("degree", "expansion")
        return self.rows.written(decoder_coords(self.last, self.src.image_ids), decoder_attrs(self.last), drop)
