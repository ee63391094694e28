"""A block of images → the decoder's arrays: the unit a runner ships to a worker.

``decode_block`` and ``sweep_block`` are pure, picklable (top-level, settings as arguments) and
return plain arrays with ``image`` first, so ``infra.runner`` can run them on local processes or
a dask cluster and concatenate them; ``as_decoded`` turns the arrays back into ``Decoded``.
The backend is ``scipy`` (``decoder.decode_image``, one image at a time) or ``torch``
(``decoder_torch.decode_batch``, the whole block at once, on the CPU or a GPU).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from .decoder import Decoded, ImageMasks, collate, decode_image
from .decoder_graph import cosines
from .decoder_settings import Settings

ARRAYS = tuple(f.name for f in fields(Decoded) if f.name not in ("settings", "grids", "patch", "view"))


def per_image(keys: np.ndarray, rows: np.ndarray | None, cols: np.ndarray | None):
    """(keys, grid) of each image: its first rows·cols patches on (rows, cols), or square (None)."""
    if rows is None:
        return [(k, None) for k in keys]
    return [(k[: int(r) * int(c)], (int(r), int(c))) for k, r, c in zip(keys, rows, cols)]


def _solve(keys: np.ndarray, settings: Settings, backend: str, device: str, rows=None, cols=None) -> list[ImageMasks]:
    if backend == "torch":
        from .decoder_torch import decode_batch, decode_grids

        return decode_batch(keys, settings, device=device) if rows is None else decode_grids(keys, rows, cols, settings, device=device)
    return [decode_image(k, settings, grid=g) for k, g in per_image(keys, rows, cols)]


def _arrays(decoded: Decoded) -> dict[str, np.ndarray]:
    return {name: getattr(decoded, name) for name in ARRAYS}


def decode_block(
    keys: np.ndarray, *, settings: Settings, backend: str = "scipy", device: str = "cpu", rows: np.ndarray | None = None, cols: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Masks of a block of images (image, patch, channel) as the arrays of ``Decoded``; ``rows``,
    ``cols`` (image,): each image's own grid (the own-size views), its padding patches never read."""
    keys = np.asarray(keys)
    return _arrays(collate(_solve(keys, settings, backend, device, rows, cols), settings, keys.shape[1]))


def as_decoded(arrays: dict[str, np.ndarray], settings: Settings) -> Decoded:
    return Decoded(**{name: arrays[name] for name in ARRAYS}, settings=settings)


def sweep_block(
    keys: np.ndarray, *, groups: list[Settings], backend: str = "scipy", device: str = "cpu", rows: np.ndarray | None = None, cols: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Every setting of ``groups`` on a block; arrays named ``<group index>/<field>``.

    The cosines of each image are computed once per centring and shared by the settings.
    """
    keys = np.asarray(keys)
    out: dict[str, np.ndarray] = {}
    if backend == "torch":
        for g, s in enumerate(groups):
            out.update({f"{g}/{k}": v for k, v in decode_block(keys, settings=s, backend=backend, device=device, rows=rows, cols=cols).items()})
        return out
    found: list[list[ImageMasks]] = [[] for _ in groups]
    for k, grid in per_image(keys, rows, cols):
        # all cosines kept where several settings (or MaskCut's rounds) decide graphs on them
        cos = {c: cosines(k, center=c, shared=sum(s.masks for s in groups if s.center == c) > 1) for c in {s.center for s in groups}}
        for g, s in enumerate(groups):
            found[g].append(decode_image(k, s, cos=cos[s.center], grid=grid))
    for g, s in enumerate(groups):
        out.update({f"{g}/{k}": v for k, v in _arrays(collate(found[g], s, keys.shape[1])).items()})
    return out


def group_arrays(arrays: dict[str, np.ndarray], g: int) -> dict[str, np.ndarray]:
    prefix = f"{g}/"
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
