"""``probe decode STORE --shard i/n`` (or under torchrun): each process decodes its share.

Shard i of n decodes a contiguous range of whole store chunks (``runner.shard_range``) and saves
it as ``results/decoder-part-<i>-of-<n>``, with the settings, backend and the store's image
list. The shard that finds all n parts present, written with the same settings on the same
images, concatenates them (in image order, so the arrays equal a one-process decode bit for
bit) and hands them back for the usual ``results/decoder`` and masks JSON; the others report
which shards they are waiting for. A rerun of a shard simply replaces its part. DSM with its
colour term shards the same way (each block reads its photographs, ``decode.colour_task``), and
so do the own-size views (each block reads its images' grids beside their keys).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..analyses.decoder import Decoded, Settings
from ..analyses.decoder_blocks import as_decoded, decode_block, group_arrays, sweep_block
from ..infra.runner import Where, map_images, shard_range
from ..labels.masks import decoded_from_dataset, decoder_dataset
from .shards import gather


def part_name(i: int, n: int) -> str:
    return f"decoder-part-{i}-of-{n}"


def decode_shard(src, settings: Settings, shard: str | None, *, where: Where, backend: str, device: str, threads: int = 1,
                 on_image=None, task: tuple | None = None) -> tuple[Decoded | None, list[int]]:
    """(all parts as one ``Decoded``, []) once every shard is in, else (None, missing shards).
    ``task``: (block function, arrays) in place of the keys' decode (DSM's colour term,
    ``decode.colour_task``; it computes nothing with torch)."""
    from ..store.extract import parse_shard  # here: extract brings torch, which decoding never needs

    i, n = parse_shard(shard)
    block = int(src.manifest.get("chunk") or 16)
    a, b = shard_range(len(src.image_ids), block, (i, n))
    identity = {"settings": settings.as_dict(), "backend": backend, "image_list_sha256": src.manifest.get("image_list_sha256"),
                "images": src.image_ids}
    if b > a:
        fn, arrays = task or (partial(decode_block, settings=settings, backend=backend, device=device), {"keys": src.keys, **src.grid_arrays()})
        progress = (lambda k: [on_image() for _ in range(k)]) if on_image else None
        arrays = map_images(fn, arrays, where=where, image_range=(a, b), block=block, threads=threads, progress=progress, torch_free=task is not None)
        part = decoder_dataset(src.with_grids(as_decoded(arrays, settings), a, b), src.image_ids[a:b])
    else:  # more shards than chunks: this one has nothing to do, and says so in an empty part
        part = decoder_dataset(src.with_grids(as_decoded(_empty(settings, src.keys.sizes["patch"]), settings), a, a), [])
    part.attrs["range"] = [a, b]
    whole, missing = gather(src.store, "decoder", (i, n), part, identity)
    if whole is None:
        return None, missing
    whole.attrs["settings"] = settings.as_dict()
    return src.with_grids(decoded_from_dataset(whole)), []


def sweep_shard(src, groups: list[Settings], shard: str | None, *, where: Where, backend: str, device: str, threads: int = 1,
                on_image=None) -> tuple[list[Decoded] | None, list[int]]:
    """``probe decode-sweep --shard i/n``: this shard's images under every setting group, saved as
    one part per group (``results/decoder-sweep-g<k>-part-<i>-of-<n>``); (every group's
    ``Decoded`` over all images, []) once every shard is in, else (None, missing shards)."""
    from ..store.extract import parse_shard

    i, n = parse_shard(shard)
    block = int(src.manifest.get("chunk") or 16)
    a, b = shard_range(len(src.image_ids), block, (i, n))
    identity = {"groups": [s.as_dict() for s in groups], "backend": backend, "image_list_sha256": src.manifest.get("image_list_sha256"),
                "images": src.image_ids, "view": src.view}
    if b > a:
        fn = partial(sweep_block, groups=groups, backend=backend, device=device)
        progress = (lambda k: [on_image() for _ in range(k)]) if on_image else None
        arrays = map_images(fn, {"keys": src.keys, **src.grid_arrays()}, where=where, image_range=(a, b), block=block, threads=threads, progress=progress)
        blocks = [as_decoded(group_arrays(arrays, g), s) for g, s in enumerate(groups)]
    else:
        blocks = [as_decoded(_empty(s, src.keys.sizes["patch"]), s) for s in groups]
    wholes, missing = [], []
    for g, (s, decoded) in enumerate(zip(groups, blocks)):  # every group's part is saved before any is missed
        part = decoder_dataset(src.with_grids(decoded, a, b), src.image_ids[a:b])
        part.attrs["range"] = [a, b]
        whole, lacking = gather(src.store, f"decoder-sweep-g{g}", (i, n), part, identity)
        missing = sorted(set(missing) | set(lacking))
        if whole is not None:
            whole.attrs["settings"] = s.as_dict()
            wholes.append(src.with_grids(decoded_from_dataset(whole)))
    return (None, missing) if missing else (wholes, [])


def _empty(settings: Settings, patches: int) -> dict[str, np.ndarray]:
    from ..analyses.decoder import collate

    empty = collate([], settings, patches)
    return {name: getattr(empty, name) for name in empty.__dataclass_fields__ if name != "settings"}
