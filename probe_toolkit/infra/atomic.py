"""Files appear whole or not at all: write to a temporary name beside the target, then rename."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import ProbeError


def write_json(path: str | Path, obj: Any, indent: int | None = None) -> Path:
    """JSON written atomically (temp name, then ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    separators = None if indent else (",", ":")
    try:
        tmp.write_text(json.dumps(obj, indent=indent, separators=separators) + "\n")
        os.replace(tmp, path)
    except BaseException as error:  # a full disk or Ctrl-C leaves neither a half file nor the temp name
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise ProbeError(path, f"could not be written ({error.strerror or error})", "pass a file path (not a folder) on a disk with free space") from None
        raise
    return path
