"""A class-folder panel (ImageNet's train/CLASS/FILE layout) registered and read, against a bare listing and, with ``--compare``, another checkout.

k-NN and the linear probes read a class-folder panel's classes (``labels.panels.read_classes``):
the folder is listed, every file stat'ed against the memo of files already hashed (a first read
hashes them), the panel's content hashes checked against the other panels' and the read entered
in the ledger. This times ``probe panel add`` (``add_panel``) and two reads of a synthetic panel
of ``--images`` small JPEG files in ``--classes`` folders, each in a fresh process with a fresh
cache: CPU seconds (untraced) and, in another process, the peak of Python's own allocations
(``tracemalloc``), with the process's largest resident set.

The baseline, in the same run: the bare cost of any such read, a recursive ``os.scandir`` of the
folder and an ``os.stat`` of each file (names kept, sorted). ``--compare OTHER_CHECKOUT`` runs the
same steps with another checkout's toolkit (e.g. a ``git worktree`` of an older commit) and checks
that both give the same classes, labels and ledger listing hash; its commit is recorded, not its
folder.

``--knn VAL`` then runs ``probe knn`` as a user does on that layout: VAL more images in ``val/``
beside ``train/`` (the same classes), a store of a tiny random network (width 32, depth 1, patch
32; view 224) extracted over both, the two panels registered in a fresh cache, and ``probe knn
--k 10,20`` read twice (the first read hashes every file), each side's command timed as
``scale.py`` times one (wall and CPU seconds, the peak of its process tree and of its largest
process, sampled every 0.2 s); both sides must print the same accuracies.

    python benchmarks/class_panel.py [--images 100000] [--classes 1000] [--rounds 3] [--compare OTHER_CHECKOUT] [--knn 20000] [--record]
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import emit, header, options  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "records" / "class-panel.jsonl"
STEPS = ("add", "first", "second")


def make_panel(folder: Path, images: int, classes: int, first: int = 0) -> None:
    """``images`` JPEG files of 8 × 8 random pixels (numbered from ``first``) over ``classes`` folders:
    every file has its own bytes and its own features (a k-NN of identical images is another case)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(first)
    for c in range(classes):
        (folder / f"n{c:08d}").mkdir(parents=True)
    for i in range(first, first + images):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).save(buffer, "JPEG")
        (folder / f"n{i % classes:08d}" / f"img_{i:08d}.JPEG").write_bytes(buffer.getvalue())


def bare(folder: Path) -> list[str]:
    """Every file's relative name, listed recursively with ``os.scandir`` and stat'ed, sorted."""
    names, stack = [], [("", os.fspath(folder))]
    while stack:
        prefix, directory = stack.pop()
        with os.scandir(directory) as found:
            for entry in found:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((f"{prefix}{entry.name}/", entry.path))
                else:
                    os.stat(entry.path)
                    names.append(prefix + entry.name)
    return sorted(names)


def child(side: str, folder: Path, cache: Path, traced: bool) -> None:
    """One side's steps in this process: per step CPU seconds, or peak traced MiB; the answer's digest."""
    if side == "bare":
        steps = {"bare": lambda: bare(folder)}
    else:
        sys.path.insert(0, side)
        from probe_toolkit.labels import panels

        def read():
            got = panels.read_classes("cf", purpose="benchmark", cache=cache, command="benchmark")
            listing = hashlib.sha256("\n".join(got.image_ids).encode()).hexdigest()
            return [listing, got.classes[:3], len(got.classes), got.labels.tolist()]

        steps = {"add": lambda: None if panels.add_panel("cf", folder, folder, "train", cache=cache, kind="classes") else None, "first": read, "second": read}
    out, answers = {}, []
    for name, step in steps.items():
        if traced:
            tracemalloc.start()
            answers.append(step())
            out[name] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        else:
            cpu = time.process_time()
            answers.append(step())
            out[name] = time.process_time() - cpu
    out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["answer"] = hashlib.sha256(json.dumps(answers[-1]).encode()).hexdigest()
    print(json.dumps(out))


def run_side(side: str, folder: Path, tmp: Path, traced: bool, n: int) -> dict:
    cache = tmp / f"cache-{n}"
    text = subprocess.run(
        [sys.executable, __file__, "--child", side, "--folder", str(folder), "--cache", str(cache), *(["--traced"] if traced else [])],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": side if side != "bare" else os.environ.get("PYTHONPATH", "")},
    ).stdout
    return json.loads(text.strip().splitlines()[-1])


def knn_runs(data: Path, sides: dict[str, str], tmp: Path) -> dict[str, dict]:
    """``probe knn`` on ``data/train`` and ``data/val`` as class-folder panels, with each side's code:
    a store extracted once (this checkout), then per side a fresh cache, both panels added and two reads."""
    from dataclasses import replace

    from scale import timed

    from probe_toolkit.demo.samples import TINY, write_checkpoint

    checkpoint, store = tmp / "tiny.pth", tmp / "store.zarr"
    write_checkpoint(checkpoint, "dino-full", replace(TINY, width=32, depth=1, heads=1, patch=32, mlp_hidden=64, pos_grid=7), seed=0)
    here = {**os.environ, "PYTHONPATH": str(ROOT)}
    extraction = ["extract", str(checkpoint), "--images", str(data), "--store", str(store), "--cache", str(tmp / "x")]
    extracted = timed([*extraction, *"--views 224 --attention none --device cpu -q".split()], here)
    print(f"store of {data} extracted: {extracted}", file=sys.stderr)
    out: dict[str, dict] = {}
    for side, where in sides.items():
        if side == "bare":
            continue
        env, cache = {**os.environ, "PYTHONPATH": where, "PYTHONSAFEPATH": "1"}, tmp / f"knn-{side}"  # safe path: -m would import the current folder's toolkit first
        for name, folder, role in (("tr", "train", "train"), ("va", "val", "val")):
            subprocess.run(
                [sys.executable, "-m", "probe_toolkit", "panel", "add", name, "--classes-from-folders", str(data / folder), "--role", role, "--cache", str(cache)],
                env=env,
                check=True,
                capture_output=True,
            )
        for read in ("first", "second"):
            answer = cache / f"{read}.json"
            got = timed(["knn", str(store), "--train", "tr", "--val", "va", "--k", "10,20", "-q", "--cache", str(cache), "--json", str(answer)], env)
            got["top1"] = json.loads(answer.read_text())["top1"]
            out[f"{side}_{read}"] = got
            print(f"{side:8s} knn {read} read {got}", file=sys.stderr)
    if len({json.dumps(r["top1"]) for r in out.values()}) != 1:
        raise SystemExit(f"the sides' k-NN accuracies differ: { {k: r['top1'] for k, r in out.items()} }")
    return out


def commit(checkout: str) -> str:
    found = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def main() -> None:
    if "--child" in sys.argv:
        at = sys.argv.index
        child(sys.argv[at("--child") + 1], Path(sys.argv[at("--folder") + 1]), Path(sys.argv[at("--cache") + 1]), "--traced" in sys.argv)
        return
    args = options(
        __doc__,
        {
            "images": "image files in the panel",
            "classes": "class folders",
            "rounds": "rounds, medians taken",
            "compare": "another checkout's root (a git worktree)",
            "knn": "val images for a probe knn run (0: none)",
        },
        record=RECORDS,
        images=100_000,
        classes=1_000,
        rounds=3,
        compare="",
        knn=0,
    )
    sides = {"probe": str(ROOT), "bare": "bare", **({"compare": str(Path(args.compare).resolve())} if args.compare else {})}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data" / "train"
        made = time.perf_counter()
        make_panel(folder, args.images, args.classes)
        if args.knn:
            make_panel(folder.parent / "val", args.knn, args.classes, first=args.images)
        print(f"{args.images} files in {args.classes} folders made in {time.perf_counter() - made:.1f} s", file=sys.stderr)
        cpu: dict[str, list[dict]] = {s: [] for s in sides}
        memory: dict[str, dict] = {}
        n = 0
        for traced in (True, False):  # memory first: the files are then in the page cache for every CPU round
            for _ in range(1 if traced else args.rounds):
                for side, where in sides.items():  # interleaved: a noisy machine slows every side alike
                    n += 1
                    got = run_side(where, folder, Path(tmp), traced, n)
                    (memory.__setitem__(side, got) if traced else cpu[side].append(got))
        knn = knn_runs(folder.parent, sides, Path(tmp)) if args.knn else None
    answers = {s: {r["answer"] for r in rows} | ({memory[s]["answer"]} if s in memory else set()) for s, rows in cpu.items() if s != "bare"}
    if len(set().union(*answers.values())) != 1:
        raise SystemExit(f"the sides read other classes: {answers}")
    steps = {s: (("bare",) if s == "bare" else STEPS) for s in sides}
    rows = {
        s: {
            **{f"{k}_cpu_s": round(statistics.median(r[k] for r in cpu[s]), 3) for k in steps[s]},
            **{f"{k}_peak_mib": round(memory[s][k], 1) for k in steps[s]},
            "maxrss_mib": round(memory[s]["maxrss_mib"], 1),
        }
        for s in sides
    }
    for side, row in rows.items():
        print(f"{side:8s} " + "  ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr)
    record = {
        **header("class-panel"),
        "images": args.images,
        "classes": args.classes,
        "rounds": args.rounds,
        "probe_commit": commit(str(ROOT)),
        **({"compare_commit": commit(sides["compare"])} if args.compare else {}),
        "rows": rows,
        **({"knn_val": args.knn, "knn": knn} if knn else {}),
        "second_read_over_bare_cpu": round(rows["probe"]["second_cpu_s"] / rows["bare"]["bare_cpu_s"], 2),
    }
    emit(record, RECORDS, args.record)


if __name__ == "__main__":
    main()
