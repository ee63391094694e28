"""Checkpoint + images → the store: one forward pass per view, written chunk by chunk.

Work is cut into the store's chunks along ``image``; a chunk's arrays are written whole and its
``done`` flags last, so a killed run resumes where it stopped and gives the same store as an
uninterrupted one, and shards (``--shard i/n``, or torchrun's RANK/WORLD_SIZE) write disjoint,
chunk-aligned ranges of one store. Decoding the next chunk and writing the last one run in
threads beside the forward pass.
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ..infra import provenance
from ..infra.errors import ProbeError
from ..infra.progress import bar
from . import cache, images
from .backbone import Arch, AttentionMode, Backbone, Interpolation
from .checkpoints import Checkpoint, load_checkpoint

OnError = Literal["fail", "skip"]


@dataclass(frozen=True)
class Settings:
    """Everything that decides a store's contents (recorded in its manifest)."""

    views: tuple[int, ...] = (224, 480)
    attention: AttentionMode = "last"
    dtype: str = "float16"
    chunk: int = 16
    interpolation: Interpolation = "dino"

    def __post_init__(self) -> None:
        bad = [v for v in self.views if v not in images.VIEWS]
        if bad or not self.views:
            raise ProbeError(None, f"--views {','.join(map(str, self.views))} is not a subset of {images.VIEWS}", "use e.g. --views 224,480")
        if self.dtype not in ("float16", "float32"):
            raise ProbeError(None, f"--dtype {self.dtype} is not float16 or float32", "use --dtype float16")
        if self.chunk < 1:
            raise ProbeError(None, f"--chunk {self.chunk} must be at least 1", "use --chunk 16")


@dataclass
class Report:
    store: Path
    n_images: int
    written: int = 0
    skipped: list[str] = field(default_factory=list)
    done: int = 0


def plan_arrays(arch: Arch, settings: Settings) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Array names, dimension names and shapes (after ``image``) for these settings.

    Patch dimensions carry their view (``patch_224``, ``patch_480``, ``patch_96``) because one
    xarray Dataset cannot hold two sizes of one dimension; ``cache.require`` hands arrays out
    with the plain name ``patch``.
    """
    def grid(size: int) -> int:
        return (size // arch.patch) ** 2

    plan: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    d, cls = arch.width, arch.class_token
    if 224 in settings.views:
        plan["tokens_224"] = (("patch_224", "channel"), (grid(224), d))
        if cls:
            plan["cls_tokens_224"] = (("channel",), (d,))
        t = grid(224) + int(cls)
        if settings.attention != "none":
            plan["attention_224"] = (("head", "query", "key"), (arch.heads, t, t))
        if settings.attention == "all":
            plan["attention_blocks_224"] = (("block", "head", "query", "key"), (arch.depth, arch.heads, t, t))
    if 480 in settings.views:
        plan["keys_480"] = (("patch_480", "channel"), (grid(480), d))
        if cls:
            plan["cls_keys_480"] = (("channel",), (d,))
    if 96 in settings.views:
        plan["tokens_96"] = (("patch_96", "channel"), (grid(96), d))
        if cls:
            plan["cls_tokens_96"] = (("channel",), (d,))
    return plan


def build_manifest(checkpoint: Checkpoint, settings: Settings, refs: list[images.ImageRef], source: str) -> dict:
    return {
        "kind": "probe-store",
        **provenance.stamp(),
        "checkpoint": checkpoint.describe(),
        "network": checkpoint.network,
        "arch": checkpoint.arch.as_dict(),
        "views": sorted(settings.views),
        "interpolation": settings.interpolation,
        "attention": settings.attention,
        "attention_has_cls": checkpoint.arch.class_token,
        "dtype": settings.dtype,
        "chunk": settings.chunk,
        "image_source": source,
        "image_list_sha256": provenance.list_hash([r.id for r in refs]),
        "n_images": len(refs),
        "readout": {
            "tokens": "last block output, before any final norm; class token in cls_* arrays",
            "keys": "last block k = W_k LN1(z) + b_k, heads concatenated in head order",
            "attention": "last block softmax(q k^T / sqrt(head_dim)) per head, explicit, over every token",
            "layernorm_eps": 1e-6,
            "gelu": "exact (erf)",
        },
        "view_geometry": {
            "96": "short side 96 (PIL bicubic), centre crop 96",
            "224": "short side 224 (PIL bicubic, long side truncated), centre crop 224",
            "480": "squash to 480x480 (PIL bicubic)",
            "normalisation": "ImageNet mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)",
        },
    }


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``i/n`` from the option, else torchrun's RANK/WORLD_SIZE, else (0, 1)."""
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise ProbeError(None, f"--shard {shard!r} is not i/n", "use e.g. --shard 0/4") from None
    else:
        i, n = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= i < n:
        raise ProbeError(None, f"shard {i}/{n} is out of range", "use 0 <= i < n")
    return i, n


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU when there is one (torchrun's LOCAL_RANK picks which), else the CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ProbeError(None, f"--device {device!r} is not auto, cpu or cuda", "use --device auto")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeError(None, "--device cuda asked for, but no CUDA device is visible", "use --device cpu (or auto)")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return torch.device(device)


def _load(refs: list[images.ImageRef], sizes: tuple[int, ...], on_error: OnError):
    """Decode and cut views for one chunk; failed images are recorded, not silently dropped."""
    batch: dict[int, list[torch.Tensor]] = {s: [] for s in sizes}
    original = np.zeros((len(refs), 2), dtype=np.int32)
    failed = np.zeros(len(refs), dtype=bool)
    errors: list[str] = []
    for i, ref in enumerate(refs):
        try:
            picture = images.load_image(ref.path)
        except ProbeError as error:
            if on_error == "fail":
                raise
            failed[i] = True
            errors.append(error.line())
            continue
        original[i] = (picture.height, picture.width)
        for size, tensor in images.views(picture, sizes).items():
            batch[size].append(tensor)
    stacked = {s: torch.stack(v) if v else None for s, v in batch.items()}
    return stacked, original, failed, errors


def _run(backbone: Backbone, view: torch.Tensor, size: int, settings: Settings, batch_size: int, device: torch.device) -> dict[str, np.ndarray]:
    """Forward one view of a chunk in batches; returns the arrays this view contributes."""
    dtype = np.dtype(settings.dtype)
    parts: dict[str, list[np.ndarray]] = {}
    want_keys = size == 480
    attention: AttentionMode = settings.attention if size == 224 else "none"

    def put(name: str, value: torch.Tensor | None) -> None:
        if value is not None:
            parts.setdefault(name, []).append(value.float().cpu().numpy().astype(dtype))

    for start in range(0, view.shape[0], batch_size):
        out = backbone.readout(view[start:start + batch_size].to(device), keys=want_keys, attention=attention)
        if size == 480:
            put("keys_480", out.keys)
            put("cls_keys_480", out.cls_key)
        else:
            put(f"tokens_{size}", out.tokens)
            put(f"cls_tokens_{size}", out.cls_token)
        if size == 224:
            put("attention_224", out.attention)
            put("attention_blocks_224", out.attention_blocks)
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def _scatter(values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Rows of the images that loaded, placed back among NaN rows for those that failed."""
    full = np.full((len(ok), *values.shape[1:]), np.nan, dtype=values.dtype)
    full[ok] = values
    return full


def _written(pending: Future, path: Path) -> None:
    """Wait for a chunk write; a full disk or a failing device becomes one clear line."""
    try:
        pending.result()
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ProbeError(path, "ran out of disk space while writing a chunk", "free space and rerun the same command: finished chunks are kept, the rest resumes") from None
        raise ProbeError(path, f"could not be written ({error})", "check the disk, then rerun the same command to resume") from None


def extract(
    checkpoint_path: str | Path,
    image_dir: str | Path,
    *,
    settings: Settings = Settings(),
    network: str = "teacher",
    convert: bool = False,
    heads: int | None = None,
    cache_dir: str | Path | None = None,
    store: str | Path | None = None,
    shard: str | None = None,
    on_error: OnError = "fail",
    limit: int | None = None,
    batch_size: int = 16,
    device: str = "auto",
    quiet: bool = False,
) -> Report:
    """``probe extract``: fill the store of ``checkpoint_path`` with the views of ``image_dir``."""
    torch_device = resolve_device(device)  # before anything is written: a wrong device leaves nothing behind
    checkpoint = load_checkpoint(checkpoint_path, network=network, heads=heads, convert=convert)
    refs = images.list_images(image_dir)
    name = network + ("-converted" if convert else "")
    path = Path(store) if store else cache.store_path(cache.cache_root(cache_dir), Path(checkpoint_path), checkpoint.sha256, name)
    plan = plan_arrays(checkpoint.arch, settings)
    try:
        writer = cache.create_store(path, build_manifest(checkpoint, settings, refs, str(image_dir)), [r.id for r in refs], plan)
    except OSError as error:  # a full disk or a read-only folder while the store is created: nothing is left but swept names
        raise ProbeError(path, f"could not be created ({error.strerror or error})", "free disk space (or choose a writable --store) and rerun") from None
    todo = writer.todo(parse_shard(shard))
    if limit is not None:
        kept, total = [], 0
        for a, b in todo:
            if total >= limit:
                break
            kept.append((a, b))
            total += b - a
        todo = kept

    backbone = Backbone.from_checkpoint(checkpoint, settings.interpolation).to(torch_device)
    sizes = tuple(sorted(settings.views))
    report = Report(store=path, n_images=len(refs))

    def load(rng: tuple[int, int]):
        return _load(refs[rng[0]:rng[1]], sizes, on_error)

    with ThreadPoolExecutor(1) as loader, ThreadPoolExecutor(1) as saver, bar("images", quiet) as progress:
        task = progress.add_task(f"extract {path.parent.name}/{path.name}", total=sum(b - a for a, b in todo))
        pending: Future | None = None
        upcoming = loader.submit(load, todo[0]) if todo else None
        for index, (start, stop) in enumerate(todo):
            views, original, failed, errors = upcoming.result()
            upcoming = loader.submit(load, todo[index + 1]) if index + 1 < len(todo) else None
            ok = ~failed
            data: dict[str, np.ndarray] = {}
            for size in sizes:
                if views[size] is not None:
                    data.update(_run(backbone, views[size], size, settings, batch_size, torch_device))
            if not ok.all():
                for array_name, (_, shape) in plan.items():
                    data[array_name] = _scatter(data[array_name], ok) if array_name in data else np.full((len(ok), *shape), np.nan, dtype=settings.dtype)
            if pending is not None:
                _written(pending, path)
            pending = saver.submit(writer.write, start, data, original, failed)
            report.written += int(ok.sum())
            report.skipped += errors
            progress.advance(task, stop - start)
        if pending is not None:
            _written(pending, path)
    report.done = int(writer.done().sum())
    return report
