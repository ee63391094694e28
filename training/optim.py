"""AdamW groups, DINO's per-tensor clipping, the frozen prototype layer, and the teacher's EMA."""

from __future__ import annotations

import torch
from torch import nn

from .config import OptimCfg
from .model import last_layer_parameters


def param_groups(network: nn.Module, optim: OptimCfg) -> list[dict]:
    """Backbone and heads, each split into weights (decayed) and biases / 1-D tensors (no decay), DINO's rule.

    Each group carries its ``name``, its peak lr ``peak`` and ``decay``; the schedules set ``lr``
    and ``weight_decay`` at every step. Frozen tensors (prototype lengths g) are left out.
    """
    groups = {f"{part}/{kind}": [] for part in ("backbone", "heads") for kind in ("decay", "no_decay")}
    for name, param in network.named_parameters():
        if not param.requires_grad:
            continue
        part = "backbone" if name.startswith("backbone.") else "heads"
        kind = "no_decay" if name.endswith(".bias") or param.ndim == 1 else "decay"
        groups[f"{part}/{kind}"].append(param)
    peaks = {"backbone": optim.lr_backbone, "heads": optim.lr_heads}
    return [
        {"params": params, "name": name, "peak": peaks[name.split("/")[0]], "decay": name.endswith("/decay"), "lr": 0.0, "weight_decay": 0.0}
        for name, params in groups.items()
        if params
    ]


def clip_per_tensor(parameters, limit: float) -> float:
    """DINO's ``clip_gradients``: each tensor's gradient scaled to norm ≤ ``limit``; returns the total norm before."""
    squares = 0.0
    for param in parameters:
        if param.grad is not None:
            squares += float(torch.nn.utils.clip_grad_norm_([param], limit)) ** 2 if limit > 0 else float(param.grad.norm()) ** 2
    return squares**0.5


def cancel_last_layer(network: nn.Module) -> None:
    """DINO's ``cancel_gradients_last_layer``: no gradient, so AdamW leaves the prototypes (and their decay) alone."""
    for param in last_layer_parameters(network):
        param.grad = None


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """teacher ← m · teacher + (1 − m) · student, tensor by tensor, as DINO's loop."""
    for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
        t.mul_(momentum).add_(s.detach(), alpha=1 - momentum)
