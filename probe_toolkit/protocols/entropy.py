"""``entropy``: how spread each attention row is (entropy, e^H, e^H / T, mean attention distance)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, setting
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
    patch: int | None = setting(None, "Follow this patch of the 224 view (patch = G·row + column).", AtLeast(0))
    image: str | None = setting(None, "Image id for the --patch tables (default: the first).")


PROTOCOL = register(Protocol(
    name="entropy",
    summary="How spread each attention row is: entropy, e^H, e^H / T, mean attention distance.",
    settings=EntropySettings,
    inputs=(Input("stores", "Stores written by probe extract (several: side by side).", "stores", True),
            json_input("Also write the numbers to this JSON file.")),
    reads=Reads(arrays=("attention_224", "attention_blocks_224"), views=("224",)),
    results=("entropy",),
    result="commands.runs:OverStoresReport",
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino vision_transformer.py"),),
    differences=(Difference("entropy and mean attention distance are computed from the stored last-block attention rows, in float64",
                            "DINO releases no entropy script; the rows are those its attention returns",
                            "none beyond float rounding: there is no published number to reproduce"),),
    run="commands.entropy:run",
    source="stores",
    command=over_stores("How spread each attention row is: entropy, e^H, e^H / T, mean attention distance.", "patch", "image",
                        table="results.tables:entropy"),
    sections=("report.sections_attention:attention", "report.sections_attention:entropy"),
    placement=("workers", "dask_address"),
))
