"""Synthetic stores for the analysis tests, written through the cache's own ``create_store``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probe_toolkit.store.create import create_store


def manifest(chunk: int, class_token: bool = False, dtype: str = "float16") -> dict:
    return {
        "toolkit_version": "0.1.0",
        "git_revision": "test",
        "checkpoint": {"path": "synthetic.pth", "sha256": "0" * 64, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": 384, "depth": 12, "heads": 6, "patch": 16, "class_token": class_token, "final_norm": class_token, "mlp_hidden": 1536},
        "views": [224, 96],
        "interpolation": "dino",
        "attention": "last",
        "dtype": dtype,
        "chunk": chunk,
        "image_list_sha256": "1" * 64,
        "n_images": 0,
        "libraries": {},
        "date": "2025-01-01",
    }


DIMS = {
    "tokens_224": ("patch_224", "channel"),
    "tokens_96": ("patch_96", "channel"),
    "attention_224": ("head", "query", "key"),
    "attention_blocks_224": ("block", "head", "query", "key"),
}


def make_store(
    path: Path, arrays: dict[str, np.ndarray], chunk: int = 4, class_token: bool = False, failed: np.ndarray | None = None, chunks_written: int | None = None
) -> Path:
    """A store holding ``arrays`` (each with a leading image axis); all chunks written unless
    ``chunks_written`` says how many (an extraction still running)."""
    n = len(next(iter(arrays.values())))
    meta = manifest(chunk, class_token)
    meta["n_images"] = n
    ids = [f"img{i:05d}.jpg" for i in range(n)]
    writer = create_store(path, meta, ids, {name: (DIMS[name], value.shape[1:]) for name, value in arrays.items()})
    failed = np.zeros(n, dtype=bool) if failed is None else failed
    for start in range(0, n, chunk)[:chunks_written]:
        stop = min(start + chunk, n)
        sizes = np.tile([480, 640], (stop - start, 1))
        writer.write(start, {name: value[start:stop] for name, value in arrays.items()}, sizes, failed[start:stop])
    return Path(path)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)
