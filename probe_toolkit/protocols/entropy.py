"""``entropy``: how spread each attention row is (entropy, e^H, e^H / T, mean attention distance)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, setting
from ..store.views import ViewName
from .registry import (
    Difference,
    Input,
    Protocol,
    Reads,
    Reference,
    json_input,
    over_stores,
    register,
)
from .summaries import OverStoresSettings


@dataclass(frozen=True)
class EntropySettings(OverStoresSettings):
    patch: int | None = setting(None, "Follow this patch of the 224 view (patch = G·row + column).", AtLeast(0), moves_numbers=False)
    image: str | None = setting(None, "Image id for the --patch tables (default: the first).", moves_numbers=False)
    view: str = setting(
        "224",
        "Whose attention: its explicit maps, or its attention statistics (probe extract --attention stats) where the "
        "store holds no maps; any view (square@2048, native).",
        ViewName(),
    )


PROTOCOL = register(
    Protocol(
        name="entropy",
        summary="How spread each attention row is: entropy, e^H, e^H / T, mean attention distance.",
        settings=EntropySettings,
        inputs=(Input("stores", "Stores written by probe extract (several: side by side).", "stores", True), json_input("Also write the numbers to this JSON file.")),
        reads=Reads(arrays=("attention_224", "attention_blocks_224"), views=("224",), stores=("attention_stats_224",)),
        results=("entropy",),
        result="results.over_stores_report:OverStoresReport",
        references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino vision_transformer.py"),),
        differences=(
            Difference(
                "entropy and mean attention distance are computed from the stored last-block attention rows, in float64",
                "DINO releases no entropy script; the rows are those its attention returns",
                "none beyond float rounding: there is no published number to reproduce",
            ),
            Difference(
                "at a view a store holds no maps of, they come from the attention statistics computed during extraction in tiles "
                "of queries (the network's float32 scores, a float64 softmax; probe extract --attention stats)",
                "the T x T maps of 1024-2048 px or own-size views do not fit in memory",
                "agree with the maps' to their float16 rounding; --patch (one row's largest weights) needs the maps",
            ),
        ),
        run="commands.entropy:run",
        source="stores",
        command=over_stores(
            "How spread each attention row is: entropy, e^H, e^H / T, mean attention distance.", "patch", "image", "view", table="results.tables:entropy"
        ),
        sections=("report.sections_attention:attention", "report.sections_attention:entropy"),
        placement=("workers", "dask_address"),
    )
)
