"""zstd chunk encoding that lets the forward pass run meanwhile.

The store's arrays are zstd-compressed (``ZstdCodec``, level 1). numcodecs' zstd, which zarr's
codec calls, compresses while holding Python's GIL, and the forward pass of the next run, whose
every torch call needs the GIL, waits for every chunk compressed (measured: docs/history.md). The ``zstandard`` package compresses the same way
(the same frame, the same bytes, decoded by any zstd reader) with the GIL released. Only the
encoding changes: decoding, the metadata (``"name": "zstd"``) and the stored bytes stay as
zarr writes them; without ``zstandard`` installed zarr's own encoder runs.

``compressors`` is the chain every array of a new store is written with: zstd, then zarr v3's
``crc32c`` of the compressed bytes, which ``store.integrity`` checks on every read.
"""

from __future__ import annotations

from functools import lru_cache

import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec


class ZstdReleasingGil(ZstdCodec):
    """zarr's ``zstd`` codec, encoding through ``zstandard`` (GIL released)."""

    def _encode_sync(self, chunk_bytes, chunk_spec):
        try:
            import zstandard
        except ImportError:  # pragma: no cover  (a dependency; zarr's own encoder otherwise)
            return super()._encode_sync(chunk_bytes, chunk_spec)
        compressor = zstandard.ZstdCompressor(level=self.level, write_checksum=self.checksum, write_content_size=True)
        return chunk_spec.prototype.buffer.from_bytes(compressor.compress(chunk_bytes.as_numpy_array()))


@lru_cache(maxsize=1)
def encode_without_gil() -> None:
    """Make ``ZstdReleasingGil`` the process's ``zstd`` implementation (once; reading is unchanged)."""
    name = f"{ZstdReleasingGil.__module__}.{ZstdReleasingGil.__qualname__}"
    zarr.registry.register_codec("zstd", ZstdReleasingGil, qualname=name)
    zarr.config.set({"codecs.zstd": name})


def compressors(level: int = 1) -> list:
    """What every array of a new store is compressed with: zstd (above), then a crc32c of the compressed bytes."""
    return [ZstdCodec(level=level), Crc32cCodec()]
