"""A store read with zarr alone: what ``probe info`` and ``probe decode`` need of it, without xarray.

xarray brings pandas (about half a second of a command's start-up); these commands only list the
arrays and read blocks of images. ``StoreData`` answers like the ``xarray.Dataset`` that
``store.cache.open_store`` returns (``ds[name]``, ``name in ds``, ``ds.attrs``, ``ds.sizes``,
``ds.dims``, ``ds.data_vars``), and each ``StoreArray`` like its lazy ``DataArray`` (``dims``,
``sizes``, ``attrs``, ``encoding``, ``isel(image=...)``, ``values``, ``rename``), restricted to the
same images; the values are the bytes zarr reads, which are xarray's (a store's arrays carry no
CF attributes). ``store.cache.open_store(..., plain=True)`` opens one.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import zarr

from .group import whole
from .plain import Variables


class StoreArray:
    """One array of a store at the images ``kept`` (positions in the store; None: all), read when
    ``values`` is asked for."""

    def __init__(
        self,
        array: zarr.Array,
        name: str,
        dims: tuple[str, ...],
        kept: np.ndarray | None,
        image: zarr.Array | None = None,
        attrs: dict[str, Any] | None = None,
        encoding: dict[str, Any] | None = None,
        picked: tuple[tuple[int, int], ...] = (),
    ):
        self.array, self.name, self.kept, self.image = array, name, kept, image
        self.picked = picked  # (axis of the zarr array, index): one block of an array holding every block, that axis dropped
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.encoding: dict[str, Any] = dict(encoding or {})
        gone = {axis for axis, _ in picked}
        self._axes = [axis for axis in range(len(array.shape)) if axis not in gone]
        self.dims = tuple(dims) if not picked else tuple(d for axis, d in enumerate(dims) if axis not in gone)
        shape = [int(array.shape[axis]) for axis in self._axes]
        if kept is not None and self.dims and self.dims[0] == "image":
            shape[0] = int(kept.size)
        self.shape = tuple(shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.dims, self.shape))

    @property
    def coords(self) -> dict[str, StoreArray]:
        """The ``image`` ids of these images (what a cluster run names its chunks by)."""
        if self.image is None or not self.dims or self.dims[0] != "image":
            return {}
        return {"image": StoreArray(self.image, "image", ("image",), self.kept)}

    def isel(self, image: slice | np.ndarray | None = None, **one: int) -> StoreArray:
        """These images ``image`` (a slice or an array of positions among them), or one index of another
        dimension (``block=3``: that dimension dropped, as xarray's ``isel`` with an int), still unread."""
        if one:
            picked = list(self.picked)
            for dim, index in one.items():
                axis = self._axes[self.dims.index(dim)]
                picked.append((axis, int(index) % int(self.array.shape[axis])))
            dims = tuple(self._dims_of_array())
            out = StoreArray(self.array, self.name, dims, self.kept, self.image, self.attrs, self.encoding, tuple(picked))
            return out if image is None else out.isel(image=image)
        if self.dims[0] != "image":
            raise ValueError(f"{self.name} has no image dimension")
        n = self.array.shape[0] if self.kept is None else self.kept.size
        kept = np.arange(n)[image] if self.kept is None else self.kept[image]
        out = StoreArray(self.array, self.name, self._dims_of_array(), np.asarray(kept, dtype=np.int64), self.image, self.attrs, self.encoding, self.picked)
        out.encoding.pop("probe_image_edges", None)
        return out

    def sel(self, image: list[str]) -> StoreArray:
        """These images by id, in the order given, as ``DataArray.sel(image=[...])``; an id the
        array lacks is a KeyError, as xarray's."""
        held = {str(i): p for p, i in enumerate(self.coords["image"].values.tolist())}
        missing = [i for i in image if str(i) not in held]
        if missing:
            raise KeyError(f"not all values found in index 'image': {missing[:5]}")
        return self.isel(image=np.asarray([held[str(i)] for i in image], dtype=np.int64))

    def _dims_of_array(self) -> tuple[str, ...]:
        """A name for each axis of the zarr array, as the constructor takes them (a picked axis: a placeholder it drops)."""
        names = iter(self.dims)
        gone = {axis for axis, _ in self.picked}
        return tuple(f"_picked{axis}" if axis in gone else next(names) for axis in range(len(self.array.shape)))

    def __getitem__(self, images: slice) -> StoreArray:
        """Images ``images`` along the first dimension (``image``), as ``DataArray[a:b]``."""
        return self.isel(image=images)

    @property
    def values(self) -> np.ndarray:
        picked = dict(self.picked)
        rest = tuple(picked.get(axis, slice(None)) for axis in range(1, len(self.array.shape)))
        if self.kept is None or not self.dims or self.dims[0] != "image":
            if 0 in picked or not self.array.shape:
                return np.asarray(self.array[(picked.get(0, slice(None)), *rest)])
            return whole(self.array, slice(None), rest)
        if self.kept.size and np.array_equal(self.kept, np.arange(self.kept[0], self.kept[0] + self.kept.size)):
            return whole(self.array, slice(int(self.kept[0]), int(self.kept[0]) + self.kept.size), rest)  # contiguous: slices read
        return np.asarray(self.array.get_orthogonal_selection((self.kept, *rest)))

    def rename(self, names: dict[str, str]) -> StoreArray:
        return StoreArray(self.array, self.name, tuple(names.get(d, d) for d in self._dims_of_array()), self.kept, self.image, self.attrs, self.encoding, self.picked)


class StoreData(Variables):
    """The arrays of a store at the images ``kept``, by name, with the root attributes (the manifest)."""

    def __init__(self, group: zarr.Group, kept: np.ndarray | None, attrs: dict[str, Any]):
        self.zarr_group = group  # its opening: the integrity check of each array read looks its members up there (``cache.checked``)
        image = group["image"] if "image" in group else None
        self.attrs = dict(attrs)
        self.variables: dict[str, StoreArray] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr's note on the results folder (a group of groups written later)
            members = sorted(group.arrays())
        for name, array in members:
            dims = tuple(array.metadata.dimension_names or ())
            if len(dims) != len(array.shape):  # metadata edited or damaged: said here, inside open_store's reader, not later in a read
                raise ValueError(f"array {name} names {len(dims)} dimensions for its {len(array.shape)} axes")
            self.variables[name] = StoreArray(array, name, dims, kept, image, encoding={"chunks": tuple(array.chunks)})  # as xarray's encoding
        self.sizes: dict[str, int] = {}
        for var in self.variables.values():
            self.sizes.update(var.sizes)

    @property
    def dims(self) -> dict[str, int]:
        return self.sizes

    @property
    def data_vars(self) -> dict[str, StoreArray]:
        """Every array but the ``image`` coordinate, as ``Dataset.data_vars``."""
        return {name: var for name, var in self.variables.items() if name not in self.sizes or var.dims != (name,)}
