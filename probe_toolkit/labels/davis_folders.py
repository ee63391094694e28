"""DAVIS-2017 folders (JPEGImages/480p/SEQ/*.jpg, Annotations/480p/SEQ/*.png, ImageSets/2017/SET.txt):
the sequences and their frames (no annotation opened), and the two readers of their annotations
(the first frames, for propagation; every frame, for the scorer), each writing one ledger entry
(``panels.log_read``) before it returns. The scores themselves are ``davis.py``'s."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..infra.errors import ProbeError
from ..store.cache import cache_root
from .guard import inside
from .panels import log_read


@dataclass(frozen=True)
class DavisSequence:
    name: str
    frames: list[Path]  # sorted JPEGs
    annotations: Path  # the sequence's annotation folder (opened only by the readers below)


def davis_sequences(root: str | Path, subset: str = "val", resolution: str = "480p") -> list[DavisSequence]:
    """The sequences of a DAVIS folder and their frames; checks the layout, opens no annotation."""
    root = Path(root)
    listing = root / "ImageSets" / "2017" / f"{subset}.txt"
    if not listing.is_file():
        raise ProbeError(listing, "is missing", "pass --davis with a DAVIS-2017 folder (JPEGImages/, Annotations/, ImageSets/2017/)")
    names = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    if not names:
        raise ProbeError(listing, "lists no sequence", "list one sequence name per line")
    out = []
    for name in names:
        folder = root / "JPEGImages" / resolution / name
        frames = sorted(folder.glob("*.jpg")) if folder.is_dir() else []
        if not frames:
            raise ProbeError(folder, "holds no frames (*.jpg)", f"restore the frames of {name}, or remove it from {listing.name}")
        if len(frames) < 2:
            raise ProbeError(folder, "holds a single frame; there is nothing to propagate to", f"remove {name} from {listing.name}")
        annotations = root / "Annotations" / resolution / name
        if not (annotations / f"{frames[0].stem}.png").is_file():
            raise ProbeError(annotations / f"{frames[0].stem}.png", "is missing (the first frame's annotation)", "restore the sequence's Annotations folder")
        out.append(DavisSequence(name, frames, annotations))
    return out


def _davis_read(
    root: Path, files: list[Path], purpose: str, checkpoint: str | None, cache: str | Path | None, command: str | None, subset: str
) -> tuple[list[tuple[np.ndarray, np.ndarray | None]], str]:
    """Read and decode ``files`` inside the guard, then write the ledger entry: (indexed array, palette) each."""
    inside.active = True
    try:
        raw = [f.read_bytes() for f in files]
        decoded = [_indexed(data, f) for f, data in zip(files, raw)]  # a bad annotation is refused before the ledger entry: nothing handed out
    except OSError as error:
        raise ProbeError(error.filename, f"cannot be read ({error.strerror})", "restore the DAVIS annotations") from None
    finally:
        inside.active = False
    digest = hashlib.sha256()
    for f, data in zip(files, raw):
        digest.update(f"{f.parent.name}/{f.name}\n".encode())
        digest.update(hashlib.sha256(data).digest())
    names = [f"{f.parent.name}/{f.name}" for f in files]
    entry = log_read(
        cache_root(cache),
        panel=f"davis:{root.resolve()}",
        role="val" if subset != "test-dev" else "test",
        annotations=str((root / "Annotations").resolve()),
        annotation_sha256=digest.hexdigest(),
        names=names,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=None,
    )
    return decoded, entry.id


def _indexed(data: bytes, where: Path) -> tuple[np.ndarray, np.ndarray | None]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.mode not in ("P", "L"):  # converted, its colours' grey levels would be read as object ids
                raise ProbeError(where, f"is an image of mode {image.mode}, not an indexed (palette) annotation PNG", "restore the DAVIS annotations")
            palette = image.getpalette() if image.mode == "P" else None
            array = np.asarray(image)
    except OSError as error:
        raise ProbeError(where, f"is not a readable annotation PNG ({error})", "restore the DAVIS annotations") from None
    return array.copy(), (np.asarray(palette, np.uint8).reshape(-1, 3) if palette is not None else None)


def read_first_annotations(
    root: str | Path,
    sequences: Sequence[DavisSequence],
    *,
    purpose: str = "propagate: first frame",
    checkpoint: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
    subset: str = "val",
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray | None]], str]:
    """Each sequence's first-frame annotation (indexed array, palette): the only label propagation reads; one ledger entry."""
    files = [s.annotations / f"{s.frames[0].stem}.png" for s in sequences]
    decoded, entry = _davis_read(Path(root), files, purpose, checkpoint, cache, command, subset)
    return {s.name: found for s, found in zip(sequences, decoded)}, entry


def read_davis_annotations(
    root: str | Path,
    sequences: Sequence[DavisSequence],
    *,
    purpose: str = "propagate: score",
    checkpoint: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
    subset: str = "val",
) -> tuple[dict[str, list[np.ndarray]], str]:
    """Every frame's annotation of every sequence, for the scorer only; one ledger entry."""
    files: list[Path] = []
    for s in sequences:
        for frame in s.frames:
            path = s.annotations / f"{frame.stem}.png"
            if not path.is_file():
                raise ProbeError(path, "is missing", "the scorer needs every frame's annotation (restore the Annotations folder)")
            files.append(path)
    decoded, entry = _davis_read(Path(root), files, purpose, checkpoint, cache, command, subset)
    out: dict[str, list[np.ndarray]] = {}
    k = 0
    for s in sequences:
        out[s.name] = [decoded[k + i][0] for i in range(len(s.frames))]
        k += len(s.frames)
    return out, entry
