"""A command's fixed cost: imports and opening the store, measured as whole ``probe`` processes.

Each command runs on a store of two images (a tiny random ViT, made here), so nearly all of its
wall time is start-up: interpreter, imports, opening the store, writing the result. The
baseline is a bare ``python -c pass`` in the same rounds. Rounds are interleaved and medians
compared (this machine is noisy). Target: under 1.5 s each, judged on
the CPU seconds a run uses (its wall time on a quiet machine; wall time is printed beside it).

    python benchmarks/startup.py [--rounds 3] [--full] [--compare OTHER_CHECKOUT]

``--full`` adds ``entropy`` and ``neighbours``, the two protocols that compute with torch on a
store of four labelled scenes (``knn``: DINO's ``torch.topk`` tie rule; ``attention-masks``:
DINO's script, on local worker processes that each import torch), and ``probe report`` (which
draws its figures with matplotlib: not a fixed cost, no target).
``--compare DIR`` runs every command a second time in each round with another checkout of the
toolkit first on the path (e.g. ``/work/main`` before a change), interleaved, on the same store,
and prints both. Prints a table and one JSON line.
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


def build_panel_store(root: Path) -> Path:
    """A store of two small labelled panels (4 train, 2 val scenes), registered in ``root/cache``."""
    from probe_toolkit.demo import scenes
    from probe_toolkit.demo.samples import TINY, write_checkpoint
    from probe_toolkit.labels.panels import add_panel
    from probe_toolkit.store.extract import Settings, extract

    data = root / "scenes"
    for name, count, seed, role in (("bench-train", 4, 1, "train"), ("bench-val", 2, 2, "val")):
        annotations = scenes.write_panel(data / name, count, seed)
        add_panel(name, annotations=annotations, images=data / name / "images", role=role, cache=root / "cache")
    ckpt = write_checkpoint(root / "tiny-panels.pth", "dino-full", TINY, 1)
    return extract(ckpt, data, settings=Settings(views=(224,), chunk=2), cache_dir=root / "cache", quiet=True).store


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(args: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; CPU time is what a quiet machine's wall would be
    for a start-up that runs on one thread, and hardly moves when other work shares the CPU.
    ``cwd`` is a folder without the toolkit: ``python -m`` puts the working folder first on the
    path, which would shadow the checkout named by PYTHONPATH."""
    c, t = _children_cpu(), time.perf_counter()
    run = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {run.stderr[-500:]}")
    return seconds, _children_cpu() - c


def commands(store: str, root: Path, full: bool, panel_store: str = "") -> dict[str, list[str]]:
    probe = [sys.executable, "-m", "probe_toolkit"]
    cache = ["--cache", str(root / "cache")]
    chosen = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "probe --help": [*probe, "--help"],
        "probe info STORE": [*probe, "info", store],
        "probe decode STORE --workers 1": [*probe, "decode", store, "-q", "--workers", "1", "--preset", "tokencut", *cache],
        "probe decode STORE (every core)": [*probe, "decode", store, "-q", "--preset", "tokencut", *cache],
    }
    if full:
        chosen["probe entropy STORE"] = [*probe, "entropy", store, "-q", "--boot", "10"]
        chosen["probe neighbours STORE"] = [*probe, "neighbours", store, "-q", "--boot", "10"]
        chosen["probe knn STORE (torch)"] = [*probe, "knn", panel_store, "--train", "bench-train", "--val", "bench-val", "--k", "1,3", "-q", *cache]
        chosen["probe attention-masks STORE (torch)"] = [*probe, "attention-masks", panel_store, "--panel", "bench-val", "-q", *cache]
        chosen["probe report STORE (draws figures)"] = [*probe, "report", store, "--out", str(root / "report"), "--format", "png", *cache]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="also entropy, neighbours and report")
    parser.add_argument("--compare", type=Path, help="another checkout of the toolkit, run interleaved (e.g. main before a change)")
    args = parser.parse_args()
    trees = {"this": Path(__file__).resolve().parents[1]}
    if args.compare is not None:
        trees["other"] = args.compare.resolve()
    envs = {tree: dict(os.environ, PYTHONPATH=str(path)) for tree, path in trees.items()}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        chosen = commands(str(build_store(root)), root, args.full, str(build_panel_store(root)) if args.full else "")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(name, tree): [] for name in chosen for tree in trees}
        for name, command in chosen.items():  # warm the page cache (and write the results the report reads) once
            for tree in trees:
                timed(command, envs[tree], root)
        for _ in range(args.rounds):
            for name, command in chosen.items():
                for tree in trees:
                    times[(name, tree)].append(timed(command, envs[tree], root))
            loads.append(os.getloadavg()[0])
    rows = []
    for (name, tree), values in times.items():
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        rows.append({"command": name, "tree": str(trees[tree]), "median_wall_s": wall, "median_cpu_s": cpu})
        target = name.startswith("probe") and "figures" not in name
        mark = ("  ok" if cpu < TARGET else f"  over the {TARGET} s target") if target else ""
        label = name if len(trees) == 1 else f"{name} [{tree}]"
        print(f"{label:44s} wall {wall:6.2f} s   CPU {cpu:5.2f} s{mark}", flush=True)
    print(f"load average during the run: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores")
    print(json.dumps({"benchmark": "startup", "target_s": TARGET, "cpu": platform.processor() or platform.machine(),
                      "cores": os.cpu_count(), "load": max(loads), "trees": {k: str(v) for k, v in trees.items()}, "rows": rows}))


if __name__ == "__main__":
    main()
