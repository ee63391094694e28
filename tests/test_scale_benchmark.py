"""benchmarks/scale.py counts the CPU of a dask cluster's workers, which outlive each command."""

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BURN = """
import sys, time
while time.process_time() < 0.3:
    pass
print("burnt", flush=True)
sys.stdin.readline()
"""
WORKER = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {BURN!r}], stdin=subprocess.PIPE)
{BURN}
"""
# in a process of its own: scale.py puts benchmarks/ first on sys.path, where its training.py
# would hide the training package from every test collected after this one
MEASURE = "import sys; sys.path.insert(0, sys.argv[1]); import scale; print(scale.cluster_cpu([int(p) for p in sys.argv[2:]]))"


def cluster_cpu(*pids: int) -> float:
    found = subprocess.run([sys.executable, "-c", MEASURE, str(BENCHMARKS), *map(str, pids)], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert found.returncode == 0, found.stderr[-2000:]
    return float(found.stdout.strip().splitlines()[-1])


def test_a_live_workers_cpu_is_counted_with_its_children():
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert [worker.stdout.readline().strip() for _ in range(2)] == ["burnt", "burnt"]  # the worker and its child: 0.3 CPU s each
        assert cluster_cpu(worker.pid) > 0.5  # both (clock ticks: a little under 0.6); RUSAGE_CHILDREN would count neither
        assert cluster_cpu() == 0.0
    finally:
        worker.kill()  # its child ends with the closed stdin
        worker.wait()
