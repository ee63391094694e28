"""A NAVI panel's poses, pairs and depth maps handed out only after their ledger entry (``read_navi``);
the layout and its checks are ``labels/navi.py``'s, the pairs ``labels/navi_pairs.py``'s."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..infra.errors import ProbeError
from . import navi_pairs
from .navi import FIX, KIND, NaviImage, parse, refuse


@dataclass
class NaviLabels:
    """What ``read_navi`` hands out, after its ledger entry: the split's images in the reference's
    order, the scored pairs (indices into ``images``), each scored image's depth map sha256 (a
    worker checks it reads these bytes), the entry id and the panel."""

    images: list[NaviImage]
    pairs: list[tuple[int, int]]
    depth_sha256: dict[str, str]  # image key → sha256 of its depth map's bytes
    entry_id: str
    panel: object  # panels.Panel
    root: Path


def read_navi(
    panel, *, purpose: str, checkpoint: str | None = None, unseal: str | None = None, cache: str | Path | None = None, command: str | None = None, seed: int | None = None
) -> NaviLabels:
    """Open a NAVI panel's annotations and the scored images' depth maps, write the ledger entry,
    then return the pairs (drawn with ``seed``, the reference's 8 by default). A sealed (``test``)
    panel needs ``unseal``, recorded."""
    from ..store.cache import cache_root
    from . import panels
    from .guard import inside
    from .navi import PAIR_SEED

    panel = panels.open_for_reading(panel, KIND, purpose=purpose, unseal=unseal, cache=cache, register="register the navi_v1 folder with probe panel add NAME --navi DIR")
    root = Path(panel.annotations)
    inside.active = True
    try:
        images, problems, parts = parse(root, lambda p: Path(p).read_bytes())
        problems = problems or navi_pairs.unpaired(images)
        refuse(problems, root)  # changed since the panel was added
        pairs = navi_pairs.scored(images, PAIR_SEED if seed is None else seed)
        used = sorted({n for pair in pairs for n in pair})
        depth = {images[n].key: hashlib.sha256((root / images[n].depth).read_bytes()).hexdigest() for n in used}
    except OSError as error:
        raise ProbeError(getattr(error, "filename", None) or root, f"cannot be read ({error.strerror})", FIX) from None
    finally:
        inside.active = False
    parts += [(images[n].depth, bytes.fromhex(depth[images[n].key])) for n in used]
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + hashlib.sha256(d).digest() for n, d in parts)).hexdigest()
    names = [images[n].image for n in used]
    store = cache_root(cache)
    entry = panels.log_checked_read(
        store,
        panel,
        root,
        names,
        annotations=str(root),
        annotation_sha256=digest,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
        pairs=len(pairs),
    )
    return NaviLabels(images, pairs, depth, entry.id, panel, root)
