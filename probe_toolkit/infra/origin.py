"""What probe made up itself: checkpoints of random weights and folders of synthetic images.

``probe make-checkpoint``, the demo and the tests write random-weight checkpoints in the released
layouts, and the demo draws synthetic scenes and a synthetic DAVIS folder. Numbers measured on
them are checks of the pipeline, not findings about a method (a DAVIS J&F of a random network on
two drawn shapes says nothing of DINO), so each carries a small marker that the report reads to
put a caveat beside every figure and table drawn from them:

- a checkpoint: ``<file>.probe-origin.json`` beside it, holding the file's sha256, so a marker
  never speaks for another file later copied to the same name (the store's manifest records the
  sha256 of the file it read);
- a folder: ``.probe-origin.json`` inside it, which covers the folder and everything below.

A file or folder without a marker is taken as the user's real data; nothing is guessed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MARK = ".probe-origin.json"
SUFFIX = ".probe-origin.json"


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def mark_random(checkpoint: str | Path, what: str) -> Path:
    """Mark ``checkpoint`` as random weights made by probe (``what``: how, e.g. its layout and seed)."""
    checkpoint = Path(checkpoint)
    marker = checkpoint.with_name(checkpoint.name + SUFFIX)
    _write(marker, {"origin": "random weights", "what": what, "sha256": _sha256(checkpoint)})
    return marker


def random_weights(checkpoint: str | Path | None, sha256: str | None) -> str | None:
    """``what`` of a random-weight checkpoint whose marker matches ``sha256``, else None."""
    if not checkpoint:
        return None
    path = Path(str(checkpoint))
    found = _read(path.with_name(path.name + SUFFIX))
    if not found or found.get("origin") != "random weights" or not sha256 or found.get("sha256") != sha256:
        return None
    return str(found.get("what") or "random weights")


def mark_synthetic(folder: str | Path, what: str) -> Path:
    """Mark ``folder`` (and everything below it) as synthetic images drawn by probe."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / MARK, {"origin": "synthetic", "what": what})
    return folder / MARK


def synthetic(path: str | Path | None, stop: str | Path | None = None) -> str | None:
    """``what`` of the marked folder holding ``path`` (looking no higher than ``stop`` when given), else None."""
    if not path:
        return None
    here = Path(str(path))
    top = Path(str(stop)).resolve() if stop else None
    for folder in [here, *here.parents]:
        found = _read(folder / MARK)
        if found and found.get("origin") == "synthetic":
            return str(found.get("what") or "synthetic images")
        if top is not None and folder.resolve() == top:
            break
    return None
