"""Peak memory of a label read's hygiene files at data-set size, against the whole-dict reading.

Every labelled command hashes its panel's photographs against ``panel-hashes.json`` (the memo of
files already hashed: every panel's paths) and checks and extends ``panel-images.json`` (every
panel's content hashes). probe reads the memo a block of text at a time (``labels/hash_memo.py``),
the index panel by panel into arrays (``labels/hash_files.py``) and writes both back member by
member (``labels/index_write.py``). The baseline, timed on the same files in the same run, is the
reading those replaced: ``json.loads`` of each file, dicts of the panel's entries, the merged
dicts written with ``json.dump`` (re-implemented here). Both give the same digests (checked).

Two reads of a panel of ``--panel`` small image files beside ``--others`` paths of another panel
(already in both files): the first (every file hashed and added) and a second (nothing to add).
Peak memory is Python's own allocations (``tracemalloc``), not the resident set; CPU seconds too.

    python benchmarks/label_cache.py [--panel 20000] [--others 100000] [--record]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from probe_toolkit.labels import hygiene

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import header  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "label-cache.jsonl"


def whole_dict_read(root: Path, folder: Path, names: list[str], panel: str) -> list[str]:
    """The reading probe's replaced: both files decoded whole, the panel's entries as dicts, written whole."""

    def load(path: Path) -> dict:
        return json.loads(path.read_text()) if path.is_file() else {}

    memo, hashes, fresh = load(root / hygiene.MEMO), {}, {}
    for name in names:
        path = str((folder / name).absolute())
        stat = os.stat(path)
        seen = memo.get(path)
        if not (isinstance(seen, list) and seen[:2] == [stat.st_size, stat.st_mtime_ns]):
            seen = fresh[path] = [stat.st_size, stat.st_mtime_ns, hashlib.sha256(Path(path).read_bytes()).hexdigest()]
        hashes[seen[2]] = name
    del memo
    index = load(root / hygiene.INDEX)
    entry = {"role": "train", "annotation_sha256": "a" * 64, "hashes": {**index.get(panel, {}).get("hashes", {}), **hashes}}
    if index.get(panel) != entry:
        (root / hygiene.INDEX).write_text(json.dumps({**index, panel: entry}, separators=(",", ":")) + "\n")
    del index
    if fresh:
        (root / hygiene.MEMO).write_text(json.dumps({**load(root / hygiene.MEMO), **fresh}, separators=(",", ":")) + "\n")
    return sorted(hashes)


def probe_read(root: Path, folder: Path, names: list[str], panel: str) -> list[str]:
    hashes, fresh = hygiene.content_hashes(root, folder, names)
    hygiene.check_overlap(root, panel, "train", "a" * 64, hashes, fresh)
    return [hashes.hex(i) for i in range(len(hashes))]


def measured(fn, *args, traced: bool) -> tuple[float, list[str]]:
    """(peak traced MiB, or CPU seconds untraced: tracemalloc slows every allocation; the digests) of one call."""
    if not traced:
        cpu = time.process_time()
        out = fn(*args)
        return time.process_time() - cpu, out
    tracemalloc.start()
    try:
        out = fn(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / 2**20, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panel", type=int, default=20_000, help="image files of the panel read")
    parser.add_argument("--others", type=int, default=100_000, help="paths of another panel already in the memo and index")
    parser.add_argument("--record", action="store_true", help=f"append the JSON line to {RECORDS.relative_to(RECORDS.parents[2])}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, start = Path(tmp) / "images", Path(tmp) / "start"
        folder.mkdir()
        start.mkdir()
        names = [f"img_{i:08d}.jpg" for i in range(args.panel)]
        for i, name in enumerate(names):
            (folder / name).write_bytes(i.to_bytes(8, "little") * 32)
        digests = [hashlib.sha256(i.to_bytes(8, "little")).hexdigest() for i in range(args.others)]
        other = [f"/data/other/train/n{i % 1000:08d}/other_{i:08d}.JPEG" for i in range(args.others)]
        memo = {p: [1000 + i, 1796559286709694735 + i, d] for i, (p, d) in enumerate(zip(other, digests))}
        (start / hygiene.MEMO).write_text(json.dumps(memo, separators=(",", ":")) + "\n")
        index = {"other": {"role": "val", "annotation_sha256": "0" * 64, "hashes": {d: Path(p).name for d, p in zip(digests, other)}}}
        (start / hygiene.INDEX).write_text(json.dumps(index, separators=(",", ":")) + "\n")
        del memo, index, other, digests
        rows: dict[str, dict] = {"whole dicts": {}, "probe": {}}
        found = set()
        for traced, unit in ((True, "peak_mib"), (False, "cpu_s")):  # memory first: the photographs are then in the page cache for both CPU passes
            for label, fn in (("whole dicts", whole_dict_read), ("probe", probe_read)):
                root = Path(tmp) / f"{label.replace(' ', '-')}-{unit}"
                shutil.copytree(start, root)
                for read in ("first", "second"):
                    rows[label][f"{read}_{unit}"], digests = measured(fn, root, folder, names, "mine", traced=traced)
                    found.add(tuple(digests))
        assert len(found) == 1, "the two readings found other digests"
    for label, row in rows.items():
        print(
            f"{label:12s} first read {row['first_peak_mib']:7.1f} MiB peak, {row['first_cpu_s']:5.2f} s CPU | "
            f"second read {row['second_peak_mib']:7.1f} MiB, {row['second_cpu_s']:5.2f} s"
        )
    record = {
        **header("label_cache"),
        "panel": args.panel,
        "others": args.others,
        "rows": rows,
        "first_peak_ratio": rows["probe"]["first_peak_mib"] / rows["whole dicts"]["first_peak_mib"],
        "second_peak_ratio": rows["probe"]["second_peak_mib"] / rows["whole dicts"]["second_peak_mib"],
    }
    print(json.dumps(record))
    if args.record:
        with open(RECORDS, "a") as handle:
            handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
