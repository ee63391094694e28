"""``position``: how much a block's patch tokens know of where they are: a linear probe of their (row, col)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Positive, Settings, Within, setting
from .registry import Command, Difference, Input, Protocol, Reads, Reference, json_input, register


@dataclass(frozen=True)
class PositionSettings(Settings):
    view: str = setting("224", "The view whose patch tokens are probed (any sized view: 224, eval224, 96, short@448, hbird@448, ...).")
    held_out: float = setting(0.2, "Share of the store's images held out and scored (a seeded draw).", Within(0.0, 1.0, "()"))
    epochs: int = setting(5, "Training epochs (RADIO position_predictor.py --num-epochs: 5).", AtLeast(1))
    lr: float = setting(1e-2, "Adam learning rate (RADIO --learning-rate: 1e-2).", Positive())
    batch: int = setting(32, "Images per step (RADIO --batch-size: 32).", AtLeast(1))
    seed: int = setting(0, "Seed of the split and of the map's initial weights.", AtLeast(0))
    partial: bool = setting(False, "Probe a store still being extracted (its finished images).")

    def check(self) -> None:
        from ..commands.token_rows import check_view

        check_view(self.view)


DIFFERENCES = (
    Difference(
        "probe splits the store's images by a seeded draw (held_out, 0.2 by default) into the images it trains on and those it scores",
        "RADIO trains on a data set's train split and scores its validation split; a store is one image set",
        "both sides come from one image set; RADIO's data sets (food101 by default) are not read: the targets are positions",
    ),
    Difference(
        "probe reports, beside RADIO's SmoothL1 figure, the mean absolute error in the same [-1, 1] units and the grid's chance level "
        "(the best constant's L1: G / (2(G − 1)) for an even side G)",
        "RADIO prints only its validation loss",
        "the L1 error is the figure the ~0.02 of trained ViTs refers to; SmoothL1 is smaller (about half its square)",
    ),
    Difference(
        "the tokens are the store's, at a fixed view (224 by default), before the final norm",
        "a store keeps them so; RADIO runs its model at 378 or 432 px on its own output",
        "the error depends on the view's grid: compare stores at one view",
    ),
    Difference(
        "the map's initial weights come from a torch Generator seeded by `seed`, under one torch thread",
        "RADIO draws them from torch's global generator",
        "a rerun gives the same bits; another seed can differ in the last digits",
    ),
)

PROTOCOL = register(
    Protocol(
        name="position",
        summary="A linear probe of each patch token's normalised (row, col): the held-out L1 error (about 0.02 for a trained ViT; chance ≈ 0.5).",
        settings=PositionSettings,
        reads=Reads(arrays=("tokens_224",), views=("224",)),
        results=("position",),
        references=(Reference("Ranzinger et al., AM-RADIO: Agglomerative Vision Foundation Model (CVPR 2024)", "NVlabs/RADIO examples/position_predictor.py"),),
        differences=DIFFERENCES,
        inputs=(
            Input("stores", "Stores written by probe extract (several: side by side, one record each).", "stores", True),
            json_input("Also write the numbers as JSON."),
        ),
        run="commands.position:run",
        result="results.position_report:PositionReport",
        command=Command(
            "A linear probe of each patch token's normalised (row, col), trained and scored on held-out images of the store.",
            options=("view", "held_out", "epochs", "lr", "batch", "seed", "json_path", "partial", "quiet"),
            table="results.tables_labelfree:position",
            progress=("images", "position"),
        ),
        sections=("report.sections_labelfree:position",),
        placement=(),  # one process: one small linear map trained in order, one torch thread
    )
)
