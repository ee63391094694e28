"""A command imports only what it uses: which heavy libraries a run loads (a module check, not a timing).

Each command runs in a fresh interpreter (the CLI's own ``main``), then lists the heavy modules
that ended up in ``sys.modules``. ``probe info`` and ``probe decode`` must load neither torch
(1.8 s of imports), nor dask.array or distributed (about a second between them: xarray's dask
chunk manager and its type check would bring them), nor matplotlib, scikit-learn, timm, nor
xarray and pandas (half a second: they read the store with zarr alone, ``store/direct.py``, and
decode writes its results with ``store/plain.py``), nor scipy.ndimage (0.15 s: connected
components come from scipy.sparse.csgraph). ``probe entropy`` and ``probe neighbours`` load no
torch either (neighbours runs the selection rules training runs, ``analyses/selection.py``, on
numpy arrays; ``tests/test_selection.py`` holds them to the torch results), and neither does
``probe attention-masks`` on a network with a class token (``probe knn``'s is checked in
``tests/test_knn.py``, on labelled panels); those two load no heavy library before their first
image (xarray only to save their results). The modules that correspond, hummingbird, linear,
linear-dinov2 and overcluster run before their first image load none of them either (checked by
importing them: their full runs need panels this file does not build). What these
commands read and write instead is checked here too: the same values as xarray's reading, the
same bytes as xarray's writing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "timm", "sklearn", "matplotlib", "distributed", "dask.array", "pycocotools.coco", "xarray", "pandas", "scipy.ndimage")

PROGRAM = """
import json, sys
from probe_toolkit.infra import runner
from probe_toolkit.cli import main
args, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
first = []
def noting(real):
    def noted(*a, **k):
        if not first:
            first.append(sorted(m for m in sys.modules if m in heavy))
        return real(*a, **k)
    return noted
runner.map_blocks = noting(runner.map_blocks)  # in this process: a worker's _call is pickled by name
sys.argv = ["probe", *args]
try:
    main()
except SystemExit as error:
    assert not error.code, error.code
print(json.dumps([sorted(m for m in sys.modules if m in heavy), first[0] if first else None]))
"""


def loaded(args: list[str]) -> tuple[list[str], list[str] | None]:
    """The heavy modules a run had loaded when it ended, and when the runner started on its first
    block of images (None: no block reached the runner), what ``benchmarks/startup.py --first-image`` times."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(args), json.dumps(HEAVY)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    end, first = json.loads(run.stdout.strip().splitlines()[-1])
    return end, first


def loaded_by(args: list[str]) -> list[str]:
    return loaded(args)[0]


@pytest.fixture()
def store(tiny_stores, tmp_path) -> Path:
    """A private copy of the tiny DINO store (decode writes its results into the store)."""
    return Path(shutil.copytree(tiny_stores["dino"], tmp_path / "teacher.zarr"))


def test_info_and_decode_load_no_heavy_library(store, tmp_path):
    assert loaded_by(["info", str(store)]) == []
    assert loaded_by(["decode", str(store), "-q", "--workers", "1", "--preset", "tokencut", "--cache", str(tmp_path / "cache")]) == []
    assert list((store / "results" / "decoder").glob("*/zarr.json"))  # the run did decode


def test_entropy_loads_no_torch_and_nothing_for_dask(store):
    assert loaded_by(["entropy", str(store), "-q", "--boot", "100"]) == []  # numpy arithmetic, the store read and the result written with zarr alone


def test_neighbours_loads_no_heavy_library(store):
    # the selection rules training runs (analyses/selection.py), here on numpy arrays
    assert loaded_by(["neighbours", str(store), "-q", "--boot", "100"]) == []


def test_attention_masks_of_a_class_token_load_no_torch(store, tmp_path):
    # DINO's rule reads the stored attention; only SelfPatch's aggregation head computes with torch
    heavy, first = loaded(["attention-masks", str(store), "-q", "--workers", "1", "--cache", str(tmp_path / "cache")])
    assert "torch" not in heavy and "timm" not in heavy
    assert first == []  # the store read with zarr alone: xarray and pandas come only to save the masks
    assert list((store / "results" / "attention_masks").glob("*/zarr.json"))  # the run did compute


IMPORTED = """
import json, sys
exec(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m in json.loads(sys.argv[2]))))
"""


@pytest.mark.parametrize(
    "statement",
    [
        "import probe_toolkit.commands.correspond, probe_toolkit.analyses.correspond",
        "import probe_toolkit.commands.hummingbird",
        "import probe_toolkit.commands.linear",
        "import probe_toolkit.commands.linear_dinov2",
        "import probe_toolkit.commands.overcluster",
        "from probe_toolkit.store.hints import extract_arguments; extract_arguments({'views': [224], 'interpolation': 'dino'}, ['224'], 'PANEL')",
    ],
    ids=["correspond", "hummingbird", "linear", "linear-dinov2", "overcluster", "a-panel's-fix-command"],
)
def test_what_a_protocol_runs_before_its_first_image_loads_no_heavy_library(statement):
    """The modules a protocol's run resolves to, and the fix command every panel's coverage check
    spells, load none of the heavy libraries: these commands read their stores with zarr alone and
    import xarray where a result is saved, torch where pairs are matched or a classifier trained
    (``benchmarks/startup.py --first-image --full`` times them)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", IMPORTED, statement, json.dumps(HEAVY)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


REFUSED = """
import json, sys
from probe_toolkit.cli import main
sys.argv = ["probe", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as error:
    code = error.code
print(json.dumps([code, sorted(m for m in sys.modules if m in ("torch", "timm"))]))
"""


@pytest.mark.parametrize(
    "options",
    [["--views", "999"], ["--views", "224", "--blocks", "x"], ["--for", "knn", "--views", "square@480"]],
    ids=["view", "blocks", "for-beside-views"],
)
def test_extract_refuses_a_bad_option_before_importing_torch(tiny_checkpoints, image_dir, options, tmp_path):
    """A mistyped option of `probe extract` is one line and exit 2 before torch and timm are
    imported (seconds of start-up): the settings are checked with plain data (store/architectures.py,
    store/extract_plan.py import neither)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    args = ["extract", str(tiny_checkpoints["dino-full"]), "--images", str(image_dir), *options, "--cache", str(tmp_path / "cache")]
    run = subprocess.run([sys.executable, "-c", REFUSED, json.dumps(args)], env=env, capture_output=True, text=True, timeout=300)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [2, []], run.stderr[-2000:]
    assert run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) <= 2
    assert not (tmp_path / "cache").exists()  # nothing written


@pytest.mark.parametrize("module", ["segment", "depth", "propagate", "correspond_navi"])
def test_the_commands_that_run_a_network_load_no_pandas_before_their_first_image(module):
    """The commands that run a network on images cannot avoid torch and timm, but they import
    xarray (and with it pandas) where they write their result, and DAVIS's scorer imports scipy
    where it measures a boundary: none of it before the first image."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    statement = f"import probe_toolkit.commands.{module}"
    run = subprocess.run(
        [sys.executable, "-c", IMPORTED, statement, json.dumps(["xarray", "pandas", "scipy.ndimage", "torch"])], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == ([] if module == "correspond_navi" else ["torch"])


def test_the_decoders_main_process_loads_no_scipy_before_its_first_image():
    """The decoding modules import scipy's sparse and dense linear algebra where they solve (0.2 s
    of imports): the command's own process, which hands blocks of images to its workers, and
    every process until its first image, load none of it."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    statement = "import probe_toolkit.commands.decode, probe_toolkit.commands.decode_sweep, probe_toolkit.commands.decode_scores"
    scipy = ("scipy.linalg", "scipy.sparse", "scipy.sparse.linalg", "scipy.spatial")
    run = subprocess.run([sys.executable, "-c", IMPORTED, statement, json.dumps(HEAVY + scipy)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


FULL_SWEEPS = """
import gc, json, sys
if sys.argv[1] == "probe":
    from probe_toolkit.cli import main
    sys.argv = ["probe", "--help"]
    try:
        main()
    except SystemExit:
        pass
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
import torch  # noqa: F401
print(json.dumps([gc.get_threshold()[2], len(full)]))
"""


def test_the_command_line_spares_full_collections_during_imports():
    """probe's main raises the oldest generation's threshold before a command's imports
    (infra/collector.py): importing torch in that process sweeps the whole heap fewer times
    than in a plain interpreter (3 times against none with torch 2.14)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    counts = {}
    for mode in ("plain", "probe"):
        run = subprocess.run([sys.executable, "-c", FULL_SWEEPS, mode], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        counts[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts["plain"][0] == 10 and counts["probe"][0] == 100
    assert counts["probe"][1] < counts["plain"][1]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_results_written_without_xarray_are_the_bytes_xarray_writes(tmp_path):
    """store.plain.write against xarray's own to_zarr: every metadata and chunk file the same,
    for the decoder's results (square and native), an empty shard's part and zarr's own chunking."""
    import numpy as np

    from probe_toolkit.analyses.decoder import collate
    from probe_toolkit.analyses.decoder_settings import Settings
    from probe_toolkit.labels.masks import decoder_dataset
    from probe_toolkit.store import plain

    rng = np.random.default_rng(0)
    decoded = collate([], Settings.from_preset("tokencut"), 900)
    n, k, patches = 3, 2, 900
    for name, shape in (("masks", (n, k, patches)), ("score", (n, k)), ("lambda2", (n, k)), ("lambda3", (n, k)), ("gap", (n, k)), ("ncut", (n, k))):
        dtype = getattr(decoded, name).dtype
        setattr(decoded, name, (rng.random(shape) > 0.5).astype(dtype) if dtype is bool else rng.standard_normal(shape).astype(dtype))
    for name in ("n_masks", "degenerate", "stop", "cuts", "dense_solves"):
        dtype = getattr(decoded, name).dtype
        setattr(decoded, name, np.asarray([0, 1, 0], dtype=dtype))
    decoded.fiedler, decoded.seed = rng.standard_normal((n, patches)).astype(np.float32), np.asarray([4, 0, 9], dtype=np.int32)
    square = decoder_dataset(decoded, ["a.jpg", "b.jpg", "c.jpg"])
    decoded.grids, decoded.patch = np.asarray([[30, 30], [20, 30], [30, 25]]), 16
    native = decoder_dataset(decoded, ["a.jpg", "b.jpg", "c.jpg"])
    empty = decoder_dataset(collate([], Settings.from_preset("tokencut"), 900), [])
    large = plain.Results(
        {
            "fiedler": (("image", "patch"), rng.standard_normal((3000, 900)).astype(np.float32)),
            "masks": (("image", "mask", "patch"), rng.random((3000, 2, 900)) > 0.5),
            "corloc": ((), 0.25),
        },
        coords={"image": np.asarray([f"{i}.jpg" for i in range(3000)], dtype=object)},
        attrs={"grid": np.int64(30), "stops": ["count"]},
    )
    for name, results in (("square", square), ("native", native), ("empty", empty), ("large", large)):
        results.attrs.update(manifest={"views": [224, 480]}, seconds=0.5)
        plain.write(results, tmp_path / f"{name}-plain")
        results.to_xarray().to_zarr(tmp_path / f"{name}-xarray", mode="w", consolidated=False, zarr_format=3)
        ours, theirs = _files(tmp_path / f"{name}-plain"), _files(tmp_path / f"{name}-xarray")
        assert sorted(ours) == sorted(theirs), name
        assert [f for f in ours if ours[f] != theirs[f]] == [], name
    assert len([f for f in _files(tmp_path / "large-plain") if f.startswith("fiedler/c/")]) > 1  # zarr chose several chunks


def test_scores_are_written_without_xarray_as_xarray_writes_them(tmp_path):
    """probe score's record (``decode_scores.scores_dataset``: 0-d numbers, string coordinates,
    store ids) is written by store.plain with every file xarray's to_zarr writes."""
    from types import SimpleNamespace

    import numpy as np

    from probe_toolkit.commands.decode_scores import scores_dataset
    from probe_toolkit.labels.scoring import METRICS, Scores
    from probe_toolkit.store import plain

    scores = Scores(
        segm={m: 0.1 * i for i, m in enumerate(METRICS)},
        bbox={m: 0.05 * i for i, m in enumerate(METRICS)},
        corloc=0.375,
        mean_best_iou=0.42,
        image_ids=[7, 3],
        corloc_hit=np.asarray([True, False]),
        first_box_iou=np.asarray([0.6, 0.1]),
        object_ids=np.asarray([11, 12, 13], dtype=np.int64),
        object_images=np.asarray([7, 7, 3], dtype=np.int64),
        best_iou=np.asarray([0.7, 0.2, 0.0]),
    )
    labels = SimpleNamespace(image_map={"sub/a.jpg": 7}, coco=SimpleNamespace(imgs={7: {"file_name": "a.jpg"}, 3: {"file_name": "b.jpg"}}))
    results = scores_dataset(scores, labels)
    results.attrs.update(panel="demo-val", counts={"images": 2})
    plain.write(results, tmp_path / "plain")
    results.to_xarray().to_zarr(tmp_path / "xarray", mode="w", consolidated=False, zarr_format=3)
    ours, theirs = _files(tmp_path / "plain"), _files(tmp_path / "xarray")
    assert sorted(ours) == sorted(theirs)
    assert [f for f in ours if ours[f] != theirs[f]] == []
    assert list(results["image"].values) == ["sub/a.jpg", "b.jpg"] and list(results["object_image"].values) == ["sub/a.jpg", "sub/a.jpg", "b.jpg"]


def test_decode_saves_what_it_saved_through_xarray(store, tmp_path):
    """probe decode's saved arrays, read back with xarray, equal a reference written by xarray from them."""
    import numpy as np

    from probe_toolkit.results import records

    assert loaded_by(["decode", str(store), "-q", "--workers", "1", "--preset", "tokencut", "--cache", str(tmp_path / "cache")]) == []
    saved = records.load(store, "decoder")
    assert saved["masks"].dims == ("image", "mask", "patch") and saved["masks"].dtype == bool
    assert saved["fiedler"].dtype == np.float32 and saved["image"].values.tolist() == sorted(saved["image"].values.tolist())
    assert saved.attrs["grid"] == 30 and saved.attrs["settings"]["preset"] == "tokencut"


def test_stores_read_with_zarr_alone_match_xarray(tmp_path):
    """open_store(plain=True): the same arrays, dimensions, values and images as xarray's reading,
    with an unfinished image dropped, and the same lines from probe info."""
    import numpy as np
    from analysis_stores import make_store

    from probe_toolkit.store.cache import open_store, require

    tokens = np.random.default_rng(1).standard_normal((10, 196, 8)).astype(np.float16)
    failed = np.zeros(10, dtype=bool)
    failed[[2, 5]] = True
    path = make_store(tmp_path / "teacher.zarr", {"tokens_224": tokens}, chunk=4, failed=failed)
    for done_only in (True, False):
        ours, theirs = open_store(path, plain=True, done_only=done_only), open_store(path, done_only=done_only)
        assert dict(ours.sizes) == dict(theirs.sizes) and sorted(ours.data_vars) == sorted(theirs.data_vars)
        for name in theirs.variables:
            assert ours[name].dims == theirs[name].dims, name
            assert np.array_equal(ours[name].values, theirs[name].values), name
        mine, xr_array = require(ours, "tokens_224"), require(theirs, "tokens_224")
        assert mine.dims == xr_array.dims and mine.attrs == xr_array.attrs and np.array_equal(mine.encoding["probe_image_edges"], xr_array.encoding["probe_image_edges"])
        assert np.array_equal(mine.isel(image=slice(1, 4)).values, xr_array.isel(image=slice(1, 4)).values)
        assert np.array_equal(mine.coords["image"].values, xr_array.coords["image"].values)
        picked = [str(i) for i in xr_array.coords["image"].values[::-2]]  # ids out of the store's order, as knn picks a panel's
        assert np.array_equal(mine.sel(image=picked).isel(image=slice(1, 3)).values, xr_array.sel(image=picked).isel(image=slice(1, 3)).values)
        with pytest.raises(KeyError):
            mine.sel(image=["absent.png"])


def test_xarray_still_knows_a_dask_array_when_there_is_one():
    """The deferred check (infra/lazy_dask) answers as xarray's own once dask.array is imported."""
    import numpy as np
    import xarray as xr
    from xarray.namedarray.pycompat import array_type, is_chunked_array

    import probe_toolkit.store.cache  # noqa: F401  (installs the deferral)
    from probe_toolkit.infra import lazy_dask

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
    from probe_toolkit.infra.cluster import image_chunk_edges
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


def _entropy(ds):
    from probe_toolkit.analyses.entropy import entropy
    from probe_toolkit.analyses.stats import Bootstrap
    from probe_toolkit.store.cache import require

    return entropy(require(ds, "attention_224"), class_token=True, blocks=require(ds, "attention_blocks_224"), patch=3, boot=Bootstrap(10))


def _neighbours(ds):
    from probe_toolkit.analyses.neighbours import neighbours
    from probe_toolkit.analyses.stats import Bootstrap
    from probe_toolkit.store.cache import require

    tokens = require(ds, "tokens_224")
    return neighbours(tokens, int(round(tokens.shape[1] ** 0.5)), k=2, top=3, boot=Bootstrap(10))


@pytest.mark.parametrize("analysis", [_entropy, _neighbours], ids=["entropy", "neighbours"])
def test_analysis_results_are_written_as_xarray_writes_them(analysis, store, tmp_path):
    """Results that store.plain writes (string coordinates from the store, fixed-width statistic
    names, 0-d scalars of every dtype, integer tables), written by store.plain and by xarray:
    the same files, byte for byte."""
    from probe_toolkit.store import plain
    from probe_toolkit.store.cache import open_store

    result = analysis(open_store(store, plain=True))
    plain.write(result, tmp_path / "plain")
    result.to_xarray().to_zarr(tmp_path / "xarray", mode="w", consolidated=False, zarr_format=3)
    ours, theirs = _files(tmp_path / "plain"), _files(tmp_path / "xarray")
    assert sorted(ours) == sorted(theirs) and [f for f in ours if ours[f] != theirs[f]] == []


def test_library_versions_are_the_metadata_versions():
    """The manifest's library versions, read from each METADATA file's Version line, are what
    importlib.metadata.version parses out of the whole file."""
    from importlib import metadata

    from probe_toolkit.infra import provenance

    versions = provenance.library_versions.__wrapped__()
    for name in provenance.LIBRARIES:
        try:
            expected = metadata.version(name)
        except metadata.PackageNotFoundError:
            expected = "absent"
        assert versions[name] == expected, name
    assert versions["numpy"] == np_version()


def np_version() -> str:
    import numpy

    return numpy.__version__
