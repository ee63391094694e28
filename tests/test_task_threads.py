"""A task's BLAS threads are its own even for a library the task itself loads (scipy's, which the
decoders import where they solve): otherwise the first block on a process ran on every core and
rounded otherwise (an old store's decoder seed moved, 154 -> 183, with the file run alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOADED_IN_A_TASK = """
import json, sys
from threadpoolctl import threadpool_info
import numpy
from probe_toolkit.infra.task_threads import task_threads
assert "scipy.linalg" not in sys.modules
def counts():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}
outside = counts()
with task_threads(1):
    import scipy.linalg
    inside = counts()
print(json.dumps([outside, inside, counts(), "OPENBLAS_NUM_THREADS" in __import__("os").environ]))
"""


def test_a_blas_loaded_inside_a_task_runs_on_the_tasks_threads_and_gets_the_process_count_after():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", LOADED_IN_A_TASK], env=env, capture_output=True, text=True, check=True).stdout
    outside, inside, after, still_set = json.loads(out)
    assert len(inside) > len(outside)  # scipy brought a BLAS of its own
    assert set(inside.values()) == {1}
    count = max(outside.values())
    assert after == {path: count for path in inside}
    assert not still_set
