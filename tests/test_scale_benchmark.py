"""benchmarks/scale.py counts the CPU of a dask cluster's workers, which outlive each command."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import scale  # noqa: E402

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


def test_a_live_workers_cpu_is_counted_with_its_children():
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert [worker.stdout.readline().strip() for _ in range(2)] == ["burnt", "burnt"]  # the worker and its child: 0.3 CPU s each
        assert scale.cluster_cpu([worker.pid]) > 0.5  # both (clock ticks: a little under 0.6); RUSAGE_CHILDREN would count neither
        assert scale.cluster_cpu([]) == 0.0
    finally:
        worker.kill()  # its child ends with the closed stdin
        worker.wait()
