"""``correspond``: SPair-71k semantic keypoint correspondence (PCK by viewpoint bin), as mbanani/probe3d scores it."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Each, Settings, Within, setting
from .registry import CACHE, Command, Difference, Input, Protocol, Reads, Reference, json_input, register


@dataclass(frozen=True)
class CorrespondSettings(Settings):
    thresholds: tuple[float, ...] = setting((0.05, 0.10, 0.15), "PCK thresholds, fractions of the target box's larger side (probe3d's "
                                            "evaluate_spair_correspondence.py thresh: 0.1; 0.05 and 0.15 beside it).", Each(Within(0.0, 1.0, "(]")))
    instances: int = setting(200, "Pairs sampled per category and viewpoint bin (probe3d's configs/spair_correspondence.yaml num_instances; "
                                  "0: every pair).", AtLeast(0))
    seed: int = setting(20, "Seed of the pairs' shuffle (probe3d's evals/datasets/spair.py random.seed).", AtLeast(0))


PROTOCOL = register(Protocol(
    name="correspond",
    summary="SPair-71k keypoint correspondence: each source keypoint's token matched to the nearest target patch; PCK by viewpoint bin.",
    settings=CorrespondSettings,
    reads=Reads(arrays=("tokens_square800",), views=("square800",), labels=True, panel_kinds=("spair",), panel_sibling=True),
    results=("correspond",),
    references=(Reference("El Banani et al., Probing the 3D Awareness of Visual Foundation Models (CVPR 2024)",
                          "mbanani/probe3d evaluate_spair_correspondence.py, evals/datasets/spair.py"),
                Reference("Min et al., SPair-71k: A Large-scale Benchmark for Semantic Correspondence (2019)", "SPair-71k release (PairAnnotation, ImageAnnotation)")),
    inputs=(Input("store", "A store holding the panel's images in the square800 view (probe extract --panel NAME --views square800).", "store", True),
            Input("panel", "A SPair-71k panel (probe panel add NAME --spair DIR --split test).", "panel", True, "panel"),
            json_input("Also write the PCK tables and settings as JSON."), Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE),
    result="commands.correspond:CorrespondReport",
    differences=(
        Difference("pairs are taken in sorted file order before the seeded shuffle",
                   "the reference shuffles glob's order, which the file system decides",
                   "the 200 pairs sampled per category and bin are reproducible, and other than the reference's on the same seed"),
        Difference("the tokens are those the store holds (float16 unless extracted with --dtype float32)",
                   "probe reads stored tokens; the reference runs the network in float32",
                   "a match can differ where two patches' cosines differ below float16's precision"),
        Difference("PCK at 0.05 and 0.15 beside the reference's 0.10",
                   "the same errors answer every threshold",
                   "none at 0.10"),
        Difference("the keypoint confusion matrix is not kept, and the segmentation masks (unused at the reference's default mask_feats=False) are not read",
                   "neither enters PCK",
                   "none"),
    ),
    run="commands.correspond:run",
    command=Command(
        "SPair-71k keypoint correspondence (mbanani/probe3d evaluate_spair_correspondence.py): PCK per category and viewpoint bin.",
        options=("panel", "thresholds", "instances", "seed", "json_path", "SCORED", "shard"),
        table="results.tables:correspond",
        progress=("pairs", "correspond")),
    sections=("report.sections_correspond:correspond",),
    placement=("workers", "dask_address", "shard"),
))
