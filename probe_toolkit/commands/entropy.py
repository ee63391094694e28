"""``probe entropy``: attention entropy of every store, saved as ``results/entropy``."""

from __future__ import annotations

from pathlib import Path

from ..infra.errors import ProbeError
from ..infra.progress import within
from ..infra.runner import per_image
from ..store.cache import require
from .runs import OverStores, Run, finish, over_stores


def run_entropy(
    stores: list[Path],
    *,
    patch: int | None = None,
    image: str | None = None,
    over: OverStores = OverStores(),
) -> Run:
    """``probe entropy``: saved as ``results/entropy`` in each store."""
    from ..analyses.entropy import entropy
    from ..analyses.stats import Bootstrap, check_boot

    check_boot(over.boot)  # before any store is opened

    def analyse(ds, progress, where):
        with within(f"bootstrap: {over.boot:,} resamples", over.boot) as boot:  # a line of its own while they run
            return _entropy(ds, progress, where, boot)

    def _entropy(ds, progress, where, boot):
        arch = ds.attrs["manifest"].get("arch", {})
        blocks = require(ds, "attention_blocks_224") if "attention_blocks_224" in ds else None
        return entropy(
            require(ds, "attention_224"), class_token=bool(arch.get("class_token", False)), registers=int(arch.get("registers", 0)),
            blocks=blocks, patch=patch,
            boot=Bootstrap(over.boot, over.seed, progress=boot), run_blocks=per_image(where, progress=progress),
        )

    runs = over_stores(stores, analyse, "attention_224", over)
    followed = None
    if patch is not None:
        followed = 0
        for store, (_, result) in runs.items():
            ids = [str(i) for i in result.image.values]
            if image is not None and image not in ids:
                raise ProbeError(store, f"has no finished image {image!r}", "pass an id from the store's image list")
            followed = ids.index(image) if image is not None else 0
    return finish("entropy", "probe entropy", runs, over.json_path, followed)
