"""``probe propagate CKPT --davis DIR --out DIR``: DAVIS-2017 label propagation and its J&F.

The backbone runs in memory, sequence by sequence (frames are read, never cached in a store):
each frame read as the script reads it (``cv2.imread``, then ``cv2.resize`` INTER_LINEAR on the
8-bit frame to DINO's size: short side 480, long side floored to a multiple of 64; BGR → RGB;
normalised with std 0.228, 0.224, 0.225), its last-block patch tokens after the final norm
(``backbone.normed_patch_tokens``), then ``analyses.propagation``. Labels: the first frame's
annotation of every sequence is read once, through the ledger (purpose ``propagate: first
frame``); the scorer alone reads the other frames' annotations, after every prediction is
written (``propagate: score``, a second entry), unless ``--no-score``.

Written under ``--out``: ``<sequence>/<frame>.png`` indexed PNGs in DAVIS's layout with the
first annotation's palette (the first frame is its annotation, as the script writes it) and
``soft.npy`` beside them (the soft patch-level segmentation of frames 1..), each sequence swapped
in whole; then davis2017-evaluation's tables ``global_results-<set>.csv`` and
``per-sequence_results-<set>.csv`` (three decimals). The scorer reads the predictions back
from those PNGs (as davis2017-evaluation reads a results folder) and checks each sequence's
against the digest of what was written, so sequences propagated on a dask cluster
(``--dask-address``) or by other shards (``--shard i/n``, torchrun; shares noted in
``<out>/.shards/``, the last shard scores) are scored only as written. Results ``results/davis`` go into
``--store`` (or the checkpoint's default store when it exists):

    j_mean, j_recall, j_decay, f_mean, f_recall, f_decay   (object)   per object of every sequence
    jf_mean, j, f                                          ()         the global means
    soft_<sequence>   (frame_<sequence>, label_<sequence>, row_<sequence>, col_<sequence>)  soft segmentations
    coords: object ("<sequence>_<n>", as the repository names them)
    attrs: settings, ledger {first_frames, score}, sequences, frame size rule, provenance
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ..analyses import propagation, tracking
from ..infra import lazy_dask, owned, provenance
from ..infra.atomic import write_json
from ..infra.errors import IntegrityError, ProbeError, worker_name
from ..infra.runner import for_workers, map_blocks, shard_range, torch_threads
from ..infra.settings import SettingError
from ..labels import davis
from ..labels.davis_folders import DavisSequence, davis_sequences, read_davis_annotations, read_first_annotations
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.propagate import PropagateSettings
from ..results.propagation_report import PropagationReport
from ..store import cache
from ..store.backbone import Backbone, forget, loaded, normed_patch_tokens, remember
from ..store.checkpoints import load_checkpoint
from ..store.images import load_image
from ..store.sources import file_digest, read_checked
from .shards import collect

if TYPE_CHECKING:
    import xarray as xr  # imported where a result is written (lazy_dask.xarray): it brings pandas

BATCH = 8  # frames per forward pass
SOFT = "soft.npy"  # beside a sequence's PNGs: (frame, label, row, column) float32, its frames 1.. soft segmentations


def indexed_png(labels: np.ndarray, palette: np.ndarray) -> bytes:
    image = Image.fromarray(np.asarray(labels, np.uint8), mode="P")
    image.putpalette(palette.astype(np.uint8).ravel().tolist())
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def sequence_features(model: Backbone, frames: Sequence[Path], device: torch.device, batch: int = BATCH, rule: tracking.Frames | None = None):
    """Yield (rows·cols, D) features per frame, the forward pass batched over frames."""
    import cv2  # the script's decoder; here, so that importing this module stays light

    size = None
    for a in range(0, len(frames), batch):
        tensors = []
        for path in frames[a : a + batch]:
            if rule is None or rule.preset == "dino":
                frame = cv2.imread(str(path))  # DINO's script's decoder (BGR, 8 bits)
                if frame is None:
                    raise ProbeError(path, "is not an image OpenCV can read", "replace the frame with the sequence's JPEG")
            else:
                frame = np.asarray(load_image(path))  # DINOv3's notebook opens frames with PIL (RGB)
            if size is None:
                size = frame.shape[:2]
            elif frame.shape[:2] != size:
                raise ProbeError(path, f"is {frame.shape[1]}×{frame.shape[0]}, the sequence's first frame {size[1]}×{size[0]}", "give every frame of a sequence one size")
            tensors.append(rule.tensor(frame) if rule is not None else propagation.frame_tensor(frame))
        feats = normed_patch_tokens(model, torch.stack(tensors).to(device)).float().cpu()
        yield from feats


def _write_sequence(out: Path, name: str, files: dict[str, bytes]) -> None:
    """All of a sequence's PNGs appear at once: written into a hidden folder, then renamed.
    Hidden folders a killed run left for this sequence are removed first."""
    for stale in [*out.glob(f".{name}.tmp-*"), *out.glob(f".{name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out / f".{name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    for file, data in files.items():
        (tmp / file).write_bytes(data)
    target = out / name
    if target.exists():
        old = out / f".{name}.old-{os.getpid()}"
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old)
    else:
        tmp.rename(target)


def _write_csv(path: Path, header: Sequence[str], rows: list[list[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([f"{v:.3f}" if isinstance(v, float) else v for v in row])
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(buffer.getvalue())
    os.replace(tmp, path)


def write_tables(out: Path, subset: str, scores: list[davis.SequenceScores], overall: dict[str, float]) -> tuple[Path, Path]:
    """davis2017-evaluation's two CSV tables."""
    g = out / f"global_results-{subset}.csv"
    s = out / f"per-sequence_results-{subset}.csv"
    _write_csv(g, davis.GLOBAL_COLUMNS, [[overall[c] for c in davis.GLOBAL_COLUMNS]])
    _write_csv(s, ("Sequence", "J-Mean", "F-Mean"), [[r["Sequence"], r["J-Mean"], r["F-Mean"]] for q in scores for r in q.rows()])
    return g, s


@dataclass(frozen=True)
class Job:
    """What every sequence task shares (small, pickled with each task): the checkpoint (loaded
    once per worker, its sha256 checked), the settings, and each sequence's frames and palette."""

    checkpoint: str
    sha256: str
    network: str
    device: str
    settings: PropagateSettings
    out: str
    patch: int
    names: tuple[str, ...]
    frames: tuple[tuple[str, ...], ...]  # absolute paths
    palettes: tuple[np.ndarray, ...]
    digests: tuple[tuple[str, ...], ...] = ()  # each frame's sha256 as this process read it: a worker proves it reads the same bytes

    def __post_init__(self) -> None:  # every path a worker receives is absolute (``runner.for_workers``)
        object.__setattr__(self, "checkpoint", for_workers(self.checkpoint))
        object.__setattr__(self, "out", for_workers(self.out))
        object.__setattr__(self, "frames", tuple(tuple(for_workers(f) for f in seq) for seq in self.frames))


def _model(job: Job) -> Backbone:
    return loaded(job.checkpoint, job.sha256, job.network, job.device)


def png_digest(files: dict[str, bytes]) -> str:
    """sha256 of a sequence's PNGs (names and bytes, in frame order): what the scorer checks it reads."""
    digest = hashlib.sha256()
    for file, data in files.items():
        digest.update(file.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def propagate_block(index: np.ndarray, annotation: np.ndarray, *, job: Job) -> dict[str, np.ndarray]:
    """Sequences ``index`` (their first annotations beside them) → their PNGs written under the
    job's ``out`` (each sequence swapped in whole) and ``digest``: per sequence, ``png_digest`` of
    what was written. The runner's unit: one torch thread, on a worker as in this process."""
    model, out = _model(job), Path(job.out)
    done = np.empty(len(index), dtype=object)
    with torch_threads(1):
        for j, (i, first_annotation) in enumerate(zip(index, annotation)):
            name, frames, palette = job.names[i], [Path(f) for f in job.frames[i]], job.palettes[i]
            missing = next((f for f in frames if not f.is_file()), None)
            if missing is not None:  # a cluster worker without the client's DAVIS folder
                raise IntegrityError(worker_name(), f"cannot read {missing}", "give every worker the DAVIS folder at the path this machine reads")
            for frame, digest in zip(frames, job.digests[i] if job.digests else ()):  # another folder at that path: one line, not other numbers
                read_checked(frame, digest)
            height, width = first_annotation.shape
            rule = job.settings.frames(job.patch)
            w, h = rule.size(width, height)
            rows, cols = h // job.patch, w // job.patch
            first = rule.first(first_annotation, rows, cols)
            files = {f"{frames[0].stem}.png": indexed_png(first_annotation, palette)}
            labels = [first_annotation]
            s = job.settings
            near = rule.window(rows, cols, s.size_mask_neighborhood)
            stream = propagation.propagate(
                sequence_features(model, frames, torch.device(job.device), rule=rule),
                first,
                rows,
                cols,
                job.patch,
                (width, height),
                n_last=s.n_last_frames,
                radius=s.size_mask_neighborhood,
                topk=s.topk,
                temperature=s.affinity_temperature,
                near=near,
                labels=rule.labels,
            )
            soft = []
            for frame, result in zip(frames[1:], stream):
                files[f"{frame.stem}.png"] = indexed_png(result.labels, palette)
                labels.append(result.labels)
                soft.append(result.soft.numpy().astype(np.float32))
            buffer = io.BytesIO()
            np.save(buffer, np.stack(soft))
            files[SOFT] = buffer.getvalue()
            _write_sequence(out, name, files)
            done[j] = png_digest(files)
    return {"digest": done}


def read_predictions(out: Path, sequence: DavisSequence, digest: str) -> tuple[list[np.ndarray], np.ndarray]:
    """A sequence's predicted labels, read back from its PNGs under ``out`` (as
    davis2017-evaluation reads a results folder), and its soft segmentations (``SOFT``), after
    checking they are the ones written."""
    folder = out / sequence.name
    files: dict[str, bytes] = {}
    for name in [*(f"{frame.stem}.png" for frame in sequence.frames), SOFT]:
        path = folder / name
        files[name] = path.read_bytes() if path.is_file() else b""
    if png_digest(files) != digest:
        raise IntegrityError(
            folder,
            "does not hold the PNGs this run wrote (changed, or written where this machine does not see them)",
            "give every worker and shard one shared --out folder, leave it alone while the run lasts, and rerun",
        )
    soft = np.load(io.BytesIO(files.pop(SOFT)), allow_pickle=False)
    return [np.asarray(Image.open(io.BytesIO(data))) for data in files.values()], soft


def gather_parts(out: Path, shard: tuple[int, int], identity: dict[str, Any], digests: dict[str, str], first_frames: str) -> tuple[dict[str, str], str, list[int]]:
    """Save this shard's share (``<out>/.shards/propagate-part-<i>-of-<n>.json``: the run's
    identity, each sequence's ``png_digest`` and the ledger entry of its first frames); once every
    share of the same identity is in: (every sequence's digest, the shards' ledger entries, []),
    else (.., .., the shards still missing). A rerun of a shard replaces its share."""
    i, n = shard
    folder = out / ".shards"
    folder.mkdir(exist_ok=True)
    path = lambda j: folder / f"propagate-part-{j}-of-{n}.json"  # noqa: E731
    parts, waiting = collect(
        shard,
        lambda: write_json(path(i), {"identity": identity, "digests": digests, "first_frames": first_frames}, indent=1),
        lambda j: json.loads(path(j).read_text()) if path(j).is_file() else None,
        lambda part: part.get("identity") == identity,
    )
    every = {name: digest for part in parts for name, digest in part["digests"].items()}
    return every, " ".join(part["first_frames"] for part in parts if part["first_frames"]), waiting


def results_dataset(scores: list[davis.SequenceScores], overall: dict[str, float], soft: dict[str, tuple[list[str], np.ndarray]] | None = None) -> xr.Dataset:
    """The J&F tables, and per sequence ``soft_<sequence>`` (frame_<sequence>, label_<sequence>,
    row_<sequence>, col_<sequence>): the soft patch-level segmentation of its frames 1.., before
    upsampling, as the script keeps it in its queue."""
    rows = [r for s in scores for r in s.rows()]
    data = {
        key.lower().replace("-", "_"): ("object", np.array([r[key] for r in rows], np.float64))
        for key in ("J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay")
    }
    data.update({"jf_mean": overall["J&F-Mean"], "j": overall["J-Mean"], "f": overall["F-Mean"]})
    coords: dict[str, Any] = {"object": [str(r["Sequence"]) for r in rows]}
    for name, (frames, grids) in (soft or {}).items():
        data[f"soft_{name}"] = ((f"frame_{name}", f"label_{name}", f"row_{name}", f"col_{name}"), grids)
        coords[f"frame_{name}"] = frames
    return lazy_dask.xarray().Dataset(data, coords=coords)


def run(inputs: Inputs, settings: PropagateSettings, context: RunContext) -> PropagationReport:
    """Propagate every sequence (one runner task each, where the context places them: local
    processes, one on a GPU, or the dask cluster), write its PNGs, then score them as read back from
    ``out``. Every sequence runs on one torch thread, on a worker as in this process
    (``runner.task_threads``); the tests check the same bits at 1 and 2 workers and on a cluster. A
    shard propagates its contiguous share of the sequences; the shard that finds every share
    written (``gather_parts``) scores them all."""
    checkpoint, davis_dir, out, network, sequences, store = inputs.checkpoint, inputs.davis, inputs.out, inputs.network, inputs.sequences, inputs.store
    cache_dir = context.cache_dir
    target_device = context.device()
    davis_dir, out = Path(davis_dir).resolve(), Path(out)  # absolute at the boundary: workers read the frames this process names
    if store is not None and not (Path(store) / "zarr.json").is_file():
        raise SettingError("store", "has no zarr.json, so no probe extract wrote it", "pass store=PATH of a probe extract output, or leave it out", store)
    found = davis_sequences(davis_dir, settings.subset)
    if sequences:
        names = {s.name for s in found}
        unknown = [s for s in sequences if s not in names]
        if unknown:
            raise SettingError(
                "sequences", f"sequences {unknown[0]!r} is not listed in ImageSets/2017/{settings.subset}.txt", f"choose from {', '.join(sorted(names)[:5])}"
            )
        named = set(sequences)
        found = [s for s in found if s.name in named]
    which = context.shard()
    mine = found if which is None else found[slice(*shard_range(len(found), 1, which))]
    # --out is probe's output folder (infra.owned): the user's own is refused before any work or label read;
    # every shard lists the same entries (all sequences', the tables, .shards/), so their manifests agree
    output = owned.claim(out, "out")
    entries = [*(f"{s.name}/" for s in found), f"global_results-{settings.subset}.csv", f"per-sequence_results-{settings.subset}.csv", ".shards/"]
    output.check(e.rstrip("/") for e in entries)
    with context.placed(device=target_device.type) as where:  # auto resolved: a GPU's run is one process
        ck = load_checkpoint(checkpoint, network=network)
        model = Backbone.from_checkpoint(ck).to(target_device)
        firsts, first_entry = read_first_annotations(davis_dir, mine, checkpoint=ck.sha256, cache=cache_dir) if mine else ({}, "")
        for seq in mine:
            annotation, _ = firsts[seq.name]
            with Image.open(seq.frames[0]) as frame:
                size = frame.size
            if annotation.shape != (size[1], size[0]):
                raise ProbeError(
                    seq.annotations / f"{seq.frames[0].stem}.png",
                    f"is {annotation.shape[1]}×{annotation.shape[0]}, its frame {size[0]}×{size[1]}",
                    "give the first frame's annotation the frame's size",
                )
        output.adopt("propagate", entries)  # listed before any of them is written
        start = time.perf_counter()
        palettes = [firsts[seq.name][1] if firsts[seq.name][1] is not None else davis.davis_palette() for seq in mine]
        job = Job(
            str(Path(checkpoint).resolve()),
            ck.sha256,
            network,
            str(target_device),
            settings,
            str(out.resolve()),
            ck.arch.patch,
            tuple(s.name for s in mine),
            tuple(tuple(str(f) for f in s.frames) for s in mine),
            tuple(palettes),
            tuple(tuple(file_digest(f) for f in s.frames) for s in mine),
        )
        remember(job.checkpoint, job.sha256, job.network, job.device, model)  # this process has it loaded already

        def read(a: int, b: int) -> dict[str, np.ndarray]:
            annotations = np.empty(b - a, dtype=object)
            for j, i in enumerate(range(a, b)):
                annotations[j] = firsts[mine[i].name][0]
            return {"index": np.arange(a, b), "annotation": annotations}

        finished = iter(mine)
        advance = context.task("propagate", sum(len(s.frames) - 1 for s in mine))

        def progress(n: int) -> None:  # sequences finish in order: their frames past the first
            for _ in range(n):
                advance(len(next(finished).frames) - 1)

        try:
            done = (
                map_blocks(
                    partial(propagate_block, job=job), read, [(i, i + 1) for i in range(len(mine))], workers=where.workers, client=where.client, progress=progress
                )["digest"]
                if mine
                else []
            )
        except ProbeError as error:  # say what the failed run leaves under --out: the sequences written whole so far
            written = sum((out / seq.name).is_dir() for seq in mine)
            kept = f"{written} sequences' PNGs are in {out}, each whole (the rerun writes them again)" if written else f"nothing was written in {out}"
            raise type(error)(error.where or None, error.problem, f"{error.fix}; {kept}" if error.fix else kept) from None
        finally:
            forget()
    digests = {seq.name: str(d) for seq, d in zip(mine, done)}
    if which is not None:
        identity = {"checkpoint": ck.sha256, "network": network, "davis": str(davis_dir.resolve()), "sequences": [s.name for s in found], "settings": settings.record()}
        digests, first_entry, waiting = gather_parts(out, which, identity, digests, first_entry)
        if waiting:
            return context.finish(
                PropagationReport(
                    out, [s.name for s in mine], sum(len(s.frames) for s in mine), time.perf_counter() - start, ledger={"first_frames": first_entry}, waiting=waiting
                )
            )
    seconds = time.perf_counter() - start
    report = PropagationReport(out, [s.name for s in found], sum(len(s.frames) for s in found), seconds, ledger={"first_frames": first_entry})
    if not inputs.score:
        return context.finish(report)
    soft = {}
    try:  # a bad annotation met only now, by the scorer: the line says the predictions are kept, whole
        truth, score_entry = read_davis_annotations(davis_dir, found, checkpoint=ck.sha256, cache=cache_dir)
        report.ledger["score"] = score_entry
        for seq in found:
            predicted, soft[seq.name] = read_predictions(out, seq, digests[seq.name])
            soft[seq.name] = ([f.stem for f in seq.frames[1:]], soft[seq.name])
            try:
                report.scores.append(davis.score_sequence(seq.name, truth[seq.name], predicted))
            except ValueError as error:
                raise ProbeError(seq.annotations, str(error), "every frame needs an annotation of the frame's size; a sequence needs 3 frames or more") from None
    except ProbeError as error:
        kept = f"the predictions of the {len(found)} sequences are in {out}, each whole, and nothing was scored (the rerun writes them again)"
        raise type(error)(error.where or None, error.problem, f"{error.fix}; {kept}" if error.fix else kept) from None
    report.global_scores = davis.global_row(report.scores)
    write_tables(out, settings.subset, report.scores, report.global_scores)
    target = Path(store) if store else cache.store_path(cache.cache_root(cache_dir), ck.stem, ck.sha256, network)
    if (target / "zarr.json").is_file():
        attrs = {
            "settings": settings.record(),
            "frame_size": settings.frames(ck.arch.patch).describe(),
            "feature": "last-block patch tokens after the final norm (none for networks without one), L2-normalised",
            "ledger": report.ledger,
            "sequences": report.sequences,
            "frames": report.frames,
            "davis": str(davis_dir.resolve()),
            "out": str(out.resolve()),
            "checkpoint": ck.describe(),
            "source": f"{tracking.SOURCES[settings.preset]}; davisvideochallenge/davis2017-evaluation",
            "provenance": {"command": context.command, **provenance.stamp()},
        }
        return context.finish(report, Saving(target, "davis", results_dataset(report.scores, report.global_scores, soft), attrs))
    return context.finish(report)
