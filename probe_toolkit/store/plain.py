"""Results as plain numpy arrays, written in the layout ``xarray.Dataset.to_zarr`` gives them.

``probe decode`` saves its masks and numbers without importing xarray and pandas (half a second
of a command's start-up): a ``Results`` holds named arrays with their dimension names, the
dimension coordinates and the attributes, and ``write`` creates the same zarr v3 arrays xarray
would (``tests/test_startup.py`` compares every file byte for byte), so every reader still opens
them with ``xarray.open_zarr`` or ``results.records.load``. What xarray adds on writing, and
this module repeats: floating-point arrays get ``fill_value`` NaN and the CF attribute
``_FillValue`` (NaN as a little-endian float64 in base64); object arrays of ``str`` become zarr
strings (an empty one float64, as xarray infers it); attribute values that are numpy arrays or scalars become lists and Python scalars;
zarr picks the chunks (``chunks="auto"``), and chunks that hold only the fill value are not
written.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

NAN_FILL = base64.standard_b64encode(struct.pack("<d", float("nan"))).decode()  # xarray's FillValueCoder for NaN


class Variables:
    """What a Dataset answers about its variables by name (``name in ds``, ``ds[name]``, iteration
    over the data variables), for ``Results`` and ``store.direct.StoreData`` alike."""

    variables: dict[str, Any]
    data_vars: dict[str, Any]

    def __contains__(self, name: object) -> bool:
        return name in self.variables

    def __getitem__(self, name: str) -> Any:
        return self.variables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data_vars)


class Results(Variables):
    """Named arrays over named dimensions, the dimension coordinates and the attributes: the part
    of ``xarray.Dataset`` a result's readers use (``ds[name].values``, ``ds.name``, ``name in ds``,
    ``ds.attrs``, ``ds.sizes``, ``ds.data_vars``)."""

    def __init__(self, data_vars: dict[str, tuple[Any, Any]], coords: dict[str, Any] | None = None, attrs: dict[str, Any] | None = None):
        self.variables: dict[str, Variable] = {}
        for name, values in (coords or {}).items():
            self.variables[name] = Variable((name,), np.asarray(values))
        self.coord_names = list(coords or {})
        for name, (dims, values) in data_vars.items():
            self.variables[name] = Variable((dims,) if isinstance(dims, str) else tuple(dims), np.asarray(values))
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.sizes: dict[str, int] = {}
        for name, var in self.variables.items():
            if var.data.ndim != len(var.dims):
                raise ValueError(f"{name}: {var.data.ndim} axes but dimensions {var.dims}")
            for dim, size in zip(var.dims, var.data.shape):
                if self.sizes.setdefault(dim, size) != size:
                    raise ValueError(f"{name}: dimension {dim} is {size} long, elsewhere {self.sizes[dim]}")

    def __getattr__(self, name: str) -> Variable:
        variables = self.__dict__.get("variables", {})
        if name.startswith("_") or name not in variables:
            raise AttributeError(name)
        return variables[name]

    @property
    def data_vars(self) -> dict[str, Variable]:
        return {name: var for name, var in self.variables.items() if name not in self.coord_names}

    def copy(self) -> Results:
        out = Results({}, attrs=self.attrs)
        out.variables, out.coord_names, out.sizes = dict(self.variables), list(self.coord_names), dict(self.sizes)
        return out

    def to_xarray(self):
        """The same results as an ``xarray.Dataset`` (imports xarray)."""
        import xarray as xr

        data_vars = {n: (v.dims, v.data) for n, v in self.variables.items() if n not in self.coord_names}
        return xr.Dataset(data_vars, coords={n: self.variables[n].data for n in self.coord_names}, attrs=dict(self.attrs))


class Variable:
    """One array of ``Results`` with its dimension names."""

    def __init__(self, dims: tuple[str, ...], data: np.ndarray):
        self.dims, self.data = dims, data

    @property
    def values(self) -> np.ndarray:
        return self.data

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)

    def __int__(self) -> int:  # a 0-d value, as ``int(ds.links)`` reads a DataArray
        return int(self.data)

    def __float__(self) -> float:
        return float(self.data)


def _attr(value: Any) -> Any:
    """An attribute value as xarray stores it (``encode_zarr_attr_value``)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def write(results: Results, path: str | Path) -> None:
    """Create the zarr v3 group ``path`` (replacing one there) holding ``results``, array for
    array and attribute for attribute as ``to_zarr(path, mode="w", consolidated=False, zarr_format=3)``.
    Results already written row block by row block (``store.plain_rows.Written``) are moved there."""
    if not isinstance(results, Results):
        results.move(path)
        return
    import zarr

    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.attrs.put({k: _attr(v) for k, v in results.attrs.items()})
    data_vars = [n for n in results.variables if n not in results.coord_names]
    for name in [*data_vars, *results.coord_names]:  # xarray's order: data variables, then coordinates
        var = results.variables[name]
        create(group, name, var.dims, var.data)[...] = stored(var.data)


def stored(data: np.ndarray) -> np.ndarray:
    """The values written for a variable: xarray infers float64 for an empty object array."""
    return np.zeros(data.shape) if data.dtype.kind == "O" and data.size == 0 else data


def create(group: Any, name: str, dims: tuple[str, ...], like: np.ndarray, shape: tuple[int, ...] | None = None) -> Any:
    """The zarr array ``to_zarr`` creates for a variable like ``like`` (its dtype; its shape unless
    ``shape`` is given): zarr's own chunks (``"auto"``), str for objects, NaN as the fill value of a
    floating-point one, with the CF ``_FillValue`` unless it was an (empty) object array."""
    data = stored(like)
    dtype: Any = str if data.dtype.kind == "O" else data.dtype  # object arrays hold str (image ids, names)
    fill = np.nan if data.dtype.kind == "f" else None
    array = group.create(name, shape=data.shape if shape is None else shape, dtype=dtype, fill_value=fill, chunks="auto", dimension_names=dims, overwrite=True, config={})
    if like.dtype.kind == "f":
        array.attrs.put({"_FillValue": NAN_FILL})
    return array
