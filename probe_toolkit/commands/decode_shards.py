"""``probe decode STORE --shard i/n`` (or under torchrun): each process decodes its share.

Shard i of n decodes a contiguous range of whole store chunks (``runner.shard_range``) and saves
it as ``results/decoder-part-<i>-of-<n>``, with the settings, backend and the store's image
list. The shard that finds all n parts present, written with the same settings on the same
images, concatenates them (in image order, so the arrays equal a one-process decode bit for
bit) and hands them back for the usual ``results/decoder`` and masks JSON; the others report
which shards they are waiting for. A rerun of a shard simply replaces its part. DSM with its
colour term shards the same way (each block reads its photographs, ``decode_keys.colour_task``), and
so do the own-size views (each block reads its images' grids beside their keys).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..analyses.decoder import Decoded
from ..analyses.decoder_blocks import as_decoded, decode_block, group_arrays, sweep_block
from ..analyses.decoder_settings import Settings
from ..infra.runner import Where, map_images
from ..labels.masks import decoded_from_dataset, decoder_dataset
from .shards import gather, share


def decode_shard(
    src, settings: Settings, shard: tuple[int, int], *, where: Where, backend: str, device: str, threads: int = 1, on_image=None, task: tuple | None = None
) -> tuple[Decoded | None, list[int]]:
    """(all parts as one ``Decoded``, []) once every shard is in, else (None, missing shards).
    ``task``: (block function, arrays) in place of the keys' decode (DSM's colour term,
    ``decode_keys.colour_task``; it computes nothing with torch)."""
    fn, arrays = task or (partial(decode_block, settings=settings, backend=backend, device=device), {"keys": src.keys, **src.grid_arrays()})
    which, (a, b), computed = _share(src, shard, fn, arrays, where, threads, on_image, torch_free=task is not None)
    decoded = as_decoded(computed if computed is not None else _empty(settings, src.keys.sizes["patch"]), settings)
    identity = {"settings": settings.as_dict(), "backend": backend, "image_list_sha256": src.manifest.get("image_list_sha256"), "images": src.image_ids}
    return _gathered(src, "decoder", which, (a, b), decoded, identity)


def sweep_shard(
    src, groups: list[Settings], shard: tuple[int, int], *, where: Where, backend: str, device: str, threads: int = 1, on_image=None
) -> tuple[list[Decoded] | None, list[int]]:
    """``probe decode-sweep --shard i/n``: this shard's images under every setting group, saved as
    one part per group (``results/decoder-sweep-g<k>-part-<i>-of-<n>``); (every group's
    ``Decoded`` over all images, []) once every shard is in, else (None, missing shards)."""
    fn = partial(sweep_block, groups=groups, backend=backend, device=device)
    which, (a, b), computed = _share(src, shard, fn, {"keys": src.keys, **src.grid_arrays()}, where, threads, on_image)
    identity = {
        "groups": [s.as_dict() for s in groups],
        "backend": backend,
        "image_list_sha256": src.manifest.get("image_list_sha256"),
        "images": src.image_ids,
        "view": src.view,
    }
    wholes, missing = [], set()
    for g, s in enumerate(groups):  # every group's part is saved before any is waited for
        decoded = as_decoded(group_arrays(computed, g) if computed is not None else _empty(s, src.keys.sizes["patch"]), s)
        whole, lacking = _gathered(src, f"decoder-sweep-g{g}", which, (a, b), decoded, identity)
        wholes.append(whole)
        missing |= set(lacking)
    return (None, sorted(missing)) if missing else (wholes, [])


def _share(src, shard: tuple[int, int], fn, arrays: dict, where: Where, threads: int, on_image, torch_free: bool = False):
    """(i, n), this shard's image range (whole store chunks) and ``fn`` over it (None when the
    range is empty: more shards than chunks)."""
    block = int(src.manifest.get("chunk") or 16)
    which, (a, b) = share(shard, len(src.image_ids), block)
    if b <= a:
        return which, (a, b), None
    progress = (lambda k: [on_image() for _ in range(k)]) if on_image else None
    computed = map_images(fn, arrays, where=where, image_range=(a, b), block=block, threads=threads, progress=progress, torch_free=torch_free)
    return which, (a, b), computed


def _gathered(src, name: str, which: tuple[int, int], rng: tuple[int, int], decoded: Decoded, identity: dict) -> tuple[Decoded | None, list[int]]:
    """Save this shard's part of ``name`` (each image's grid with it); every part as one
    ``Decoded`` once all are in (in image order), else (None, the shards still missing)."""
    a, b = rng
    part = decoder_dataset(src.with_grids(decoded, a, b), src.image_ids[a:b])
    part.attrs["range"] = [a, b]
    whole, missing = gather(src.store, name, which, part, identity)
    if whole is None:
        return None, missing
    whole.attrs["settings"] = decoded.settings.as_dict()
    return src.with_grids(decoded_from_dataset(whole)), []


def _empty(settings: Settings, patches: int) -> dict[str, np.ndarray]:
    from ..analyses.decoder import collate

    empty = collate([], settings, patches)
    return {name: getattr(empty, name) for name in empty.__dataclass_fields__ if name != "settings"}
