"""The exact search of ``analyses.search`` in torch, on the CPU or a GPU, with the same answer.

Same arithmetic and the same tie rule as the numpy search:

- each block of bank rows is multiplied with the queries in **float64** and the products are
  rounded to float32: the cosine is the float32 rounding of the float64 product, whatever kernel
  or block shape computed it (``analyses.search``). Float64 is what makes the search exact on a
  GPU: a float32 (or TF32) product would round in the kernel's order and could swap two
  neighbours whose cosines differ in the last bit. On a GPU with full-rate float64 (H100, H200)
  this costs little; the bank is held on the device in float32 and each block is widened to
  float64 there;
- ranking uses one int64 key per (cosine, bank row): the cosine's float32 bits mapped to an
  order-preserving integer in the high 32 bits and ``2**32 - 1 - row`` in the low ones, so the
  k largest keys are the k largest cosines with equal cosines ranked by bank row, the lower
  first (``search.keys``, mirrored); keys are unique, so ``torch.topk`` has no tie to break and
  its answer does not depend on the device or the block. Once a row's running list is full, only
  the cosines above its k-th can enter (an equal one has a higher row), so a block's keys are
  made for those alone (``_entering``): the selection then costs a comparison per product, not
  a key and a sort.

Pure: arrays in, arrays out. The bank is moved to the device once per process and bank
(``on_device``: keyed by the caller's digest of it), in blocks, so the host never holds a
second whole copy, not once per block of queries.
"""

from __future__ import annotations

import numpy as np

from .search import bank_blocks, check_search

LOW = 2**32  # rows per key: the bank index lives in the low 32 bits
MOVE_BLOCK = 65536  # bank rows moved to the device at a time

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


def _values(keys):
    """float32 cosines of keys (a tensor on the keys' device)."""
    import torch

    ordered = torch.div(keys, LOW, rounding_mode="floor")
    return torch.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(torch.int32).view(torch.float32)


def _entering(similarity, offset: int, floor):
    """(rows, most per row) keys of the cosines above each row's ``floor`` (its running k-th),
    padded with the least int64 (worse than every key); None when no cosine enters."""
    import torch

    r, c = torch.nonzero(similarity > floor[:, None], as_tuple=True)
    if r.numel() == 0:
        return None
    rows = similarity.shape[0]
    counts = torch.bincount(r, minlength=rows)
    starts = torch.cumsum(counts, 0) - counts
    out = torch.full((rows, int(counts.max())), torch.iinfo(torch.int64).min, dtype=torch.int64, device=similarity.device)
    bits = (similarity[r, c] + 0.0).view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    out[r, torch.arange(r.numel(), device=r.device) - starts[r]] = ordered * LOW + (LOW - 1 - (offset + c))
    return out


def _unkey(keys) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float32, bank rows int64) of keys."""
    import torch

    ordered = torch.div(keys, LOW, rounding_mode="floor")
    rows = LOW - 1 - (keys - ordered * LOW)
    bits = torch.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(torch.int32)
    return bits.view(torch.float32).cpu().numpy(), rows.cpu().numpy()


def _moved(bank, device: str):
    """The bank as one float32 tensor on ``device``, filled ``MOVE_BLOCK`` rows at a time from an
    array or a ``Shared`` handle (``search.bank_blocks``)."""
    import torch

    where = device_of(device)
    out = torch.empty(tuple(int(n) for n in bank.shape), dtype=torch.float32, device=where)
    for a, rows in bank_blocks(bank, MOVE_BLOCK):
        out[a : a + rows.shape[0]] = torch.as_tensor(np.ascontiguousarray(rows, np.float32)).to(where, non_blocking=False)
    return out


def on_device(bank, device: str, digest: str | None = None):
    """The (rows, D) normalised bank (an array, a ``Shared`` handle, or a function returning
    either: called only when the device lacks it) as a float32 tensor on ``device``; kept for the
    next block of the same run when ``digest`` names it (one bank per process at a time: a new
    digest lets the last go)."""

    def moved():
        return _moved(bank() if callable(bank) else bank, device)

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
    """(cosines float32, bank rows int64), each (queries, k), best first: as ``search.nearest``
    with normalised ``queries`` and a bank from ``on_device`` (or an array), computed on ``device``."""
    import torch

    where = device_of(device)
    rows = bank if isinstance(bank, torch.Tensor) else on_device(bank, device)
    check_search(rows.shape[0], k, block)
    with torch.no_grad():
        q = torch.as_tensor(np.asarray(queries, np.float32)).to(where).to(torch.float64)
        best = None
        for offset in range(0, rows.shape[0], block):
            part = rows[offset : offset + block].to(torch.float64)
            similarity = (q @ part.T).to(torch.float32)
            if best is None or best.shape[1] < k:  # the running list is not full: every key of the block
                keys = _keys(similarity, offset)
                keys = keys.topk(min(k, keys.shape[1]), dim=1).values
                best = keys if best is None else torch.cat([best, keys], dim=1).topk(min(k, best.shape[1] + keys.shape[1]), dim=1).values
                continue
            fresh = _entering(similarity, offset, _values(best.min(1).values))
            if fresh is not None:
                best = torch.cat([best, fresh], dim=1).topk(k, dim=1).values
        return _unkey(best)
