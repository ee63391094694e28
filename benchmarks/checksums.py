"""Checksums: reading every chunk of a store with probe's crc32c check against a plain read of the same data, in one run.

A new store's arrays end their codec chain with zarr v3's ``crc32c`` (``store.codec.compressors``)
and are read through ``integrity.CheckedPipeline``. The baseline is the same tokens written with zstd
alone and read through zarr's default pipeline: what a store cost to read before checksums. Both
arrays hold the same random float16 tokens (image, patch, channel) in chunks of ``--chunk`` images,
written at the same zstd level; rounds alternate and medians are compared. The ratio is checked
seconds / plain seconds (1.0: the checksum costs nothing measurable). A third timing reads the
checksummed array through zarr's own pipeline, so the checksum's cost and the checked pipeline's
are told apart.

    python benchmarks/checksums.py [--images 512] [--patches 196] [--channels 384] [--chunk 64] [--rounds 3] [--record]

``--record`` appends the JSON line to ``benchmarks/records/checksums.jsonl``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from probe_toolkit.store import codec, integrity

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit, header, options  # noqa: E402  (the processor's name and the record, as every benchmark writes them)

RECORDS = Path(__file__).resolve().parent / "records" / "checksums.jsonl"
DEFAULT_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"


def write(path: Path, data: np.ndarray, chunk: int, compressors: list) -> int:
    """The array as a store's tokens are written; its bytes on disk."""
    array = zarr.create_array(
        str(path),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(chunk, *data.shape[1:]),
        compressors=compressors,
        fill_value=np.nan,
        dimension_names=["image", "patch", "channel"],
    )
    array[:] = data
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_all(path: Path, pipeline: str, chunk: int) -> float:
    """Seconds to read every chunk (one chunk at a time, as the runners read blocks) through ``pipeline``."""
    with zarr.config.set({"codec_pipeline.path": pipeline}):
        array = zarr.open_array(str(path), mode="r")
        start = time.perf_counter()
        total = 0.0
        for lo in range(0, array.shape[0], chunk):
            total += float(np.asarray(array[lo : lo + chunk])[0, 0, 0])
        return time.perf_counter() - start


def main() -> None:
    args = options(__doc__, record=RECORDS, images=512, patches=196, channels=384, chunk=64, rounds=3)
    integrity.install()  # registers CheckedPipeline (and makes it the default: each read below names its own)
    checked_pipeline = f"{integrity.CheckedPipeline.__module__}.{integrity.CheckedPipeline.__qualname__}"
    rng = np.random.default_rng(0)
    data = rng.normal(size=(args.images, args.patches, args.channels)).astype(np.float16)
    folder = Path(tempfile.mkdtemp(prefix="probe-checksums-"))
    try:
        checked_bytes = write(folder / "checked", data, args.chunk, codec.compressors())
        plain_bytes = write(folder / "plain", data, args.chunk, [ZstdCodec(level=1)])
        same = np.array_equal(np.asarray(zarr.open_array(str(folder / "checked"))[:]), np.asarray(zarr.open_array(str(folder / "plain"))[:]))
        times: dict[str, list[float]] = {"plain": [], "checked": [], "crc_only": []}
        for r in range(args.rounds + 1):  # round 0 warms the page cache up
            t_plain = read_all(folder / "plain", DEFAULT_PIPELINE, args.chunk)
            t_checked = read_all(folder / "checked", checked_pipeline, args.chunk)
            t_crc = read_all(folder / "checked", DEFAULT_PIPELINE, args.chunk)
            if r:
                times["plain"].append(t_plain)
                times["checked"].append(t_checked)
                times["crc_only"].append(t_crc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    plain_s, checked_s, crc_s = (statistics.median(times[k]) for k in ("plain", "checked", "crc_only"))
    megabytes = data.nbytes / 1e6
    print(
        f"{args.images} images × {args.patches} patches × {args.channels} channels float16 ({megabytes:.1f} MB), chunks of {args.chunk}; "
        f"{os.cpu_count()} cores, {cpu_model()}"
    )
    print(f"  plain (zstd, zarr's pipeline)            {plain_s:7.3f} s   {megabytes / plain_s:8.1f} MB/s   rounds {[round(t, 3) for t in times['plain']]}")
    print(f"  checked (zstd + crc32c, CheckedPipeline) {checked_s:7.3f} s   {megabytes / checked_s:8.1f} MB/s   rounds {[round(t, 3) for t in times['checked']]}")
    print(f"  crc32c, zarr's pipeline                  {crc_s:7.3f} s   {megabytes / crc_s:8.1f} MB/s   rounds {[round(t, 3) for t in times['crc_only']]}")
    print(
        f"  ratio {checked_s / plain_s:.3f} (checked seconds / plain seconds; crc32c in zarr's pipeline {crc_s / plain_s:.3f}); "
        f"{checked_bytes - plain_bytes} bytes more on disk (checksums and their metadata); same values {same}"
    )
    emit(
        {
            **header("checksums"),
            "images": args.images,
            "patches": args.patches,
            "channels": args.channels,
            "chunk": args.chunk,
            "rounds": args.rounds,
            "plain_s": round(plain_s, 4),
            "checked_s": round(checked_s, 4),
            "crc_zarr_pipeline_s": round(crc_s, 4),
            "ratio": round(checked_s / plain_s, 3),
            "checksum_bytes": checked_bytes - plain_bytes,
            "same_values": bool(same),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
