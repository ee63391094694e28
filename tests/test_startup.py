"""A command imports only what it uses: which heavy libraries a run loads (a module check, not a timing).

Each command runs in a fresh interpreter (the CLI's own ``main``), then lists the heavy modules
that ended up in ``sys.modules``. ``probe info`` and ``probe decode`` must load neither torch
(1.8 s of imports), nor dask.array or distributed (about a second between them: xarray's dask
chunk manager and its type check would bring them), nor matplotlib, scikit-learn, timm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "timm", "sklearn", "matplotlib", "distributed", "dask.array", "pycocotools.coco")

PROGRAM = """
import json, sys
from probe_toolkit.cli import main
args, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["probe", *args]
try:
    main()
except SystemExit as error:
    assert not error.code, error.code
print(json.dumps(sorted(m for m in sys.modules if m in heavy)))
"""


def loaded_by(args: list[str]) -> list[str]:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(args), json.dumps(HEAVY)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture()
def store(tiny_stores, tmp_path) -> Path:
    """A private copy of the tiny DINO store (decode writes its results into the store)."""
    return Path(shutil.copytree(tiny_stores["dino"], tmp_path / "teacher.zarr"))


def test_info_and_decode_load_no_heavy_library(store, tmp_path):
    assert loaded_by(["info", str(store)]) == []
    assert loaded_by(["decode", str(store), "-q", "--workers", "1", "--preset", "tokencut", "--cache", str(tmp_path / "cache")]) == []
    assert (store / "results" / "decoder" / "zarr.json").is_file()  # the run did decode


def test_entropy_loads_torch_for_its_arithmetic_and_nothing_for_dask(store):
    assert loaded_by(["entropy", str(store), "-q", "--boot", "10"]) == ["torch"]


def test_xarray_still_knows_a_dask_array_when_there_is_one():
    """The deferred check (infra/lazy_dask) answers as xarray's own once dask.array is imported."""
    import numpy as np
    import xarray as xr

    import probe_toolkit.store.cache  # noqa: F401  (installs the deferral)
    from probe_toolkit.infra import lazy_dask
    from xarray.namedarray.pycompat import array_type, is_chunked_array

    assert lazy_dask.defer()
    import dask.array as da

    lazy = xr.DataArray(da.zeros((4, 3), chunks=2))
    assert isinstance(lazy.data, da.Array) and lazy.chunks == ((2, 2), (2, 1))
    assert is_chunked_array(lazy.data) and not is_chunked_array(np.zeros(3))
    assert isinstance(lazy.data, array_type("dask")) and not isinstance(np.zeros(3), array_type("dask"))
    masked = xr.DataArray(da.ma.masked_array(da.arange(3.0), mask=[True, False, False]))
    assert np.array_equal(masked.values, [np.nan, 1.0, 2.0], equal_nan=True)  # xarray's masked-dask branch still taken
    assert xr.Dataset({"a": ("x", np.arange(4))}).chunk({"x": 2}).chunks == {"x": (2, 2)}


def test_store_arrays_know_their_chunks_without_dask(tmp_path):
    """open_store records the zarr chunks along ``image`` among the finished images, where dask kept
    them as its chunks, so the runner still reads each chunk once (``infra.runner._ChunkReader``)."""
    import numpy as np
    from analysis_stores import make_store

    from probe_toolkit.infra import runner
    from probe_toolkit.infra.chunked import image_chunk_edges
    from probe_toolkit.store.cache import open_store, require

    tokens = np.random.default_rng(0).standard_normal((10, 196, 8)).astype(np.float16)
    failed = np.zeros(10, dtype=bool)
    failed[5] = True
    path = make_store(tmp_path / "teacher.zarr", {"tokens_224": tokens}, chunk=4, failed=failed)
    array = require(open_store(path), "tokens_224")
    assert image_chunk_edges(array) == [0, 4, 7, 9]  # chunks 0-3 | 4, 6, 7 | 8, 9 of the store
    reader = runner._ChunkReader({"tokens": array}, 0, 9)
    assert reader.edges.tolist() == [0, 4, 7, 9]
    assert np.array_equal(reader(4, 6)["tokens"], tokens[[4, 6]]) and reader.span == (4, 7)
    assert np.array_equal(reader(6, 7)["tokens"], tokens[[7]]) and reader.span == (4, 7)  # the held chunk, not a new read
