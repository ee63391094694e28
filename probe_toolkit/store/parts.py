"""A store's checkpoint, reopened for the small parts a store does not hold.

Stores keep the last block's tokens before any final norm. Two protocols need one more piece of
the network: DINO's k-NN reads the class token *after* the final LayerNorm (``eval_knn.py``),
and SelfPatch's image summary is its aggregation head ``ca_head``. Both are read here from the
file the manifest names, after checking its sha256, so a number is never computed with the
weights of another file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..infra.errors import ProbeError
from .checkpoints import load_checkpoint


def store_checkpoint(manifest: dict[str, Any], where: str | Path, why: str):
    """The manifest's checkpoint (same network, same conversion), its sha256 checked (its keys were
    checked when the store was extracted from it)."""
    info = manifest.get("checkpoint") or {}
    path = Path(str(info.get("path", "")))
    if not path.is_file():
        raise ProbeError(where, f"names checkpoint {path}, which is gone; {why} needs it", "restore the file at that path")
    heads = (manifest.get("arch") or {}).get("heads")
    checkpoint = load_checkpoint(path, network=str(manifest.get("network", "teacher")), heads=heads, convert=bool(info.get("converted")),
                                 checked_sha256=info.get("sha256"))
    if checkpoint.sha256 != info.get("sha256"):
        raise ProbeError(path, "is not the file this store was extracted from (sha256 differs)", "restore the original checkpoint")
    return checkpoint


def final_norm(manifest: dict[str, Any], where: str | Path) -> torch.nn.LayerNorm | None:
    """The network's final LayerNorm (eps 1e-6), or None when it has none."""
    if not manifest.get("arch", {}).get("final_norm"):
        return None
    checkpoint = store_checkpoint(manifest, where, "the final norm (DINO's k-NN feature)")
    weight, bias = checkpoint.backbone["norm.weight"], checkpoint.backbone["norm.bias"]
    norm = torch.nn.LayerNorm(weight.shape[0], eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(weight.float())
        norm.bias.copy_(bias.float())
    return norm.eval()


def aggregation_head(manifest: dict[str, Any], where: str | Path) -> dict[str, torch.Tensor] | None:
    """SelfPatch's ``ca_head`` weights when the checkpoint holds them, else None."""
    info = manifest.get("checkpoint") or {}
    if "selfpatch" not in str(info.get("format", "")) and "probe-training" not in str(info.get("format", "")):
        return None
    checkpoint = store_checkpoint(manifest, where, "SelfPatch's aggregation head")
    head = checkpoint.heads.get("ca_head")
    return {k: v.float() for k, v in head.items()} if head else None
