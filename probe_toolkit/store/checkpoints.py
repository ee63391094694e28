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
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import pickle
import re
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..infra.errors import ProbeError
from . import dinov3_layouts, hints
from .architectures import VIT_S16, Arch  # noqa: F401  (Arch and VIT_S16 are part of this module's face)

HEAD_PREFIXES = ("head.", "ca_head.", "c_head.", "p_head.")
# tensors of a backbone file that the readout never uses, kept as named heads (strict loading)
UNUSED_BACKBONE_KEYS = {"mask_token": "mask_token"}
NETWORKS = ("teacher", "student")
TRAINER_MARK = "probe-training"
# DINO's first published full checkpoints used older names inside the heads (dino #30, #65)
OLD_HEAD_NAMES = {"projection_head.": "mlp.", "prototypes.": "last_layer."}




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

    def describe(self) -> dict[str, Any]:
        """The manifest's view of this checkpoint."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "format": self.format,
            "network": self.network,
            "converted": self.converted,
        }


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_safetensors(path: Path) -> bool:
    """A safetensors file opens with its header's length (8 bytes, little-endian) and then ``{``."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return 2 <= int.from_bytes(head[:8], "little") < 1 << 30  # a truncated file is still one, refused by its reader


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (Hugging Face's format: a JSON header and raw bytes, no code)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise ProbeError(path, f"is not a readable safetensors file ({str(error).splitlines()[0][:120]})", "the file may be truncated; fetch it again") from None


def read_file(path: str | Path) -> Any:
    """``torch.load`` with ``weights_only=True``; only ``argparse.Namespace`` is allow-listed.
    A safetensors file is read by the ``safetensors`` package instead."""
    path = Path(path)
    if not path.is_file():
        raise ProbeError(path, "no such checkpoint file", "check the path")
    if path.stat().st_size == 0:
        raise ProbeError(path, "is empty (0 bytes)", "the download or copy did not finish; fetch the file again")
    if is_safetensors(path):
        return read_safetensors(path)
    hints.refuse_compressed(path)  # a compressed download is not truncated
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL ([\w.]+)(?: (?!whose)(\w+))?", str(error))
        if not found:
            raise ProbeError(path, "is not a readable PyTorch checkpoint (not a pickle of tensors)", "the file may be truncated or of another kind; fetch it again") from None
        what = ".".join(part for part in found.groups() if part)
        raise ProbeError(
            path,
            f"refused: unpickling it would need {what}, which could run code",
            "only tensors, plain containers and argparse.Namespace are accepted; re-save the weights as a state dict",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, KeyError, IndexError, TypeError, AttributeError) as error:
        raise ProbeError(
            path,
            f"is not a readable PyTorch checkpoint ({str(error).splitlines()[0][:120]})",
            "the file may be truncated or of another kind; fetch it again",
        ) from None


def _unwrap(obj: Any, path: Path) -> Any:
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and not (set(obj) & set(NETWORKS)) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
    return obj


def _strip(key: str, prefix: str) -> str:
    return key[len(prefix):] if key.startswith(prefix) else key


def _split(state: dict[str, Any], path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Backbone and heads of one network's state dict; ``module.`` is stripped as a prefix only."""
    state = {_strip(k, "module."): v for k, v in state.items()}
    if not any(k.startswith("backbone.") for k in state):
        return state, {}
    backbone: dict[str, torch.Tensor] = {}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    stray = []
    for key, value in state.items():
        if key.startswith("backbone."):
            backbone[key[len("backbone."):]] = value
            continue
        prefix = next((p for p in HEAD_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            stray.append(key)
            continue
        name = key[len(prefix):]
        for old, new in OLD_HEAD_NAMES.items():
            name = new + name[len(old):] if name.startswith(old) else name
        heads.setdefault(prefix[:-1], {})[name] = value
    if stray:
        raise ProbeError(path, f"has keys outside backbone and the known heads: {sorted(stray)[:8]}", "is it a DINO or SelfPatch checkpoint?")
    return backbone, heads


def from_dinov2(backbone: dict[str, torch.Tensor], heads: dict[str, dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """DINOv2's names → timm's: ``mask_token`` set aside as a head, registers as ``reg_token``.

    With registers, timm's model has no table row for the class token (``no_embed_class``),
    so that row is added to ``cls_token`` here, once, instead of in every forward pass.
    """
    out = dict(backbone)
    heads = dict(heads)
    for key, head in UNUSED_BACKBONE_KEYS.items():
        if key in out:
            heads[head] = {key: out.pop(key)}
    if "register_tokens" in out:
        out["reg_token"] = out.pop("register_tokens")
        if "cls_token" in out and "pos_embed" in out:
            out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
            out["pos_embed"] = out["pos_embed"][:, 1:]
    return out, heads


def infer_arch(backbone: dict[str, torch.Tensor], path: Path, heads: int | None = None) -> Arch:
    """Width, depth, patch, class token, final norm and grid from the tensors; heads = width/64 unless given."""
    for key in ("patch_embed.proj.weight", "pos_embed", "blocks.0.mlp.fc1.weight"):
        if key not in backbone:
            found = ", ".join(sorted(backbone)[:5]) or "nothing"
            hints.refuse_prefixed(backbone, key, path)  # e.g. a PyTorch Lightning module's model.patch_embed...
            raise ProbeError(path, f"is not a ViT backbone in DINO/timm layout (no {key}; found {found}...)", "pass a DINO or SelfPatch checkpoint")
    proj = backbone["patch_embed.proj.weight"]
    if proj.ndim != 4 or proj.shape[1] != 3 or proj.shape[2] != proj.shape[3]:
        raise ProbeError(path, f"patch_embed.proj.weight has shape {tuple(proj.shape)}, not (width, 3, p, p)", "pass a ViT checkpoint")
    width, patch = int(proj.shape[0]), int(proj.shape[2])
    depth = 1 + max(int(m.group(1)) for k in backbone if (m := re.match(r"blocks\.(\d+)\.", k)))
    class_token = "cls_token" in backbone
    registers = int(backbone["reg_token"].shape[1]) if "reg_token" in backbone else 0
    rows = int(backbone["pos_embed"].shape[1]) - int(class_token and not registers)
    grid = math.isqrt(rows)
    if grid * grid != rows:
        raise ProbeError(path, f"pos_embed has {rows} patch rows, not a square grid", "is the class-token row missing or extra?")
    head_count = heads if heads is not None else max(width // 64, 1)
    if width % head_count:
        raise ProbeError(path, f"width {width} is not divisible by {head_count} heads", "pass --heads")
    return Arch(
        width=width,
        depth=depth,
        heads=head_count,
        patch=patch,
        class_token=class_token,
        final_norm="norm.weight" in backbone,
        pos_grid=grid,
        mlp_hidden=int(backbone["blocks.0.mlp.fc1.weight"].shape[0]),
        registers=registers,
        layerscale="blocks.0.ls1.gamma" in backbone,
    )


def expected_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """Every backbone key and shape for ``arch`` (timm's names, which are DINO's names). timm is
    imported here, when a checkpoint is read, not by every command that names this module.
    A DINOv3 backbone also carries its RoPE periods (``rope.periods``, head width / 4)."""
    from .backbone import build_vit

    shapes = {k: tuple(v.shape) for k, v in build_vit(arch, device="meta", init=False).state_dict().items()}
    if arch.family == "dinov3":
        shapes["rope.periods"] = (arch.width // arch.heads // 4,)
    return shapes


# heads of the released DINOv3 ViTs by width (hub/backbones.py); a file without RoPE periods
# (timm's, or transformers' without its config.json) does not say its head count otherwise
DINOV3_HEADS = {384: 6, 768: 12, 1024: 16, 1280: 20, 4096: 32}


def dinov3_heads(backbone: dict[str, torch.Tensor], width: int, path: Path, heads: int | None) -> int:
    """Head count: from the RoPE periods (head width / 4 of them) of an official file, else ``heads``,
    else a transformers ``config.json`` beside the file, else the released sizes, else width / 64."""
    periods = backbone.get("rope.periods")
    if periods is not None and periods.ndim == 1 and periods.numel() and width % (4 * periods.numel()) == 0:
        found = width // (4 * periods.numel())
        if heads is not None and heads != found:
            raise ProbeError(path, f"its rope.periods ({periods.numel()}) give {found} heads, not --heads {heads}", f"pass --heads {found} or omit it")
        return found
    if heads is not None:
        return heads
    config = path.with_name("config.json")
    if config.is_file():
        import json

        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("num_attention_heads")
        except (ValueError, OSError):
            value = None
        if isinstance(value, int) and value > 0:
            return value
    return DINOV3_HEADS.get(width, max(width // 64, 1))


def infer_dinov3_arch(backbone: dict[str, torch.Tensor], path: Path, heads: int | None = None) -> Arch:
    """Width, depth, patch, storage tokens, feed-forward and bias of a DINOv3 backbone in timm's names."""
    swiglu = "blocks.0.mlp.fc1_g.weight" in backbone
    fc1 = "blocks.0.mlp.fc1_g.weight" if swiglu else "blocks.0.mlp.fc1.weight"
    for key in ("patch_embed.proj.weight", fc1):
        if key not in backbone:
            found = ", ".join(sorted(backbone)[:5]) or "nothing"
            raise ProbeError(path, f"is not a DINOv3 ViT backbone (no {key} in timm's names; found {found}...)", "pass a DINOv3 checkpoint")
    proj = backbone["patch_embed.proj.weight"]
    if proj.ndim != 4 or proj.shape[1] != 3 or proj.shape[2] != proj.shape[3]:
        raise ProbeError(path, f"its patch embedding has shape {tuple(proj.shape)}, not (width, 3, p, p)", "pass a ViT checkpoint")
    width, patch = int(proj.shape[0]), int(proj.shape[2])
    head_count = dinov3_heads(backbone, width, path, heads)
    if width % head_count or (width // head_count) % 4:
        raise ProbeError(path, f"width {width} does not split into {head_count} heads of a multiple of 4", "pass --heads")
    reg = backbone.get("reg_token")
    return Arch(
        width=width,
        depth=1 + max(int(m.group(1)) for k in backbone if (m := re.match(r"blocks\.(\d+)\.", k))),
        heads=head_count,
        patch=patch,
        class_token=True,
        final_norm=True,
        pos_grid=0,
        mlp_hidden=int(backbone[fc1].shape[0]),
        registers=int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0,
        layerscale=True,
        family="dinov3",
        ffn="swiglu" if swiglu else "mlp",
        qkv_bias="blocks.0.attn.q_bias" in backbone,
    )


def check_backbone(backbone: dict[str, torch.Tensor], arch: Arch, path: Path) -> None:
    """Strict: missing, unexpected or misshapen keys are an error that lists them."""
    expected = expected_shapes(arch)
    missing = sorted(set(expected) - set(backbone))
    unexpected = sorted(set(backbone) - set(expected))
    misshapen = sorted(k for k in set(expected) & set(backbone) if tuple(backbone[k].shape) != expected[k])
    if missing or unexpected or misshapen:
        parts = []
        if missing:
            parts.append(f"missing {missing[:10]}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
        if misshapen:
            parts.append(f"wrong shape {[(k, tuple(backbone[k].shape), expected[k]) for k in misshapen[:5]]}")
        what = f"a DINOv3 ViT in timm's names ({arch.width} wide, {arch.heads} heads)" if arch.family == "dinov3" else "a ViT"
        raise ProbeError(path, f"backbone keys do not match {what}: " + "; ".join(parts), "is it another architecture?")


def _format(full: bool, heads: dict[str, Any], extra: dict[str, Any], backbone: dict[str, Any]) -> str:
    if not full:
        if "reg_token" in backbone:
            return "dinov2-reg-backbone"
        if "mask_token" in heads or "blocks.0.ls1.gamma" in backbone:
            return "dinov2-backbone"
        return "dino-backbone" if "cls_token" in backbone else "selfpatch-backbone"
    args = extra.get("args")
    if isinstance(args, dict) and args.get("trainer") == TRAINER_MARK:
        return TRAINER_MARK
    return "selfpatch-full" if "ca_head" in heads else "dino-full"


def load_checkpoint(path: str | Path, network: str = "teacher", heads: int | None = None, convert: bool = False,
                    checked_sha256: str | None = None) -> Checkpoint:
    """Read ``path`` safely and return the chosen network's backbone, checked key for key.

    ``checked_sha256``: the digest of a file read and checked before (a store's manifest keeps
    the one it was extracted from). A file with that digest is those very bytes, so the key check
    (which builds timm's network: timm and torchvision, over a second of imports) is not
    repeated; a file with any other digest is checked in full."""
    path = Path(path)
    if network not in NETWORKS:
        raise ProbeError(None, f"--network {network!r} is not one of {NETWORKS}", "use teacher or student")
    with ThreadPoolExecutor(1) as hasher:  # hashing (GIL released) beside the read (read_file, weights only): ~0.4 s at ViT-B
        digest = hasher.submit(sha256_file, path)
        checkpoint = _read_network(path, network, heads, digest, checked_sha256)
    return to_selfpatch(checkpoint) if convert else checkpoint


def _read_network(path: Path, network: str, heads: int | None, digest: Future, checked_sha256: str | None) -> Checkpoint:
    """One network of the file; ``digest`` is the file's sha256, computed meanwhile."""
    obj = _unwrap(read_file(path), path)
    if not isinstance(obj, dict) or not obj:
        raise ProbeError(path, "holds no state dict (empty or not a dict)", "pass a checkpoint that holds network weights")
    full = bool(set(obj) & set(NETWORKS))
    extra: dict[str, Any] = {}
    if full:
        if not isinstance(obj.get(network), dict):
            present = [k for k in NETWORKS if k in obj]
            raise ProbeError(path, f"is a training checkpoint without a {network!r} entry (it has {present})", f"pass --network {present[0]}" if present else "pass another file")
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
        backbone, head_states = from_dinov2(*_split(state, path))
        arch = infer_arch(backbone, path, heads)
        hints.heads_agree(arch, extra, heads, path)
    if checked_sha256 is None or digest.result() != checked_sha256:
        check_backbone(backbone, arch, path)
    return Checkpoint(
        path=path,
        sha256=digest.result(),
        format=dinov3 or _format(full, head_states, extra, backbone),
        network=network,
        arch=arch,
        backbone=backbone,
        heads=head_states,
        extra=extra,
    )


def read_dinov3(state: dict[str, torch.Tensor], layout: str, path: Path, heads: int | None) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], Arch]:
    """A DINOv3 file's backbone in timm's names (with ``rope.periods``), its heads and its shape."""
    if layout == "dinov3-official":
        try:
            backbone, head_states = dinov3_layouts.from_official(state)
        except dinov3_layouts.LayoutError as error:
            raise ProbeError(path, str(error), "pass the network's own released file") from None
        return backbone, head_states, infer_dinov3_arch(backbone, path, heads)
    # timm's and transformers' files carry no periods: the head count decides their number
    proj = state.get("patch_embed.proj.weight", state.get("embeddings.patch_embeddings.weight"))
    width = int(proj.shape[0]) if proj is not None and proj.ndim else 0
    head_dim = width // dinov3_heads({}, width, path, heads) if width else 64
    try:
        backbone, head_states = dinov3_layouts.to_timm_names(state, layout, head_dim)
    except dinov3_layouts.LayoutError as error:
        raise ProbeError(path, str(error), "pass the network's own released file") from None
    return backbone, head_states, infer_dinov3_arch(backbone, path, heads)


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


def save_state(state: dict[str, Any], out: str | Path) -> Path:
    """``torch.save`` to a temporary name, then rename: never a half-written checkpoint."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")  # a killed run's name, swept as litter
    try:
        torch.save(state, tmp)
        tmp.replace(out)
    except BaseException:  # a full disk or Ctrl-C leaves neither a half file nor the temporary name
        tmp.unlink(missing_ok=True)
        raise
    return out


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
