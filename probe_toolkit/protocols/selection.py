"""Which block a run reads (``probe <protocol> --block B``, ``probe.run(..., block=B)``), resolved
and checked before any label is read.

A block is 0-based, as DINOv2's and DINOv3's ``get_intermediate_layers`` and ``probe extract
--blocks`` count them (negative: from the end); None is the store's last block, what every store
holds. A run of a protocol that reads a store is refused in one line where the store holds none
of the arrays the protocol reads (``wanted``: ``Reads.arrays`` and what ``probe extract --for``
stores for it, any of them, at the run's ``--view``; every block's attention statistics serve every
block) at that block, naming the whole extraction that adds it (``extraction``). A protocol that
reads a panel's tokens from the store beside its source (``Reads.panel_sibling``), where the source
holds none of its views, is checked on the panels' stores beside it instead (``_siblings_hold``);
a panel with no store beside is left to the read, whose line names its extraction at the block
(``commands.panel_stores.panel_extract``). A protocol that reads
a checkpoint or masks has no block to choose. The
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


STATS = "attention_stats"  # the plan's name for every block's attention statistics (``--attention stats``; store.plan)


def wanted(protocol, view: str | None) -> tuple[str, ...]:
    """The arrays a run of ``protocol`` could read (plain last-block names, any of them): those it
    declares (``Reads.arrays``, and what ``probe extract --for`` stores for it), at the run's
    ``view`` where its settings have one (declared at their default view)."""
    from ..store import layout, views

    names = tuple(dict.fromkeys((*protocol.reads.arrays, *(protocol.reads.stores or ()))))
    default = protocol.settings.defaults().get("view")
    if view is None or not isinstance(default, str):
        return names
    default, view = views.canonical(default), views.canonical(str(view))
    return tuple(dict.fromkeys(name[: -len(default)] + view for name in names if layout.view_of(name) == default))


def _holds_views(store: Path, names: tuple[str, ...]) -> bool:
    """Whether ``store`` holds any of ``names``' kinds at its view, at any block."""
    from ..store import layout

    present = {(a.kind, a.view) for a in map(layout.parse, _array_names(store))}
    return any((w.kind, w.view) in present for w in map(layout.parse, names))


def held(store: Path, names: tuple[str, ...], block: int, depth: int) -> bool:
    """Whether ``store`` holds any of ``names`` (plain last-block names) at ``block`` (0-based)."""
    from ..store import layout

    present = [layout.parse(n) for n in _array_names(store)]
    last = block == depth - 1
    for name in names:
        wanted = layout.parse(name)
        same = [a for a in present if a.view == wanted.view]
        if wanted.kind in layout.BLOCKED and any(a.kind == wanted.kind for a in same):
            return True
        if wanted.kind == STATS and any(a.kind in layout.BLOCKED and a.kind != "attention_blocks" for a in same):
            return True  # the statistics hold every block
        if wanted.kind == "attention" and not last and any(a.kind == "attention_blocks" for a in same):
            return True
        if any(a.kind == wanted.kind and a.block == (None if last else block) for a in same):
            return True
    return False


def resolve(protocol, inputs: dict[str, Any], block: Any, view: str | None = None) -> int | None:
    """The 0-based block the run reads, checked against every store it reads (see the module's text);
    ``view``: the run's view, where the protocol's settings have one."""
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
                f"{store} holds a {depth}-block network: block {block} is not one of 0..{depth - 1}",
                f"pass a 0-based block index, e.g. block={depth - 1} (the last)",
            )
        index = int(block) % depth
        names = wanted(protocol, view)
        if protocol.reads.panel_sibling and names and not _holds_views(store, names):
            _siblings_hold(protocol, inputs, store, index, depth, names)
            names = ()  # read from the panels' stores beside it (commands.panel_stores), checked just now where they exist
        if names and not held(store, names, index, depth):
            raise SettingError(
                "block",
                f"{store} holds none of what {protocol.name} reads ({', '.join(names)}) at block {index}",
                f"extract it first: `{extraction(protocol, store, index, names, view)}`",
            )
        resolved = index if resolved is None else resolved
    return resolved if resolved is not None else int(block)


def _siblings_hold(protocol, inputs: dict[str, Any], store: Path, block: int, depth: int, names: tuple[str, ...]) -> None:
    """Refused in one line where a panel's store beside ``store`` (``<network>-panel-<panel>.zarr``,
    which a protocol with ``Reads.panel_sibling`` reads when ``store`` lacks its views) holds them
    at some block but not at ``block``: the line names every such store and the ``probe extract
    --panel ... --blocks`` that adds the block to each (joined with ``&&``). A panel with no store
    beside is left to the read, whose line names the extraction that writes it."""
    import zarr

    from ..commands.panel_stores import _sibling, panel_extract
    from ..store import layout

    short, fixes = [], []
    for panel in dict.fromkeys(str(inputs[i.name]) for i in protocol.inputs if i.panel and isinstance(inputs.get(i.name), (str, Path))):
        beside = _sibling(store, panel)
        if beside.resolve() == store.resolve() or not (beside / "zarr.json").is_file() or not _holds_views(beside, names):
            continue
        if held(beside, names, block, depth):
            continue
        present = {(a.kind, a.view) for a in map(layout.parse, _array_names(beside))}
        views = list(dict.fromkeys(w.view for w in map(layout.parse, names) if (w.kind, w.view) in present))
        meta = dict(zarr.open_group(beside, mode="r").attrs).get("manifest") or {}
        short.append(str(beside))
        fixes.append(panel_extract(meta, beside, panel, views, into=beside, block=block))
    if short:
        plural = len(short) > 1
        raise SettingError(
            "block",
            f"{', '.join(short)} (the panel {'stores' if plural else 'store'} beside {store}) {'hold' if plural else 'holds'} none of what "
            f"{protocol.name} reads ({', '.join(names)}) at block {block}",
            f"extract it first: `{' && '.join(fixes)}`",
        )


def _array_names(store: Path) -> list[str]:
    import zarr

    from ..store.group import array_names

    return array_names(zarr.open_group(store, mode="r", use_consolidated=False))


def extraction(protocol, store: Path, block: int, names: tuple[str, ...], view: str | None) -> str:
    """The ``probe extract`` that adds what the run reads at ``block`` to ``store``, with the store's
    checkpoint, images and settings (CKPT and DIR where its images cannot be found): ``--for`` the
    protocol at its own views; at another view, that view's arrays (keys as ``--facets k``, attention
    as its statistics, which hold every block)."""
    import shlex

    import zarr

    from ..store import layout, views
    from ..store.hints import extract_arguments
    from ..store.sources import image_folder_or_none

    meta = dict(zarr.open_group(store, mode="r").attrs).get("manifest") or {}
    default = protocol.settings.defaults().get("view")
    own_views = view is None or not isinstance(default, str) or views.canonical(str(view)) == views.canonical(default)
    target = layout.view_of(names[0])
    source = image_folder_or_none(store, meta)
    if source is not None and Path(source).is_dir():
        args = extract_arguments(meta, [target], source)
        for flag in ("--views", "--attention"):  # chosen below
            if flag in args:
                at = args.index(flag)
                del args[at : at + 2]
    else:
        args = ["CKPT", "--images", "DIR"]
    kinds = {layout.parse(n).kind for n in names}
    if own_views:
        chosen = ["--for", protocol.name, "--blocks", str(block)]
    elif kinds & {"attention", "attention_blocks", STATS}:
        chosen = ["--views", target, "--attention", "stats"]
    else:
        chosen = ["--views", target, "--blocks", str(block), *(["--facets", "k"] if "keys" in kinds else [])]
    return "probe extract " + shlex.join([*args, *chosen, "--store", str(store)])
