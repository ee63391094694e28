"""The forward pass of ``probe extract``: one view of a run's images through the backbone in
batches, its arrays laid out for the store (NaN where an image has no value), and which images'
values are all finite."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch

from ..infra.errors import ProbeError
from . import arrays, images, layout
from .architectures import Arch
from .backbone import Backbone
from .extract_load import Loaded
from .extract_plan import Settings
from .streams import Streams
from .taps import Capture, Taps
from .writer import SharedBuffers


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


def taps_for(names: list[str], arch: Arch) -> Taps:
    """What one pass must keep to give the arrays ``names`` (``store.layout`` names of one view)."""
    blocks: set[int] = set()
    facets: set[str] = set()
    maps, stats = "none", False
    for name in names:
        found = layout.parse(name)
        if found.kind == "attention_blocks":
            maps = "all"
        elif found.kind == "attention":
            maps = "all" if maps == "all" else "last"
        elif found.kind.startswith("attention_"):
            stats = True
        else:
            facets.add(found.facet)
            blocks.add(arch.depth - 1 if found.block is None else found.block)
    return Taps(blocks=tuple(sorted(blocks)), facets=tuple(sorted(facets)), maps=maps, stats=stats)


def cut(capture: Capture, name: str, arch: Arch) -> torch.Tensor:
    """Array ``name`` of one pass's capture: patch tokens, the class token's or the registers' rows
    of a kind at a block, the maps, or the statistics stacked along ``block``."""
    found = layout.parse(name)
    kind, block = found.kind, arch.depth - 1 if found.block is None else found.block
    p, c = arch.prefix, int(arch.class_token)
    if kind == "attention":
        return capture.maps[-1]
    if kind == "attention_blocks":
        return torch.stack(capture.maps, dim=1)
    if kind.startswith("attention_"):
        values = torch.stack(capture.stats[kind[len("attention_") :]], dim=1)
        return values[..., p:] if kind == "attention_distance" else values  # distances of the patch queries only
    if kind.startswith("cls_"):
        return capture.sequences[(kind[len("cls_") :], block)][:, 0]
    if kind.startswith("registers"):
        return capture.sequences[(kind[len("registers_") :] or "tokens", block)][:, c:p]
    return capture.sequences[(kind, block)][:, p:]


class Copies:
    """The device's arrays of each batch brought to the host, one batch behind the network.

    On a GPU a batch's arrays are rounded to the stored dtype on the device, then copied on a
    stream of their own into page-locked host buffers (two sets, used in turn) while the next
    batch is already computing; the host reads a batch's buffers once its copy has finished
    (``deliver`` one batch later, and ``flush`` at the end). The pixels go the other way through a
    page-locked buffer too, without blocking the host. On the CPU (or with ``overlap`` False)
    every step is immediate, in the same order: the same values either way."""

    def __init__(self, device: torch.device, overlap: bool | None = None) -> None:
        self.device = device
        self.overlap = device.type == "cuda" if overlap is None else overlap
        self.stream = torch.cuda.Stream(device) if self.overlap and device.type == "cuda" else None
        self._host: list[dict[str, torch.Tensor]] = [{}, {}]
        self._pixels: list[tuple[torch.Tensor, torch.cuda.Event] | None] = [None, None]  # page-locked, used in turn
        self._slot = 0
        self._pending: tuple | None = None

    def pixels(self, batch: torch.Tensor) -> torch.Tensor:
        """The batch on the device (through a page-locked buffer, not waiting, on a GPU)."""
        if self.stream is None:
            return batch.to(self.device)
        held = self._pixels[self._slot]
        if held is None or held[0].numel() < batch.numel():
            held = (torch.empty(batch.numel(), dtype=batch.dtype, pin_memory=True), None)
        elif held[1] is not None:
            held[1].synchronize()  # this buffer's last batch (two batches ago) has reached the device
        staged = held[0][: batch.numel()].view(batch.shape)
        staged.copy_(batch)
        moved = staged.to(self.device, non_blocking=True)
        sent = torch.cuda.Event()
        sent.record(torch.cuda.current_stream(self.device))
        self._pixels[self._slot] = (held[0], sent)
        return moved

    def send(self, start: int, values: dict[str, torch.Tensor], deliver: Callable[[int, dict[str, torch.Tensor]], None]) -> None:
        """Bring one batch's arrays (on the device, stored dtype) to the host; ``deliver(start,
        host arrays)`` runs for the previous batch now (overlapped) or for this one (immediate)."""
        if not self.overlap:
            deliver(start, {name: value.cpu() for name, value in values.items()})
            return
        host = self._host[self._slot]
        done = None
        if self.stream is not None:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
        for name, value in values.items():
            if name not in host or host[name].numel() < value.numel():
                host[name] = torch.empty(value.numel(), dtype=value.dtype, pin_memory=self.stream is not None)
        copied = None
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(done)
                for name, value in values.items():
                    host[name][: value.numel()].view(value.shape).copy_(value, non_blocking=True)
                    value.record_stream(self.stream)  # not freed before the copy has read it
                copied = torch.cuda.Event()
                copied.record(self.stream)
        else:  # the overlapped order, on the CPU (tests hold it to the immediate one)
            for name, value in values.items():
                host[name][: value.numel()].view(value.shape).copy_(value)
        shapes = {name: value.shape for name, value in values.items()}
        self.flush(deliver)
        self._pending = (start, host, shapes, copied)
        self._slot = 1 - self._slot

    def flush(self, deliver: Callable[[int, dict[str, torch.Tensor]], None]) -> None:
        """Deliver the batch still on its way (the end of a view)."""
        if self._pending is None:
            return
        start, host, shapes, copied = self._pending
        self._pending = None
        if copied is not None:
            copied.synchronize()
        deliver(start, {name: host[name][: int(np.prod(shape))].view(shape) for name, shape in shapes.items()})


def forward_view(
    backbone: Backbone,
    pixels: torch.Tensor,
    names: list[str],
    settings: Settings,
    batch_size: int,
    device: torch.device,
    tick: Callable[[int], None],
    shared: SharedBuffers | None = None,
    overlap: bool | None = None,
    streams: Streams | None = None,
) -> dict[str, np.ndarray]:
    """Forward one view of some images in batches; returns the arrays ``names`` (of that view).
    ``shared``: each array is copied from the device, batch by batch, into one shared-memory
    tensor of the whole run (taken from ``shared``), which a writing process then reads without
    a copy (``writer.shared_views``); the same values. Statistics stay float32 (``arrays.STATS_DTYPE``).
    On a GPU each batch's arrays come back while the next batch computes (``Copies``; ``overlap``
    False: one after the other, as on the CPU). ``streams``: each batch's images shared out over
    single-threaded streams (``store.streams``, the CPU's); the same values."""
    taps = taps_for(names, backbone.arch)
    parts: dict[str, list[np.ndarray]] = {}
    whole: dict[str, torch.Tensor] = {}
    copies = Copies(device, overlap)

    def stored(name: str, value: torch.Tensor) -> torch.Tensor:
        # torch rounds to float16 as numpy's astype does (nearest even; an overflow becomes inf,
        # which finite_images then refuses), several times faster, and on the device before the copy
        return value.float().to(getattr(torch, arrays.STATS_DTYPE if name.startswith(STATS) else settings.dtype))

    def deliver(start: int, values: dict[str, torch.Tensor]) -> None:
        for name, value in values.items():
            if shared is None:
                parts.setdefault(name, []).append(value.numpy().copy() if copies.overlap else value.numpy())
                continue
            if name not in whole:
                whole[name] = shared.take((pixels.shape[0], *value.shape[1:]), value.dtype)
            whole[name][start : start + value.shape[0]].copy_(value)

    def arrays_of(model: Backbone, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        capture = model.capture(batch, taps)
        return {name: stored(name, cut(capture, name, model.arch)) for name in names}

    for start in range(0, pixels.shape[0], batch_size):
        batch = copies.pixels(pixels[start : start + batch_size])
        copies.send(start, arrays_of(backbone, batch) if streams is None else streams.run(batch, arrays_of), deliver)
        tick(batch.shape[0])
    copies.flush(deliver)
    if shared is not None:
        return {name: values.numpy() for name, values in whole.items()}
    return {name: chunks[0] if len(chunks) == 1 else np.concatenate(chunks) for name, chunks in parts.items()}


STATS = tuple(f"attention_{s}_" for s in layout.STATISTICS)


def _blank(plan: dict, name: str, n: int, settings: Settings) -> np.ndarray:
    return np.full((n, *plan[name][1]), np.nan, dtype=arrays.STATS_DTYPE if name.startswith(STATS) else settings.dtype)


def view_data(
    backbone: Backbone,
    loaded: Loaded,
    view: str,
    plan: dict,
    n: int,
    settings: Settings,
    batch_size: int,
    device: torch.device,
    tick,
    shared: SharedBuffers | None = None,
    streams: Streams | None = None,
) -> dict[str, np.ndarray]:
    """One view's arrays (those of ``plan`` that belong to it, in any of its parts) for the ``n``
    images of a run: NaN rows where an image has no value (``shared``, ``streams``: see ``forward_view``)."""
    names = [name for name in plan if layout.view_of(name) == view]
    if view not in images.OWN_SIZE:
        where, pixels = loaded.fixed[view]
        out = forward_view(backbone, pixels, names, settings, batch_size, device, tick, shared, streams=streams) if pixels is not None else {}
        if len(where) == n and sorted(out) == sorted(names) and all(out[k].shape == (n, *plan[k][1]) for k in names):
            return out  # every image decoded: the arrays as they come, no NaN-filled copy
        data = {name: _blank(plan, name, n, settings) for name in names}
        for name, values in out.items():
            data[name][where] = values
        return data
    data = {name: _blank(plan, name, n, settings) for name in names}
    shapes: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
    for i, tensor in loaded.own[view]:
        shapes.setdefault(tuple(tensor.shape), []).append((i, tensor))
    for group in shapes.values():  # one batch shape per grid: images of one size forward together
        where = [i for i, _ in group]
        out = forward_view(backbone, torch.stack([t for _, t in group]), names, settings, batch_size, device, tick, streams=streams)
        for name, values in out.items():
            corner = tuple(slice(0, size) for size in values.shape[1:])  # padded along its patch (and token) axes
            for row, i in enumerate(where):
                data[name][i][corner] = values[row]
    return data


def finite_images(data: dict[str, np.ndarray], plan: dict, rows: np.ndarray, cols: np.ndarray, ok: np.ndarray, prefix: int = 0) -> np.ndarray:
    """Images (among ``ok``) whose every value in the valid region of this view is finite: along a
    patch dimension their own grid's patches, along a query or key dimension those and the
    ``prefix`` tokens (an own-size view's arrays are padded past them)."""
    good = ok.copy()
    patches = rows * cols
    for name, values in data.items():
        axes = {
            axis: extra
            for axis, dim in enumerate(plan[name][0], start=1)
            for kind, extra in (("patch", 0), ("query", prefix), ("key", prefix))
            if dim == kind or dim.startswith(f"{kind}_")
        }
        if any(np.any(patches + extra < values.shape[axis]) for axis, extra in axes.items()):  # padded grids: each image's own region
            for i in np.flatnonzero(good):
                region = values[i][tuple(slice(0, int(patches[i]) + axes[axis]) if axis in axes else slice(None) for axis in range(1, values.ndim))]
                good[i] &= region.size > 0 and bool(_finite_rows(region[None])[0])
        else:
            good &= _finite_rows(values) & (patches > 0 if axes else True)
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
