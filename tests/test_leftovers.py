"""Issue 46, class 8: what a run leaves beside the user's files, and the modes of what it writes
(docs/guarantees.md, "Leftovers and modes").

- A temporary memory file (``infra.shared``: k-NN's and Hummingbird's banks, the colour term's
  photographs) is gone within a second of a SIGKILL of its run: its janitor removes it.
- A store's ``.<store>.lock`` stays beside the store, and goes with a store probe removes itself
  (a first extraction that failed before finishing an image).
- Every file probe writes has the umask's mode: safetensors' ``save_file`` made 0600 files.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_catalogue import probe

ROOT = Path(__file__).resolve().parents[1]


def test_a_killed_runs_memory_file_is_removed_by_its_janitor(tmp_path):
    folder = tmp_path / "results"
    code = (
        "import numpy as np, os, signal, sys; from probe_toolkit.infra.shared import shared\n"
        f"with shared(np.arange(1000.0), {str(folder)!r}, 'bank') as handle:\n"
        "    print(handle.path, flush=True); signal.pause()\n"
    )
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    path = Path(run.stdout.readline().strip())
    assert path.is_file() and path.parent == folder
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    for _ in range(200):  # the janitor polls its parent twice a second
        if not path.exists():
            break
        time.sleep(0.05)
    assert not path.exists(), "the memory file outlived its killed run"


def test_a_finished_runs_memory_file_and_janitor_are_gone(tmp_path):
    import numpy as np

    from probe_toolkit.infra import shared as module

    started = []
    real = module.janitor
    module.janitor = lambda paths: started.append(real(paths)) or started[-1]
    try:
        with module.shared(np.zeros(4), tmp_path, "bank") as handle:
            assert Path(handle.path).is_file()
    finally:
        module.janitor = real
    assert not Path(handle.path).exists()
    assert started and all(p is None or p.poll() is not None for p in started)


def test_a_first_extraction_that_fails_leaves_neither_store_nor_lock(tmp_path):
    from probe_toolkit.demo.samples import TINY, write_checkpoint

    checkpoint = write_checkpoint(tmp_path / "tiny.pth", "dino-full", TINY, seed=0)
    images = tmp_path / "images"
    images.mkdir()
    (images / "broken.png").write_bytes(b"\x89PNG\r\n")
    store = tmp_path / "stores" / "teacher.zarr"
    failed = probe("extract", checkpoint, "--images", images, "--views", "224", "--store", store, "-q")
    assert failed.code == 2
    assert not store.exists() and not (store.parent / ".teacher.zarr.lock").exists(), sorted(p.name for p in store.parent.iterdir())


@pytest.mark.parametrize("mask", [0o022, 0o077])
@pytest.mark.parametrize("name,layout,arch", [("m.safetensors", "dinov3-hf", "tiny-dinov3"), ("m.pth", "dino-full", "tiny")])
def test_files_probe_writes_have_the_umasks_mode(tmp_path, mask, name, layout, arch):
    before = os.umask(mask)
    try:
        out = tmp_path / name
        assert probe("make-checkpoint", out, "--layout", layout, "--arch", arch).code == 0
        summary = tmp_path / "s.json"
        from probe_toolkit.infra.owned import write_summary

        write_summary(summary, {"a": 1})
    finally:
        os.umask(before)
    for path in (out, summary):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, (path.name, oct(path.stat().st_mode))
