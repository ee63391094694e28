"""Which block a run reads (``probe <protocol> --block B``, ``probe.run(..., block=B)``), resolved
and checked before any label is read.

A block is 0-based, as DINOv2's and DINOv3's ``get_intermediate_layers`` and ``probe extract
--blocks`` count them (negative: from the end); None is the store's last block, what every store
holds. A run of a protocol that reads a store is refused in one line where the store holds none
of the arrays the protocol reads (``Reads.arrays``, any of them) at that block, naming the
extraction that adds it; a protocol that reads a checkpoint or masks has no block to choose. The
record says which block it read (``selection``: the resolved index, the last where none was
asked and the store's network is known). Within the run, ``store.cache.require`` reads that block
where the protocol names none (``cache.reading_block``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..infra.settings import SettingError


def _stores(inputs: dict[str, Any]) -> list[Path]:
    found = inputs.get("stores") if inputs.get("stores") is not None else [inputs.get("store")]
    return [Path(s) for s in (found if isinstance(found, (list, tuple)) else [found]) if isinstance(s, (str, Path))]


def _depth(store: Path) -> int | None:
    import zarr

    if not (store / "zarr.json").is_file():
        return None
    depth = ((dict(zarr.open_group(store, mode="r").attrs).get("manifest") or {}).get("arch") or {}).get("depth")
    return int(depth) if depth is not None else None


def held(store: Path, names: tuple[str, ...], block: int, depth: int) -> bool:
    """Whether ``store`` holds any of ``names`` (plain last-block names) at ``block`` (0-based)."""
    import zarr

    from ..store import layout
    from ..store.group import array_names

    present = [layout.parse(n) for n in array_names(zarr.open_group(store, mode="r", use_consolidated=False))]
    last = block == depth - 1
    for name in names:
        wanted = layout.parse(name)
        same = [a for a in present if a.view == wanted.view]
        if wanted.kind in layout.BLOCKED and any(a.kind == wanted.kind for a in same):
            return True
        if wanted.kind == "attention" and not last and any(a.kind == "attention_blocks" for a in same):
            return True
        if any(a.kind == wanted.kind and a.block == (None if last else block) for a in same):
            return True
    return False


def resolve(protocol, inputs: dict[str, Any], block: Any) -> int | None:
    """The 0-based block the run reads, checked against every store it reads (see the module's text)."""
    stores = _stores(inputs) if protocol.source in ("store", "stores") else []
    depths = [d for d in (_depth(s) for s in stores) if d is not None]
    if block is None:
        return depths[0] - 1 if len(stores) == 1 and depths else None
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise SettingError("block", f"block {block!r} is not a whole number", "pass a 0-based block index, e.g. block=11")
    if protocol.source not in ("store", "stores"):
        raise SettingError("block", f"{protocol.name} reads a {protocol.source}, not a store's blocks (block {block})", "drop block")
    resolved = None
    for store, depth in ((s, _depth(s)) for s in stores):
        if depth is None:
            continue
        if not -depth <= int(block) < depth:
            raise SettingError(
                "block",
                f"{store} holds a network of {depth} blocks: block {block} is not one of 0..{depth - 1}",
                f"pass a 0-based block index, e.g. block={depth - 1} (the last)",
            )
        index = int(block) % depth
        names = protocol.reads.arrays
        if names and not held(store, names, index, depth):
            from ..store.layout import view_of

            views = sorted({view_of(n) for n in names})
            raise SettingError(
                "block",
                f"{store} holds none of what {protocol.name} reads ({', '.join(names)}) at block {index}",
                f"extract it first: probe extract CKPT --images DIR --store {store} --views {views[0]} --blocks {index} (or --for {protocol.name} --blocks {index})",
            )
        resolved = index if resolved is None else resolved
    return resolved if resolved is not None else int(block)
