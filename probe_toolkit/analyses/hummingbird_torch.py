"""The Hummingbird retrieval of ``analyses.hummingbird.nearest`` in torch, on the CPU or a GPU,
with the same answer.

Same arithmetic and the same tie rule as the numpy path:

- each block of bank rows is multiplied with the queries in **float64** and the products are
  rounded to float32, so a cosine is the float32 rounding of an (almost) exact dot product
  whatever library, kernel or block shape computed it (the float64 sums of two libraries differ
  by about D · 2**-53 relative, which the rounding removes unless the exact value lies that close
  to a float32 rounding midpoint). Float64 is what makes the search exact on a GPU: a float32 (or
  TF32) product would round in the kernel's order and could swap two neighbours whose cosines
  differ in the last bit. On a GPU with full-rate float64 (H100, H200) this costs little; the
  bank is held on the device in float32 and each block is widened to float64 there;
- ranking uses one int64 key per (cosine, bank row): the cosine's float32 bits mapped to an
  order-preserving integer in the high 32 bits and ``2**32 - 1 - row`` in the low ones, so the
  k largest keys are the k largest cosines with equal cosines ranked by bank row, the lower
  first (``analyses/knn.py``'s keys, mirrored); keys are unique, so ``torch.topk`` has no tie to
  break and its answer does not depend on the device or the block.

Pure: arrays in, arrays out. The bank is moved to the device once per process and bank
(``cached``: keyed by the caller's digest of it), not once per block of queries.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .knn import check_search

LOW = 2**32  # rows per key: the bank index lives in the low 32 bits

_device_banks: dict[tuple[str, str], object] = {}  # (bank digest, device) → the bank on the device (this run's)


def device_of(name: str):
    """``cpu`` or ``cuda`` (``cuda:N``) as a torch device."""
    import torch

    return torch.device(name)


def _keys(similarity, offset: int):
    """int64 keys of float32 cosines (rows, width) at bank rows ``offset + column``."""
    import torch

    bits = (similarity + 0.0).contiguous().view(torch.int32)  # + 0: -0.0 ranks as 0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # larger cosine, larger integer
    rows = torch.arange(offset, offset + similarity.shape[1], device=similarity.device, dtype=torch.int64)
    return ordered * LOW + (LOW - 1 - rows)


def _unkey(keys) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, bank rows int64) of keys."""
    import torch

    ordered = torch.div(keys, LOW, rounding_mode="floor")
    rows = LOW - 1 - (keys - ordered * LOW)
    bits = torch.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(torch.int32)
    return bits.view(torch.float32).cpu().numpy(), rows.cpu().numpy()


def on_device(bank: Callable[[], np.ndarray] | np.ndarray, device: str, digest: str | None = None):
    """The (rows, D) normalised bank (an array, or a function that returns it: called only when
    the device lacks it) as a float32 tensor on ``device``; kept for the next block of the same
    run when ``digest`` names it (one bank per process at a time: a new digest lets the last go)."""
    import torch

    def moved():
        return torch.as_tensor(np.ascontiguousarray(bank() if callable(bank) else bank, np.float32)).to(device_of(device))

    if digest is None:
        return moved()
    key = (digest, str(device))
    if key not in _device_banks:
        _device_banks.clear()
        _device_banks[key] = moved()
    return _device_banks[key]


def forget() -> None:
    """Let the device's copy of the bank go (the end of a run)."""
    _device_banks.clear()


def nearest(queries: np.ndarray, bank, k: int, block: int, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, bank rows int64), each (queries, k), best first: as
    ``analyses.hummingbird.nearest`` with normalised ``queries`` and a bank from ``on_device``
    (or an array), computed on ``device``."""
    import torch

    where = device_of(device)
    rows = bank if isinstance(bank, torch.Tensor) else on_device(bank, device)
    check_search(rows.shape[0], k, block)
    with torch.no_grad():
        q = torch.as_tensor(np.asarray(queries, np.float32)).to(where).to(torch.float64)
        best = None
        for offset in range(0, rows.shape[0], block):
            part = rows[offset:offset + block].to(torch.float64)
            similarity = (q @ part.T).to(torch.float32)
            keys = _keys(similarity, offset)
            keys = keys.topk(min(k, keys.shape[1]), dim=1).values
            best = keys if best is None else torch.cat([best, keys], dim=1).topk(min(k, best.shape[1] + keys.shape[1]), dim=1).values
        return _unkey(best)
