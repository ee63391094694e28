"""analyses.grid.components against scipy.ndimage.label: the same labels, numbered alike, 4- and 8-connected."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from probe_toolkit.analyses.grid import components


def test_components_are_ndimage_labels():
    rng = np.random.default_rng(0)
    for _ in range(400):
        rows, cols = (int(v) for v in rng.integers(1, 33, 2))
        mask = rng.random((rows, cols)) < rng.random()
        for eight in (False, True):
            labels, count = components(mask, eight=eight)
            expected, expected_count = ndimage.label(mask, structure=np.ones((3, 3)) if eight else None)
            assert count == expected_count and np.array_equal(labels, expected), (rows, cols, eight)


def test_hand_cases():
    diagonal = np.eye(3, dtype=bool)
    assert components(diagonal)[1] == 3 and components(diagonal, eight=True)[1] == 1  # corners touch only in 8-connectivity
    ring = np.ones((3, 3), dtype=bool)
    ring[1, 1] = False
    labels, count = components(ring)
    assert count == 1 and labels[1, 1] == 0
    assert components(np.zeros((2, 4), dtype=bool))[1] == 0
    labels, count = components(np.array([[1, 0, 1], [0, 0, 1]], dtype=bool))
    assert count == 2 and labels.tolist() == [[1, 0, 2], [0, 0, 2]]  # numbered by their first patch, row-major
