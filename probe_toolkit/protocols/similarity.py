"""``similarity``: linear CKA between the blocks of one store, or between two checkpoints' stores of the same images."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Each, OneOf, SettingError, Settings, setting
from .registry import Command, Difference, Input, Protocol, Reads, Reference, json_input, register

EXAMPLES = ("image", "class", "patch")
ESTIMATORS = ("full", "minibatch")


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True)
class SimilaritySettings(Settings):
    view: str = setting("224", "The view whose tokens are compared (any sized view: 224, eval224, 96, short@448, hbird@448, ...).")
    examples: str = setting(
        "image", "image (an image's patch tokens flattened, Kornblith 2019, Nguyen 2021), class (class tokens) or patch (every patch token).", OneOf(EXAMPLES)
    )
    estimators: tuple[str, ...] = setting(
        ESTIMATORS, "full,minibatch: linear CKA and the unbiased minibatch estimator.", Each(OneOf(ESTIMATORS)), parse=_names, spell=",".join
    )
    batch: int = setting(256, "Examples per minibatch (Nguyen et al. 2021: 256).", AtLeast(4, why="the unbiased estimator needs at least 4 examples"))
    epochs: int = setting(1, "Passes over the examples for the minibatch estimator, each a new seeded permutation.", AtLeast(1))
    seed: int = setting(0, "Seed of the minibatches.", AtLeast(0))
    partial: bool = setting(False, "Compare stores still being extracted (their finished images).")

    def check(self) -> None:
        from ..commands.token_rows import check_view

        check_view(self.view)
        if not self.estimators or len(set(self.estimators)) != len(self.estimators):
            raise SettingError("estimators", f"estimators {list(self.estimators)} must name full and/or minibatch, each once", "use e.g. estimators=full,minibatch")


DIFFERENCES = (
    Difference(
        "linear CKA and the minibatch sums are computed in float64", "google-research's efficient_CKA.py accumulates in float32 by default", "none beyond float rounding"
    ),
    Difference(
        "with examples=class or patch the full estimator is accumulated in feature space a chunk of images at a time, the centring "
        "made exact by a shift; with examples=image (the references' convention) it is computed on the n × n Gram matrices of whole "
        "images, refused above 2 GiB",
        "memory (F·D)² or n², never n × F·D at once",
        "none: the same CKA",
    ),
    Difference(
        "minibatches are seeded permutations of the images, the last partial batch of each epoch dropped; the minibatch estimator is not computed on patch tokens",
        "every batch then has the same size, so the b(b − 3) factor of each HSIC₁ cancels; the references iterate a data loader",
        "another seed picks other batches: the estimate moves within its sampling spread",
    ),
    Difference(
        "the tokens are the stored blocks' outputs before the final norm, at one fixed view; two stores must hold the same image "
        "files (ids and sha256) in one order, and one grid for patch tokens",
        "examples must pair up",
        "a pair of stores that does not is refused in one line, before any token is read",
    ),
)

PROTOCOL = register(
    Protocol(
        name="similarity",
        summary="Linear CKA (and its unbiased minibatch estimator) between the blocks of one store, or between two checkpoints' stores of the same images.",
        settings=SimilaritySettings,
        reads=Reads(arrays=("tokens_224", "cls_tokens_224"), views=("224",)),
        results=("similarity",),
        references=(
            Reference(
                "Kornblith et al., Similarity of Neural Network Representations Revisited (ICML 2019)",
                "google-research/google-research representation_similarity/Demo.ipynb",
            ),
            Reference(
                "Nguyen, Raghu & Kornblith, Do Wide and Deep Networks Learn the Same Things? (ICLR 2021)",
                "google-research/google-research do_wide_and_deep_networks_learn_the_same_things/efficient_CKA.py",
            ),
        ),
        differences=DIFFERENCES,
        inputs=(
            Input("store", "A store written by probe extract (the record is saved there).", "store", True),
            Input("other", "A second checkpoint's store of the same images: every block of one against every block of the other.", "path"),
            json_input("Also write the numbers as JSON."),
        ),
        run="commands.similarity:run",
        result="results.similarity_report:SimilarityReport",
        command=Command(
            "Linear CKA between the blocks of a store, or between two checkpoints' stores of the same images (--other).",
            options=("other", "view", "examples", "estimators", "batch", "epochs", "seed", "json_path", "partial", "quiet"),
            table="results.tables_labelfree:similarity",
            progress=("images", "similarity"),
        ),
        sections=("report.sections_labelfree:similarity",),
        placement=(),  # one process: float64 products that BLAS spreads over the cores
    )
)
