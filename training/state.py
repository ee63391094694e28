"""The checkpoint file: DINO's and SelfPatch's full layout, readable with ``torch.load(weights_only=True)``.

Top level (as facebookresearch/dino ``main_dino.py`` and alinlab/SelfPatch ``main_selfpatch.py`` save it):

- ``student``: ``module.backbone.*`` (147 SelfPatch-style keys), ``module.ca_head.*``,
  ``module.c_head.*``, ``module.p_head.*``; ``last_layer.weight_g`` / ``last_layer.weight_v``.
- ``teacher``: the same keys without ``module.``.
- ``optimizer``: AdamW's state dict (4 named groups: backbone/heads × decay/no_decay).
- ``epoch``: the next epoch to run (as DINO); ``step``: the next global step.
- ``args``: the resolved config as plain data, with ``"trainer": "probe-training"`` and ``arch``.
- ``dino_loss``: ``center`` (1, 1, P) and ``patch_center`` (1, Q).
- ``rng``: ``{"torch": [ByteTensor per process], "cuda": [[ByteTensor per device] per process]}``.

This module is the one place where names are mapped: the network's own names (``backbone.vit.*``,
``last_layer.parametrizations.weight.original0/1``) ↔ the released names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.checkpoint_files import read_file, save_state
from probe_toolkit.store.checkpoint_layouts import TRAINER_MARK
from probe_toolkit.store.checkpoints import Checkpoint

from .model import Network

WEIGHT_NORM = {"last_layer.parametrizations.weight.original0": "last_layer.weight_g", "last_layer.parametrizations.weight.original1": "last_layer.weight_v"}
RELEASED_WEIGHT_NORM = {new: old for old, new in WEIGHT_NORM.items()}
LATEST = "checkpoint.pth"


def _rename(key: str, pairs: dict[str, str]) -> str:
    for old, new in pairs.items():
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


def _moved(state: dict[str, torch.Tensor], old: str, new: str, pairs: dict[str, str]) -> dict[str, torch.Tensor]:
    """Keys under the prefix ``old`` moved under ``new``, and every key's tail renamed by ``pairs``."""
    return {_rename(new + key[len(old) :] if key.startswith(old) else key, pairs): value for key, value in state.items()}


def released_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Network state dict → SelfPatch's names (``backbone.*``, ``*.last_layer.weight_g/_v``)."""
    return _moved(state, "backbone.vit.", "backbone.", WEIGHT_NORM)


def network_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SelfPatch's names → the network's own (the inverse of ``released_names``)."""
    return _moved(state, "backbone.", "backbone.vit.", RELEASED_WEIGHT_NORM)


def head_names(head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One head's released keys (``last_layer.weight_g``) → module keys."""
    return {_rename(k, RELEASED_WEIGHT_NORM): v for k, v in head.items()}


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], where: str | Path) -> None:
    """``load_state_dict(strict=True)`` with shapes checked first; a mismatch is a ProbeError that lists keys."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or misshapen:
        detail = "; ".join(
            part
            for part in (
                f"missing {missing[:6]}" if missing else "",
                f"unexpected {unexpected[:6]}" if unexpected else "",
                f"wrong shape {[(k, tuple(state[k].shape), tuple(own[k].shape)) for k in misshapen[:4]]}" if misshapen else "",
            )
            if part
        )
        raise ProbeError(where, f"weights do not fit the network ({detail})", "check the model settings against the checkpoint (prototypes, head sizes)")
    module.load_state_dict(state, strict=True)


def load_init(network: Network, checkpoint: Checkpoint, heads: bool) -> list[str]:
    """Start ``network`` from a loaded checkpoint: its backbone, and its heads when present and asked for."""
    load_strict(network.backbone.vit, checkpoint.backbone, checkpoint.path)
    loaded = ["backbone"]
    if heads:
        for name in ("ca_head", "c_head", "p_head"):
            if name in checkpoint.heads:
                load_strict(getattr(network, name), head_names(checkpoint.heads[name]), checkpoint.path)
                loaded.append(name)
    return loaded


# which loaded head each of the loss's centres belongs to
CENTRE_OF = {"center": "c_head", "patch_center": "p_head"}


@torch.no_grad()
def load_centres(loss: nn.Module, checkpoint: Checkpoint, loaded: list[str]) -> list[str]:
    """The file's teacher centres (its ``dino_loss`` entry) for the heads taken from it, as
    SelfPatch and DINO resume them; a head started afresh keeps a zero centre. Returns the names."""
    saved = checkpoint.extra.get("dino_loss")
    taken = []
    for name, head in CENTRE_OF.items():
        value = saved.get(name) if isinstance(saved, dict) else None
        own = getattr(loss, name)
        if head in loaded and isinstance(value, torch.Tensor) and value.numel() == own.numel():
            own.copy_(value.reshape(own.shape).to(own))  # DINO keeps (1, P), SelfPatch (1, 1, P)
            taken.append(name)
    return taken


def checkpoint_state(student: nn.Module, teacher: nn.Module, optimizer, loss: nn.Module, epoch: int, step: int, args: dict[str, Any], rng: dict) -> dict[str, Any]:
    student_state = released_names(student.state_dict())
    return {
        "student": {f"module.{k}": v for k, v in student_state.items()},
        "teacher": released_names(teacher.state_dict()),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": step,
        "args": {**args, "trainer": TRAINER_MARK},
        "dino_loss": {k: v for k, v in loss.state_dict().items()},
        "rng": rng,
    }


def save(state: dict[str, Any], run_dir: Path, epoch: int, keep: bool) -> Path:
    """Write ``checkpoint.pth`` (atomically); with ``keep`` also ``checkpoint{epoch:04}.pth``."""
    latest = save_state(state, run_dir / LATEST)
    if keep:
        save_state(state, run_dir / f"checkpoint{epoch:04d}.pth")
    return latest


def read(path: Path) -> dict[str, Any]:
    """A checkpoint this trainer wrote, read safely; refuse anything else as a resume point."""
    state = read_file(path)
    args = state.get("args") if isinstance(state, dict) else None
    if not isinstance(args, dict) or args.get("trainer") != TRAINER_MARK:
        raise ProbeError(
            path, "is not a checkpoint written by probe's trainer", "resume only from a run folder of `probe train`; start other files through init.checkpoint"
        )
    return state


def restore(state: dict[str, Any], student: nn.Module, teacher: nn.Module, optimizer, loss: nn.Module, path: Path) -> None:
    """Put a checkpoint's weights, optimiser and centres back (the caller restores RNG, epoch and step)."""
    student_state = {k[len("module.") :]: v for k, v in state["student"].items()}
    load_strict(student, network_names(student_state), path)
    load_strict(teacher, network_names(state["teacher"]), path)
    optimizer.load_state_dict(state["optimizer"])
    loss.load_state_dict(state["dino_loss"])
