"""Before a protocol reads a panel's labels: does the store hold the panel's images?

A store that holds none of them would be scored on nothing and print a plausible 0.00 (every
COCO metric of an empty match); that run is refused here, before any label is read and before
any work. The check lists the panel's image folder only (no annotation is opened): a panel's
images are held when their ids in the store (``commands.panel_stores.wanted_ids``: the
sub-folder prefix when the store was extracted from a folder above the panel's) or, for a store
extracted elsewhere, their file names are finished images of the store (or, for a protocol that
reads a panel's tokens from there, of the store's sibling ``<network>-panel-<panel>.zarr`` of the
same network, which ``probe extract --panel`` writes). The coverage found goes
into the run's record beside its scores. A store holding only part of the panel is refused too,
unless the caller allows it (``allow_partial``, ``--allow-partial``): the scores would then
describe a subset the user did not choose, and the record says which share it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from ..infra.settings import SettingError


def _held(ds, found, ids) -> int:
    """How many of a panel's images ``ds`` holds: by their ids there, else by file name."""
    from ..commands.panel_stores import wanted_ids

    held_ids = {str(i) for i in ds["image"].values.tolist()}
    wanted = wanted_ids(ds, found, ids)
    held = len(set(wanted) & held_ids) if wanted is not None else 0
    if not held:  # a store extracted from another folder: matched by file name, as the label read matches
        names = {Path(i).name for i in held_ids}
        held = sum(Path(i).name in names for i in ids)
    return held


def panel_coverage(
    store: str | Path,
    panel: str,
    cache_dir: str | Path | None = None,
    allow_partial: bool = False,
    sibling: bool = False,
    views: tuple[str, ...] = (),
    block: int | None = None,
) -> dict[str, Any]:
    """``{"panel", "panel_images", "held"}`` for a store and a registered panel, or a ProbeError
    when the store holds none of the panel's images (or only some, unless ``allow_partial``).
    ``sibling``: the protocol reads the panel's tokens from the store's panel sibling when the
    store lacks them (``Reads.panel_sibling``), so the sibling's images count too. ``views``: those
    the protocol reads (the fix extracts them; none: the store's own), at ``block`` (the run's)."""
    from ..commands.panel_stores import _same_network, _sibling, panel_extract, panel_ids
    from ..labels.panels import get_panel
    from ..store import cache

    found = get_panel(panel, cache_dir)
    if found.kind == "navi":  # its views are cut by its labels, so the network runs on them after the ledger entry: no store holds them
        return {"panel": panel, "panel_images": None, "held": None}
    if found.kind == "classes" or found.images is None or not Path(found.images).is_dir():
        return {"panel": panel, "panel_images": None, "held": None}  # the command's own checks name what is wrong
    ids = panel_ids(found)
    ds = cache.open_store(store, plain=True)
    held = _held(ds, found, ids)
    beside = _sibling(Path(store), panel)  # `probe extract --panel` writes the panel's images beside the store
    if sibling and held < len(ids) and beside.resolve() != Path(store).resolve() and (beside / "zarr.json").is_file():
        other = cache.open_store(beside, plain=True)
        if _same_network(cache.manifest(ds), cache.manifest(other)):
            held = max(held, _held(other, found, ids))
    meta = cache.manifest(ds)
    extract = f"`{panel_extract(meta, Path(store), panel, [str(v) for v in views or meta.get('views', [])], block=block)}`"
    then = "then rerun" if sibling else f"then pass {beside} instead"  # a protocol that reads the sibling finds it there itself
    if ids and not held:
        raise ProbeError(
            store,
            f"holds none of the {len(ids)} images of panel {panel!r} ({found.images}); its scores would describe no image",
            f"extract them first: {extract}, {then}",
        )
    if ids and held < len(ids) and not allow_partial:
        raise SettingError(
            "allow_partial",
            f"holds {held} of the {len(ids)} images of panel {panel!r} ({found.images}); its scores would describe only those",
            f"extract the panel's images ({extract}, {then}) or pass allow_partial to score the {held} held",
            store,
        )
    return {"panel": panel, "panel_images": len(ids), "held": held}


def current_photographs(store: str | Path, panel: str, cache_dir: str | Path | None = None) -> None:
    """Before a protocol pairs a store's features with a panel's labels: every panel image the
    store (or its panel sibling of the same network, which the protocols may read) holds is still the file it was
    extracted from (``store.sources.changed``: size and mtime, the sha256 where they moved). A
    photograph edited in place would be scored as its old features against its new labels."""
    import numpy as np

    from ..commands.panel_stores import _same_network, _sibling, panel_ids, wanted_ids
    from ..infra.names import lookup
    from ..labels.panels import get_panel
    from ..store import cache
    from ..store.sources import Pairs, changed, check_current, image_folder_or_none

    found = get_panel(panel, cache_dir)
    if found.images is None or not Path(found.images).is_dir():
        return  # the command's own checks name what is wrong
    ids = panel_ids(found)
    candidates = {Path(store): cache.open_store(store, plain=True)}  # each store opened once (its checks read every flag)
    beside = _sibling(Path(store), panel)
    if beside.resolve() != Path(store).resolve() and (beside / "zarr.json").is_file():
        other = cache.open_store(beside, plain=True)
        if _same_network(cache.manifest(candidates[Path(store)]), cache.manifest(other)):
            candidates[beside] = other
    folder = str(found.images)  # each file named as text: a list of a data set's Path objects is several times its names' size
    for candidate, ds in candidates.items():
        held = ds["image"].values  # looked up as sorted arrays (infra.names): a set of a data set's names is tens of MiB
        wanted = wanted_ids(ds, found, ids)
        if wanted is not None:
            check_current(candidate, Pairs(wanted, folder, ids, np.flatnonzero(lookup(held, wanted)[1])))
            continue
        by_name = {Path(h).name: h for h in held}  # extracted from another folder: matched by file name, as the label read matches
        other = changed(candidate, [(by_name[Path(i).name], os.path.join(folder, i)) for i in ids if Path(i).name in by_name])
        if other:
            source = image_folder_or_none(candidate, cache.manifest(ds)) or cache.manifest(ds).get("image_source")
            checkpoint = (cache.manifest(ds).get("checkpoint") or {}).get("path", "CKPT")
            raise ProbeError(
                other[0][0],
                f"is another file than {Path(str(source)) / Path(other[0][0]).name}, from which {candidate} was extracted "
                f"({len(other)} of the images of panel {panel!r} differ so): its features are not this image's",
                f"extract the panel's own images and pass that store: probe extract {checkpoint} --panel {panel} "
                f"--views {','.join(str(v) for v in cache.manifest(ds).get('views', []))}",
            )
