"""Matching a store's image ids to a panel's file names (see ``panels``' docstring): the same name,
or one is the other with leading folders added and exactly one candidate exists."""

from __future__ import annotations

from collections.abc import Iterable

from ..infra.errors import ProbeError


def clean_name(path: str) -> str:
    """A file name as the panel writes it: forward slashes, no leading ``./``."""
    path = path.replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path


def match_images(store_ids: Iterable[str], file_names: dict[int, str]) -> dict[str, int]:
    """store id → COCO image id for every store id that matches one panel image (the rule in ``panels``' docstring)."""
    by_name: dict[str, int] = {}
    for image_id, name in file_names.items():
        by_name.setdefault(clean_name(name), image_id)
    by_tail: dict[str, list[str]] = {}
    for name in by_name:
        parts = name.split("/")
        for k in range(1, len(parts)):
            by_tail.setdefault("/".join(parts[k:]), []).append(name)
    out: dict[str, int] = {}
    taken: dict[int, str] = {}
    for sid in store_ids:
        clean = clean_name(sid)
        if clean in by_name:
            candidates = [clean]
        else:
            parts = clean.split("/")
            candidates = [t for t in ("/".join(parts[k:]) for k in range(1, len(parts))) if t in by_name]
            candidates += by_tail.get(clean, [])
            candidates = sorted(set(candidates))
        if len(candidates) > 1:
            raise ProbeError(
                None, f"store image {sid!r} matches several panel images ({', '.join(candidates[:3])})", "extract from the panel's image folder so ids equal file names"
            )
        if candidates:
            image_id = by_name[candidates[0]]
            if image_id in taken:
                raise ProbeError(
                    None,
                    f"panel image {candidates[0]!r} matches store images {taken[image_id]!r} and {sid!r}",
                    "extract from the panel's image folder so ids equal file names",
                )
            taken[image_id] = sid
            out[sid] = image_id
    return out
