"""``linear``: linear probes on the frozen tokens, fitted on a train panel and scored on a val panel."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Each, OneOf, Positive, Settings, Within, setting
from .registry import CACHE, Command, Difference, Input, Protocol, Reads, Reference, json_input, register, train_val


@dataclass(frozen=True)
class LinearSettings(Settings):
    level: str = setting("patch", "patch (dense, mIoU) or image (categories present, mAP).", OneOf(("patch", "image")))
    epochs: int = setting(100, "Most L-BFGS iterations of the dense probe (each a full pass over the train patches).", AtLeast(1))
    weight_decays: tuple[float, ...] = setting(
        (1e-1, 1e-2, 1e-3, 1e-4, 1e-5), "Weight decays the dense probe's hold-out chooses from (strongest first: a tie keeps it).", Each(Positive(), distinct=True)
    )
    holdout: float = setting(0.2, "Share of the train panel's images held out to choose the regularisation.", Within(0.0, 1.0, "()"))
    seed: int = setting(0, "Seed of the train hold-out that chooses the regularisation.", AtLeast(0))
    tolerance: float = setting(1e-4, "Stop the dense fit when every gradient entry of the mean loss is smaller (scikit-learn's default tol).", Positive())


PROTOCOL = register(
    Protocol(
        name="linear",
        summary="Linear probes on the frozen 224 tokens: a dense probe (mIoU) or an image-level one (mAP), regularisation chosen on a train hold-out.",
        settings=LinearSettings,
        inputs=(
            Input("stores", "Stores to compare (each holds, or sits beside, the panels' images).", "stores", True),
            *train_val("Panel whose labels fit the probe (and choose its regularisation).", "Panel whose labels score it, read only after every fit."),
            json_input("Also write the table and its settings as JSON."),
            Input("unseal", "Reason to open a sealed test panel as --val (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(arrays=("tokens_224",), views=("224",), labels=True, panel_kinds=("coco", "voc"), stores=("tokens_224", "cls_tokens_224")),
        results=("linear_patch", "linear_image"),
        result="results.linear_report:LinearReport",
        references=(
            Reference(
                "Yun et al., Patch-level Representation Learning for Self-supervised Vision Transformers (CVPR 2022)", "alinlab/SelfPatch (linear segmentation protocol)"
            ),
        ),
        differences=(
            Difference(
                "a convex probe fitted to its optimum by full-batch L-BFGS (what scikit-learn's lbfgs reaches)",
                "the objective is convex, so its optimum does not depend on a schedule of SGD epochs",
                "the probe of the regularisation chosen, not of a training schedule",
            ),
            Difference(
                "the weight decay (image level: C) is chosen on a hold-out of the train panel, never on val",
                "no val label reaches a fit or a choice of regularisation",
                "the val score is an honest estimate (the reference's choice is not stated)",
            ),
        ),
        run="commands.linear:run",
        source="stores",
        command=Command(
            "Linear probes on the frozen 224 tokens: fit on --train, score on --val, one table for all stores.",
            options=(
                "train",
                "val",
                "level",
                "epochs",
                "seed",
                "weight_decays",
                "holdout",
                "tolerance",
                "json_path",
                "unseal",
                "workers",
                "dask_address",
                "cache",
                "quiet",
            ),
            table="results.tables:linear",
            progress=(None, "linear"),
        ),
        sections=("report.sections_linear:linear",),
        placement=(),
    )
)
