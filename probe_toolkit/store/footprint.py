"""How much memory one image's forward pass needs in an own-size view, told before it is tried.

A fixed view (224, 480) has a bounded grid; an own-size view (``native``, ``native_crop``,
``native_resized``) has as many patches as the image has: an 8000 × 8000 photograph at /16 is
250,000 patches, and one block's attention over them is heads × T² weights (T tokens with the
class token and registers), 500 GB for two heads. The forward would swap or be killed after
minutes without a word, so the largest image of each own-size view is measured from its file
header, and a run that cannot fit is refused in one line with the estimate, the image and the
fix, before the network is built.
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..infra.errors import ProbeError
from .architectures import Arch

SHARE = 0.5  # of the machine's memory one image's attention may take (the rest: weights, activations, the loader)


def machine_bytes(device: str = "cpu") -> int:
    """Physical memory of the host (or the GPU's, when the forward runs there)."""
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def attention_bytes(arch: Arch, patches: int) -> int:
    """One image's last-block attention rows in float32: heads × T × T, T = patches + prefix tokens."""
    tokens = patches + arch.prefix
    return arch.heads * tokens * tokens * 4


def check_own_views(
    ids: list[str], grids: dict[str, tuple[np.ndarray, np.ndarray]], views: tuple[str, ...], arch: Arch, device: str = "cpu", budget: int | None = None
) -> None:
    """Refuse an own-size view whose largest image would need more than ``SHARE`` of the memory."""
    budget = int(SHARE * machine_bytes(device)) if budget is None else budget
    for view in views:
        rows, cols = grids[view]
        if not len(rows):
            continue
        patches = rows.astype(np.int64) * cols.astype(np.int64)
        worst = int(np.argmax(patches))
        need = attention_bytes(arch, int(patches[worst]))
        if need <= budget:
            continue
        fits = math.isqrt(max(budget // (4 * arch.heads), 1)) - arch.prefix  # patches whose attention fits
        side = math.isqrt(max(fits, 1)) * arch.patch
        raise ProbeError(
            ids[worst],
            f"is {int(rows[worst])}×{int(cols[worst])} = {int(patches[worst])} patches in the {view} view: one forward's "
            f"attention would need ~{_size(need)} ({arch.heads} heads × {int(patches[worst]) + arch.prefix}² × 4 bytes), "
            f"more than half of this machine's {_size(2 * budget)}",
            f"use a fixed view (--views 480) for such images, or downscale them to about {side} px a side for own-size views",
        )


def check_maps(requests: dict, grids: dict[str, tuple[np.ndarray, np.ndarray]], arch: Arch, batch: int = 1, device: str = "cpu", budget: int | None = None) -> None:
    """Refuse explicit attention maps (``--attention last`` or ``all``) at a view whose one image's
    maps would need more than ``SHARE`` of the memory; the statistics (``--attention stats``) grow
    with the tokens, not their square, and are the fix."""
    budget = int(SHARE * machine_bytes(device)) if budget is None else budget
    for view, request in requests.items():
        if request.maps == "none" or view not in grids or not len(grids[view][0]):
            continue
        patches = int((grids[view][0].astype(np.int64) * grids[view][1].astype(np.int64)).max())
        blocks = arch.depth if request.maps == "all" else 1
        need = blocks * attention_bytes(arch, patches)
        if need <= budget:
            continue
        raise ProbeError(
            None,
            f"the {view} view's explicit attention maps would need ~{_size(need)} an image ({blocks} block{'s' if blocks > 1 else ''} × "
            f"{arch.heads} heads × {patches + arch.prefix}² × 4 bytes), more than half of this machine's {_size(2 * budget)}",
            "use --attention stats (entropy, distance and the class-token maps in memory linear in the tokens), or a smaller view",
        )


def _size(n: float) -> str:
    """Bytes in decimal units, as a user compares them with ``free -h``'s order of magnitude."""
    unit = "bytes"
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            break
        n /= 1000
    return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
