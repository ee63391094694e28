"""Issue 33, classes 4 and 5, through the real CLI: damaged stores and relative paths.

Each case asserts what the catalogue asserts (``test_catalogue.refused``): the exit status, one
line on stderr naming the problem and the fix, no traceback, the user's files untouched; then it
runs the fix the line gives and checks the corrected rerun, and its numbers: a store re-extracted
with ``--repair`` holds the very chunk bytes it held before the damage and gives the same
neighbours figures; a decode from another directory reads the photographs the store was extracted
from, not the ones under the current directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import scenes_folder, synthetic_scene
from test_catalogue import SCENES, probe, refused, tree, w  # noqa: F401  (w: the catalogue's world, for the careless trial)

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.results import records


@pytest.fixture(scope="module")
def t(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    images = scenes_folder(root, SCENES)
    world = SimpleNamespace(root=root, images=images, ckpt=write_checkpoint(root / "tiny.pth", "dino-full", TINY, seed=0), cache=root / "cache")
    world.store = root / "stores" / "good" / "teacher.zarr"
    made = probe(
        "extract", world.ckpt, "--images", images, "--views", "224,480", "--chunk", "2", "--batch-size", "2", "--store", world.store, "--cache", world.cache, "-q"
    )
    assert made.code == 0, made.err
    world.base = json.loads(_neighbours(world.store, root / "base.json").read_text())
    world.count = iter(range(1000))
    return world


def _neighbours(store: Path, out: Path) -> Path:
    run = probe("neighbours", store, "--boot", "100", "--json", out, "-q")
    assert run.code == 0, run.err
    return out


def _summary(payload: dict) -> dict:
    (only,) = payload["stores"].values()
    return only["summary"]


def _copy(t, store: Path | None = None) -> Path:
    path = t.root / "stores" / f"copy-{next(t.count)}" / "teacher.zarr"
    shutil.copytree(store or t.store, path)
    return path


def _leaf(folder: Path) -> Path:
    """The one chunk file of a chunk's key (a file itself for a one-dimensional array)."""
    if folder.is_file():
        return folder
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert len(files) == 1, files
    return files[0]


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 3])
    elif how == "flip":  # one byte changed, the length kept: only a checksum sees it
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0x5A]) + data[middle + 1 :])


def _fix_command(line: str) -> list[str]:
    """The ``probe extract ... --repair`` command the line gives, as arguments."""
    command = line.split("re-extract only those images: probe ", 1)[1]
    return command.split()


DAMAGE = [  # (command, array, how, what the line says); chunk 1 holds c.png and d.png (chunks of 2)
    ("neighbours", "tokens_224", "delete", "is missing"),
    ("neighbours", "tokens_224", "truncate", "fails its checksum"),
    ("neighbours", "tokens_224", "flip", "fails its checksum"),
    ("entropy", "attention_224", "truncate", "fails its checksum"),
    ("decode", "keys_480", "delete", "is missing"),
    ("decode", "keys_480", "flip", "fails its checksum"),
    ("attention-masks", "attention_224", "flip", "fails its checksum"),  # read through xarray
    ("info", "keys_480", "truncate", "fails its checksum"),
    ("decode", "image_height", "flip", "fails its checksum"),  # the shared sizes: every view is extracted again
    ("entropy", "image_width", "delete", "is missing"),  # checked by every command that opens the store
]

ARGS = {"neighbours": ["--boot", "100", "-q"], "entropy": ["--boot", "100", "-q"], "decode": ["-q"], "attention-masks": ["-q"], "info": []}


@pytest.mark.parametrize("command,array,how,needle", DAMAGE, ids=[f"{c}-{a}-{h}" for c, a, h, _ in DAMAGE])
def test_a_damaged_chunk_is_one_line_and_repair_restores_the_same_bytes(t, command, array, how, needle):
    store = _copy(t)
    good = _leaf(t.store / array / "c" / "1").read_bytes()
    damage(_leaf(store / array / "c" / "1"), how)
    args = [command, *(["--verify"] if command == "info" else []), store, *ARGS[command]]
    before = tree(store, t.images, t.ckpt)
    result = probe(*args)
    refused(result, 1, (array, "chunk 1", "images c.png, d.png", needle, "--repair", str(t.images.resolve())))
    assert tree(store, t.images, t.ckpt) == before  # nothing written, nothing removed
    fix = probe(*_fix_command(result.lines[0]), "-q")
    assert fix.code == 0, fix.err
    assert _leaf(store / array / "c" / "1").read_bytes() == good  # the chunk as extracted first, byte for byte
    assert probe(*args).code == 0
    verified = probe("info", "--verify", store)
    assert verified.code == 0 and "none damaged (checksums verified)" in verified.out, verified.out
    if command == "neighbours":
        assert _summary(json.loads(_neighbours(store, t.root / f"n-{next(t.count)}.json").read_text())) == _summary(t.base)


FLAGS = [("done", "neighbours"), ("done_224", "neighbours"), ("done", "report"), ("done_480", "decode")]


@pytest.mark.parametrize("flag,command", FLAGS, ids=[f"{f}-{c}" for f, c in FLAGS])
def test_a_deleted_done_chunk_is_damage_not_unfinished_images(t, flag, command):
    """The completion flag of chunk 1 (c.png, d.png) deleted: before, its images read as not yet
    extracted (a reader dropped them, extract extracted them again unchecked). Now every reader,
    ``info --verify`` and the plain extract rerun (issue 46: also for the global ``done``) refuse
    in one line naming the flag and ``--repair``, touching nothing; the repair gives back the same figures."""
    store = _copy(t)
    good = _leaf(t.store / flag / "c" / "1").read_bytes()
    _leaf(store / flag / "c" / "1").unlink()
    before = tree(store, t.images, t.ckpt)
    out = t.root / f"report-{next(t.count)}"
    args = {"neighbours": ["neighbours", store, "--boot", "100", "-q"], "decode": ["decode", store, "-q"], "report": ["report", store, "--out", out]}[command]
    result = probe(*args)
    assert not out.exists()
    refused(result, 1, (flag, "chunk 1", "images c.png, d.png", "is missing", "--repair"))
    refused(probe("info", "--verify", store), 1, (flag, "chunk 1", "--repair"))
    again = probe("extract", t.ckpt, "--images", t.images, "--views", "224,480", "--chunk", "2", "--batch-size", "2", "--store", store, "-q")
    refused(again, 1, (flag, "chunk 1", "--repair"))  # the global flag too: never "0 written now" with exit 0 while readers refuse
    assert tree(store, t.images, t.ckpt) == before  # nothing written, nothing re-extracted
    fix = probe(*_fix_command(result.lines[0]), "-q")
    assert fix.code == 0, fix.err
    assert _leaf(store / flag / "c" / "1").read_bytes() == good
    assert probe("info", "--verify", store).code == 0
    assert probe(*args).code == 0
    if command == "neighbours":
        assert _summary(json.loads(_neighbours(store, t.root / f"n-{next(t.count)}.json").read_text())) == _summary(t.base)


def test_the_report_reads_stored_arrays_through_the_one_checked_read(t):
    """The report's pictures read tokens and attention themselves (not through a command's
    ``require``): a deleted chunk of the followed image was a NaN picture; now it is one line,
    and no report folder is left."""
    store = _copy(t)
    _leaf(store / "tokens_224" / "c" / "1").unlink()
    out = t.root / f"report-{next(t.count)}"
    result = probe("report", store, "--follow", "c.png", "--out", out)
    refused(result, 1, ("tokens_224", "chunk 1", "images c.png, d.png", "is missing", "--repair"))
    assert not out.exists()
    assert probe(*_fix_command(result.lines[0]), "-q").code == 0
    assert probe("report", store, "--follow", "c.png", "--out", out).code == 0


@pytest.mark.parametrize("how", ["delete", "flip"])
def test_a_damaged_result_file_is_one_line_and_a_rerun_writes_a_new_record(t, how):
    """Result groups skip all-fill chunks and carry no checksums: ``record.json`` lists each file's
    sha256, and every reader of a record (the report, ``probe results``' loads) checks them."""
    store = _copy(t)
    assert probe("decode", store, "-q").code == 0
    (record,) = records.runs(store, "decoder")
    listed = json.loads((record.path / "record.json").read_text())["files"]
    assert set(listed) == {str(p.relative_to(record.path)) for p in record.path.rglob("*") if p.is_file() and p.name != "record.json"}
    assert all(listed[k] == integrity_digest(str(record.path / k)) for k in listed)  # sha256 written out here
    victim = next(record.path / k for k in sorted(listed) if k.startswith("masks/c/"))
    damage(victim, how)
    out = t.root / f"report-{next(t.count)}"
    result = probe("report", store, "--out", out)
    refused(result, 1, (str(victim), "is missing" if how == "delete" else "has changed", "probe decode", "new record"))
    assert not out.exists()
    assert probe("decode", store, "-q").code == 0  # the fix: a new record beside the damaged one
    assert probe("report", store, "--out", out).code == 0


def test_a_missing_chunk_no_longer_gives_other_numbers(t):
    """The issue's case: one chunk file deleted, neighbours exited 0 with other numbers. Before the
    damage the figure is the baseline; the damaged store now refuses; after --repair the figure is
    the baseline again, and it equals the share computed here from the tokens (an independent count)."""
    store = _copy(t)
    tokens = _tokens(store)
    _leaf(store / "tokens_224" / "c" / "0").unlink()
    result = probe("neighbours", store, "--boot", "100", "-q")
    refused(result, 1, ("tokens_224", "images a.png, b.png", "is missing"))
    info = probe("info", store, env={"COLUMNS": "400"})
    assert info.code == 0 and "MISSING" in info.out and "4/4 done" in info.out
    assert probe(*_fix_command(result.lines[0]), "-q").code == 0
    again = _summary(json.loads(_neighbours(store, t.root / "again.json").read_text()))
    assert again == _summary(t.base)
    # float64 here, float32 in the toolkit: near-ties among float16 tokens may rank one neighbour of the 4 × 196 × 8 otherwise
    assert again["top_in_window"]["mean"] == pytest.approx(_top_in_window(tokens), abs=2 / (4 * 196 * 8))


def _tokens(store: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_group(str(store), mode="r")["tokens_224"][:], dtype=np.float64)


def _top_in_window(tokens: np.ndarray, side: int = 14, top: int = 8) -> float:
    """Share of each patch's ``top`` most cosine-similar other patches that lie in its 3×3 window
    on the torus (wrapping), mean over patches, then over images: written here from the definition."""
    shares = []
    for image in tokens:
        x = image / np.linalg.norm(image, axis=1, keepdims=True)
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)
        r, c = np.divmod(np.arange(side * side), side)
        dr = np.abs(r[:, None] - r[None, :])
        dc = np.abs(c[:, None] - c[None, :])
        window = (np.minimum(dr, side - dr) <= 1) & (np.minimum(dc, side - dc) <= 1)
        np.fill_diagonal(window, False)
        best = np.argsort(-sim, axis=1, kind="stable")[:, :top]
        shares.append(np.take_along_axis(window, best, axis=1).mean())
    return float(np.mean(shares))


def test_a_worker_that_finds_a_chunk_missing_says_so(t, monkeypatch):
    """On a real local dask cluster: the client's checks pass, then the chunk goes before the
    worker reads it (another machine's copy of the store): one line, not NaN tokens."""
    from distributed import LocalCluster

    from probe_toolkit.infra import cluster as cluster_side

    store = _copy(t)
    cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    real = cluster_side.connect

    def connect(address):
        client = real(address)
        _leaf(store / "tokens_224" / "c" / "1").unlink()
        return client

    try:
        monkeypatch.setattr(cluster_side, "connect", connect)
        result = probe("neighbours", store, "--boot", "100", "--dask-address", cluster.scheduler_address, "-q")
        refused(result, 1, ("tokens_224", "chunk 1", "is missing"))
    finally:
        cluster.close()


def test_stores_written_before_checksums_still_read_and_verify_says_what_it_can(t, monkeypatch):
    from zarr.codecs import ZstdCodec

    from probe_toolkit.store import codec

    monkeypatch.setattr(codec, "compressors", lambda level=1: [ZstdCodec(level=level)])
    old = t.root / "stores" / "old" / "teacher.zarr"
    assert probe("extract", t.ckpt, "--images", t.images, "--views", "224", "--chunk", "2", "--store", old, "-q").code == 0
    monkeypatch.undo()
    assert '"crc32c"' not in (old / "tokens_224" / "zarr.json").read_text()
    verified = probe("info", "--verify", old)
    assert verified.code == 0 and "presence and decodability checked, not content" in verified.out
    assert _summary(json.loads(_neighbours(old, t.root / "old.json").read_text())) == _summary(t.base)
    damage(_leaf(old / "tokens_224" / "c" / "1"), "truncate")
    refused(probe("neighbours", old, "--boot", "100", "-q"), 1, ("tokens_224", "chunk 1", "cannot be decoded", "--repair"))


# ----------------------------------------------------------------------------------------------
# class 5: paths


def test_image_source_and_checkpoint_are_recorded_absolute(t, monkeypatch):
    monkeypatch.chdir(t.root)
    store = t.root / "stores" / "rel" / "teacher.zarr"
    assert probe("extract", "tiny.pth", "--images", "scenes", "--views", "480", "--chunk", "2", "--store", "stores/rel/teacher.zarr", "-q").code == 0
    meta = json.loads((store / "zarr.json").read_text())["attributes"]["manifest"]
    assert meta["image_source"] == str(t.images.resolve()) and meta["checkpoint"]["path"] == str(t.ckpt.resolve())


def _relative(t, source: str) -> Path:
    """A copy of the store as an older probe wrote it: ``image_source`` as typed, relative."""
    import zarr

    store = _copy(t)
    group = zarr.open_group(str(store), mode="r+", use_consolidated=False)
    meta = dict(group.attrs["manifest"])
    meta["image_source"] = source
    group.attrs["manifest"] = meta
    return store


def _decoded(store: Path) -> dict[str, np.ndarray]:
    ds = records.load(store, "decoder")
    return {name: np.asarray(ds[name].values) for name in ("masks", "fiedler") if name in ds}


def test_colour_term_reads_the_stores_photographs_not_the_current_directorys(t, monkeypatch, tmp_path):
    """An older store recorded ``scenes`` relative. Run from a directory that holds another
    ``scenes/`` (the same names, other pixels), decode --color-lambda reads the store's own
    photographs: the masks equal those of a store recording the folder absolute."""
    reference = _copy(t)
    assert probe("decode", reference, "--preset", "dsm", "--color-lambda", "1", "-q").code == 0
    older = _relative(t, "scenes")  # under stores/copy-N/: found two folders up, beside stores/
    decoy = tmp_path / "scenes"
    decoy.mkdir()
    for seed, (name, (size, _boxes)) in enumerate(SCENES.items()):
        synthetic_scene(decoy / name, size, [], seed=100 + seed)
    monkeypatch.chdir(tmp_path)
    run = probe("decode", older, "--preset", "dsm", "--color-lambda", "1", "-q")
    assert run.code == 0, run.err
    got, want = _decoded(older), _decoded(reference)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k], equal_nan=True) for k in want)


def test_a_relative_source_found_nowhere_is_refused_and_recorded_by_extract(t, tmp_path):
    store = _relative(t, "nowhere")
    before = tree(store, t.images)
    result = probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "-q")
    refused(result, 2, ("'nowhere'", "relative", "probe extract", "--store"))
    assert tree(store, t.images) == before
    command = result.lines[0].split("nothing is extracted again): probe ", 1)[1].split()
    command[command.index("--images") + 1] = str(t.images)
    assert probe(*command, "-q").code == 0
    assert json.loads((store / "zarr.json").read_text())["attributes"]["manifest"]["image_source"] == str(t.images.resolve())
    assert probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "-q").code == 0


def test_photographs_changed_since_extraction_are_refused(t):
    folder = t.root / "changing"
    shutil.copytree(t.images, folder)
    store = t.root / "stores" / "changing" / "teacher.zarr"
    assert probe("extract", t.ckpt, "--images", folder, "--views", "480", "--chunk", "2", "--store", store, "-q").code == 0
    kept = (folder / "c.png").read_bytes()
    synthetic_scene(folder / "c.png", (64, 64), [], seed=9)  # another photograph under the same name
    result = probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "-q")
    refused(result, 2, ("c.png", "64×64", "112×80", "restore"))
    (folder / "c.png").write_bytes(kept)
    assert probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "-q").code == 0
    synthetic_scene(folder / "d.png", SCENES["d.png"][0], [], seed=9)  # the same size, other pixels: only the recorded sha256 sees it
    refused(probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "-q"), 2, ("d.png", "has changed", "since", "restore", "--store"))
    damage(_leaf(store / "keys_480" / "c" / "1"), "flip")  # c.png, d.png: --repair would extract d.png from other pixels
    result = probe("decode", store, "-q")
    refused(result, 1, ("keys_480", "fails its checksum", "--repair"))
    before = tree(store)
    refused(probe(*_fix_command(result.lines[0].replace(str(t.images.resolve()), str(folder.resolve()))), "-q"), 2, ("d.png", "has changed", "new store"))
    assert tree(store) == before  # refused before any change
    (folder / "d.png").write_bytes((t.images / "d.png").read_bytes())
    assert probe(*_fix_command(result.lines[0].replace(str(t.images.resolve()), str(folder.resolve()))), "-q").code == 0
    assert probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "-q").code == 0


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_worker_reading_other_bytes_than_the_command_hashed_is_one_line(t, monkeypatch, workers):
    """The command hashes each photograph; a worker that then reads other bytes at that path (its
    own machine's folder) stops with one line, at one worker or two (forked processes)."""
    from probe_toolkit.store import sources

    real = sources.file_digest
    monkeypatch.setattr(sources, "file_digest", lambda path: "0" * 64 if Path(path).name == "d.png" else real(path))
    monkeypatch.setattr(sources, "recorded_digests", lambda store, positions: [None] * len(positions))  # as for a store without records
    store = _copy(t)
    result = probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "--workers", workers, "-q")
    refused(result, 1, ("d.png", "other bytes", "same folder"))
    monkeypatch.undo()
    assert probe("decode", store, "--preset", "dsm", "--color-lambda", "1", "--workers", workers, "-q").code == 0


def test_propagate_hands_workers_absolute_frames_and_their_digests(t, monkeypatch, tmp_path):
    """--davis given relative: the frames the workers get are absolute; a frame whose bytes differ
    from what the command hashed (another machine's DAVIS folder) is one line, never another J&F."""
    from probe_toolkit.commands import propagate
    from probe_toolkit.demo.video import write_davis

    write_davis(tmp_path / "DAVIS", {"pair": 3}, size=(96, 64), seed=3)
    monkeypatch.chdir(tmp_path)
    seen = []
    real_block = propagate.propagate_block

    def block(*args, job, **kwargs):
        seen.append(job)
        return real_block(*args, job=job, **kwargs)

    monkeypatch.setattr(propagate, "propagate_block", block)
    args = ["propagate", t.ckpt, "--davis", "DAVIS", "--n-last-frames", "2", "--workers", "1", "--cache", tmp_path / "c", "-q"]
    run = probe(*args, "--out", "out")
    assert run.code == 0, run.err
    frames = [f for job in seen for seq in job.frames for f in seq]
    assert frames and all(Path(f).is_absolute() and Path(f).is_file() for f in frames)
    assert [d for job in seen for seq in job.digests for d in seq] == [integrity_digest(f) for f in frames]
    real = propagate.file_digest
    monkeypatch.setattr(propagate, "file_digest", lambda path: "0" * 64 if Path(path).name == "00001.jpg" else real(path))
    refused(probe(*args, "--out", "out2"), 1, ("00001.jpg", "other bytes"))


def integrity_digest(path: str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------
# a fresh careless trial (issue 33): outputs over inputs and users' files, panels of the wrong kind


def _careless_world(w):
    notes = w.root / "notes.txt"
    if not notes.exists():
        notes.write_text("the user's own notes\n")
        (w.root / "grid.toml").write_text('preset = ["tokencut"]\ntau = [0.2]\n')
        (w.root / "mine.json").write_text('{"my": "own results"}\n')  # the user's JSON object, not a summary probe wrote
    return notes


CARELESS = [  # (id, bad arguments, needles, corrected arguments); S the store, M its masks file, N the user's notes, R a fresh path
    ("decode-out-over-the-stores-zarr-json", ["decode", "S", "--out", "S/zarr.json"], ("lies inside the store", "its own input"), ["decode", "S", "--out", "R.json"]),
    ("decode-out-over-a-users-file", ["decode", "S", "--out", "N"], ("exists and is not a masks file probe wrote",), ["decode", "S", "--out", "R.json"]),
    ("decode-out-a-folder", ["decode", "S", "--out", "IMAGES"], ("is a folder",), ["decode", "S", "--out", "R.json"]),
    ("decode-json-over-the-stores-zarr-json", ["decode", "S", "--json", "S/zarr.json"], ("lies inside teacher.zarr", "--json"), ["decode", "S", "--json", "R.json"]),
    (
        "entropy-json-over-the-stores-zarr-json",
        ["entropy", "S", "--boot", "100", "--json", "S/zarr.json"],
        ("lies inside teacher.zarr",),
        ["entropy", "S", "--boot", "100", "--json", "R.json"],
    ),
    (
        "neighbours-json-over-a-users-file",
        ["neighbours", "S", "--boot", "100", "--json", "N"],
        ("not a JSON summary probe wrote",),
        ["neighbours", "S", "--boot", "100", "--json", "R.json"],
    ),
    (
        "entropy-json-over-a-users-json-object",
        ["entropy", "S", "--boot", "100", "--json", "UJ"],
        ("not a JSON summary probe wrote",),
        ["entropy", "S", "--boot", "100", "--json", "R.json"],
    ),
    (
        "score-json-over-its-masks",
        ["score", "M", "--panel", "va", "--json", "M"],
        ("is the file this command reads",),
        ["score", "M", "--panel", "va", "--json", "R.json"],
    ),
    (
        "sweep-settings-out-over-the-stores-zarr-json",
        ["decode-sweep", "S", "--panel", "va", "--grid", "GRID", "--settings-out", "S/zarr.json"],
        ("lies inside teacher.zarr", "--settings-out"),
        ["decode-sweep", "S", "--panel", "va", "--grid", "GRID", "--settings-out", "R.json"],
    ),
    ("correspond-on-a-coco-panel", ["correspond", "S", "--panel", "va"], ("is a coco panel", "correspond reads spair or navi panels"), None),
    ("hummingbird-on-coco-panels", ["hummingbird", "S", "--train", "tr", "--val", "va"], ("is a coco panel", "voc-segmentation or ade20k"), None),
    (
        "linear-with-workers",
        ["linear", "S", "--train", "tr", "--val", "va", "--workers", "2"],
        ("linear does not use --workers", "drop --workers"),
        ["linear", "S", "--train", "tr", "--val", "va", "--epochs", "5"],
    ),
    (
        "panel-add-a-checkpoint-as-coco",
        ["panel", "add", "junk", "--annotations", "CKPT", "--images", "IMAGES", "--role", "val"],
        ("is not a COCO annotation file", "not a .json file"),
        ["panel", "add", "junk", "--annotations", "VALJSON", "--images", "IMAGES", "--role", "val"],
    ),
    (
        "report-run-id-of-no-record",
        ["report", "S", "--run", "19990101", "--out", "R"],
        ("--run", "'19990101' is the run id of no record", "`probe results "),
        ["report", "S", "--out", "R"],
    ),
    (
        "extract-into-another-stores-results",
        ["extract", "CKPT", "--images", "IMAGES", "--views", "224", "--chunk", "2", "--store", "S/results/inner.zarr"],
        ("lies inside the store", "outside any store"),
        ["extract", "CKPT", "--images", "IMAGES", "--views", "224", "--chunk", "2", "--store", "R.zarr"],
    ),
    ("ledger-verify-a-mistyped-cache", ["ledger", "verify", "--cache", "IMAGES"], ("not a probe cache folder", "--cache"), ["ledger", "verify", "--cache", "CACHE"]),
]


def test_summary_replaced_only_where_probe_wrote_it(w):
    """A --json summary of an earlier run is replaced by the rerun; it carries probe's mark."""
    out = w.root / "summary-twice.json"
    for _ in range(2):
        result = probe("entropy", str(w.store), "--boot", "100", "--json", str(out), "-q")
        assert result.code == 0, result.err
    written = json.loads(out.read_text())
    assert written["written_by"].startswith("probe ") and written["analysis"] == "entropy"


@pytest.mark.parametrize("case", CARELESS, ids=[c[0] for c in CARELESS])
def test_careless(w, case):
    name, bad, needles, fixed = case
    notes = _careless_world(w)
    fresh = w.root / f"careless-{next(w.count)}"
    names = {
        "S": str(w.store),
        "M": str(w.masks),
        "N": str(notes),
        "R": str(fresh),
        "IMAGES": str(w.images),
        "CKPT": str(w.ckpt),
        "GRID": str(w.root / "grid.toml"),
        "VALJSON": str(w.root / "val.json"),
        "CACHE": str(w.cache),
        "UJ": str(w.root / "mine.json"),
    }

    def spelled(args):
        out = []
        for a in args:
            head, sep, tail = a.partition("/") if a.startswith(("S/", "M/")) else (a.partition(".") if a.startswith("R.") else (a, "", ""))
            out.append(names[head] + sep + tail if head in names else a)
        cached = [] if args[0] in ("entropy", "neighbours", "ledger") else ["--cache", w.cache]  # the summaries over stores read no panel
        return [*out, *cached, *([] if args[0] in ("panel", "score", "ledger", "report") else ["-q"])]

    roots = (w.store, w.images, w.ckpt, notes, w.root / "mine.json", w.cache / "panels.toml", w.cache / "ledger.jsonl")
    before = tree(*roots)
    result = probe(*spelled(bad))
    refused(result, 2, needles)
    assert tree(*roots) == before  # nothing written, nothing replaced, no ledger line
    if fixed is not None:
        again = probe(*spelled(fixed))
        assert again.code == 0, again.err
