"""``neighbours``: do a patch's most similar patches lie in SelfPatch's 3×3 window?"""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, OneOf, Within, setting
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
class NeighboursSettings(OverStoresSettings):
    view: str | None = setting(
        None, "224 (default) or 96: the view's tokens, at whatever grid the store holds (ViT-S/16 at 224: 14x14; ViT-S/8: 28x28).", OneOf(("224", "96"))
    )
    grid: int | None = setting(None, "Accepted when it is the grid the store holds (picks the view with that grid).", AtLeast(2))
    k: int = setting(4, "Positives per anchor (SelfPatch's k_num).", Within(1, 8, "[]", integer=True))
    top: int = setting(8, "How many of the most similar patches to test against the window.", AtLeast(1))
    wrap: bool = setting(True, "Plain borders instead of SelfPatch's wrap-around.", cli="negated")
    distance: str = setting("chebyshev", "chebyshev or euclidean (on the torus unless --no-wrap).", OneOf(("chebyshev", "euclidean")))

    def __post_init__(self) -> None:
        if isinstance(self.view, int):  # view=224 from Python means the 224 view
            object.__setattr__(self, "view", str(self.view))
        super().__post_init__()


PROTOCOL = register(
    Protocol(
        name="neighbours",
        summary="Whether a patch's most similar patches lie in SelfPatch's 3×3 window, with the selection rules' positives.",
        settings=NeighboursSettings,
        inputs=(Input("stores", "Stores written by probe extract (several: side by side).", "stores", True), json_input("Also write the numbers to this JSON file.")),
        reads=Reads(arrays=("tokens_224", "tokens_96"), views=("224", "96")),
        results=("neighbours_g<grid>", "neighbours_g<grid>_nowrap"),
        result="results.over_stores_report:OverStoresReport",
        references=(
            Reference(
                "Yun et al., Patch-level Representation Learning for Self-supervised Vision Transformers (CVPR 2022)", "alinlab/SelfPatch selfpatch_vision_transformer.py"
            ),
        ),
        differences=(
            Difference(
                "the window's positives are chosen by the selection module training/ uses (analyses/selection.py), not SelfPatch's training code",
                "one implementation of each rule, tested against SelfPatch's",
                "none: the same positives on the same tokens",
            ),
            Difference(
                "statistics are means over images with bootstrapped 95 % intervals",
                "SelfPatch reports no such statistic; images are the unit of resampling",
                "an interval beside each mean, none in the reference",
            ),
        ),
        run="commands.neighbours:run",
        source="stores",
        command=over_stores(
            "Do a patch's most similar patches lie in SelfPatch's 3×3 window? With the rules' selections.",
            "view",
            "grid",
            "k",
            "top",
            "wrap",
            "distance",
            table="results.tables:neighbours",
        ),
        sections=("report.sections_neighbours:neighbour_map", "report.pictures:token_pca", "report.sections_neighbours:premise"),
        placement=("workers", "dask_address"),
    )
)
