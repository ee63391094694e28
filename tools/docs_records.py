"""Copy the records the docs' results tables read (``probe table``'s columns) out of a demo's stores into ``docs/data/records``.

The docs render their results tables with ``probe table``'s own code from records committed beside them, so a
store's arrays stay behind: each copied store keeps its manifest (the root group's attributes, nothing else) and
the latest record of each result that ``report/paper.py`` reads. Records name the folders of the machine they were
made on; the copy names them relative to the demo's ``--out`` folder (``demo/work/...``) or to this repository, and
refuses to write a copy that would still name an absolute folder. Each copied record lists its files' new digests
(``records.check_files``) and says that it was relabelled.

    probe demo --quick --out /tmp/demo
    python tools/docs_records.py /tmp/demo trained=cache/checkpoint-<sha>/teacher.zarr random=cache/tiny-random-<sha>/teacher.zarr
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = ROOT / "docs" / "data" / "records"
ABSOLUTE = re.compile(r"(?<![\w.~/:…])/(?:tmp|home|root|work|usr|var|opt|mnt|srv|Users)/[^\s\"']*")
RELABELLED = "tools/docs_records.py: folders named relative to the demo's --out folder (demo/...) or to the repository"


def relabelled(text: str, out: Path) -> str:
    """``text`` with the demo's folder and this repository's folder named relatively; refused if any absolute folder is left."""
    text = text.replace(f"{out.resolve()}/", "demo/").replace(str(out.resolve()), "demo").replace(f"{ROOT}/", "")
    left = ABSOLUTE.findall(text)
    if left:
        raise SystemExit(f"docs_records: {left[0]} is an absolute folder the copy would publish; name it relatively in relabelled()")
    return text


def copy_record(found, into: Path, out: Path) -> None:
    from probe_toolkit.infra.provenance import file_sha256
    from probe_toolkit.results import records

    shutil.copytree(found.path, into)
    for path in sorted(into.rglob("zarr.json")):
        path.write_text(relabelled(path.read_text(encoding="utf-8"), out), encoding="utf-8")
    meta = json.loads(relabelled(json.dumps(found.meta), out))
    meta["files"] = {str(p.relative_to(into)): file_sha256(p) for p in sorted(into.rglob("*")) if p.is_file() and p.name != records.RECORD}
    meta["relabelled"] = RELABELLED
    records.write_meta(into, meta)


def copy_store(store: Path, name: str, out: Path) -> Path:
    """``docs/data/records/<name>.zarr``: the store's manifest and the latest record of each result ``probe table`` reads."""
    from probe_toolkit.report import paper
    from probe_toolkit.results import records
    from probe_toolkit.store import cache

    target = TARGET / f"{name}.zarr"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    manifest = json.loads(relabelled(json.dumps(cache.manifest(store)), out))
    (target / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"manifest": manifest}}, indent=1) + "\n")
    for result in records.results(store):
        if records.is_part(result) or not any(metric.belongs(result) for metric in paper.METRICS.values()):
            continue
        found = records.find(store, result)
        copy_record(found, target / "results" / result / found.run_id, out)
    return target


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    out = Path(argv[0])
    for item in argv[1:]:
        name, _, store = item.partition("=")
        print(copy_store(out / "work" / store, name, out).relative_to(ROOT))


if __name__ == "__main__":
    main(sys.argv[1:])
