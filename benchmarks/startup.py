"""A command's fixed cost: imports and opening the store, measured as whole ``probe`` processes.

Each command runs on a store of two images (a tiny random ViT, made here), so nearly all of its
wall time is start-up: interpreter, imports, opening the store, writing the result. The
baseline is a bare ``python -c pass`` in the same rounds. Rounds are interleaved and medians
compared (this machine is noisy). Target: under 1.5 s each, judged on
the CPU seconds a run uses (its wall time on a quiet machine; wall time is printed beside it).
Every command runs with Python's bytecode cached, as an installed toolkit runs after its first
command (``child_env``: a fresh cache folder, written in the warm-up round). The records that
ran so say ``"bytecode": "cached"``; the ones before may have compiled modules in every run,
where the shell set ``PYTHONDONTWRITEBYTECODE``.

    python benchmarks/startup.py [--rounds 3] [--full] [--compare OTHER_CHECKOUT] [--record]
    python benchmarks/startup.py --first-image [--full] [--rounds 3] [--compare OTHER_CHECKOUT] [--record]
    python benchmarks/startup.py --collections [--rounds 5]

``--first-image`` measures what the target is stated on, the CPU seconds before a command's first
image: each command (one worker where it takes ``--workers``) in a fresh interpreter that notes
the process's CPU time at the first of: the runner starting on a block of images
(``infra.runner.map_blocks`` or ``_call``), the first read of a store's image array (a
``tokens_``, ``cls_tokens_``, ``keys_`` or ``attention_`` array, through zarr), or the first
photograph decoded (``store.images.load_image``, or ``load_photo`` as extraction decodes: the commands that run a network on images). The
measuring program wraps those functions as their modules are imported, so it imports nothing a
command would not. Medians of ``--rounds``; target 1.0 s. Without ``--full``: decode, entropy and
neighbours on the 2-image store. ``--full`` adds k-NN, the attention masks and DINOv2's linear
protocol on two labelled panels of scenes, and every other protocol command on the stores,
panels and folders ``probe demo --quick`` makes (a SelfPatch network at random weights; two
minutes more): score, decode-sweep, decode of an image folder (``--images``), linear, propagate,
correspond on SPair-71k and on NAVI, hummingbird, segment, depth, rank, position, similarity and
overcluster. ``score`` reads no image (it scores a masks file against a panel's labels): its whole
run's CPU seconds are taken instead (the record lists such commands under ``whole_run``). The
commands that run a network before their first image (propagate, segment, depth, NAVI's
correspondence, decode ``--images``) cannot go below importing torch and timm: ``--full`` measures
that floor in the same rounds (a fresh interpreter that imports both and notes its CPU time) and
records it apart, as ``floor_cpu_s``, so what probe adds above it can be read beside each row.

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


def header(benchmark: str) -> dict:
    """The fields every benchmark record opens with: its name, the UTC time, the machine, its cores
    and the load beside the run (a record names the machine, never its folders)."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": cpu_model(),
        "cores": os.cpu_count(),
        "load": round(os.getloadavg()[0], 2),
    }


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


def build_panel_store(root: Path, views: tuple[str, ...] = ("224",), store: Path | None = None) -> Path:
    """A store of two small labelled panels (4 train, 2 val scenes), registered in ``root/cache``
    (once: a second call extracts other ``views`` of the same network into ``store``)."""
    from probe_toolkit.demo import scenes
    from probe_toolkit.demo.samples import TINY, write_checkpoint
    from probe_toolkit.labels.panels import add_panel
    from probe_toolkit.store.extract import Settings, extract

    data = root / "scenes"
    for name, count, seed, role in (("bench-train", 4, 1, "train"), ("bench-val", 2, 2, "val")):
        if not (data / name).is_dir():
            annotations = scenes.write_panel(data / name, count, seed)
            add_panel(name, annotations=annotations, images=data / name / "images", role=role, cache=root / "cache")
    ckpt = write_checkpoint(root / "tiny-panels.pth", "dino-full", TINY, 1)
    return extract(ckpt, data, settings=Settings(views=views, chunk=2), store=store, cache_dir=root / "cache", quiet=True).store


FIRST_TARGET = 1.0
LINEAR_DINOV2 = ["--n-last-blocks", "1", "--learning-rates", "0.001,0.05", "--epochs", "2", "--epoch-length", "5"]  # a short schedule
FLOOR = "import torch, timm (the network commands' floor)"
FLOOR_PROGRAM = "import json, time, torch, timm\nprint(json.dumps([None, time.process_time()]))"
FRESH = "run-FRESH"  # a folder of its own for each run of a command that writes outside the store (a finished one is resumed, not redone)
FIRST = """
import functools, importlib.abc, importlib.machinery, json, sys, time
mark = []
def note():
    if not mark:
        mark.append(time.process_time())
def noting(real):
    @functools.wraps(real)  # pickled by its name for a worker, as the real one
    def noted(*args, **kwargs):
        note()
        return real(*args, **kwargs)
    return noted
def reading(real):
    async def read(self, *args, **kwargs):
        if self.store_path.path.rpartition("/")[2].startswith(("tokens_", "cls_tokens_", "keys_", "attention_")):
            note()
        return await real(self, *args, **kwargs)
    return read
WRAP = {
    "probe_toolkit.infra.runner": lambda m: (setattr(m, "_call", noting(m._call)), setattr(m, "map_blocks", noting(m.map_blocks))),
    "probe_toolkit.store.images": lambda m: [setattr(m, n, noting(getattr(m, n))) for n in ("load_image", "load_photo") if hasattr(m, n)],
    "zarr.core.array": lambda m: setattr(m.AsyncArray, "_get_selection", reading(m.AsyncArray._get_selection)),
}
class Wrapping(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WRAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            WRAP[name](module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Wrapping())
from probe_toolkit.cli import main
sys.argv = ["probe", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as error:
    assert not error.code, error.code
print(json.dumps([mark[0] if mark else None, time.process_time()]))
"""


def protocol_commands(root: Path) -> dict[str, list[str]]:
    """Every other protocol command on ``probe demo --quick``'s stores, panels and folders (its
    random-weight network's store; the trained network's as ``similarity``'s other), each with the
    settings the demo runs it with, spelled as the command line spells them (``infra.spelling``)."""
    import shlex

    from probe_toolkit.infra.spelling import fix_command

    # its own process: this folder's training.py would shadow the toolkit's training package the demo imports
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    subprocess.run([sys.executable, "-m", "probe_toolkit", "demo", "--quick", "--out", str(root / "demo")], env=env, cwd=root, capture_output=True, check=True)
    work = root / "demo" / "work"
    (store,), (other,) = (list(work.glob(f"cache/{pattern}/teacher.zarr")) for pattern in ("tiny-random-*", "checkpoint-*"))
    cache, checkpoint = work / "cache", work / "checkpoints" / "tiny-random.pth"
    masks = next(store.glob("results/decoder-masks.json"))
    grid = root / "grid.toml"
    grid.write_text('preset = ["tokencut"]\ncenter = [true]\ntau = [0.2]\nmasks = [1]\n')
    seg = {"train": "demo-seg-train", "val": "demo-seg-val"}
    short = {"iterations": 4, "batch_size": 2, "chunk": 2}
    common = {"cache": cache, "quiet": True, "workers": 1}  # one worker: every CPU second in the measured process
    spelled = {
        "score": fix_command("score", masks, panel="demo-val", cache=cache),
        "decode-sweep": fix_command("decode-sweep", store, panel="demo-val", grid=grid, settings_out=root / FRESH / "best.json", **common),
        "decode --images (stream)": fix_command("decode", checkpoint, images=work / "data" / "photos", **{**common, "cache": root / FRESH / "cache"}),
        "linear": fix_command("linear", store, train="demo-train", val="demo-val", epochs=50, cache=cache, quiet=True),
        "propagate": fix_command("propagate", checkpoint, davis=work / "davis", out=root / FRESH / "davis-out", store=store, **common),
        "correspond": fix_command("correspond", store, panel="demo-spair", **common),
        "correspond (NAVI)": fix_command("correspond", store, panel="demo-navi", **common),
        "hummingbird": fix_command("hummingbird", store, memory=(1000,), **seg, **common),
        "segment": fix_command("segment", checkpoint, store=store, crop=32, size=32, stride=21, **seg, **short, **common),
        "depth": fix_command("depth", checkpoint, train="demo-nyu-train", val="demo-nyu-test", store=store, device="cpu", replicas=1, crop=(48, 64), **short, **common),
        "rank": fix_command("rank", store, tokens=("patch",), quiet=True),
        "position": fix_command("position", store, quiet=True),
        "similarity": fix_command("similarity", store, other=other, quiet=True),
        "overcluster": fix_command("overcluster", store, panel="demo-seg-val", view="hbird@512", k=(21, 100), cache=cache, quiet=True),
    }
    return {name: shlex.split(line)[1:] for name, line in spelled.items()}


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
            evaluated = str(build_panel_store(root, ("eval224",), root / "eval224.zarr"))  # DINOv2's protocol reads its eval224 view
            chosen["linear-dinov2"] = ["linear-dinov2", evaluated, "--train", "bench-train", "--val", "bench-val", *LINEAR_DINOV2, "-q", *cache]
            chosen.update(protocol_commands(root))
        programs = {name: [sys.executable, "-c", FIRST, json.dumps(args)] for name, args in chosen.items()}
        if full:
            programs[FLOOR] = [sys.executable, "-c", FLOOR_PROGRAM]
        envs = {tree: child_env(path, root) for tree, path in trees.items()}
        runs = [(name, tree) for name in chosen for tree in trees] + [(FLOOR, "this")] * (FLOOR in programs)
        seconds: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        whole: set[str] = set()
        loads = [os.getloadavg()[0]]
        for r in range(rounds + 1):  # round 0 warms the page cache and writes the bytecode cache (child_env)
            for name, tree in runs:
                fresh = [a.replace(FRESH, f"run-{r}-{tree}") for a in programs[name]]
                out = subprocess.run(fresh, env=envs[tree], cwd=root, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"{name} [{tree}] failed: {out.stderr[-800:]}")
                first, end = json.loads(out.stdout.strip().splitlines()[-1])
                if first is None and name != FLOOR:
                    whole.add(name)
                if r:
                    seconds[(name, tree)].append(end if first is None else first)
            loads.append(os.getloadavg()[0])
    rows = {tree: {name: statistics.median(seconds[(name, tree)]) for name in chosen} for tree in trees}
    floor = statistics.median(seconds[(FLOOR, "this")]) if FLOOR in programs else None
    if floor is not None:
        print(f"{FLOOR:57s} {floor:5.2f} s  (no target: torch's and timm's own imports)")
    for name in chosen:
        for tree in trees:
            value = rows[tree][name]
            mark = "ok" if value <= FIRST_TARGET else f"over the {FIRST_TARGET} s target"
            label = f"{name} [{tree}]" if len(trees) > 1 else name
            what = "its whole run (no image read)" if name in whole else "before its first image"
            print(f"probe {label:28s} CPU {what:29s} {value:5.2f} s  {mark}")
    print(f"load average during the run: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores")
    record = {
        "benchmark": "startup-first-image",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": cpu_model(),
        "target_s": FIRST_TARGET,
        "cores": os.cpu_count(),
        "load": max(loads),
        "load_min": min(loads),
        "rounds": rounds,
        "cpu_s": rows["this"],
        "whole_run": sorted(whole),  # commands that read no image: their whole run's CPU seconds
        "bytecode": "cached",  # child_env
    }
    if floor is not None:
        record["floor_cpu_s"] = {"import torch, timm": floor}
    if "other" in rows:  # the trees by their labels, never their folders
        record["other_cpu_s"] = rows["other"]
    emit(record, RECORDS, keep)


def child_env(tree: Path, root: Path) -> dict[str, str]:
    """A measured command's environment: ``tree`` first on the path, and Python's bytecode cached as
    an installed toolkit has it after its first run. The cache is a fresh prefix under ``root``
    (``PYTHONPYCACHEPREFIX``), written in the warm-up round whatever ``PYTHONDONTWRITEBYTECODE``
    says in the caller's shell, and nothing is written into the checkouts. Without it each run
    compiles every module whose cache is missing or older than its source (a checkout just edited)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONPYCACHEPREFIX=str(root / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


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
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        envs = {tree: child_env(path, root) for tree, path in trees.items()}
        chosen = commands(str(build_store(root)), root, args.full, str(build_panel_store(root)) if args.full else "")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(name, tree): [] for name in chosen for tree in trees}
        for command in chosen.values():  # warm the page and bytecode caches (and write the results the report reads) once
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
                "bytecode": "cached",  # child_env
                "rows": rows,
            }
        ),
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
