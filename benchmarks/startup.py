"""A command's fixed cost: imports and opening the store, measured as whole ``probe`` processes.

Each command runs on a store of two images (a tiny random ViT, made here), so nearly all of its
wall time is start-up: interpreter, imports, opening the store, writing the result. The
baseline is a bare ``python -c pass`` in the same rounds. Rounds are interleaved and medians
compared (this machine is noisy). Target: under 1.5 s each, judged on
the CPU seconds a run uses (its wall time on a quiet machine; wall time is printed beside it).

    python benchmarks/startup.py [--rounds 3] [--full]

``--full`` adds the analyses that import torch for their own arithmetic (entropy, neighbours).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.5


def build_store(root: Path) -> Path:
    from probe_toolkit.demo.samples import TINY, sample_photos, write_checkpoint
    from probe_toolkit.store.extract import Settings, extract

    folder = root / "images"
    folder.mkdir()
    for name in sorted(p.name for p in sample_photos().glob("*.jpg"))[:2]:
        shutil.copy(sample_photos() / name, folder / name)
    ckpt = write_checkpoint(root / "tiny.pth", "dino-full", TINY, 0)
    return extract(ckpt, folder, settings=Settings(views=(224, 480), chunk=2), cache_dir=root / "cache", quiet=True).store


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(args: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; CPU time is what a quiet machine's wall would be
    for a start-up that runs on one thread, and hardly moves when other work shares the CPU."""
    c, t = _children_cpu(), time.perf_counter()
    run = subprocess.run(args, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {run.stderr[-500:]}")
    return seconds, _children_cpu() - c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="also entropy and neighbours")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    probe = [sys.executable, "-m", "probe_toolkit"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = str(build_store(root))
        cache = ["--cache", str(root / "cache")]
        commands = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "probe --help": [*probe, "--help"],
            "probe info STORE": [*probe, "info", store],
            "probe decode STORE --workers 1": [*probe, "decode", store, "-q", "--workers", "1", "--preset", "tokencut", *cache],
            "probe decode STORE (every core)": [*probe, "decode", store, "-q", "--preset", "tokencut", *cache],
        }
        if args.full:
            commands["probe entropy STORE"] = [*probe, "entropy", store, "-q", "--boot", "10"]
            commands["probe neighbours STORE"] = [*probe, "neighbours", store, "-q", "--boot", "10"]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for name, command in commands.items():  # warm the page cache once
            timed(command, env)
        for _ in range(args.rounds):
            for name, command in commands.items():
                times[name].append(timed(command, env))
    rows = []
    for name, values in times.items():
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        rows.append({"command": name, "median_wall_s": wall, "median_cpu_s": cpu})
        mark = "" if name.startswith("python") else ("  ok" if cpu < TARGET else f"  over the {TARGET} s target")
        print(f"{name:34s} wall {wall:6.2f} s   CPU {cpu:5.2f} s{mark}", flush=True)
    print(json.dumps({"benchmark": "startup", "target_s": TARGET, "cpu": platform.processor() or platform.machine(),
                      "cores": os.cpu_count(), "load": os.getloadavg()[0], "rows": rows}))


if __name__ == "__main__":
    main()
