"""What a result was computed on, and whether its store has moved on since.

Every saved result records ``computed_on``: how many images it read and the hash of their ids,
whether it read the whole store or a panel's images, and the store's completion at that moment
(done, failed, total, and the hash of the store's image list). The report compares this record
with the store as it is now, so a result computed with ``--partial`` on 8 of 40 images is never
shown beside a store that has since finished as if it described all 40.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from ..infra.provenance import list_hash
from .group import open_read, whole


def completion(store: str | Path) -> dict[str, Any]:
    """The store's completion now: images done (and not failed), failed, total, image-list hash."""
    from .integrity import check_flags

    group = open_read(store)
    check_flags(store, group)  # a deleted flag chunk would count its images as not done
    done = np.asarray(whole(group["done"]), dtype=bool)
    failed = np.asarray(whole(group["failed"]), dtype=bool) if "failed" in group else np.zeros_like(done)
    manifest = dict(group.attrs.get("manifest", {}))
    return {"done": int((done & ~failed).sum()), "failed": int(failed.sum()), "total": int(done.size), "image_list_sha256": manifest.get("image_list_sha256")}


def computed_on(store: str | Path, image_ids: Collection[str], scope: str = "store", read_from: str | Path | None = None) -> dict[str, Any]:
    """The ``computed_on`` record of a result that read ``image_ids`` of ``store``.

    ``scope``: ``store`` for analyses of every finished image (entropy, neighbours, decoder),
    ``panel`` for those that read a panel's images only (probes, scores). ``read_from``: the store the
    images were read from; where it is another (the panel's own store beside ``store``), the scope is
    ``panel-store``: ``store``'s completion then says nothing of those images, and the report does not
    call the record current by it."""
    if read_from is not None and Path(read_from).resolve() != Path(store).resolve():
        scope = "panel-store"
    images_sha256 = list_hash(map(str, image_ids))  # a few thousand at a time: no copy of a store's ids as Python strings
    return {"images": len(image_ids), "images_sha256": images_sha256, "scope": scope, "store": completion(store)}


def staleness(store: str | Path, record: dict[str, Any] | None) -> str | None:
    """Why a result no longer describes its store (None when it still does, or when it predates
    these records: then ``unknown`` is for the caller to say)."""
    if not record or record.get("scope") == "panel-store":  # images of another store: this one says nothing of them
        return None
    then, now = record.get("store", {}), completion(store)
    if then.get("image_list_sha256") != now["image_list_sha256"]:
        return "the store's image list changed since"
    if record.get("scope") == "store" and (record.get("images") != now["done"]):
        return f"computed on {record.get('images')} images; the store now has {now['done']} of {now['total']} done"
    return None
