"""Keep xarray from importing dask just to ask whether an array is a dask array.

xarray answers "is this data a dask array?" (when it builds any variable from numpy data) by
importing ``dask.array`` whenever dask is installed: start-up paid by every command that builds
a result (``benchmarks/startup.py``), though probe's local runs never make a dask array. No object can
be a ``dask.array.Array`` before ``dask.array.core`` is imported, so ``defer`` gives xarray a
stand-in type whose ``isinstance`` check reads dask's class from ``sys.modules`` when it is
there and answers False otherwise: the same answer, without the import. Once a cluster run
imports dask.array, the check is dask's own.

Likewise xarray asks ``dask.base.is_dask_collection`` (importing dask) of every
index it builds; dask's answer for an object without a ``__dask_graph__`` method (a numpy
array) is False, so that case is answered here and every other one is still dask's. Where
xarray's internals differ from what this expects, nothing is changed (start-up is slower,
never wrong).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from functools import cached_property


class _DaskArrayType(type):
    def __instancecheck__(cls, obj: object) -> bool:
        core = sys.modules.get("dask.array.core")
        real = getattr(core, "Array", None)
        return real is not None and isinstance(obj, real)

    def __subclasscheck__(cls, other: type) -> bool:
        core = sys.modules.get("dask.array.core")
        real = getattr(core, "Array", None)
        return real is not None and issubclass(other, real)


class DaskArray(metaclass=_DaskArrayType):
    """Stands for ``dask.array.Array`` in isinstance checks, without importing it."""


class _DeferredDask:
    """What xarray caches about the dask module, with the module and version read on demand."""

    type = (DaskArray,)
    available = True

    @cached_property
    def module(self):
        import dask

        return dask

    @cached_property
    def version(self):
        from packaging.version import Version

        return Version(self.module.__version__)


def xarray():
    """xarray, imported with the stand-in installed (``defer_on_import`` does the same for a plain
    ``import xarray``)."""
    defer()
    import xarray as xr

    return xr


class _AfterXarray(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``xarray`` is about to be imported, wraps its loader so that
    ``defer`` runs as soon as the package has loaded, before any variable is built."""

    def find_spec(self, name, path=None, target=None):
        if name != "xarray":
            return None
        sys.meta_path.remove(self)  # once, and not while the real finders look
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            defer()

        spec.loader.exec_module = exec_module
        return spec


def defer_on_import() -> None:
    """Install the stand-in when xarray is imported, wherever that happens (now, if it is already):
    stores open without xarray (``store.direct``), so importing the store no longer brings it."""
    if "xarray" in sys.modules:
        defer()
    elif not any(isinstance(f, _AfterXarray) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterXarray())


def defer() -> bool:
    """Install the stand-in in xarray's cache of duck-array modules (True when installed)."""
    if importlib.util.find_spec("dask") is None:
        return False
    try:
        from xarray.namedarray import pycompat
    except ImportError:
        return False
    cached = getattr(pycompat, "_cached_duck_array_modules", None)
    if not isinstance(cached, dict) or not hasattr(pycompat, "array_type"):
        return False
    cached.setdefault("dask", _DeferredDask())
    _answer_plain_arrays()
    return cached["dask"].__class__ is _DeferredDask


def _answer_plain_arrays() -> None:
    """xarray's ``is_dask_collection``, answering objects without ``__dask_graph__`` itself."""
    from xarray.namedarray import utils

    ask_dask = getattr(utils, "is_dask_collection", None)
    if ask_dask is None or getattr(ask_dask, "_probe_deferred", False):
        return

    def is_dask_collection(x: object) -> bool:
        if not hasattr(x, "__dask_graph__"):  # dask.base.is_dask_collection's own first test
            return False
        return ask_dask(x)

    is_dask_collection._probe_deferred = True
    utils.is_dask_collection = is_dask_collection
