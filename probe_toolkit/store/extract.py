"""Checkpoint + images → the store: one forward pass per view, written run by run.

Work is cut into runs of images inside the store's chunks; a run's arrays are written whole and
its ``done_<view>`` flags last, so a killed run resumes where it stopped and gives the same store
as an uninterrupted one, and shards (``--shard i/n``, or torchrun's RANK/WORLD_SIZE) write
disjoint, chunk-aligned ranges of one store. A store grows: a later run with new views adds them
beside the existing ones. Decoding the next run and writing the last one run in threads beside
the forward pass (the first run already while the checkpoint is read); where the forward pass
leaves cores free (beside a GPU), images are decoded on several threads and several runs
written at once, which never changes a stored value. An image is marked done only when every
value of its arrays is finite.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
import zarr

from ..infra import provenance
from ..infra.errors import ProbeError
from ..infra.memory import reusing_blocks
from ..infra.progress import bar
from . import arrays, cache, grids, images, own_size, parts
from .architectures import Arch
from .backbone import RULES, AttentionMode, Backbone, Interpolation, resolve_interpolation
from .checkpoints import Checkpoint, load_checkpoint

OnError = Literal["fail", "skip"]
SAVERS = 4  # runs compressed and written at once, at most (and at most one per decoding thread)
RESAMPLES = tuple(images.RESAMPLE)
# Most images per zarr chunk. A chunk is the unit of writing and resume: a run's arrays are
# assembled and written whole per chunk, so one chunk's arrays are held in memory at once. At
# ViT-S/16 with the default views (tokens 224, attention 224, keys 480 in float16) an image
# takes about 1.3 MB, so 1024 images are about 1.3 GB (ViT-B, or --attention all: several GB);
# beyond that a chunk no longer fits a laptop, and resume granularity is lost for nothing.
MAX_CHUNK = 1024


def at_least(option: str, value: int | None, minimum: int, example: str) -> None:
    """Numeric options are checked where they enter: one line naming the option."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ProbeError(None, f"{option} {value!r} must be a whole number of at least {minimum}", f"use e.g. {option} {example}")


@dataclass(frozen=True)
class Settings:
    """Everything that decides a store's contents (recorded in its manifest).

    ``views``: any of 96, 224, "eval224", 480, "native" and "native_crop"; ``resample``: the 480 view's filter.
    """

    views: tuple[int | str, ...] = (224, 480)
    attention: AttentionMode = "last"
    dtype: str = "float16"
    chunk: int = 16
    interpolation: Interpolation = "auto"  # the checkpoint's own rule (backbone.resolve_interpolation)
    resample: str = "bicubic"

    def __post_init__(self) -> None:
        if not self.views:
            raise ProbeError(None, "--views is empty", "use e.g. --views 224,480")
        for view in self.views:
            images.view_name(view)
        if self.dtype not in ("float16", "float32"):
            raise ProbeError(None, f"--dtype {self.dtype} is not float16 or float32", "use --dtype float16")
        at_least("--chunk", self.chunk, 1, "16")
        if self.chunk > MAX_CHUNK:  # refused here, before a store is created or an array allocated
            raise ProbeError(None, f"--chunk {self.chunk} is more than {MAX_CHUNK} images per chunk (a chunk's arrays are held in memory "
                             f"whole while written: about 1.3 MB per image at ViT-S/16)", "use e.g. --chunk 16 (the default)")
        if self.resample not in RESAMPLES:
            raise ProbeError(None, f"--resample {self.resample!r} is not one of {', '.join(RESAMPLES)}", "use --resample lanczos (MaskCut's filter) or bicubic")

    @property
    def names(self) -> list[str]:
        """The canonical view names, in a fixed order."""
        given = {images.view_name(v) for v in self.views}
        return [v for v in images.VIEW_NAMES if v in given]


@dataclass
class Report:
    store: Path
    n_images: int
    written: int = 0
    skipped: list[str] = field(default_factory=list)
    done: int = 0
    views: list[str] = field(default_factory=list)
    left: int = 0  # images of this shard still to do after a --limit run
    limit: int | None = None
    # wall seconds: "setup" (checkpoint read and hash, network, store) and "images" (decode,
    # forward, writes), so that a benchmark can tell fixed costs from per-image ones
    seconds: dict[str, float] = field(default_factory=dict)


def patch_counts(arch: Arch, settings: Settings, own_patches: dict[str, int] | None = None) -> dict[str, int]:
    """Each view's patch dimension: rows x cols of a fixed view, the set's largest grid for an
    own-size view (``own_patches``: view -> that grid's patch count)."""
    out = {}
    for view in settings.names:
        if view in images.OWN_SIZE:
            out[view] = max(int((own_patches or {}).get(view, 0)), 1)
        else:
            rows, cols = images.fixed_grid(view, arch.patch)
            out[view] = rows * cols
    return out


def plan_arrays(arch: Arch, settings: Settings, own_patches: dict[str, int] | None = None) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Array names, dimension names and shapes (after ``image``) for these settings.

    Patch dimensions carry their view (``patch_224``, ``patch_480``, ``patch_native``, ...) because one
    xarray Dataset cannot hold two sizes of one dimension; ``cache.require`` hands arrays out
    with the plain name ``patch``.
    """
    plan: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    for view, patches in patch_counts(arch, settings, own_patches).items():
        plan.update(arrays.view_arrays(view, arch, patches, settings.attention))
    return plan


def build_manifest(checkpoint: Checkpoint, settings: Settings, refs: list[images.ImageRef], source: str,
                   own_patches: dict[str, int] | None = None) -> dict:
    arch = checkpoint.arch
    counts = patch_counts(arch, settings, own_patches)
    dinov3 = arch.family == "dinov3"
    norm = parts.record_final_norm(checkpoint.backbone, eps=1e-5 if dinov3 else parts.EPS)
    return {
        "kind": "probe-store",
        **provenance.stamp(),
        "checkpoint": checkpoint.describe(),
        "network": checkpoint.network,
        "arch": arch.as_dict(),
        "views": [images.manifest_view(v) for v in settings.names],
        "per_view": {v: arrays.view_facts(v, arch, counts[v], settings.attention, settings.resample) for v in settings.names},
        "interpolation": resolve_interpolation(settings.interpolation, arch),
        "interpolation_rule": RULES[resolve_interpolation(settings.interpolation, arch)],
        "attention": settings.attention if "224" in settings.names else "none",  # the 224 view's maps
        "attention_has_cls": arch.class_token,
        "attention_prefix": arch.prefix,  # tokens before the patches: class, then registers
        "registers": arch.registers,
        "dtype": settings.dtype,
        "chunk": settings.chunk,
        "image_source": source,
        "image_list_sha256": provenance.list_hash([r.id for r in refs]),
        "n_images": len(refs),
        "readout": {
            "tokens": "last block output, before any final norm; class token in cls_* arrays",
            "keys": "last block k = W_k LN1(z) + b_k, heads concatenated in head order",
            "attention": "last block softmax(q k^T / sqrt(head_dim)) per head, explicit, over every token (class, registers, patches)",
            "registers": "DINOv2 register tokens' last block output, in registers_* arrays, never among the patches",
            "layernorm_eps": 1e-5 if dinov3 else 1e-6,
            "gelu": "exact (erf)",
            **({"dinov3": "timm Eva (vit_*_patch16_dinov3): registers are the 4 storage tokens; keys before RoPE, the key bias "
                          "masked to zero (bias_mask); attention over class, storage and patch tokens after RoPE "
                          "(base 100, per-axis coordinates, patch tokens only), recomputed explicitly beside the fused kernel",
                "native_views": "every view: RoPE is computed per grid, no position table is interpolated"} if dinov3 else {}),
        },
        "view_geometry": {
            **{v: arrays.geometry(v, settings.resample) for v in settings.names},
            "normalisation": "ImageNet mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)",
            "patch_grid": f"view side // {checkpoint.arch.patch}; pixels beyond the last whole patch unused",
        },
        **({"final_norm": norm} if norm is not None else {}),  # for DINO's k-NN feature, without the checkpoint (store.parts)
    }


def _kept_layout(path: Path, plan: dict) -> dict:
    """A view written before it held its register tokens (``registers_480`` came later) resumes
    without them: its finished images have none, so the store keeps the layout it was made with."""
    if not (path / "zarr.json").is_file():
        return plan
    group = zarr.open_group(path, mode="r", use_consolidated=False)
    present = set(cache.array_names(group))

    def started(view: str) -> bool:
        flag = f"done_{view}" if f"done_{view}" in present else "done"
        held = any(grids.view_of(a) == view for a in present if a not in cache.FLAGS and not a.startswith(cache.PER_VIEW))
        return held and bool(np.asarray(group[flag][:]).any())

    return {name: spec for name, spec in plan.items() if not (name.startswith("registers_") and name not in present and started(grids.view_of(name)))}


def native_grids(refs: list[images.ImageRef], patch: int, on_error: OnError, views: tuple[str, ...] = (images.NATIVE,)
                 ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each image's grid in each own-size view of ``views``, from its file header read once (0 x 0
    where it cannot have one, with skip)."""
    out = {v: (np.zeros(len(refs), dtype=np.int32), np.zeros(len(refs), dtype=np.int32)) for v in views}
    for i, ref in enumerate(refs):
        try:
            width, height = images.header_size(ref.path)
        except ProbeError:
            if on_error == "fail":
                raise
            continue
        for view, (rows, cols) in out.items():
            try:
                rows[i], cols[i] = _own_grid(ref, width, height, patch, view)
            except ProbeError:
                if on_error == "fail":
                    raise
    return out


def _own_grid(ref: images.ImageRef, width: int, height: int, patch: int, view: str) -> tuple[int, int]:
    """The image's grid in an own-size view. One smaller than a patch on a side is its file's
    error when cut (nothing of it is left) or padded (the native view has always refused it);
    resized, it becomes one patch on that side (``own_size.needs_whole_patch``)."""
    if own_size.needs_whole_patch(view) and (width < patch or height < patch):
        raise ProbeError(ref.path, f"is {width}x{height} px, smaller than one {patch}-px patch, so its {view} view has no patch",
                         "remove it, or record it as failed with --on-error skip")
    return images.native_grid(width, height, patch, view)


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


@dataclass
class Loaded:
    """One run's decoded images: the fixed views stacked, each own-size view's tensors one by one."""

    fixed: dict[str, tuple[list[int], torch.Tensor | None]]
    own: dict[str, list[tuple[int, torch.Tensor]]]  # own-size view -> (image, pixels)
    original: np.ndarray  # (n, 2) height, width; 0 where the file could not be read
    failed: dict[str, np.ndarray]  # per view: images that cannot have it
    errors: list[str]


@dataclass
class _Picture:
    """One file decoded and cut: its size, its fixed views, its own-size views, or why not."""

    size: tuple[int, int] = (0, 0)  # height, width
    fixed: dict[str, torch.Tensor] = field(default_factory=dict)
    own: dict[str, torch.Tensor] = field(default_factory=dict)  # own-size view -> pixels
    error: ProbeError | None = None  # the file cannot be read: no view
    own_error: dict[str, ProbeError] = field(default_factory=dict)  # own-size views it has not (too small, or changed)


def _picture(ref: images.ImageRef, expected: dict[str, tuple[int, int]], *, fixed: list[str], resample: str, patch: int) -> _Picture:
    """Decode and cut one image (runs on a decoding thread: PIL and numpy release the GIL);
    ``expected``: its grid in each own-size view asked for, as the store was created with."""
    try:
        picture = images.load_image(ref.path)
    except ProbeError as error:
        return _Picture(error=error)
    out = _Picture(size=(picture.height, picture.width))
    for v in fixed:
        out.fixed[v] = images.fixed_pixels(picture, v, resample, ref.id)
    for view, grid in expected.items():
        try:
            if _own_grid(ref, picture.width, picture.height, patch, view) != grid:
                raise ProbeError(ref.path, f"is now {picture.width}x{picture.height} px, not the size the store was created with", "restore the file, or extract into a new --store")
            out.own[view] = images.native(picture, patch, view)
        except ProbeError as error:
            out.own_error[view] = error
    return out


def decoder_threads(asked: int | None, device: str) -> int:
    """Threads that decode and cut images beside the forward pass (``--decoders``).

    By default the cores the forward pass leaves free: all but torch's threads on the CPU (one
    when torch takes every core, as it does by default), all but one beside a GPU, where a
    single thread (decoding and cutting about 60 images/s at 224 + 480 px, writing about 250 at
    224 px: ``benchmarks/extract.py --decoding``) would starve the network; at most 16. As
    many runs, up to ``SAVERS``, are written at once. More threads never change a value: each
    image is decoded alone, each run assembled in image order and written to its own chunks.
    """
    at_least("--decoders", asked, 1, "4")
    if asked:
        return int(asked)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    gpu = device in ("auto", "cuda") and torch.cuda.is_available()
    return max(1, min(16, cores - (1 if gpu else torch.get_num_threads())))


def load_run(refs: list[images.ImageRef], views: list[str], settings: Settings, patch: int,
             grid: dict[str, tuple[np.ndarray, np.ndarray]] | None, on_error: OnError, pool: ThreadPoolExecutor | None = None) -> Loaded:
    """Decode and cut the views of one run (on ``pool``'s threads when given, else here), in image
    order; failed images are recorded, not silently dropped, and the first one (in image order)
    fails the run when ``on_error`` is fail. ``grid``: each own-size view's (rows, cols) of these images."""
    fixed_views = [v for v in views if v not in images.OWN_SIZE]
    own_views = [v for v in views if v in images.OWN_SIZE]
    fixed: dict[str, list[torch.Tensor]] = {v: [] for v in fixed_views}
    where: dict[str, list[int]] = {v: [] for v in fixed}
    own: dict[str, list[tuple[int, torch.Tensor]]] = {v: [] for v in own_views}
    original = np.zeros((len(refs), 2), dtype=np.int32)
    failed = {v: np.zeros(len(refs), dtype=bool) for v in views}
    errors: list[str] = []

    def fail(i: int, error: ProbeError, which: list[str]) -> None:
        if on_error == "fail":
            raise error
        for v in which:
            failed[v][i] = True
        errors.append(error.line())

    expected = [{v: (int(grid[v][0][i]), int(grid[v][1][i])) for v in own_views} for i in range(len(refs))]
    decode = functools.partial(_picture, fixed=fixed_views, resample=settings.resample, patch=patch)
    pictures = pool.map(decode, refs, expected) if pool is not None else map(decode, refs, expected)
    for i, picture in enumerate(pictures):
        if picture.error is not None:
            fail(i, picture.error, views)
            continue
        original[i] = picture.size
        for v in fixed:
            fixed[v].append(picture.fixed[v])
            where[v].append(i)
        for view in own_views:
            if view in picture.own_error:
                fail(i, picture.own_error[view], [view])
            else:
                own[view].append((i, picture.own[view]))
    stacked = {v: (where[v], images.stack(t) if t else None) for v, t in fixed.items()}
    return Loaded(stacked, own, original, failed, errors)


def forward_view(backbone: Backbone, pixels: torch.Tensor, view: str, settings: Settings, batch_size: int, device: torch.device, tick: Callable[[int], None]) -> dict[str, np.ndarray]:
    """Forward one view of some images in batches; returns the arrays this view contributes."""
    dtype = getattr(torch, settings.dtype)
    reads = arrays.READS[view]
    parts: dict[str, list[np.ndarray]] = {}
    attention: AttentionMode = settings.attention if "attention" in reads else "none"

    def put(name: str, value: torch.Tensor | None) -> None:
        # torch rounds to float16 as numpy's astype does (nearest even; an overflow becomes inf,
        # which _finite then refuses), several times faster, and on the device before the copy
        if value is not None:
            parts.setdefault(name, []).append(value.float().to(dtype).cpu().numpy())

    for start in range(0, pixels.shape[0], batch_size):
        batch = pixels[start:start + batch_size]
        out = backbone.readout(batch.to(device), keys="keys" in reads, attention=attention)
        if "keys" in reads:
            put(f"keys_{view}", out.keys)
            put(f"cls_keys_{view}", out.cls_key)
        if "tokens" in reads:
            put(f"tokens_{view}", out.tokens)
            put(f"cls_tokens_{view}", out.cls_token)
        put(f"registers_{view}", out.registers)  # every view of a register model (None otherwise)
        if "attention" in reads:
            put(f"attention_{view}", out.attention)
            put(f"attention_blocks_{view}", out.attention_blocks)
        tick(batch.shape[0])
    return {name: chunks[0] if len(chunks) == 1 else np.concatenate(chunks) for name, chunks in parts.items()}


def view_data(backbone: Backbone, loaded: Loaded, view: str, plan: dict, n: int, settings: Settings, batch_size: int, device: torch.device, tick) -> dict[str, np.ndarray]:
    """One view's arrays for the ``n`` images of a run: NaN rows where an image has no value."""
    names = [name for name in plan if grids.view_of(name) == view]
    if view not in images.OWN_SIZE:
        where, pixels = loaded.fixed[view]
        out = forward_view(backbone, pixels, view, settings, batch_size, device, tick) if pixels is not None else {}
        out = {name: values for name, values in out.items() if name in plan}
        if len(where) == n and sorted(out) == sorted(names) and all(out[k].shape == (n, *plan[k][1]) for k in names):
            return out  # every image decoded: the arrays as they come, no NaN-filled copy
        data = {name: np.full((n, *plan[name][1]), np.nan, dtype=settings.dtype) for name in names}
        for name, values in out.items():
            data[name][where] = values
        return data
    data = {name: np.full((n, *plan[name][1]), np.nan, dtype=settings.dtype) for name in names}
    shapes: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
    for i, tensor in loaded.own[view]:
        shapes.setdefault(tuple(tensor.shape), []).append((i, tensor))
    for group in shapes.values():  # one batch shape per grid: images of one size forward together
        where = [i for i, _ in group]
        out = forward_view(backbone, torch.stack([t for _, t in group]), view, settings, batch_size, device, tick)
        for name, values in ((k, v) for k, v in out.items() if k in plan):
            if name.startswith("cls_"):
                data[name][where] = values
            else:
                data[name][where, : values.shape[1]] = values
    return data


def _finite(data: dict[str, np.ndarray], view: str, rows: np.ndarray, cols: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Images (among ``ok``) whose every value in the valid region of this view is finite."""
    good = ok.copy()
    for name, values in data.items():
        patches = name.startswith(("tokens_", "keys_"))
        if patches and np.any(rows * cols < values.shape[1]):  # padded grids: each image's own region
            for i in np.flatnonzero(good):
                region = values[i, : int(rows[i]) * int(cols[i])]
                good[i] &= region.size > 0 and bool(_finite_rows(region[None])[0])
        else:
            good &= _finite_rows(values) & (rows * cols > 0 if patches else True)
    return good


def _finite_rows(values: np.ndarray) -> np.ndarray:
    """Per image (first axis): every value finite. float16 by its exponent bits (inf and NaN have
    them all set), which reads the attention maps several times faster than ``np.isfinite``."""
    flat = values.reshape(values.shape[0], -1)
    if flat.shape[1] == 0:
        return np.zeros(flat.shape[0], dtype=bool)
    if flat.dtype == np.float16:
        return (flat.view(np.uint16) & 0x7C00).max(axis=1) < 0x7C00
    return np.isfinite(flat).all(axis=1)


def _written(pending: Future, path: Path) -> None:
    """Wait for a chunk write; a full disk or a failing device becomes one clear line."""
    try:
        pending.result()
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ProbeError(path, "ran out of disk space while writing a chunk", "free space and rerun the same command: finished chunks are kept, the rest resumes") from None
        raise ProbeError(path, f"could not be written ({error})", "check the disk, then rerun the same command to resume") from None


def _limited(runs: list[tuple[int, int, tuple[str, ...]]], limit: int | None) -> tuple[list[tuple[int, int, tuple[str, ...]]], int]:
    """At most ``limit`` images: the last run is cut inside its chunk. Returns (runs, images left)."""
    total = sum(b - a for a, b, _ in runs)
    if limit is None:
        return runs, 0
    kept, taken = [], 0
    for a, b, views in runs:
        if taken >= limit:
            break
        take = min(b - a, limit - taken)
        kept.append((a, a + take, views))
        taken += take
    return kept, total - taken


def _decode_first_run(refs: list[images.ImageRef], views: list[str], settings: Settings, shard: tuple[int, int], limit: int | None, on_error: OnError,
                      pool: ThreadPoolExecutor) -> tuple[tuple[int, int, tuple[str, ...]], Future] | None:
    """Start decoding the run a new store begins with while the checkpoint is read and the network
    built (the fixed views only: the own-size views need the checkpoint's patch size).

    Returns (run, future); the loop takes the future only when its first run is this one (a
    resumed store starts elsewhere and decodes its own), so the same images are decoded the
    same way either way, and a bad image's error comes where it came before, when the run is
    taken. The thread ends once the run is decoded.
    """
    ranges = cache.chunk_ranges(len(refs), settings.chunk, shard)
    if any(v in images.OWN_SIZE for v in views) or not ranges:
        return None
    a, b = ranges[0]
    run = (a, min(b, a + limit) if limit is not None else b, tuple(views))
    decoder = ThreadPoolExecutor(1)
    future = decoder.submit(load_run, refs[run[0]:run[1]], list(views), settings, 0, None, on_error, pool)
    decoder.shutdown(wait=False)
    return run, future


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
    decoders: int | None = None,
    quiet: bool = False,
) -> Report:
    """``probe extract``: fill (or grow) the store of ``checkpoint_path`` with the views of ``image_dir``."""
    started = time.perf_counter()
    at_least("--batch-size", batch_size, 1, "16")
    at_least("--limit", limit, 1, "100")
    at_least("--heads", heads, 1, "6")
    # freed blocks are reused from the first decoded image on (under the command line's pinned
    # mmap threshold every decoded view was a fresh mapping: decoding ran 1.6x slower, and its
    # threads queued on the kernel's mapping lock)
    threads = decoder_threads(decoders, device)
    savers = min(SAVERS, threads)
    with reusing_blocks(), ThreadPoolExecutor(threads, thread_name_prefix="probe-decode") as decoding:
        shard_range = parse_shard(shard)
        views = settings.names
        try:
            refs, unlisted = images.list_images(image_dir), None
        except ProbeError as error:  # told after the checkpoint's own errors, as before
            refs, unlisted = [], error
        early = _decode_first_run(refs, views, settings, shard_range, limit, on_error, decoding)
        checkpoint = load_checkpoint(checkpoint_path, network=network, heads=heads, convert=convert)
        if unlisted is not None:
            raise unlisted
        patch = checkpoint.arch.patch
        own_views = tuple(v for v in views if v in images.OWN_SIZE)
        grids = {v: (np.full(len(refs), r, np.int32), np.full(len(refs), c, np.int32))
                 for v in views if v not in own_views for r, c in [images.fixed_grid(v, patch)]}
        if own_views:
            grids.update(native_grids(refs, patch, on_error, own_views))
        own_patches = {v: int((grids[v][0] * grids[v][1]).max(initial=0)) for v in own_views}
        torch_device = resolve_device(device)
        backbone = Backbone.from_checkpoint(checkpoint, settings.interpolation).to(torch_device)

        name = network + ("-converted" if convert else "")
        path = Path(store) if store else cache.store_path(cache.cache_root(cache_dir), Path(checkpoint_path), checkpoint.sha256, name)
        plan = _kept_layout(path, plan_arrays(checkpoint.arch, settings, own_patches))
        manifest = build_manifest(checkpoint, settings, refs, str(image_dir), own_patches)
        existed = (path / "zarr.json").is_file()
        try:
            writer = cache.create_store(path, manifest, [r.id for r in refs], plan, grids)
        except OSError as error:  # a read-only folder while the store is created: nothing is left but swept names
            raise ProbeError(path, f"could not be created ({error.strerror or error})", "free disk space (or choose a writable --store) and rerun") from None
        todo, left = _limited(writer.todo(shard_range, views), limit)
        report = Report(store=path, n_images=len(refs), views=views, left=left, limit=limit)

        def load(run: tuple[int, int, tuple[str, ...]]) -> Loaded:
            a, b, needed = run
            own = {v: (grids[v][0][a:b], grids[v][1][a:b]) for v in own_views}
            return load_run(refs[a:b], list(needed), settings, patch, own, on_error, decoding)

        report.seconds["setup"] = time.perf_counter() - started
        try:
            with ThreadPoolExecutor(1) as loader, ThreadPoolExecutor(savers) as saver, bar("images", quiet) as progress:
                task = progress.add_task(f"extract {path.parent.name}/{path.name}", total=sum(b - a for a, b, _ in todo))
                writes: deque[tuple[int, Future]] = deque()  # (chunk, write) of the runs being written, oldest first
                upcoming = (early[1] if early and early[0] == todo[0] else loader.submit(load, todo[0])) if todo else None
                for index, (start, stop, _) in enumerate(todo):
                    loaded = upcoming.result()
                    upcoming = loader.submit(load, todo[index + 1]) if index + 1 < len(todo) else None
                    n, needed = stop - start, list(loaded.failed)
                    ticked = [0.0]

                    def tick(count: int, share: float = 1.0 / len(needed)) -> None:
                        ticked[0] += count * share
                        progress.advance(task, count * share)

                    out: dict[str, tuple[dict[str, np.ndarray], np.ndarray]] = {}
                    any_ok = np.zeros(n, dtype=bool)
                    for view in needed:
                        data = view_data(backbone, loaded, view, plan, n, settings, batch_size, torch_device, tick)
                        ok = ~loaded.failed[view]
                        good = _finite(data, view, grids[view][0][start:stop], grids[view][1][start:stop], ok)
                        for i in np.flatnonzero(ok & ~good):
                            error = ProbeError(refs[start + i].path, f"gives non-finite values in the {view} view", "check the checkpoint's weights and --dtype (float16 overflows past 65504), or record it as failed with --on-error skip")
                            if on_error == "fail":
                                raise error
                            loaded.errors.append(error.line())
                            for values in data.values():
                                values[i] = np.nan
                        out[view] = (data, ~good)
                        any_ok |= good
                    # runs of other chunks are written at once (their arrays and flags share no chunk);
                    # two runs of one chunk never are
                    home = start // writer.chunk
                    while writes and (len(writes) >= savers or writes[-1][0] == home):
                        _written(writes.popleft()[1], path)
                    writes.append((home, saver.submit(writer.write_views, start, out, loaded.original)))
                    report.written += int(any_ok.sum())
                    report.skipped += loaded.errors
                    progress.advance(task, n - ticked[0])
                while writes:
                    _written(writes.popleft()[1], path)
        except BaseException:
            # a run that made the store and then failed before finishing any image leaves nothing
            # behind, so the corrected command starts clean (an unsharded run only: a shard's store
            # may already be another shard's)
            if not existed and shard_range == (0, 1) and not any(writer.done(v).any() for v in views):
                shutil.rmtree(path, ignore_errors=True)
            raise
        report.done = int(np.logical_and.reduce([writer.done(v) for v in views]).sum())
        report.seconds["images"] = time.perf_counter() - started - report.seconds["setup"]
        return report
