"""``position``: how much a block's patch tokens know of where they are: a linear probe of their (row, col)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least, one_of, positive, within
from .registry import Command, Option, Protocol, Reads, Reference, register, written_to


@dataclass(frozen=True)
class PositionSettings(Settings):
    view: str = "224"  # the view whose patch tokens are probed (one grid for every image)
    held_out: float = 0.2  # share of the store's images held out and scored (a seeded draw)
    epochs: int = 5  # RADIO position_predictor.py --num-epochs
    lr: float = 1e-2  # --learning-rate (Adam)
    batch: int = 32  # --batch-size: images per step
    seed: int = 0  # seed of the split and of the map's initial weights
    partial: bool = False  # probe a store still being extracted

    def check(self) -> None:
        from .rank import _views

        one_of("view", self.view, _views())
        within("held_out", self.held_out, 0.0, 1.0, closed="()")
        at_least("epochs", self.epochs, 1)
        positive("lr", self.lr)
        at_least("batch", self.batch, 1)
        at_least("seed", self.seed, 0)


def execute(settings: PositionSettings, placement, *, stores, json_path=None, progress=None, **_):
    from ..commands.position import run_position

    return run_position(list(stores), settings, json_path=json_path, progress=progress)


DIFFERENCES = (
    "Follows NVlabs/RADIO examples/position_predictor.py: patch tokens L2-normalised over channels, one linear map with bias (its 1×1 "
    "convolution, torch's default initialisation), targets linspace(-1, 1) along each side of the grid, SmoothL1Loss (β = 1, mean), "
    "Adam at 1e-2, batches of 32 images in order, 5 epochs, the held-out images' loss reported. What differs, item by item: "
    "(1) RADIO trains on a data set's train split and scores its validation split; probe splits the store's images by a seeded draw "
    "(held_out, 0.2 by default), so both sides come from one image set; "
    "(2) probe reports, beside RADIO's SmoothL1 figure, the mean absolute error in the same [-1, 1] units (the L1 error the ~0.02 "
    "of trained ViTs refers to) and the chance level of the grid (the best constant's L1: G / (2(G − 1)) for an even side G); "
    "(3) the tokens are the store's, at a fixed view (224 by default, RADIO's own model at 378 or 432 px), before the final norm; "
    "(4) the map's initial weights come from a torch Generator seeded by `seed` (RADIO's from torch's global generator), one torch "
    "thread, so a rerun gives the same bits; "
    "(5) RADIO's data sets (food101 by default) are not read: any store's images serve, since the targets are positions."
)

PROTOCOL = register(Protocol(
    name="position",
    summary="A linear probe of each patch token's normalised (row, col): the held-out L1 error (about 0.02 for a trained ViT; chance ≈ 0.5).",
    settings=PositionSettings,
    reads=Reads(arrays=("tokens_224",), views=("224",)),
    results=("position",),
    references=(Reference("Ranzinger et al., AM-RADIO: Agglomerative Vision Foundation Model (CVPR 2024)", "NVlabs/RADIO examples/position_predictor.py"),),
    differences=DIFFERENCES,
    execute=execute,
    source="stores",
    command=Command(
        help="A linear probe of each patch token's normalised (row, col), trained and scored on held-out images of the store.",
        source="Stores written by probe extract (several: side by side, one record each).",
        options=(
            Option("view", "The view whose patch tokens are probed (224, eval224, 96, hbird512, square800).", default="224"),
            Option("held_out", "Share of the images held out and scored (a seeded draw).", "float", 0.2),
            Option("epochs", "Training epochs (RADIO: 5).", "int", 5),
            Option("lr", "Adam learning rate (RADIO: 1e-2).", "float", 1e-2),
            Option("batch", "Images per step (RADIO: 32).", "int", 32),
            Option("seed", "Seed of the split and of the map's initial weights.", "int", 0),
            written_to("Also write the numbers as JSON."),
            "partial", "quiet"),
        table="results.tables_labelfree:position",
        progress=("images", "progress", "position")),
    sections=("report.sections_labelfree:position",),
    placement=(),  # one process: one small linear map trained in order, one torch thread
))
