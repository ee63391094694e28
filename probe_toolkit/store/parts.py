"""A store's checkpoint, reopened for the small parts a store does not hold.

Stores keep the last block's tokens before any final norm. Two protocols need one more piece of
the network: DINO's k-NN reads the class token *after* the final LayerNorm (``eval_knn.py``),
and SelfPatch's image summary is its aggregation head ``ca_head``. Both are read here from the
file the manifest names, after checking its sha256, so a number is never computed with the
weights of another file.

The final LayerNorm is small (two vectors), so extraction records it in the store's manifest
(``final_norm``, ``record_final_norm``) and ``probe knn`` applies it with numpy, reading no
checkpoint and importing no torch; stores extracted before that reread it from the checkpoint.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..infra.errors import ProbeError

if TYPE_CHECKING:
    import torch

EPS = 1e-6  # DINO's vision_transformer.py: partial(nn.LayerNorm, eps=1e-6)


def store_checkpoint(manifest: dict[str, Any], where: str | Path, why: str):
    """The manifest's checkpoint (same network, same conversion), its sha256 checked (its keys were
    checked when the store was extracted from it)."""
    from .checkpoints import load_checkpoint

    info = manifest.get("checkpoint") or {}
    path = Path(str(info.get("path", "")))
    if not path.is_file():
        raise ProbeError(where, f"names checkpoint {path}, which is gone; {why} needs it", "restore the file at that path")
    heads = (manifest.get("arch") or {}).get("heads")
    checkpoint = load_checkpoint(
        path, network=str(manifest.get("network", "teacher")), heads=heads, convert=bool(info.get("converted")), checked_sha256=info.get("sha256")
    )
    if checkpoint.sha256 != info.get("sha256"):
        raise ProbeError(path, "is not the file this store was extracted from (sha256 differs)", "restore the original checkpoint")
    return checkpoint


@dataclass(frozen=True)
class FinalNorm:
    """The network's final LayerNorm as two float32 vectors; applied in float64 and rounded to
    float32 (torch's float32 kernel differs from that by at most an ulp or so)."""

    weight: np.ndarray
    bias: np.ndarray
    eps: float = EPS

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        centred = x - x.mean(-1, keepdims=True)
        scaled = centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + self.eps)
        return (scaled * self.weight + self.bias).astype(np.float32)


def _encode(vector: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vector, "<f4").tobytes()).decode("ascii")


def _decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), "<f4").copy()


def record_final_norm(backbone: dict[str, torch.Tensor], eps: float = EPS) -> dict[str, Any] | None:
    """The manifest's ``final_norm`` entry for a backbone state dict (None without a final norm);
    ``eps`` is the network's (1e-5 for DINOv3's ``layernormbf16``)."""
    if "norm.weight" not in backbone:
        return None
    weight, bias = (backbone[f"norm.{k}"].detach().float().cpu().numpy() for k in ("weight", "bias"))
    return {"weight": _encode(weight), "bias": _encode(bias), "eps": eps, "encoding": "float32 little-endian, base64"}


def final_norm(manifest: dict[str, Any], where: str | Path) -> FinalNorm | None:
    """The network's final LayerNorm (eps 1e-6; DINOv3's 1e-5), or None when it has none: from the manifest, else
    (a store extracted before extraction recorded it) from the checkpoint, sha256 checked."""
    if not manifest.get("arch", {}).get("final_norm"):
        return None
    recorded = manifest.get("final_norm")
    if isinstance(recorded, dict):
        try:
            weight, bias = _decode(recorded["weight"]), _decode(recorded["bias"])
        except (KeyError, TypeError, ValueError) as error:  # binascii.Error is a ValueError
            raise ProbeError(where, f"records an unreadable final norm ({type(error).__name__})", "extract the store again") from None
        if weight.shape != bias.shape or weight.shape[0] != int(manifest["arch"]["width"]):
            raise ProbeError(where, f"records a final norm of {weight.shape[0]} channels for a network of width {manifest['arch']['width']}", "extract the store again")
        return FinalNorm(weight, bias, float(recorded.get("eps", EPS)))
    checkpoint = store_checkpoint(manifest, where, "the final norm (DINO's k-NN feature)")
    weight, bias = (checkpoint.backbone[f"norm.{k}"].float().numpy() for k in ("weight", "bias"))
    return FinalNorm(weight, bias, 1e-5 if manifest["arch"].get("family") == "dinov3" else EPS)  # DINOv3's layernormbf16: eps 1e-5


def aggregation_head(manifest: dict[str, Any], where: str | Path) -> dict[str, torch.Tensor] | None:
    """SelfPatch's ``ca_head`` weights when the checkpoint holds them, else None."""
    info = manifest.get("checkpoint") or {}
    if "selfpatch" not in str(info.get("format", "")) and "probe-training" not in str(info.get("format", "")):
        return None
    checkpoint = store_checkpoint(manifest, where, "SelfPatch's aggregation head")
    head = checkpoint.heads.get("ca_head")
    return {k: v.float() for k, v in head.items()} if head else None
