"""``linear-dinov2``: DINOv2's linear classification protocol (facebookresearch/dinov2 ``dinov2/eval/linear.py``):
the grid of linear classifiers on the last blocks' class tokens (± average-pooled patch tokens), chosen on val."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import linear_dinov2 as ld
from ..infra.settings import AtLeast, Each, Positive, SettingError, Settings, setting
from .registry import CACHE, Command, Difference, Input, Protocol, Reads, Reference, json_input, register, train_val

AVGPOOL = {"both": ld.AVGPOOL, "off": (False,), "on": (True,)}


def avgpool_choice(text: str) -> tuple[bool, ...]:
    if text not in AVGPOOL:
        raise SettingError("avgpool", f"avgpool {text!r} is not one of {', '.join(AVGPOOL)}", "use avgpool both (DINOv2 trains both)")
    return AVGPOOL[text]


def avgpool_text(value: tuple[bool, ...]) -> str:
    return next((name for name, choice in AVGPOOL.items() if tuple(value) == choice), str(value))


@dataclass(frozen=True)
class LinearDinov2Settings(Settings):
    n_last_blocks: tuple[int, ...] = setting(
        ld.N_LAST_BLOCKS, "Class tokens of the last n blocks, each n a family of classifiers (linear.py's n_last_blocks_list).", Each(AtLeast(1), distinct=True)
    )
    avgpool: tuple[bool, ...] = setting(
        ld.AVGPOOL, "The last block's patch tokens averaged and appended: both (linear.py trains both), on or off.", parse=avgpool_choice, spell=avgpool_text
    )
    learning_rates: tuple[float, ...] = setting(
        ld.LEARNING_RATES, "Rates of the grid before scaling by batch / 256 (linear.py's learning_rates).", Each(Positive(), distinct=True)
    )
    epochs: int = setting(ld.EPOCHS, "Epochs (linear.py's epochs).", AtLeast(1))
    epoch_length: int = setting(ld.EPOCH_LENGTH, "Iterations per epoch (linear.py's epoch_length).", AtLeast(1))
    batch_size: int = setting(ld.BATCH_SIZE, "Images per iteration (linear.py's batch_size per GPU; one process here).", AtLeast(1))
    seed: int = setting(ld.SEED, "Seed of the train sampler (linear.py's seed 0).", AtLeast(0))
    init_seed: int = setting(0, "Seed of the classifiers' initial weights (the reference draws them from torch's global generator).", AtLeast(0))

    def check(self) -> None:
        if not self.avgpool or len(set(self.avgpool)) != len(self.avgpool) or not all(isinstance(v, bool) for v in self.avgpool):
            raise SettingError("avgpool", f"avgpool must be both, on or off, got {self.avgpool!r}", "use avgpool both")


PROTOCOL = register(
    Protocol(
        name="linear-dinov2",
        summary="DINOv2's linear protocol: 52 linear classifiers on the last 1 or 4 blocks' class tokens (± average-pooled patches), the best chosen on val.",
        settings=LinearDinov2Settings,
        inputs=(
            Input(
                "store",
                "A store holding (or beside a store holding) the panels' images in the eval224 view (n_last_blocks 4: its last 4 blocks, "
                "probe extract --views eval224 --blocks last4).",
                "store",
                True,
            ),
            *train_val(
                "Panel whose images train the classifiers (class folders, or COCO: largest category).",
                "Panel that scores every classifier and chooses the best (the reference's val set).",
                use="fit the classifiers",
            ),
            Input(
                "test",
                "Panel where the chosen classifier alone is scored (the reference's --test-datasets); without it the val accuracy is reported.",
                "panel",
                False,
                "panel",
            ),
            json_input("Also write every classifier's accuracy and the choice as JSON."),
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(arrays=("cls_tokens_eval224", "tokens_eval224"), views=("eval224",), labels=True, panel_kinds=("classes", "coco"), blocks="last4"),
        results=("linear-dinov2",),
        result="results.linear_dinov2_report:LinearDinov2Report",
        references=(Reference("Oquab et al., DINOv2: Learning Robust Visual Features without Supervision (TMLR 2024)", "facebookresearch/dinov2 dinov2/eval/linear.py"),),
        differences=(
            Difference(
                "every iteration reads the stored features of the evaluation view (resize 256, centre crop 224)",
                "a frozen store holds one view per image; the reference trains on a new random resized crop and flip of each image at every iteration",
                "the classifiers see no augmentation: accuracies can differ from the reference's by points",
            ),
            Difference(
                "the initial weights come from a generator seeded by init_seed, drawn as nn.Linear then normal_(0, 0.01) draw them",
                "the reference draws from torch's global generator after building the network and transforming a sample",
                "other initial weights than the reference's run; the same at every placement and rerun",
            ),
            Difference(
                "the features are those the store holds (float16 unless extracted with --dtype float32)",
                "probe reads stored tokens; the reference computes them under autocast",
                "float rounding only",
            ),
            Difference("its intermediate val evaluations every 1,250 iterations are not run", "they only log", "none"),
            Difference(
                "one process: the rates are scaled by batch / 256 with a world size of 1",
                "linear.py scales by the global batch (per-GPU batch × GPUs)",
                "at batch 128 the rates are half those of one 2-GPU run; two of them print alike (lr_0_00001) and, as in the reference, "
                "the earlier classifier is neither trained nor evaluated",
            ),
        ),
        run="commands.linear_dinov2:run",
        command=Command(
            "DINOv2's linear classification protocol (facebookresearch/dinov2 dinov2/eval/linear.py): the best of 52 classifiers, chosen on --val.",
            options=(
                "train",
                "val",
                "test",
                "n_last_blocks",
                "avgpool",
                "learning_rates",
                "epochs",
                "epoch_length",
                "batch_size",
                "seed",
                "init_seed",
                "json_path",
                "unseal",
                "cache",
                "quiet",
                "device",
            ),
            table="results.tables_linear:linear_dinov2",
            progress=("iterations", "linear-dinov2"),
        ),
        sections=(),
        placement=("device",),
    )
)
