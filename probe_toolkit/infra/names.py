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


class SortedNames:
    """Names as their sorted UTF-8 bytes (``sorted``) and where each came from (``order``), looked up by bisection."""

    def __init__(self, held: Sequence[str]) -> None:
        keys = as_keys(held)
        self.order = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]

    def find(self, wanted: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """For each of ``wanted``: its position among the names (the last of a name held twice, as a
        dict of them keeps it; 0 where absent) and whether they hold it. The names asked keep their
        own width, so a longer one is never cut to match a held one."""
        want = as_keys(wanted)
        if not len(self.sorted):
            return np.zeros(len(want), np.int64), np.zeros(len(want), bool)
        at = np.searchsorted(self.sorted, want, side="right") - 1
        found = (at >= 0) & (self.sorted[np.maximum(at, 0)] == want)
        return np.where(found, self.order[np.maximum(at, 0)], 0), found


def lookup(held: Sequence[str], wanted: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``SortedNames(held).find(wanted)``: positions in ``held`` and whether found."""
    return SortedNames(held).find(wanted)
