"""Scale: a synthetic store of 20,000 images at 224 (tokens and attention), several times larger
than the memory the analyses are allowed, measured by ``probe entropy`` and ``probe neighbours``.

The commands run in child processes under an address-space-independent cap on their data
segment (``RLIMIT_DATA``, which the kernel enforces on heap and private mappings) well below the
store's size; their peak resident memory is measured and must stay below it too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from analysis_stores import manifest, softmax

from probe_toolkit.results import records
from probe_toolkit.store.create import create_store

N_IMAGES = 20_000
CHUNK = 64
CAP = 1280 * 2**20  # bytes of data segment each analysis may use: under a third of the store


def _build(path: Path) -> int:
    """Write the store chunk by chunk (never all in memory); returns its size on disk in bytes."""
    rng = np.random.default_rng(0)
    heads, channels = 3, 32
    meta = manifest(CHUNK)
    meta["n_images"] = N_IMAGES
    meta["arch"]["heads"] = heads
    meta["arch"]["width"] = channels
    ids = [f"img{i:05d}.jpg" for i in range(N_IMAGES)]
    writer = create_store(path, meta, ids, {"tokens_224": (("patch_224", "channel"), (196, channels)), "attention_224": (("head", "query", "key"), (heads, 196, 196))})
    base_tokens = rng.standard_normal((CHUNK, 196, channels)).astype(np.float16)
    base_attention = softmax(rng.standard_normal((CHUNK, heads, 196, 196)) * 2).astype(np.float16)
    for start in range(0, N_IMAGES, CHUNK):
        n = min(CHUNK, N_IMAGES - start)  # the last chunk is short
        order = rng.permutation(CHUNK)[:n]
        writer.write(start, {"tokens_224": base_tokens[order], "attention_224": base_attention[order]}, np.tile([480, 640], (n, 1)), np.zeros(n, dtype=bool))
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _run_capped(*command: str) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``command`` in a child under the data cap; return it and its peak RSS in bytes."""
    script = (
        "import resource, subprocess, sys\n"
        f"cap = {CAP}\n"
        "def limit():\n"
        "    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))\n"
        "r = subprocess.run(sys.argv[1:], preexec_fn=limit, capture_output=True, text=True)\n"
        "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)\n"
        "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n"
    )
    run = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, text=True)
    peak = int(run.stdout.rsplit("PEAK_KB", 1)[1].split()[0]) * 1024
    return run, peak


def probe(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe_toolkit", *args]


@pytest.mark.slow
def test_twenty_thousand_images_in_bounded_memory(tmp_path):
    store = tmp_path / "big.zarr"
    size = _build(store)
    assert size > 3 * CAP, f"the store ({size / 2**30:.2f} GiB) must be well above the cap"
    for args, name in (
        (("entropy", str(store), "-q", "--boot", "200"), "entropy"),
        (("neighbours", str(store), "--grid", "14", "-q", "--boot", "200"), "neighbours_g14"),
    ):
        run, peak = _run_capped(*probe(*args, "--json", str(tmp_path / f"{name}.json")))
        assert run.returncode == 0, run.stderr[-2000:]
        assert peak < CAP, f"{name}: peak RSS {peak / 2**20:.0f} MiB"
        numbers = json.loads((tmp_path / f"{name}.json").read_text())["stores"][str(store)]
        assert numbers  # the set-level statistics came back
        saved = records.load(store, name)
        assert saved.sizes["image"] == N_IMAGES


def test_the_cap_really_binds():
    """The same cap stops a child that tries to hold more than it: the cap above is not vacuous."""
    run, _ = _run_capped(sys.executable, "-c", f"import numpy as np; a = np.ones({2 * CAP // 8})")
    assert run.returncode != 0 and "MemoryError" in run.stderr
