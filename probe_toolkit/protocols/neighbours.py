"""``neighbours``: do a patch's most similar patches lie in SelfPatch's 3×3 window?"""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least, one_of, within
from .registry import Option, Protocol, Reads, Reference, over_stores, register


@dataclass(frozen=True)
class NeighboursSettings(Settings):
    view: str | None = None  # 224 (default) or 96
    grid: int | None = None  # accepted when it is the grid the store holds
    k: int = 4  # positives per anchor (SelfPatch k_num = 4)
    top: int = 8  # most similar patches tested against the window
    wrap: bool = True  # SelfPatch's wrap-around borders
    distance: str = "chebyshev"
    seed: int = 0
    boot: int = 1000
    partial: bool = False

    def check(self) -> None:
        if self.view is not None:
            one_of("view", str(self.view), ("224", "96"))
        if self.grid is not None:
            at_least("grid", self.grid, 2)
        within("k", self.k, 1, 8, closed="[]")
        at_least("top", self.top, 1)
        one_of("distance", self.distance, ("chebyshev", "euclidean"))
        from ..analyses.stats import check_boot  # numpy: not imported while the CLI is built

        check_boot(self.boot)


def execute(settings: NeighboursSettings, placement, *, stores, json_path=None, quiet=True, **_):
    from ..commands.neighbours import run_neighbours
    from ..commands.runs import OverStores

    s = settings
    return run_neighbours(list(stores), view=s.view, grid=s.grid, k=s.k, top=s.top, wrap=s.wrap, distance=s.distance,
                          over=OverStores.of(settings, placement, json_path, quiet))


PROTOCOL = register(Protocol(
    name="neighbours",
    summary="Whether a patch's most similar patches lie in SelfPatch's 3×3 window, with the selection rules' positives.",
    settings=NeighboursSettings,
    reads=Reads(arrays=("tokens_224", "tokens_96"), views=("224", "96")),
    results=("neighbours_g<grid>", "neighbours_g<grid>_nowrap"),
    references=(Reference("Yun et al., Patch-level Representation Learning for Self-supervised Vision Transformers (CVPR 2022)",
                          "alinlab/SelfPatch selfpatch_vision_transformer.py"),),
    differences="The window's positives are chosen by the same selection module training/ uses (analyses/selection.py); statistics are bootstrapped over images.",
    execute=execute,
    source="stores",
    command=over_stores(
        "Do a patch's most similar patches lie in SelfPatch's 3×3 window? With the rules' selections.",
        Option("view", "224 (default) or 96: the view's tokens, at whatever grid the store holds (ViT-S/16 at 224: 14x14; ViT-S/8: 28x28)."),
        Option("grid", "Accepted when it is the grid the store holds (picks the view with that grid).", "int"),
        Option("k", "Positives per anchor (SelfPatch k_num = 4).", "int", 4),
        Option("top", "How many of the most similar patches to test against the window.", "int", 8),
        Option("wrap", "Plain borders instead of SelfPatch's wrap-around.", "negated", True),
        Option("distance", "chebyshev or euclidean (on the torus unless --no-wrap).", default="chebyshev"),
        table="results.tables:neighbours"),
    sections=("report.sections_neighbours:neighbour_map", "report.pictures:token_pca", "report.sections_neighbours:premise"),
    placement=("workers", "dask_address"),
))
