"""``linear-dinov2``: DINOv2's linear classification protocol (facebookresearch/dinov2 ``dinov2/eval/linear.py``):
the grid of linear classifiers on the last blocks' class tokens (± average-pooled patch tokens), chosen on val."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import linear_dinov2 as ld
from ..infra.settings import SettingError, Settings, at_least, positive
from .registry import UNSEAL_VAL, Option, Protocol, Reads, Reference, on_train_val, register, written_to

AVGPOOL = {"both": ld.AVGPOOL, "off": (False,), "on": (True,)}


def avgpool_choice(text: str) -> tuple[bool, ...]:
    if text not in AVGPOOL:
        raise SettingError("avgpool", f"avgpool {text!r} is not one of {', '.join(AVGPOOL)}", "use avgpool both (DINOv2 trains both)")
    return AVGPOOL[text]


@dataclass(frozen=True)
class LinearDinov2Settings(Settings):
    n_last_blocks: tuple[int, ...] = ld.N_LAST_BLOCKS  # each default is linear.py's, its source beside it in analyses/linear_dinov2.py
    avgpool: tuple[bool, ...] = ld.AVGPOOL
    learning_rates: tuple[float, ...] = ld.LEARNING_RATES
    epochs: int = ld.EPOCHS
    epoch_length: int = ld.EPOCH_LENGTH
    batch_size: int = ld.BATCH_SIZE  # per GPU in the reference; one process here: its rates scaled by 128 / 256
    seed: int = ld.SEED  # the train sampler's
    init_seed: int = 0  # the classifiers' initial weights (the reference draws them from torch's global generator)

    def check(self) -> None:
        for name, values in (("n_last_blocks", self.n_last_blocks), ("avgpool", self.avgpool), ("learning_rates", self.learning_rates)):
            if not values or len(set(values)) != len(values):
                raise SettingError(name, f"{name} must name at least one value, each once, got {values!r}", f"give each of {name} once, or leave it out")
        for n in self.n_last_blocks:
            at_least("n_last_blocks", n, 1)
        for rate in self.learning_rates:
            positive("learning_rates", rate)
        at_least("epochs", self.epochs, 1)
        at_least("epoch_length", self.epoch_length, 1)
        at_least("batch_size", self.batch_size, 1)
        at_least("seed", self.seed, 0)
        at_least("init_seed", self.init_seed, 0)


def execute(settings: LinearDinov2Settings, placement, *, store, train, val, test=None, unseal=None, cache_dir=None, json_path=None, on_step=None, **_):
    from ..commands.linear_dinov2 import run_linear_dinov2

    return run_linear_dinov2(store, train, val, settings, test=test, unseal=unseal, cache_dir=cache_dir, json_path=json_path, on_step=on_step,
                             placement=placement)


DIFFERENCES = (
    "Follows dinov2/eval/linear.py on one process: the 52 classifiers (n_last_blocks 1 and 4, avgpool off and on, 13 rates), the class tokens "
    "of the last blocks through the final norm (+ the final-normed patch tokens averaged), SGD momentum 0.9 without weight decay, rates scaled "
    "by batch / 256, cosine annealing over epochs × epoch_length iterations, ShardedInfiniteSampler's batches (seed 0), cross-entropy summed, "
    "the best classifier chosen on val by top-1 (its names included: at batch 128 the two smallest rates share a name and the earlier classifier "
    "is trained but not evaluated, as in the reference). What differs: (1) the reference trains on a new random resized crop and flip of each "
    "image at every iteration; probe reads the stored features of the evaluation view (resize 256, centre crop 224) at every iteration, as a "
    "frozen store holds one view per image; (2) the initial weights are drawn from a generator seeded by init_seed (nn.Linear's initialisation, "
    "then N(0, 0.01)), where the reference draws from torch's global generator after building the network; (3) the features are those the "
    "store holds (float16 unless extracted with --dtype float32), where the reference computes them under autocast; (4) its intermediate val "
    "evaluations every 1,250 iterations only log and are not run; (5) as in the reference, the classifier is chosen on val, and the reported "
    "number is that val accuracy unless --test names a third panel, where the chosen classifier alone is scored."
)

PROTOCOL = register(Protocol(
    name="linear-dinov2",
    summary="DINOv2's linear protocol: 52 linear classifiers on the last 1 or 4 blocks' class tokens (± average-pooled patches), the best chosen on val.",
    settings=LinearDinov2Settings,
    reads=Reads(arrays=("cls_tokens_eval224", "tokens_eval224"), views=("eval224",), labels=True, panel_kinds=("classes", "coco")),
    results=("linear-dinov2",),
    references=(Reference("Oquab et al., DINOv2: Learning Robust Visual Features without Supervision (TMLR 2024)", "facebookresearch/dinov2 dinov2/eval/linear.py"),),
    differences=DIFFERENCES,
    execute=execute,
    command=on_train_val(
        "DINOv2's linear classification protocol (facebookresearch/dinov2 dinov2/eval/linear.py): the best of 52 classifiers, chosen on --val.",
        "A store holding (or beside a store holding) the panels' images in the eval224 view (n_last_blocks 4: its last 4 blocks).",
        "Panel whose images train the classifiers (class folders, or COCO: largest category).",
        "Panel that scores every classifier and chooses the best (the reference's val set).",
        Option("test", "Panel where the chosen classifier alone is scored (the reference's --test-datasets); without it the val accuracy is reported."),
        Option("n_last_blocks", "Class tokens of the last n blocks, each n a classifier family (DINOv2: 1,4).", "ints",
               ",".join(map(str, ld.N_LAST_BLOCKS)), example="1,4"),
        Option("avgpool", "Average-pooled patch tokens appended: both (DINOv2), on or off.", default="both", parse=avgpool_choice),
        Option("learning_rates", "Rates of the grid, before scaling by batch / 256 (DINOv2: 1e-5 … 0.1, 13 rates).", "floats",
               ",".join(map(str, ld.LEARNING_RATES)), example="1e-4,1e-3,1e-2"),
        Option("epochs", "Epochs (DINOv2: 10).", "int", ld.EPOCHS),
        Option("epoch_length", "Iterations per epoch (DINOv2: 1250).", "int", ld.EPOCH_LENGTH),
        Option("batch_size", "Images per iteration (DINOv2: 128 per GPU; one process here).", "int", ld.BATCH_SIZE),
        Option("seed", "Seed of the train sampler (DINOv2: 0).", "int", ld.SEED),
        Option("init_seed", "Seed of the classifiers' initial weights.", "int", 0),
        written_to("Also write every classifier's accuracy and the choice as JSON."),
        UNSEAL_VAL,
        "cache", "quiet", "device",
        table="results.tables_linear:linear_dinov2",
        progress=("iterations", "on_step", "linear-dinov2")),
    sections=(),
    placement=("device",),
))
