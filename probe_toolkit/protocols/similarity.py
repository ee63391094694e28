"""``similarity``: linear CKA between the blocks of one store, or between two checkpoints' stores of the same images."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import SettingError, Settings, at_least, one_of
from .registry import Command, Option, Protocol, Reads, Reference, register, written_to

EXAMPLES = ("image", "class", "patch")
ESTIMATORS = ("full", "minibatch")


@dataclass(frozen=True)
class SimilaritySettings(Settings):
    view: str = "224"  # the view whose tokens are compared (one grid for every image)
    examples: str = "image"  # image: its patch tokens flattened (Kornblith 2019, Nguyen 2021); class: its class token; patch: each patch token
    estimators: tuple[str, ...] = ESTIMATORS  # full linear CKA and the unbiased minibatch estimator
    batch: int = 256  # examples per minibatch (Nguyen et al. 2021)
    epochs: int = 1  # passes over the examples, each a new seeded permutation
    seed: int = 0  # seed of the minibatches
    partial: bool = False  # compare stores still being extracted

    def check(self) -> None:
        from .rank import _views

        one_of("view", self.view, _views())
        one_of("examples", self.examples, EXAMPLES)
        if not self.estimators or any(e not in ESTIMATORS for e in self.estimators) or len(set(self.estimators)) != len(self.estimators):
            raise SettingError("estimators", f"estimators {list(self.estimators)} must name full and/or minibatch, each once",
                               "use e.g. estimators=('full', 'minibatch')")
        at_least("batch", self.batch, 4, why="the unbiased estimator needs at least 4 examples")
        at_least("epochs", self.epochs, 1)
        at_least("seed", self.seed, 0)


def execute(settings: SimilaritySettings, placement, *, store, other=None, json_path=None, progress=None, **_):
    from ..commands.similarity import run_similarity

    return run_similarity(store, settings, other=other, json_path=json_path, progress=progress)


DIFFERENCES = (
    "Linear CKA as Kornblith et al. (ICML 2019) define it, ‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F) on centred features, and the unbiased "
    "minibatch estimator of Nguyen et al. (ICLR 2021) as google-research's efficient_CKA.py computes it (U-centred Gram matrices of "
    "each minibatch, their inner products summed over minibatches, then normalised). What differs, item by item: "
    "(1) in float64 throughout (efficient_CKA.py accumulates in float32 by default); "
    "(2) with examples=class or patch the full estimator is accumulated in feature space a chunk of images at a time, with the "
    "centring made exact by a shift (memory (F·D)², not n²); with examples=image (the references' convention) it is computed on the n × n "
    "Gram matrices of whole images, refused above 2 GiB, where the minibatch estimator alone serves; "
    "(3) minibatches are seeded permutations of the images, the last partial batch of each epoch dropped so that every batch has the "
    "same size (the references iterate a data loader); the minibatch estimator is not computed on patch tokens; "
    "(4) the tokens are the stored blocks' outputs before the final norm, at one fixed view; two stores must hold the same image files "
    "(ids and sha256) in one order, and one grid for patch tokens."
)

PROTOCOL = register(Protocol(
    name="similarity",
    summary="Linear CKA (and its unbiased minibatch estimator) between the blocks of one store, or between two checkpoints' stores of the same images.",
    settings=SimilaritySettings,
    reads=Reads(arrays=("tokens_224", "cls_tokens_224"), views=("224",)),
    results=("similarity",),
    references=(
        Reference("Kornblith et al., Similarity of Neural Network Representations Revisited (ICML 2019)",
                  "google-research/google-research representation_similarity/Demo.ipynb"),
        Reference("Nguyen, Raghu & Kornblith, Do Wide and Deep Networks Learn the Same Things? (ICLR 2021)",
                  "google-research/google-research do_wide_and_deep_networks_learn_the_same_things/efficient_CKA.py"),
    ),
    differences=DIFFERENCES,
    execute=execute,
    command=Command(
        help="Linear CKA between the blocks of a store, or between two checkpoints' stores of the same images (--other).",
        source="A store written by probe extract (the record is saved there).",
        options=(
            Option("other", "A second checkpoint's store of the same images: compare every block of one with every block of the other.", "path"),
            Option("view", "The view whose tokens are compared (224, eval224, 96, hbird512, square800).", default="224"),
            Option("examples", "image (patch tokens flattened per image), class (class tokens) or patch (every patch token).", default="image"),
            Option("estimators", "full,minibatch: linear CKA and the unbiased minibatch estimator.", "parse", "full,minibatch",
                   parse=lambda text: tuple(t.strip() for t in text.split(",") if t.strip())),
            Option("batch", "Examples per minibatch (Nguyen et al.: 256).", "int", 256),
            Option("epochs", "Passes over the examples for the minibatch estimator.", "int", 1),
            Option("seed", "Seed of the minibatches.", "int", 0),
            written_to("Also write the numbers as JSON."),
            "partial", "quiet"),
        table="results.tables_labelfree:similarity",
        progress=("images", "progress", "similarity")),
    sections=("report.sections_labelfree:similarity",),
    placement=(),  # one process: float64 products that BLAS spreads over the cores
))
