"""Two processes under torchrun (gloo on CPU): both ranks end with identical weights, equal to one process's run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from probe_toolkit.demo.samples import sample_photos
from training import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_processes_hold_identical_weights(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"):
        shutil.copy(sample_photos() / name, photos / name)
    sets = [f"data.images={photos}", "optim.epochs=2", "save.every=2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2", "-m", "training", "tiny", "--quiet"]
    for s in sets + [f"run.out={tmp_path / 'ddp'}"]:
        command += ["--set", s]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    manifest = json.loads((tmp_path / "ddp" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["accumulation"] == 1
    for network in ("student", "teacher"):
        hashes = manifest["replicas"][network]
        assert len(hashes) == 2 and hashes[0] == hashes[1]
    log = [json.loads(line) for line in (tmp_path / "ddp" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1]

    # the same global batch on one process (2 micro-batches accumulated) reaches the same weights
    one = train("tiny", [*sets, f"run.out={tmp_path / 'one'}"])
    a = torch.load(tmp_path / "ddp" / "checkpoint.pth", weights_only=True)
    b = torch.load(one.checkpoint, weights_only=True)
    assert len(a["rng"]["torch"]) == 2 and len(b["rng"]["torch"]) == 1
    for key, value in b["teacher"].items():
        torch.testing.assert_close(a["teacher"][key], value, rtol=1e-4, atol=1e-5, msg=key)
