"""Read a checkpoint file safely, recognise its layout, and hand over a clean backbone state dict.

Layouts recognised without being told (as facebookresearch/dino and alinlab/SelfPatch
save them):

- ``dino-backbone``: DINO's released backbone file, flat, 150 keys, ``cls_token``, 197-row
  ``pos_embed`` and a final ``norm``.
- ``selfpatch-backbone``: 147 keys, 196-row ``pos_embed``, no class token, no final norm (also
  what ``probe convert`` writes).
- ``dino-full`` / ``selfpatch-full``: training checkpoints with ``teacher`` and ``student`` entries;
  student keys carry ``module.``; submodules ``backbone.``, ``head.`` (DINO) or ``ca_head.``,
  ``c_head.``, ``p_head.`` (SelfPatch); ``args`` is an ``argparse.Namespace``.
- ``probe-training``: what this project's ``training/`` writes (the full layout, ``args`` as plain
  data with ``"trainer": "probe-training"``).
- ``dinov2-backbone`` / ``dinov2-reg-backbone``: DINOv2's released ``*_pretrain.pth`` files
  (facebookresearch/dinov2 ``hub/backbones.py`` loads them strictly): LayerScale
  ``blocks.i.ls1.gamma`` / ``ls2.gamma``, an unused ``mask_token`` (iBOT's masked-patch
  embedding, kept as the head ``mask_token``), a 37 × 37 table trained at 518 px, and in the
  register models ``register_tokens`` (1, 4, D) that take no row of the position table. These
  are read into timm's names as timm's own DINOv2 loader does: ``register_tokens`` becomes
  ``reg_token`` and the table's class row is added to ``cls_token`` (DINOv2 adds it to the class
  token in every forward, so the sum is the same float32 operation).
- ``dinov3-official`` / ``dinov3-timm`` / ``dinov3-hf``: a DINOv3 ViT as facebookresearch/dinov3
  saves it, as timm's ``Eva`` names it, or as transformers' ``DINOv3ViTModel`` safetensors file
  (``store.dinov3_layouts`` names every key and reads the three into timm's names; the official
  key bias is masked to zero by its ``bias_mask``). A ``.safetensors`` file is read with the
  ``safetensors`` package (no pickle at all).
- Any of these wrapped in a ``state_dict`` or ``model`` entry.

Prefixes are stripped only as prefixes, and the backbone must match the architecture inferred
from its own tensors key for key: a missing or unexpected key is an error that lists them.
Reading and writing files is ``checkpoint_files``; the layouts, ``checkpoint_layouts``; the
architecture and the key check, ``checkpoint_arch``.
"""

from __future__ import annotations

import argparse
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..infra.errors import ProbeError
from . import dinov3_layouts, hints
from .architectures import VIT_S16, Arch  # noqa: F401  (Arch and VIT_S16 are part of this module's face)
from .checkpoint_arch import check_backbone, infer_arch
from .checkpoint_files import read_file, save_state, sha256_file
from .checkpoint_layouts import NETWORKS, file_format, from_dinov2, read_dinov3, split_heads, unwrap
from .hub import locate


@dataclass
class Checkpoint:
    """One network of one file: its backbone weights under timm's names, and what came with it."""

    path: Path
    sha256: str
    format: str
    network: str
    arch: Arch
    backbone: dict[str, torch.Tensor]
    heads: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    converted: bool = False
    stem: str = ""  # the name a store folder takes (the file's stem, or a Hub repository's name)
    source: dict[str, Any] = field(default_factory=dict)  # a Hub name or a folder: repository, revision, file, licence (store.hub)

    def describe(self) -> dict[str, Any]:
        """The manifest's view of this checkpoint."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "format": self.format,
            "network": self.network,
            "converted": self.converted,
            **({"source": self.source} if self.source else {}),
        }


def load_checkpoint(
    path: str | Path, network: str = "teacher", heads: int | None = None, convert: bool = False, checked_sha256: str | None = None, revision: str | None = None
) -> Checkpoint:
    """Read ``path`` safely and return the chosen network's backbone, checked key for key.

    ``path``: a file, a transformers / timm folder, or a Hugging Face Hub name (``hf-hub:org/name``
    or ``org/name``; ``revision`` a branch, tag or commit), resolved by ``store.hub.locate``.

    ``checked_sha256``: the digest of a file read and checked before (a store's manifest keeps
    the one it was extracted from). A file with that digest is those very bytes, so the key check
    (which builds timm's network: timm and torchvision, over a second of imports) is not
    repeated; a file with any other digest is checked in full."""
    if network not in NETWORKS:
        raise ProbeError(None, f"--network {network!r} is not one of {NETWORKS}", "use teacher or student")
    located = locate(path, revision)
    path = located.path
    with ThreadPoolExecutor(1) as hasher:  # hashing (GIL released) beside the read (read_file, weights only): the file is read once, not twice
        digest = hasher.submit(sha256_file, path)
        checkpoint = replace(_read_network(path, network, heads, digest, checked_sha256), stem=located.stem, source=located.source)
    return to_selfpatch(checkpoint) if convert else checkpoint


def _read_network(path: Path, network: str, heads: int | None, digest: Future, checked_sha256: str | None) -> Checkpoint:
    """One network of the file; ``digest`` is the file's sha256, computed meanwhile."""
    obj = unwrap(read_file(path), path)
    if not isinstance(obj, dict) or not obj:
        raise ProbeError(path, "holds no state dict (empty or not a dict)", "pass a checkpoint that holds network weights")
    full = bool(set(obj) & set(NETWORKS))
    extra: dict[str, Any] = {}
    if full:
        if not isinstance(obj.get(network), dict):
            present = [k for k in NETWORKS if k in obj]
            raise ProbeError(
                path, f"is a training checkpoint without a {network!r} entry (it has {present})", f"pass --network {present[0]}" if present else "pass another file"
            )
        state = obj[network]
        extra = {k: v for k, v in obj.items() if k not in NETWORKS}
        if isinstance(extra.get("args"), argparse.Namespace):
            extra["args"] = vars(extra["args"])
    else:
        state = obj
    not_tensors = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise ProbeError(path, f"entries {not_tensors[:5]} are not tensors", "pass a state dict or a DINO/SelfPatch checkpoint")
    dinov3 = None if full else dinov3_layouts.detect(state)
    if dinov3:
        backbone, head_states, arch = read_dinov3(state, dinov3, path, heads)
    else:
        backbone, head_states = from_dinov2(*split_heads(state, path))
        arch = infer_arch(backbone, path, heads)
        hints.heads_agree(arch, extra, heads, path)
    if checked_sha256 is None or digest.result() != checked_sha256:
        check_backbone(backbone, arch, path)
    return Checkpoint(
        path=path,
        sha256=digest.result(),
        format=dinov3 or file_format(full, head_states, extra, backbone),
        network=network,
        arch=arch,
        backbone=backbone,
        heads=head_states,
        extra=extra,
    )


def convert_backbone(backbone: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DINO → SelfPatch-style backbone: drop ``cls_token``, ``pos_embed`` row 0 and ``norm.*``."""
    out = {k: v for k, v in backbone.items() if k != "cls_token" and not k.startswith("norm.")}
    out["pos_embed"] = backbone["pos_embed"][:, 1:, :].clone()
    return out


def to_selfpatch(checkpoint: Checkpoint) -> Checkpoint:
    """The same network without class token and final norm (1,536 parameters fewer at ViT-S)."""
    if not checkpoint.arch.class_token:
        raise ProbeError(checkpoint.path, "has no class token to drop (already SelfPatch-style)", "omit --convert")
    if checkpoint.arch.family == "dinov3":
        raise ProbeError(checkpoint.path, "is a DINOv3 network (RoPE, storage tokens), which a SelfPatch-style backbone has no place for", "omit --convert")
    if checkpoint.arch.registers:
        raise ProbeError(checkpoint.path, f"has {checkpoint.arch.registers} register tokens, which a SelfPatch-style backbone has no place for", "omit --convert")
    backbone = convert_backbone(checkpoint.backbone)
    arch = replace(checkpoint.arch, class_token=False, final_norm=False)
    check_backbone(backbone, arch, checkpoint.path)
    return replace(checkpoint, backbone=backbone, arch=arch, converted=True, heads={})


def parameter_count(state: dict[str, torch.Tensor]) -> int:
    return sum(int(v.numel()) for v in state.values())


def convert_file(source: str | Path, out: str | Path, network: str = "teacher", *, force: bool = False) -> tuple[int, int]:
    """``probe convert``: write the SelfPatch-style backbone of a DINO file; returns (before, after) counts.

    ``out`` is never ``source`` (under any spelling or link: the DINO file would be lost), and an
    existing ``out`` is replaced only with ``force``; both are refused before the source is read."""
    from ..infra.owned import refuse_existing, same_file

    if Path(source).exists() and same_file(source, out):
        raise ProbeError(out, f"is the source file {source} itself; converting in place would lose the DINO checkpoint", "write the converted backbone to another path")
    refuse_existing(out, force, "checkpoint file")
    checkpoint = load_checkpoint(source, network=network)
    converted = to_selfpatch(checkpoint)
    save_state(converted.backbone, out)
    return parameter_count(checkpoint.backbone), parameter_count(converted.backbone)
