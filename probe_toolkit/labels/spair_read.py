"""SPair-71k pairs handed out only after their ledger entry (``read_pairs``); the layout and its
checks are ``labels/spair.py``'s."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..infra.errors import ProbeError
from .spair import FIX, KIND, Pair, pair_folder, parse, refuse


@dataclass
class PairLabels:
    """What ``read_pairs`` hands out, after its ledger entry."""

    pairs: list[Pair]
    entry_id: str
    panel: object  # panels.Panel
    image_map: dict[str, str]  # store id → image path under JPEGImages/ (when store ids were given)


def read_pairs(
    panel,
    *,
    purpose: str,
    checkpoint: str | None = None,
    images: Sequence[str] | None = None,
    unseal: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
) -> PairLabels:
    """Open a SPair panel's annotations, write the ledger entry, then return its pairs.

    ``images`` (store ids) restricts the pairs handed out to those whose two images both match
    one (``matching.match_images``); a sealed (``test``) panel needs ``unseal``, recorded."""
    from ..store.cache import cache_root
    from . import panels
    from .guard import inside
    from .matching import match_images

    panel = panels.open_for_reading(panel, KIND, purpose=purpose, unseal=unseal, cache=cache, register="register the SPair-71k folder with probe panel add --spair DIR")
    root, split = panel.annotations, panel.split or "test"
    inside.active = True
    try:
        pairs, problems, parts = parse(root, split, lambda p: Path(p).read_bytes())
    except OSError as error:
        raise ProbeError(getattr(error, "filename", None) or root, f"cannot be read ({error.strerror})", FIX) from None
    finally:
        inside.active = False
    refuse(problems, root)  # changed since the panel was added
    image_map: dict[str, str] = {}
    if images is not None:
        names = sorted({p.source for p in pairs} | {p.target for p in pairs})
        matched = match_images(images, dict(enumerate(names)))
        image_map = {sid: names[n] for sid, n in matched.items()}
        held = set(image_map.values())
        pairs = [p for p in pairs if p.source in held and p.target in held]
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + hashlib.sha256(d).digest() for n, d in parts)).hexdigest()
    names = sorted({p.source for p in pairs} | {p.target for p in pairs})
    store = cache_root(cache)
    entry = panels.log_checked_read(
        store,
        panel,
        panel.images,
        names,
        annotations=str(pair_folder(root, split)),
        annotation_sha256=digest,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
        pairs=len(pairs),
    )
    return PairLabels(pairs, entry.id, panel, image_map)
