"""Checkpoint files read and written safely: ``torch.load(..., weights_only=True)`` with only
``argparse.Namespace`` allow-listed, safetensors through the ``safetensors`` package (no pickle
at all), the file's sha256, and a save that never leaves a half-written file."""

from __future__ import annotations

import argparse
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from ..infra.atomic import publish
from ..infra.errors import ProbeError
from ..infra.provenance import file_sha256
from . import hints


def sha256_file(path: str | Path) -> str:
    """The checkpoint file's sha256 (``infra.provenance.file_sha256``)."""
    return file_sha256(path)


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
        raise ProbeError(path, f"is not a readable safetensors file ({_first_line(error)})", "the file may be truncated; fetch it again") from None


def _first_line(error: BaseException) -> str:
    """The error's first line, or its type's name when it has no message (``EOFError()``)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:120]


def read_file(path: str | Path) -> Any:
    """``torch.load`` with ``weights_only=True``; only ``argparse.Namespace`` is allow-listed.
    A safetensors file is read by the ``safetensors`` package instead."""
    path = Path(path)
    if not path.is_file():
        raise ProbeError(path, "no such checkpoint file", "check the path, or name a Hugging Face Hub repository (org/name or hf-hub:org/name, read from its cache)")
    if path.stat().st_size == 0:
        raise ProbeError(path, "is empty (0 bytes)", "the download or copy did not finish; fetch the file again")
    if is_safetensors(path):
        return read_safetensors(path)
    hints.refuse_compressed(path)  # a compressed download is not truncated
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on a file's pickle protocol are not the user's business; its errors are
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL ([\w.]+)(?: (?!whose)(\w+))?", str(error))
        if not found:
            raise ProbeError(
                path, "is not a readable PyTorch checkpoint (not a pickle of tensors)", "the file may be truncated or of another kind; fetch it again"
            ) from None
        what = ".".join(part for part in found.groups() if part)
        raise ProbeError(
            path,
            f"refused: unpickling it would need {what}, which could run code",
            "only tensors, plain containers and argparse.Namespace are accepted; re-save the weights as a state dict",
        ) from None
    except Exception as error:  # noqa: BLE001 - any failure to read arbitrary bytes (torch.load meets safetensors', zip's and pickle's errors) is this file's
        raise ProbeError(
            path,
            f"is not a readable PyTorch checkpoint ({_first_line(error)})",
            "the file may be truncated or of another kind; fetch it again",
        ) from None


def save_state(state: dict[str, Any], out: str | Path) -> Path:
    """``torch.save`` to a temporary name, then rename: never a half-written checkpoint."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")  # a killed run's name, swept as litter
    try:
        torch.save(state, tmp)
        publish(tmp, out)
    except BaseException:  # a full disk or Ctrl-C leaves neither a half file nor the temporary name
        tmp.unlink(missing_ok=True)
        raise
    return out
