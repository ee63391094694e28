"""Faults during extraction: SIGKILL, concurrent shards, readers during writes, a full disk."""

from __future__ import annotations

import errno
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.cache import open_store
from probe_toolkit.store.extract import Settings, extract

PROBE = [sys.executable, "-m", "probe_toolkit"]
SETTINGS = ["--views", "224,480", "--chunk", "2", "--batch-size", "2", "-q"]


@pytest.fixture(scope="module")
def many_images(tmp_path_factory, photos):
    folder = tmp_path_factory.mktemp("many")
    names = sorted(p.name for p in photos.glob("*.jpg"))
    for i in range(48):
        shutil.copy(photos / names[i % len(names)], folder / f"{i:03d}-{names[i % len(names)]}")
    return folder


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_checkpoints, many_images):
    """The store an uninterrupted single process writes."""
    path = tmp_path_factory.mktemp("ref") / "ref.zarr"
    extract(tiny_checkpoints["dino-full"], many_images, settings=Settings(views=(224, 480), chunk=2), store=path, batch_size=2, quiet=True)
    return _arrays(path)


def _arrays(path):
    group = zarr.open_group(path, mode="r")
    return {name: group[name][:] for name in group.array_keys()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f"), name


def _done(path) -> int:
    try:
        return int(zarr.open_group(path, mode="r")["done"][:].sum())
    except Exception:
        return 0


def _start(checkpoint, images, store, *extra):
    return subprocess.Popen(
        [*PROBE, "extract", str(checkpoint), "--images", str(images), "--store", str(store), *SETTINGS, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


HELD = 12  # images written before the held chunk (6 chunks of 2)
# ``probe extract`` with its image loader held at image HELD: the run says "held" on stdout when it
# reaches it, and waits there for a line on stdin. Every chunk before it is computed and written;
# none after it can be, so what the test sees of the store does not depend on how fast anything runs.
HOLDING = """
import sys
from probe_toolkit.store import extract as ex

def load_run(refs, *args, real=ex.load_run, **kwargs):
    if refs and refs[0].id == HELD_ID:
        print("held", flush=True)
        sys.stdin.readline()
    return real(refs, *args, **kwargs)

if __name__ == "__main__":  # a spawned worker imports this file too: only the command's own process runs the command
    ex.load_run = load_run
    from probe_toolkit.cli import main

    main()
"""


def _held_at(tmp_path, checkpoint, images, store) -> subprocess.Popen:
    """``probe extract`` started and held at image HELD, once every image before it is written."""
    held_id = sorted(p.name for p in images.iterdir())[HELD]
    driver = tmp_path / "held_extract.py"
    driver.write_text(f"HELD_ID = {held_id!r}\n" + HOLDING)
    process = subprocess.Popen(
        [sys.executable, str(driver), "extract", str(checkpoint), "--images", str(images), "--store", str(store), *SETTINGS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()  # blocks until the loader reaches the held image (or the run ends)
    assert line.strip() == "held", (line, process.stderr.read() if process.poll() is not None else "")
    while _done(store) < HELD:  # the chunks before it are on their way to the disk and nothing can overtake them
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.02)
    return process


def test_sigkill_then_rerun_gives_the_uninterrupted_store(tmp_path, tiny_checkpoints, many_images, reference):
    store = tmp_path / "killed.zarr"
    process = _held_at(tmp_path, tiny_checkpoints["dino-full"], many_images, store)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = _done(store)
    assert killed_at == HELD  # killed mid-run, with every chunk before the held one written
    # a reader of the killed store sees only whole images
    partial = open_store(store)
    assert partial.sizes["image"] == killed_at
    assert not np.isnan(partial.tokens_224.values.astype(np.float32)).any()
    rerun = subprocess.run(
        [*PROBE, "extract", str(tiny_checkpoints["dino-full"]), "--images", str(many_images), "--store", str(store), *SETTINGS], capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr
    _assert_same(_arrays(store), reference)


def test_two_shards_at_once_lose_no_chunk(tmp_path, tiny_checkpoints, many_images, reference):
    store = tmp_path / "shared.zarr"
    shards = [_start(tiny_checkpoints["dino-full"], many_images, store, "--shard", f"{i}/2") for i in range(2)]
    for process in shards:
        process.wait(timeout=300)
        assert process.returncode == 0, process.stderr.read()
    _assert_same(_arrays(store), reference)


def test_reader_during_a_write_sees_only_whole_images(tmp_path, tiny_checkpoints, many_images):
    store = tmp_path / "busy.zarr"
    process = _held_at(tmp_path, tiny_checkpoints["dino-full"], many_images, store)
    ds = open_store(store)  # mid-run: the writer holds the rest of the images
    assert ds.sizes["image"] == HELD
    for name in ("tokens_224", "keys_480", "attention_224"):
        assert not np.isnan(ds[name].values.astype(np.float32)).any(), name
    _, err = process.communicate("go\n")  # released: the run writes the other images
    assert process.returncode == 0, err
    assert open_store(store).sizes["image"] == 48


def test_full_disk_leaves_a_consistent_store(tmp_path, monkeypatch, tiny_checkpoints, many_images, reference):
    import zarr.storage._local as local

    real_put, budget = local._put, {"chunks": 25}

    def failing_put(path, value, exclusive=False):
        if "/c/" in str(path):  # chunk files, not metadata
            budget["chunks"] -= 1
            if budget["chunks"] < 0:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_put(path, value, exclusive=exclusive)

    store = tmp_path / "full.zarr"
    monkeypatch.setattr(local, "_put", failing_put)
    with pytest.raises(ProbeError, match="ran out of disk space.*rerun the same command") as error:
        extract(tiny_checkpoints["dino-full"], many_images, settings=Settings(views=(224, 480), chunk=2), store=store, batch_size=2, quiet=True)
    assert "\n" not in error.value.line()
    monkeypatch.setattr(local, "_put", real_put)
    partial = open_store(store)
    assert 0 < partial.sizes["image"] < 48
    assert not np.isnan(partial.keys_480.values.astype(np.float32)).any()
    extract(tiny_checkpoints["dino-full"], many_images, settings=Settings(views=(224, 480), chunk=2), store=store, batch_size=2, quiet=True)
    _assert_same(_arrays(store), reference)
