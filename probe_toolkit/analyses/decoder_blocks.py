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

from ..infra.runner import check_workers
from ..infra.settings import SettingError
from .decoder import Decoded, ImageMasks, collate, decode_image
from .decoder_graph import cosines
from .decoder_settings import Settings

BACKENDS = ("scipy", "torch")
ARRAYS = tuple(f.name for f in fields(Decoded) if f.name not in ("settings", "grids", "patch", "view"))


def check_backend(backend: str, device: str = "cpu") -> None:
    """``--backend`` / ``--device`` at the boundary: the backend exists, the device is there."""
    if backend not in BACKENDS:
        raise SettingError("backend", f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}", "use backend='scipy' or backend='torch'")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise SettingError("device", f"device must be cpu or cuda, got {device!r}", "use device='cpu' or device='cuda'")
    if backend == "scipy" and device != "cpu":
        raise SettingError("backend", f"device {device} needs backend torch (scipy runs on the CPU)", "set backend='torch'")
    if backend == "torch":
        try:
            import torch
        except ImportError:
            raise SettingError("backend", "backend torch needs torch, which is not installed", "pip install torch, or use backend='scipy'") from None
        if device != "cpu" and not torch.cuda.is_available():
            raise SettingError("device", f"device {device} is not available here: torch sees no CUDA GPU", "use device='cpu' (or run on a machine with a GPU)")


def default_workers(workers: int | None, device: str, dask_address: str | None = None) -> int | None:
    """One process drives a GPU (it batches the images itself); on the CPU, every core; on a
    cluster, its workers (``--workers`` is then left as given, for ``runner.placed`` to refuse
    beside ``--dask-address``). A bad ``--workers`` is refused here, before the store is opened
    and a progress bar drawn."""
    if workers is not None:
        check_workers(workers)
    return 1 if workers is None and device != "cpu" and not dask_address else workers


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


def decode_block(keys: np.ndarray, *, settings: Settings, backend: str = "scipy", device: str = "cpu",
                 rows: np.ndarray | None = None, cols: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Masks of a block of images (image, patch, channel) as the arrays of ``Decoded``; ``rows``,
    ``cols`` (image,): each image's own grid (the own-size views), its padding patches never read."""
    keys = np.asarray(keys)
    return _arrays(collate(_solve(keys, settings, backend, device, rows, cols), settings, keys.shape[1]))


def as_decoded(arrays: dict[str, np.ndarray], settings: Settings) -> Decoded:
    return Decoded(**{name: arrays[name] for name in ARRAYS}, settings=settings)


def sweep_block(keys: np.ndarray, *, groups: list[Settings], backend: str = "scipy", device: str = "cpu",
                rows: np.ndarray | None = None, cols: np.ndarray | None = None) -> dict[str, np.ndarray]:
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
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
