"""Names (file names, paths, image ids) of a data set looked up as sorted byte arrays.

A dict or set of 100 k names is tens of MiB of Python objects, and building one per lookup made
checks quadratic; a sorted array of the names' UTF-8 bytes is their bytes alone, and numpy
compares them as Python compares the texts (byte order of UTF-8 is code-point order). numpy's
variable-width ``StringDType`` is not used: its ``isin`` is quadratic, and its ``searchsorted``
crashed (numpy 2.3) on names longer than 15 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def as_keys(texts: Sequence[str]) -> np.ndarray:
    """Texts as one fixed-width bytes array (UTF-8; lone surrogates, as undecodable file names
    come, kept by ``surrogatepass``). File names hold no NUL, which a bytes array would drop at the end."""
    return np.array([t.encode("utf-8", "surrogatepass") for t in texts], dtype=bytes) if len(texts) else np.zeros(0, "S1")


def lookup(held: Sequence[str], wanted: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``wanted``: its position in ``held`` (the last of a name held twice, as a dict
    of ``held`` keeps it; 0 where absent) and whether ``held`` has it."""
    keys = as_keys(held)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    del keys
    want = as_keys(wanted)
    at = np.searchsorted(ordered, want, side="right") - 1
    found = (at >= 0) & (ordered[np.maximum(at, 0)] == want) if len(ordered) else np.zeros(len(want), bool)
    return np.where(found, order[np.maximum(at, 0)] if len(ordered) else 0, 0), found
