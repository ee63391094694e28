"""``probe hummingbird``'s CPU until its memory is built, per train image, this checkout against another, on one scale-run store.

The scale run (``benchmarks/scale.py``) times the whole command per val image; the memory's part
(the train panel's checks and label read, then the bank drawn and read a portion at a time) is
per train image, and must not grow with the data set. Each checkout's command (the published
1024·10² memory, one augmentation epoch, as the scale run gives it) runs in its own process until
its first memory is built, then stops (its spooled files removed as a failed run's are): the
process's CPU seconds (this process alone: the search's workers start later), its peak resident
memory, and the sha256 of the bank's features and of its label distributions, which must be the
same for both checkouts (the same rows drawn, the same features). ``--compare ''`` times this
checkout alone (e.g. at 100 k images, where the other may take far longer).

    python benchmarks/hummingbird_memory.py --folder /tmp/hbird-scale/n1000 --compare OTHER_CHECKOUT [--record]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import emit, header, options  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "hummingbird-memory.jsonl"
MEMORY = 102400  # benchmarks/scale.py's

# run in the measured checkout: the command, stopped once its first memory is built
DRIVER = """
import json, resource, sys, time
from contextlib import contextmanager
from probe_toolkit.commands import hummingbird as command
built = command.built
class Built(Exception):
    pass
@contextmanager
def stop_when_built(source, *args):
    with built(source, *args) as (bank, labels, per_view):
        use = resource.getrusage(resource.RUSAGE_SELF)
        found = {"cpu_s": use.ru_utime + use.ru_stime, "peak_mib": use.ru_maxrss / 1024, "train": len(source.ids),
                 "bank_rows": int(bank.shape[0]), "bank_sha256": bank.sha256, "labels_sha256": labels.sha256}
        print("MEMORY " + json.dumps(found), flush=True)
        raise Built
command.built = stop_when_built
from probe_toolkit.cli import main
sys.argv = ["probe", *sys.argv[1:]]
try:
    main()
except Built:
    pass
"""


def built(tree: Path, folder: Path) -> dict:
    """The driver's findings for ``tree``'s code (run from an empty folder: ``python -m`` and ``-c``
    put the working folder first on the path)."""
    args = ["hummingbird", str(folder / "store.zarr"), "--train", "voc-train", "--val", "voc-val", "--memory", str(MEMORY)]
    args += ["--augmentation-epochs", "1", "-q", "--cache", str(folder / "cache"), "--workers", "1"]
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run([sys.executable, "-c", DRIVER, *args], env=dict(os.environ, PYTHONPATH=str(tree)), cwd=cwd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("MEMORY ")]
    if not lines:
        raise SystemExit(f"probe hummingbird ({tree}) did not build its memory: {done.stderr[-800:]}")
    return json.loads(lines[0].removeprefix("MEMORY "))


def main() -> None:
    args = options(
        __doc__,
        {"folder": "one size of benchmarks/scale.py (store.zarr, cache)", "compare": "another checkout of the toolkit ('': this one alone)"},
        RECORDS,
        folder="/tmp/hbird-scale/n1000",
        compare="",
        note="",
    )
    folder = Path(args.folder)
    trees = {"this": Path(__file__).resolve().parents[1], **({"other": Path(args.compare).resolve()} if args.compare else {})}
    found = {name: built(tree, folder) for name, tree in trees.items()}
    for name, f in found.items():
        print(f"  {name:5s}: {f['cpu_s']:8.1f} s CPU, {1e3 * f['cpu_s'] / f['train']:6.2f} ms per train image, peak {f['peak_mib']:.1f} MiB", flush=True)
    same = len({(f["bank_sha256"], f["labels_sha256"]) for f in found.values()}) == 1 if "other" in found else None
    this = found["this"]
    record = {
        **header("hummingbird-memory"),
        "train": this["train"],
        "memory": MEMORY,
        "bank_rows": this["bank_rows"],
        "network": "tiny DINO (width 32, depth 1, patch 32), random weights (benchmarks/scale.py)",
        "cpu_s": {name: round(f["cpu_s"], 2) for name, f in found.items()},
        "cpu_ms_per_train_image": {name: round(1e3 * f["cpu_s"] / f["train"], 3) for name, f in found.items()},
        "peak_mib": {name: round(f["peak_mib"], 1) for name, f in found.items()},
        **({"ratio": round(found["other"]["cpu_s"] / this["cpu_s"], 3), "same_memory": same} if same is not None else {}),
        **({"note": args.note} if args.note else {}),
    }
    emit(record, RECORDS, args.record)


if __name__ == "__main__":
    main()
