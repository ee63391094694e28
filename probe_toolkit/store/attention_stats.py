"""What ``probe entropy`` and the class-token maps read of one block's attention, without its T × T
matrix: computed from the block's queries and keys in tiles of queries (``probe extract
--attention stats``), so memory grows with the tokens, not with their square.

For query i and key j, a_ij = softmax_j(q_i · k_j / √d) over every token (class, registers or
storage tokens, patches), as the network attends (DINOv3: q and k after RoPE). Per block, head
and query:

- ``entropy``: H_i = −Σ_j a_ij ln a_ij in nats, computed as −Σ_j a_ij (s_ij − logsumexp(s_i)) (the
  same quantity; e^H is its exponent, taken by the reader);
- ``distance``: for a patch query, Σ_j a_ij ‖u_i − u_j‖ / Σ_j a_ij over patch keys j only, u the
  patch centres on the view's grid, in patch units (``analyses.entropy.attention_distance``);
  NaN for the class and register queries;
- ``topk``: the mass of its k largest weights, for each k of ``TOPK``;

and per block and head the class token's row (``cls``, every key) and each register's or
storage token's row (``storage``). Scores are formed in the network's float32, the softmax and
its sums in float64; the results are stored in float32.
"""

from __future__ import annotations

import math

import torch

TOPK = (1, 5, 10)  # the masses of a row's largest weights kept per query
TILE_BYTES = 32 * 2**20  # float64 scores of one tile of queries (all heads, every key): with their exponentials, the memory the statistics add


def patch_coordinates(rows: int, cols: int, device: torch.device | None = None) -> torch.Tensor:
    """(N, 2) float64 (row, column) of every patch, row-major (``analyses.grid.positions``)."""
    flat = torch.arange(rows * cols, device=device)
    return torch.stack([flat // cols, flat % cols], dim=1).to(torch.float64)


def query_tile(batch: int, heads: int, tokens: int, budget: int = TILE_BYTES) -> int:
    """Queries per tile: the float64 scores of a tile, (batch, heads, tile, tokens), within ``budget`` bytes."""
    return max(1, min(tokens, budget // max(1, 8 * batch * heads * tokens)))


@torch.inference_mode()
def statistics(q: torch.Tensor, k: torch.Tensor, *, class_token: bool, registers: int, grid: tuple[int, int], budget: int = TILE_BYTES) -> dict[str, torch.Tensor]:
    """One block's statistics from its queries and keys, (B, heads, T, d) each, tokens ordered
    class, registers, patches on a ``grid`` of (rows, cols); see the module docstring. Returns
    float32 tensors: entropy, distance, topk (B, heads, T[, len(TOPK)]), cls (B, heads, T) with a
    class token, storage (B, heads, registers, T) with registers."""
    b, h, t, d = q.shape
    prefix = int(class_token) + registers
    rows, cols = grid
    if rows * cols != t - prefix:
        raise ValueError(f"{t - prefix} patch tokens do not fill a {rows} x {cols} grid")
    scale = 1.0 / math.sqrt(d)
    coords = patch_coordinates(rows, cols, q.device)
    keys = k.transpose(-2, -1)
    entropy = torch.empty(b, h, t, dtype=torch.float32, device=q.device)
    distance = torch.full((b, h, t), float("nan"), dtype=torch.float32, device=q.device)
    mass = torch.empty(b, h, t, len(TOPK), dtype=torch.float32, device=q.device)
    rows_kept = torch.empty(b, h, prefix, t, dtype=torch.float32, device=q.device)
    top = min(max(TOPK), t)
    picks = torch.tensor([min(kk, t) - 1 for kk in TOPK], device=q.device)
    step = query_tile(b, h, t, budget)
    for start in range(0, t, step):
        stop = min(t, start + step)
        logits = (q[:, :, start:stop] @ keys).to(torch.float64).mul_(scale)  # (B, heads, tile, T): the scores, then in place s - logsumexp(s)
        logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))
        weights = logits.exp()
        # H = -Σ a (s - lse): row by row as a product of vectors (no third tile-sized tensor)
        entropy[:, :, start:stop] = -(weights.unsqueeze(-2) @ logits.unsqueeze(-1))[..., 0, 0].float()
        del logits
        mass[:, :, start:stop] = weights.topk(top, dim=-1).values.cumsum(-1).index_select(-1, picks).float()
        if start < prefix:
            rows_kept[:, :, start : min(stop, prefix)] = weights[:, :, : min(stop, prefix) - start].float()
        first = max(start, prefix)
        if first < stop:  # patch queries of the tile: their rows over patch keys, renormalised
            on_patches = weights[:, :, first - start :, prefix:]
            where = coords[first - prefix : stop - prefix]
            apart = torch.cdist(where, coords, compute_mode="donot_use_mm_for_euclid_dist")  # (tile patches, N) Euclidean, patch units
            weighted = (on_patches.unsqueeze(-2) @ apart.unsqueeze(-1))[..., 0, 0]  # Σ_j a_ij ‖u_i − u_j‖, row by row
            distance[:, :, first:stop] = (weighted / on_patches.sum(-1)).float()
        del weights
    out = {"entropy": entropy, "distance": distance, "topk": mass}
    if class_token:
        out["cls"] = rows_kept[:, :, 0]
    if registers:
        out["storage"] = rows_kept[:, :, int(class_token) :]
    return out
