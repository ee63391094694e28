"""``probe entropy``: attention entropy of every store, saved as ``results/entropy``."""

from __future__ import annotations

from ..infra.errors import ProbeError
from ..infra.progress import within
from ..infra.runner import per_image
from ..protocols.context import Inputs, RunContext
from ..protocols.entropy import EntropySettings
from ..store.cache import require
from .runs import OverStoresReport, finish, over_stores


def run(inputs: Inputs, settings: EntropySettings, context: RunContext) -> OverStoresReport:
    """Every store's attention rows measured, saved as ``results/entropy`` in each."""
    from ..analyses.entropy import entropy
    from ..analyses.stats import Bootstrap

    def analyse(ds, progress, where):
        with within(f"bootstrap: {settings.boot:,} resamples", settings.boot) as boot:  # a line of its own while they run
            arch = ds.attrs["manifest"].get("arch", {})
            blocks = require(ds, "attention_blocks_224") if "attention_blocks_224" in ds else None
            return entropy(require(ds, "attention_224"), class_token=bool(arch.get("class_token", False)), registers=int(arch.get("registers", 0)),
                           blocks=blocks, patch=settings.patch, boot=Bootstrap(settings.boot, settings.seed, progress=boot),
                           run_blocks=per_image(where, progress=progress))

    runs = over_stores(inputs.stores, analyse, "attention_224", settings.partial, context)
    followed = None
    if settings.patch is not None:
        followed = 0
        for store, (_, result) in runs.items():
            ids = [str(i) for i in result.image.values]
            if settings.image is not None and settings.image not in ids:
                raise ProbeError(store, f"has no finished image {settings.image!r}", "pass an id from the store's image list")
            followed = ids.index(settings.image) if settings.image is not None else 0
    return finish("entropy", runs, context, followed)
