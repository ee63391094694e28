"""Inputs that must belong together, checked before any work: a number is never attributed to
what did not produce it.

Three pairings, one rule each, every one read from the store's manifest:

- a checkpoint and a store (``probe segment CKPT --store S``, ``probe propagate CKPT --store S``:
  the store keeps the record, and the report titles it with the store's network): the file's
  sha256 and the network must be the store's;
- two stores read as one (a store and its ``<network>-panel-<panel>.zarr`` sibling): the same
  checkpoint, network and architecture, and the same facts of every view read (geometry,
  readout, interpolation);
- masks and the store they were cut from (``probe score`` saves into the store its masks'
  metadata names): the store there must still be the one decoded.

Each refusal is one line naming both sides and what differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..infra.errors import ProbeError
from ..infra.spelling import fix_command


def _short(digest: Any) -> str:
    return str(digest or "?")[:12]


def checkpoint_store(store: str | Path, checkpoint: str | Path, network: str = "teacher", sha256: str | None = None) -> None:
    """Refuse a store extracted from another checkpoint file or network than ``checkpoint``'s.

    ``sha256``: the checkpoint's digest where the caller has it (else it is computed here, the
    file's bytes being what identifies it: a path can hold another file now)."""
    from ..infra.provenance import file_sha256
    from . import cache

    store, checkpoint = Path(store), Path(checkpoint)
    if not (store / "zarr.json").is_file() or not checkpoint.is_file():
        return  # the command's own checks say what is missing
    meta = cache.manifest(cache.open_store(store, plain=True))  # zarr alone: no xarray (pandas) for a manifest
    theirs = meta.get("checkpoint") or {}
    mine = sha256 or file_sha256(checkpoint)
    from .sources import image_folder_or_none

    photos = image_folder_or_none(store, meta) or "DIR"  # the same photographs, through this checkpoint

    def extract(network: str) -> str:
        return fix_command("extract", checkpoint, images=photos, network=None if network == "teacher" else network)

    if theirs.get("sha256") and theirs["sha256"] != mine:
        raise ProbeError(
            store,
            f"was extracted from {theirs.get('path', '?')} (sha256 {_short(theirs['sha256'])}), not from {checkpoint} "
            f"(sha256 {_short(mine)}): its record would give this checkpoint's numbers the other's name",
            f"pass the store of {checkpoint.name} (`{extract(network)}` makes it), or leave --store out",
        )
    if meta.get("network") and meta["network"] != network:
        raise ProbeError(
            store,
            f"holds the {meta['network']} network of {checkpoint.name}, not the {network}",
            f"pass --network {meta['network']}, or the store of the {network} (`{extract(network)}` makes it)",
        )


FACTS = ("checkpoint", "network", "arch")  # what two stores read as one must share, besides each view's facts


def differences(a: Mapping[str, Any], b: Mapping[str, Any], views: Sequence[str] = ()) -> list[str]:
    """What differs between two stores' manifests among the facts that make their tokens one
    set: the checkpoint's bytes, the network, the architecture, and for each view read its
    geometry and readout (``per_view``) and the interpolation."""
    out = []
    if (a.get("checkpoint") or {}).get("sha256") != (b.get("checkpoint") or {}).get("sha256"):
        out.append(f"checkpoint sha256 {_short((a.get('checkpoint') or {}).get('sha256'))} vs {_short((b.get('checkpoint') or {}).get('sha256'))}")
    for key in ("network", "arch"):
        if a.get(key) != b.get(key):
            out.append(key if key == "arch" else f"{key} {a.get(key)} vs {b.get(key)}")
    if views:  # (the dtype is storage precision of the same tokens: a float32 sibling of a float16 store is read as one)
        if a.get("interpolation") != b.get("interpolation"):
            out.append(f"interpolation {a.get('interpolation')} vs {b.get('interpolation')}")
        for view in views:
            mine, theirs = (a.get("per_view") or {}).get(view), (b.get("per_view") or {}).get(view)
            if mine is not None and theirs is not None and mine != theirs:
                out.append(f"view {view}'s extraction settings")
    return out


def masks_store(masks_file: str | Path, meta: Mapping[str, Any]) -> None:
    """Masks whose metadata names a store (``probe decode`` writes it) are scored into that store
    only while it is the store they were cut from: same checkpoint, network and image list."""
    from . import cache

    store = meta.get("store")
    if not store or not (Path(store) / "zarr.json").is_file():
        return
    manifest = cache.manifest(cache.open_store(Path(store), plain=True))  # zarr alone: no xarray for a manifest
    mine = (manifest.get("checkpoint") or {}).get("sha256")
    said = {
        "checkpoint": (meta.get("checkpoint"), mine),
        "network": (meta.get("network"), manifest.get("network")),
        "image list": (meta.get("image_list_sha256"), manifest.get("image_list_sha256")),
    }
    differ = [what for what, (recorded, now) in said.items() if recorded and now and recorded != now]
    if differ:
        raise ProbeError(
            masks_file,
            f"was decoded from another store than the one now at {store} (its {', '.join(differ)} differ): its scores would be saved under the wrong checkpoint",
            f"decode that store again into this file, then score it: `{fix_command('decode', store, out=masks_file)}`",
        )
