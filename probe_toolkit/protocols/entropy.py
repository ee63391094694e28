"""``entropy``: how spread each attention row is (entropy, e^H, e^H / T, mean attention distance)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least
from .registry import Option, Protocol, Reads, Reference, over_stores, register


@dataclass(frozen=True)
class EntropySettings(Settings):
    patch: int | None = None  # follow this patch of the 224 grid (patch = G·row + column)
    image: str | None = None  # image id of the followed tables (default: the first)
    seed: int = 0  # seed of the bootstrap over images
    boot: int = 1000  # bootstrap resamples of the 95 % intervals
    partial: bool = False  # summarise a store still being extracted

    def check(self) -> None:
        if self.patch is not None:
            at_least("patch", self.patch, 0)
        from ..analyses.stats import check_boot  # numpy: not imported while the CLI is built

        check_boot(self.boot)


def execute(settings: EntropySettings, placement, *, stores, json_path=None, quiet=True, **_):
    from ..commands.entropy import run_entropy
    from ..commands.runs import OverStores

    return run_entropy(list(stores), patch=settings.patch, image=settings.image, over=OverStores.of(settings, placement, json_path, quiet))


PROTOCOL = register(Protocol(
    name="entropy",
    summary="How spread each attention row is: entropy, e^H, e^H / T, mean attention distance.",
    settings=EntropySettings,
    reads=Reads(arrays=("attention_224", "attention_blocks_224"), views=("224",)),
    results=("entropy",),
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino vision_transformer.py"),),
    differences="Entropy and mean attention distance are computed from the stored last-block attention rows in float64; DINO releases no entropy script.",
    execute=execute,
    source="stores",
    command=over_stores("How spread each attention row is: entropy, e^H, e^H / T, mean attention distance.",
                        Option("patch", "Follow this patch of the 224 view (patch = G·row + column).", "int"),
                        Option("image", "Image id for the --patch tables (default: the first)."), table="results.tables:entropy"),
    sections=("report.sections_attention:attention", "report.sections_attention:entropy"),
    placement=("workers", "dask_address"),
))
