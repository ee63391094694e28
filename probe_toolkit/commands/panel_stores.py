"""Which store holds a panel's images: ``probe linear`` and ``probe knn`` read labelled panels
from stores, and neither reads a label to find them.

A store holds a panel's images when every image of the panel's folder is a finished image of it,
and the store was extracted from that folder or from one above it (ids then carry the
sub-folder: one store extracted from ``data/`` serves panels on ``data/train`` and ``data/val``).
``probe extract CKPT --panel NAME`` writes ``<network>-panel-NAME.zarr`` beside the checkpoint's
other stores; when the STORE given lacks a panel's images, that sibling of the same checkpoint
and network is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..infra.errors import ProbeError
from ..labels.panels import Panel
from ..store import cache, images

if TYPE_CHECKING:
    import xarray as xr

    from ..store.direct import StoreData

Level = Literal["patch", "image"]


@dataclass
class Source:
    """One STORE argument: where each panel's tokens are, and what to call it in the table."""

    store: Path  # the store given; results go here
    name: str
    manifest: dict[str, Any]
    panel_stores: dict[str, tuple[xr.Dataset | StoreData, list[str]]] = field(default_factory=dict)  # panel → (dataset, its ids there)


def store_name(manifest: dict[str, Any]) -> str:
    checkpoint = manifest.get("checkpoint", {})
    converted = " converted" if checkpoint.get("converted") else ""
    return f"{Path(str(checkpoint.get('path', '?'))).stem} ({manifest.get('network', '?')}{converted})"


def _sibling(store: Path, panel: str) -> Path:
    base = store.name.removesuffix(".zarr").split("-panel-")[0]
    return store.parent / f"{base}-panel-{panel}.zarr"


def panel_extract(meta: dict[str, Any], store: Path, panel: str, views: Sequence[str], into: str | Path | None = None, block: int | None = None) -> str:
    """The ``probe extract`` that writes a panel's images into ``store``'s panel sibling, with the
    store's own settings (checkpoint, network, interpolation, ...): the command every "this store
    lacks the panel's images" line prints, so that the rerun finds them where it looks (``into``:
    another store instead). ``block``: the block the run reads (None: the run's own,
    ``cache.run_block``); where it is not the network's last, ``--blocks`` adds it."""
    import shlex

    from ..store.hints import extract_arguments

    args = extract_arguments(meta, [str(v) for v in views], "PANEL")
    at = args.index("--images")
    args[at : at + 2] = ["--panel", panel]
    block, depth = cache.run_block() if block is None else block, (meta.get("arch") or {}).get("depth")
    if block is not None and depth is not None and -int(depth) <= int(block) < int(depth) and int(block) % int(depth) != int(depth) - 1:
        args += ["--blocks", str(int(block) % int(depth))]
    return "probe extract " + shlex.join([*args, "--store", str(into or _sibling(Path(store), panel))])


def _same_network(a: dict[str, Any], b: dict[str, Any], views: Sequence[str] = ()) -> bool:
    """A store and its panel sibling are read as one set of tokens (``store/pairing.py``)."""
    from ..store.pairing import differences

    return not differences(a, b, views)


def panel_ids(panel: Panel) -> list[str]:
    """The panel's images as paths relative to its folder (= the COCO ``file_name``s); no label read.
    A VOC segmentation panel's are those its split file lists (``ImageSets/Segmentation``: ids, not labels),
    an NYU panel's those of its ``nyu_<split>.txt``."""
    from ..labels import nyu, voc_layout

    if panel.kind == voc_layout.KIND:
        return voc_layout.split_images(panel)
    if panel.kind == nyu.KIND:
        return nyu.split_images(panel)
    return images.image_ids(panel.images)


def panels_ids(panels: Sequence[Panel]) -> list[list[str]]:
    """Each panel's ``panel_ids``, a folder listed once: panels whose images are their whole folder
    (COCO, class folders) and share it get the same list (100 k ids are 100 k Python strings)."""
    from ..labels import nyu, voc_layout

    def listing(panel: Panel) -> tuple[str, Any]:  # what decides the ids a panel lists
        return ("split", panel.name) if panel.kind in (voc_layout.KIND, nyu.KIND) else ("folder", panel.images)

    listed: dict[tuple[str, Any], list[str]] = {}
    for panel in panels:
        if listing(panel) not in listed:
            listed[listing(panel)] = panel_ids(panel)
    return [listed[listing(panel)] for panel in panels]


def wanted_ids(ds: xr.Dataset | StoreData, panel: Panel, ids: Sequence[str]) -> list[str] | None:
    """The ids a panel's images have in this store, or None when it was extracted from another folder.

    A store records the folder it was extracted from (``image_source``). When that folder still
    exists, it must be the panel's folder or hold it (ids then carry the sub-folder), so that two
    panels whose folders share file names are never confused; a store without a usable record is
    matched on the ids alone.
    """
    from ..store.sources import image_folder_or_none

    prefix = ""
    meta = cache.manifest(ds)
    source = image_folder_or_none(ds.attrs["store"], meta) if ds.attrs.get("store") else meta.get("image_source")  # never the current directory's
    if source and Path(source).is_dir():
        source_dir, panel_dir = Path(source).resolve(), panel.images.resolve()
        if panel_dir != source_dir:
            if not panel_dir.is_relative_to(source_dir):
                return None
            prefix = panel_dir.relative_to(source_dir).as_posix() + "/"
    return [prefix + i for i in ids]


def image_sizes(ds: xr.Dataset | StoreData, ids: Sequence[str]) -> list[tuple[int, int]]:
    """(width, height) of each image's original, as the store recorded them (read with xarray or zarr alone)."""
    widths, heights = (ds[name].sel(image=list(ids)).values.astype(int).tolist() for name in ("image_width", "image_height"))
    return list(zip(widths, heights))


def ids_in(ds: xr.Dataset | StoreData, panel: Panel, ids: Sequence[str]) -> list[str] | None:
    """The store ids of a panel's images when this store holds all of them (finished), else None."""
    wanted = wanted_ids(ds, panel, ids)
    return wanted if wanted is not None and not set(wanted) - set(ds["image"].values.tolist()) else None


def locate(
    store: str | Path,
    panels: Sequence[tuple[Panel, list[str]] | tuple[Panel, list[str], Sequence[str]]],
    level: Level,
    views: Sequence[str] = ("224",),
    plain: bool = False,
) -> Source:
    """The datasets holding each panel's images for one STORE argument, or a ProbeError listing the missing.

    Each must hold the level's array in one of ``views`` (the error names the first). A panel given
    with its own views (a third element) is read from the store, or its sibling, that holds every
    one of them for it: when two panels share an image folder (VOC's train and val in one
    JPEGImages/), the first store holding the images may not hold the view this panel needs. ``plain``:
    the datasets are read with zarr alone (``store.direct``), for a protocol that only reads arrays
    at images (``StoreArray.sel``)."""
    store = Path(store)
    ds = cache.open_store(store, plain=plain)
    meta = cache.manifest(ds)
    source = Source(store, store_name(meta), meta)
    for panel, ids, *own in panels:
        candidates = [ds]
        sibling = _sibling(store, panel.name)
        unlike = ""
        if sibling.resolve() != store.resolve() and (sibling / "zarr.json").is_file():
            other = cache.open_store(sibling, plain=plain)
            from ..store.pairing import differences

            unlike = "; ".join(differences(meta, cache.manifest(other), views))
            if not unlike:
                candidates.append(other)
        kind = "tokens" if level == "patch" or not meta["arch"].get("class_token") else "cls_tokens"
        holding = [(c, found) for c in candidates if (found := ids_in(c, panel, ids)) is not None]
        complete = [(c, found) for c, found in holding if not own or all(cache.holds(c, f"{kind}_{v}") for v in own[0])]  # at the run's block
        if holding:
            source.panel_stores[panel.name] = (complete or holding)[0]
        else:
            wanted = wanted_ids(ds, panel, ids)
            missing = sorted(set(wanted) - set(ds["image"].values.tolist())) if wanted is not None else []
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            what = (
                f"lacks {len(missing)} of the {len(ids)} images of panel {panel.name!r} ({shown})"
                if missing
                else f"was extracted from another folder than the one of panel {panel.name!r} ({panel.images})"
            )
            beside = f"the {sibling.name} beside it was extracted otherwise ({unlike})" if unlike else f"no {sibling.name} of the same network beside it holds them"
            extract = panel_extract(meta, store, panel.name, own[0] if own else views)
            raise ProbeError(store, f"{what}, and {beside}", f"move {sibling} away, then run `{extract}`" if unlike else f"run `{extract}`")
        held = source.panel_stores[panel.name][0]
        cache.require(held, next((f"{kind}_{v}" for v in views if cache.holds(held, f"{kind}_{v}")), f"{kind}_{views[0]}"))
    return source
