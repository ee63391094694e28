"""The image pairs of a NAVI panel, drawn as mbanani/probe3d ``evals/datasets/navi.py``
(``generate_instance_pairs``) draws them, and each image's camera as a 4 × 4 matrix
(``evals/datasets/utils.py`` ``camera_matrices_from_annotation``), in float32 torch as there.

``camera``: the translation (mm → m, as ``get_single`` scales it) times the rotation of the
quaternion [w, x, y, z] (s = 2 / |q|²). ``pairs``: one generator seeded ``PAIR_SEED`` for the whole
panel; per object and collection, per image in order, a partner drawn uniformly among the
collection's images at a relative angle in (0°, 120°]. ``scored``: every ``STRIDE``-th image and its
partner, as the reference keeps ``instances[::4]`` after drawing every image's partner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .navi import MAX_ANGLE, PAIR_SEED, STRIDE, NaviImage


def rotation(q: Sequence[float]):
    """3 × 3 float32 rotation of a quaternion [w, x, y, z] (``quaternion_to_rotation_matrix``'s formula)."""
    import torch

    q = torch.as_tensor(q, dtype=torch.float32)
    w, x, y, z = q.unbind(-1)
    s = 2.0 / (q * q).sum(dim=-1)
    return torch.stack(
        [
            torch.stack([1 - s * (y**2 + z**2), s * (x * y - z * w), s * (x * z + y * w)]),
            torch.stack([s * (x * y + z * w), 1 - s * (x**2 + z**2), s * (y * z - x * w)]),
            torch.stack([s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x**2 + y**2)]),
        ]
    )


def camera(image: NaviImage):
    """4 × 4 float32 [R | t] with t in metres: the annotation's translation (mm) after its rotation."""
    import torch

    out = torch.eye(4, dtype=torch.float32)
    out[:3, :3] = rotation(image.q)
    out[:3, 3] = torch.as_tensor(image.t, dtype=torch.float32)
    out[:3, 3] = out[:3, 3] / 1000.0
    return out


def angles(rotations):
    """(n, n) relative rotation angles in degrees between every two of (n, 3, 3) float32 rotations."""
    import torch

    out = []
    for i in range(len(rotations)):
        product = torch.bmm(rotations[i, None].repeat(len(rotations), 1, 1), rotations.permute(0, 2, 1))
        trace = product[:, 0, 0] + product[:, 1, 1] + product[:, 2, 2]
        out.append((0.5 * trace - 0.5).clamp(min=-1, max=1).acos() * 180 / math.pi)
    return torch.stack(out)


def _groups(images: Sequence[NaviImage]) -> dict[tuple[str, str], list[int]]:
    groups: dict[tuple[str, str], list[int]] = {}
    for n, image in enumerate(images):
        groups.setdefault((image.object, image.collection), []).append(n)
    return groups


def unpaired(images: Sequence[NaviImage]) -> list[str]:
    """One problem line per image with no other image of its collection within ``MAX_ANGLE``."""
    import torch

    problems = []
    for (obj, collection), members in _groups(images).items():
        table = angles(torch.stack([rotation(images[n].q) for n in members]))
        for row, n in enumerate(members):
            if not ((table[row] > 0) & (table[row] <= MAX_ANGLE)).any():
                problems.append(
                    f"{obj}/{collection}/{images[n].id}: no other image of its collection lies within {MAX_ANGLE:g}° of it, so it has no "
                    f"partner (the reference's torch.multinomial fails on it); remove it from the folder or restore the release's annotations"
                )
    return problems


def pairs(images: Sequence[NaviImage], seed: int = PAIR_SEED) -> list[int]:
    """The partner (an index into ``images``) of every image."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    partner = [-1] * len(images)
    for members in _groups(images).values():
        table = angles(torch.stack([rotation(images[n].q) for n in members]))
        for row, n in enumerate(members):
            weights = table[row].clone()
            weights[weights > MAX_ANGLE] = 0
            weights[weights > 0] = 1
            partner[n] = members[int(torch.multinomial(weights, 1, generator=generator).item())]
    return partner


def scored(images: Sequence[NaviImage], seed: int = PAIR_SEED, stride: int = STRIDE) -> list[tuple[int, int]]:
    """(image, partner) of the pairs the reference scores: every ``stride``-th image from the first."""
    partner = pairs(images, seed)
    return [(n, partner[n]) for n in range(0, len(images), stride)]
