"""``linear``: linear probes on the frozen tokens, fitted on a train panel and scored on a val panel."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least, one_of
from .registry import UNSEAL_VAL, Option, Protocol, Reads, Reference, on_train_val, register, written_to


@dataclass(frozen=True)
class LinearSettings(Settings):
    level: str = "patch"  # patch (dense, mIoU) or image (categories present, mAP)
    epochs: int = 100  # most L-BFGS iterations of the dense probe
    seed: int = 0  # seed of the train hold-out that chooses the regularisation

    def check(self) -> None:
        one_of("level", self.level, ("patch", "image"))
        at_least("epochs", self.epochs, 1)


def execute(settings: LinearSettings, placement, *, stores, train, val, unseal=None, cache_dir=None, json_path=None, on_step=None, **_):
    from ..analyses.linear import FitSettings
    from ..commands.linear import run_linear

    return run_linear(list(stores), train, val, level=settings.level, settings=FitSettings(epochs=settings.epochs, seed=settings.seed), unseal=unseal,
                      cache_dir=cache_dir, json_path=json_path, on_step=on_step)


PROTOCOL = register(Protocol(
    name="linear",
    summary="Linear probes on the frozen 224 tokens: a dense probe (mIoU) or an image-level one (mAP), regularisation chosen on a train hold-out.",
    settings=LinearSettings,
    reads=Reads(arrays=("tokens_224",), views=("224",), labels=True, panel_kinds=("coco", "voc")),
    results=("linear_patch", "linear_image"),
    references=(Reference("Yun et al., Patch-level Representation Learning for Self-supervised Vision Transformers (CVPR 2022)",
                          "alinlab/SelfPatch (linear segmentation protocol)"),),
    differences="A convex probe fitted to its optimum by full-batch L-BFGS (what scikit-learn's lbfgs reaches), not a schedule of SGD epochs; "
                "the weight decay is chosen on a hold-out of the train panel, never on val.",
    execute=execute,
    source="stores",
    command=on_train_val(
        "Linear probes on the frozen 224 tokens: fit on --train, score on --val, one table for all stores.",
        "Stores to compare (each holds, or sits beside, the panels' images).",
        "Panel whose labels fit the probe (and choose its regularisation).",
        "Panel whose labels score it, read only after every fit.",
        Option("level", "patch (dense, mIoU) or image (categories present, mAP).", default="patch"),
        Option("epochs", "Most L-BFGS iterations of the dense probe (each a full pass over the train patches).", "int", 100),
        Option("seed", "Seed of the train hold-out that chooses the regularisation.", "int", 0),
        written_to("Also write the table and its settings as JSON."),
        UNSEAL_VAL,
        "workers", "dask_address", "cache", "quiet",
        table="results.tables:linear",
        progress=(None, "on_step", "linear")),
    sections=("report.sections_linear:linear",),
    placement=(),
))
