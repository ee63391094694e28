"""A command's fixed cost: imports and opening the store, measured as whole ``probe`` processes.

Each command runs on a store of two images (a tiny random ViT, made here), so nearly all of its
wall time is start-up: interpreter, imports, opening the store, writing the result. The
baseline is a bare ``python -c pass`` in the same rounds. Rounds are interleaved and medians
compared (this machine is noisy). Target: under 1.5 s each, judged on
the CPU seconds a run uses (its wall time on a quiet machine; wall time is printed beside it).

    python benchmarks/startup.py [--rounds 3] [--full] [--compare OTHER_CHECKOUT] [--record]
    python benchmarks/startup.py --first-image [--full] [--rounds 3] [--compare OTHER_CHECKOUT] [--record]
    python benchmarks/startup.py --collections [--rounds 5]

``--first-image`` measures what the target is stated on, the CPU seconds before a command's first
image: each command (one worker where it takes ``--workers``) in a fresh interpreter whose runner
notes the process's CPU time when it starts on its images (``infra.runner.map_blocks`` or
``_call``, patched by the measuring program before the command's ``main``), on the
2-image store and, with ``--full``, the labelled panels; medians of ``--rounds``; target 1.0 s.

``--collections`` counts the full garbage collections, and the CPU seconds they take, while a
fresh interpreter imports torch and timm, under CPython's thresholds and under probe's
(``infra/collector.py``).

``--full`` adds ``python -c 'import torch'`` (what every command computing with torch pays
first), ``entropy`` and ``neighbours``, the two frozen-feature protocols that read labelled panels,
on a store of four labelled scenes (``knn`` and ``attention-masks``: both on numpy now, torch
imported only for an old store's final norm or SelfPatch's aggregation head), and ``probe
report`` (which draws its figures with matplotlib: not a fixed cost, no target).
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
RECORDS = Path(__file__).resolve().parent / "records" / "startup.jsonl"


def cpu_model() -> str:
    """The processor's name as the kernel gives it (``/proc/cpuinfo``), for the record."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def options(doc: str, helps: dict[str, str] | None = None, record: Path | None = None, **defaults) -> argparse.Namespace:
    """A benchmark's command line, one option per keyword (``train_images=100`` is ``--train-images``,
    typed by its default; ``False`` is a switch), so every benchmark parses the same way; ``record``
    adds ``--record`` (append the JSON line to that file, see ``emit``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    helps = helps or {}
    for name, default in defaults.items():
        flag, text = "--" + name.replace("_", "-"), helps.get(name)
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=text)
    if record is not None:
        parser.add_argument("--record", action="store_true", help=f"append the JSON line to {record.relative_to(record.parents[2])}")
    return parser.parse_args()


def emit(record: dict, path: Path, keep: bool) -> None:
    """Print a benchmark's JSON line, and append it to its records (``path``) when ``keep``
    (``--record``): the documentation's benchmark tables are generated from those files."""
    line = json.dumps(record)
    print(line)
    if keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


REFUSED = "999"  # the bad view of the option-error row: that run must exit 2 (before torch and timm are imported)


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


FIRST_TARGET = 1.0
FIRST = """
import json, sys, time
from probe_toolkit.infra import runner
mark = []
def noting(real):
    def noted(*args, **kwargs):
        if not mark:
            mark.append(time.process_time())
        return real(*args, **kwargs)
    return noted
runner._call, runner.map_blocks = noting(runner._call), noting(runner.map_blocks)
from probe_toolkit.cli import main
sys.argv = ["probe", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as error:
    assert not error.code, error.code
print(json.dumps(mark[0] if mark else None))
"""


def first_image(rounds: int, full: bool, keep: bool = False, compare: Path | None = None) -> None:
    """``--first-image``: CPU seconds before each command's first block of images (medians); with
    ``compare``, the other checkout's run of each command interleaved with this one's, on the same stores."""
    trees = {"this": Path(__file__).resolve().parents[1], **({"other": compare.resolve()} if compare is not None else {})}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store, cache = str(build_store(root)), ["--cache", str(root / "cache")]
        chosen = {
            "decode": ["decode", store, "-q", "--preset", "tokencut", "--workers", "1", *cache],
            "entropy": ["entropy", store, "-q", "--boot", "100"],
            "neighbours": ["neighbours", store, "-q", "--boot", "100"],
        }
        if full:
            panels = str(build_panel_store(root))
            chosen["knn"] = ["knn", panels, "--train", "bench-train", "--val", "bench-val", "--k", "1,3", "-q", "--workers", "1", *cache]
            chosen["attention-masks"] = ["attention-masks", panels, "--panel", "bench-val", "-q", "--workers", "1", *cache]
        envs = {tree: dict(os.environ, PYTHONPATH=str(path)) for tree, path in trees.items()}
        seconds: dict[tuple[str, str], list[float]] = {(name, tree): [] for name in chosen for tree in trees}
        loads = [os.getloadavg()[0]]
        for r in range(rounds + 1):  # round 0 warms the page cache
            for name, args in chosen.items():
                for tree in trees:
                    out = subprocess.run([sys.executable, "-c", FIRST, json.dumps(args)], env=envs[tree], cwd=root, capture_output=True, text=True)
                    if out.returncode:
                        raise SystemExit(f"probe {' '.join(args)} [{tree}] failed: {out.stderr[-800:]}")
                    value = json.loads(out.stdout.strip().splitlines()[-1])
                    if r and value is not None:
                        seconds[(name, tree)].append(value)
            loads.append(os.getloadavg()[0])
    rows = {tree: {name: statistics.median(v) if (v := seconds[(name, tree)]) else None for name in chosen} for tree in trees}
    for name in chosen:
        for tree in trees:
            value = rows[tree][name]
            mark = "no block reached the runner" if value is None else ("ok" if value <= FIRST_TARGET else f"over the {FIRST_TARGET} s target")
            label = f"{name} [{tree}]" if len(trees) > 1 else name
            print(f"probe {label:26s} CPU before its first image {value if value is not None else float('nan'):5.2f} s  {mark}")
    print(f"load average during the run: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores")
    record = {
        "benchmark": "startup-first-image",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": cpu_model(),
        "target_s": FIRST_TARGET,
        "cores": os.cpu_count(),
        "load": max(loads),
        "rounds": rounds,
        "cpu_s": rows["this"],
    }
    if "other" in rows:  # the trees by their labels, never their folders
        record["other_cpu_s"] = rows["other"]
    emit(record, RECORDS, keep)


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
    if run.returncode != (2 if REFUSED in args else 0):
        raise SystemExit(f"{' '.join(args)} failed: {run.stderr[-500:]}")
    return seconds, _children_cpu() - c


def commands(store: str, root: Path, full: bool, panel_store: str = "") -> dict[str, list[str]]:
    probe = [sys.executable, "-m", "probe_toolkit"]
    cache = ["--cache", str(root / "cache")]
    chosen = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        "probe --help": [*probe, "--help"],
        "probe info STORE": [*probe, "info", store],
        "probe extract --views 999 (option error)": [*probe, "extract", str(root / "tiny.pth"), "--images", str(root / "images"), "--views", REFUSED],
        "probe decode STORE --workers 1": [*probe, "decode", store, "-q", "--workers", "1", "--preset", "tokencut", *cache],
        "probe decode STORE (every core)": [*probe, "decode", store, "-q", "--preset", "tokencut", *cache],
    }
    if full:
        chosen["python -c 'import torch' (torch alone)"] = [sys.executable, "-c", "import torch"]
        chosen["probe entropy STORE"] = [*probe, "entropy", store, "-q", "--boot", "100"]
        chosen["probe neighbours STORE"] = [*probe, "neighbours", store, "-q", "--boot", "100"]
        chosen["probe knn STORE (two panels)"] = [*probe, "knn", panel_store, "--train", "bench-train", "--val", "bench-val", "--k", "1,3", "-q", *cache]
        chosen["probe attention-masks STORE (a panel)"] = [*probe, "attention-masks", panel_store, "--panel", "bench-val", "-q", *cache]
        chosen["probe report STORE (draws figures)"] = [*probe, "report", store, "--out", str(root / "report"), "--format", "png", *cache]
    return chosen


SWEEPS = """
import gc, json, sys, time
if sys.argv[1] == "probe":
    from probe_toolkit.infra.collector import fewer_full_collections
    fewer_full_collections()
full = [0, 0.0]
def count(phase, info, started=[0.0]):
    if info["generation"] != 2:
        return
    if phase == "start":
        started[0] = time.thread_time()
    else:
        full[0] += 1
        full[1] += time.thread_time() - started[0]
gc.callbacks.append(count)
start = time.process_time()
import torch, timm  # noqa: F401
print(json.dumps([full[0], full[1], time.process_time() - start]))
"""


def collections(rounds: int) -> None:
    """``--collections``: full (oldest-generation) collections and their CPU seconds while importing
    torch and timm, in fresh interpreters under CPython's thresholds and under probe's
    (``infra.collector``), interleaved rounds, medians."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    runs: dict[str, list[list[float]]] = {"cpython": [], "probe": []}
    for r in range(rounds):
        for mode in ("cpython", "probe") if r % 2 == 0 else ("probe", "cpython"):
            out = subprocess.run([sys.executable, "-c", SWEEPS, mode], env=env, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = {}
    for mode, values in runs.items():
        sweeps, gc_s, import_s = (statistics.median(v[i] for v in values) for i in range(3))
        rows[mode] = {"full_collections": sweeps, "their_cpu_s": gc_s, "import_cpu_s": import_s}
        print(
            f"import torch, timm under {mode:8s} thresholds: {sweeps:.0f} full collections, {gc_s:.3f} s CPU in them, "
            f"{import_s:.2f} s CPU for the import ({rounds} rounds, medians)"
        )
    print(json.dumps({"benchmark": "startup-collections", "rounds": rounds, "cpu": platform.processor() or platform.machine(), "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="also entropy, neighbours and report")
    parser.add_argument("--compare", type=Path, help="another checkout of the toolkit, run interleaved (e.g. main before a change)")
    parser.add_argument("--collections", action="store_true", help="full garbage collections while importing torch and timm, CPython's thresholds against probe's")
    parser.add_argument("--first-image", action="store_true", help="CPU seconds before each command's first image (the target's measure)")
    parser.add_argument("--record", action="store_true", help="append the JSON line to benchmarks/records/startup.jsonl")
    args = parser.parse_args()
    if args.collections:
        return collections(args.rounds)
    if args.first_image:
        return first_image(args.rounds, args.full, args.record, args.compare)
    trees = {"this": Path(__file__).resolve().parents[1]}
    if args.compare is not None:
        trees["other"] = args.compare.resolve()
    envs = {tree: dict(os.environ, PYTHONPATH=str(path)) for tree, path in trees.items()}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        chosen = commands(str(build_store(root)), root, args.full, str(build_panel_store(root)) if args.full else "")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(name, tree): [] for name in chosen for tree in trees}
        for command in chosen.values():  # warm the page cache (and write the results the report reads) once
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
        rows.append({"command": name, "tree": tree, "median_wall_s": wall, "median_cpu_s": cpu})
        target = name.startswith("probe") and "figures" not in name
        mark = ("  ok" if cpu < TARGET else f"  over the {TARGET} s target") if target else ""
        label = name if len(trees) == 1 else f"{name} [{tree}]"
        print(f"{label:44s} wall {wall:6.2f} s   CPU {cpu:5.2f} s{mark}", flush=True)
    print(f"load average during the run: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores")
    emit(
        (
            {
                "benchmark": "startup",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": cpu_model(),
                "target_s": TARGET,
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "load": max(loads),
                "trees": sorted(trees),  # the trees by their labels (this, base): a record names the machine, never its folders
                "rows": rows,
            }
        ),
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
