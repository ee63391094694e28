"""What every manifest records about where a number came from: code, libraries, time."""

from __future__ import annotations

import datetime as _dt
import hashlib
import subprocess
from collections.abc import Iterable
from functools import lru_cache
from importlib import metadata
from itertools import islice
from pathlib import Path

from .._version import __version__

LIBRARIES = ("torch", "timm", "numpy", "scipy", "scikit-learn", "xarray", "zarr", "dask", "pycocotools", "pillow")


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file, read a mebibyte at a time (checkpoints, images, markers)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@lru_cache(maxsize=1)
def git_revision() -> str:
    """The toolkit's git commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = _version(metadata.distribution(name))
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _version(dist: metadata.Distribution) -> str:
    """``metadata.version``'s answer from the METADATA file's ``Version:`` line, without parsing
    the whole file as an e-mail message (a twentieth of a second of every command's start-up)."""
    for line in (dist.read_text("METADATA") or "").splitlines():
        if line.startswith("Version:"):
            return line.partition(":")[2].strip()
        if not line:  # the headers end at the first empty line
            break
    return dist.version


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


HASHED_AT_ONCE = 4096  # ids joined per update: a 100 k store's ids never sit in one string


def list_hash(items: Iterable[str]) -> str:
    """sha256 of a list of ids, one per line: the identity of an image list (hashed a few thousand
    ids at a time, the digest of the whole list joined by newlines)."""
    digest, ids, between = hashlib.sha256(), iter(items), b""
    while block := list(islice(ids, HASHED_AT_ONCE)):
        digest.update(between + "\n".join(block).encode())
        between = b"\n"
    return digest.hexdigest()


def stamp() -> dict[str, object]:
    """The common manifest fields."""
    return {"toolkit_version": __version__, "git_revision": git_revision(), "libraries": library_versions(), "date": now()}
