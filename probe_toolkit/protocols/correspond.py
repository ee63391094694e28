"""``correspond``: SPair-71k semantic keypoint correspondence (PCK by viewpoint bin) and NAVI multiview correspondence (recall
by distance and by relative rotation), as mbanani/probe3d scores them; the panel's kind chooses which."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Each, OneOf, SettingError, Settings, Within, setting
from .registry import CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register


@dataclass(frozen=True)
class CorrespondSettings(Settings):
    thresholds: tuple[float, ...] = setting(
        (0.05, 0.10, 0.15),
        "PCK thresholds, fractions of the target box's larger side (probe3d's evaluate_spair_correspondence.py thresh: 0.1; 0.05 and 0.15 beside it).",
        Each(Within(0.0, 1.0, "(]")),
    )
    instances: int = setting(200, "Pairs sampled per category and viewpoint bin (probe3d's configs/spair_correspondence.yaml num_instances; 0: every pair).", AtLeast(0))
    seed: int | None = setting(
        None,
        "Seed of the pairs (probe3d: SPair's random.seed(20) in evals/datasets/spair.py, NAVI's torch.manual_seed(8) in evals/datasets/navi.py); none: the panel's.",
        AtLeast(0),
    )
    num_corr: int = setting(1000, "NAVI: correspondences kept per pair, by ratio-test weight (probe3d's configs/navi_correspondence.yaml num_corr).", AtLeast(1))
    scale_factor: float = setting(
        0.25, "NAVI: the matching's resolution, a fraction of the 512 view (probe3d's configs/navi_correspondence.yaml scale_factor).", OneOf((1.0, 0.5, 0.25, 0.125))
    )


SPAIR_SEED = 20  # evals/datasets/spair.py random.seed(20)
NAVI_SEED = 8  # evals/datasets/navi.py generate_instance_pairs: torch.manual_seed(8)
SPAIR_ONLY = ("thresholds", "instances")  # refused on a NAVI panel, as the NAVI ones on a SPair panel: they would change nothing
NAVI_ONLY = ("num_corr", "scale_factor")


def not_for(settings: CorrespondSettings, names: tuple[str, ...], kind: str) -> None:
    """A setting of the other data set given for this panel's kind: refused before any label read (it would change nothing)."""
    defaults = CorrespondSettings()
    for name in names:
        if getattr(settings, name) != getattr(defaults, name):
            raise SettingError(name, f"{name} applies to the other data set's panels, not to a {kind} panel", f"drop {name}")


PROTOCOL = register(
    Protocol(
        name="correspond",
        summary="Correspondence as probe3d scores it: SPair-71k keypoints (PCK by viewpoint bin) or NAVI multiview pairs (recall at 1/2/5 cm, "
        "5/25/50 px, by relative rotation).",
        settings=CorrespondSettings,
        reads=Reads(arrays=("tokens_square800",), views=("square800",), labels=True, panel_kinds=("spair", "navi"), panel_sibling=True),
        results=("correspond", "correspond-navi"),
        references=(
            Reference(
                "El Banani et al., Probing the 3D Awareness of Visual Foundation Models (CVPR 2024)",
                "mbanani/probe3d evaluate_spair_correspondence.py, evaluate_navi_correspondence.py, evals/datasets/spair.py, navi.py",
            ),
            Reference("Min et al., SPair-71k: A Large-scale Benchmark for Semantic Correspondence (2019)", "SPair-71k release (PairAnnotation, ImageAnnotation)"),
            Reference(
                "Jampani et al., NAVI: Category-Agnostic Image Collections with High-Quality 3D Shape and Pose Annotations (NeurIPS 2023)", "google/navi navi_v1 release"
            ),
        ),
        inputs=(
            Input(
                "store",
                "A store: for SPair-71k, holding the panel's images in the square800 view (probe extract --panel NAME --views square800); "
                "for NAVI, any store of the network (its checkpoint runs on the NAVI views; the record is saved in it).",
                "store",
                True,
            ),
            Input("panel", "A SPair-71k panel (probe panel add NAME --spair DIR --split test) or a NAVI one (probe panel add NAME --navi DIR).", "panel", True, "panel"),
            json_input("Also write the PCK tables and settings as JSON."),
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE,
        ),
        result="results.correspond_report:CorrespondReport",
        differences=(
            Difference(
                "pairs are taken in sorted file order before the seeded shuffle",
                "the reference shuffles glob's order, which the file system decides",
                "the 200 pairs sampled per category and bin are reproducible, and other than the reference's on the same seed",
            ),
            Difference(
                "the tokens are those the store holds (float16 unless extracted with --dtype float32)",
                "probe reads stored tokens; the reference runs the network in float32",
                "a match can differ where two patches' cosines differ below float16's precision",
            ),
            Difference("PCK at 0.05 and 0.15 beside the reference's 0.10", "the same errors answer every threshold", "none at 0.10"),
            Difference(
                "the keypoint confusion matrix is not kept, and the segmentation masks (unused at the reference's default mask_feats=False) are not read",
                "neither enters PCK",
                "none",
            ),
            Difference(
                "NAVI: the store's checkpoint runs on probe3d's NAVI views (each image cut to the square around its object, whose pixels are "
                "the depth map's), made after the ledger entry and never stored, one image per forward pass",
                "the network's input depends on the labels, and extraction never reads a label; the reference batches four pairs",
                "float rounding only",
            ),
            Difference(
                "NAVI: objects, collections and images are sorted before the pairs are drawn (torch.manual_seed(8), torch.multinomial)",
                "the reference takes glob's and os.listdir's order, which the file system decides",
                "the pairs are reproducible, and other than the reference's on another file system",
            ),
            Difference(
                "NAVI: exact nearest neighbours (float64 L2 of the unit features, equal distances to the lower index); equal ratio-test "
                "weights keep the lower source pixel",
                "the reference's faiss GpuIndexFlatL2 computes float32 distances on a GPU, and torch.topk leaves ties open",
                "a match can differ where two distances differ in float32's last bits",
            ),
            Difference(
                "NAVI: a pair whose object covers fewer than num_corr pixels at the matching resolution keeps them all",
                "the reference's torch.stack of the pairs fails there",
                "none where the reference runs",
            ),
            Difference(
                "NAVI: the ten numbers the reference prints (recall at 1, 2, 5 cm, at 5, 25, 50 px, the 2 cm recall in four rotation bins) "
                "and the mean of the four bins beside them",
                "which of them a published 'NAVI' number is goes unstated (NVlabs/RADIO#148; docs/commands/correspond.md)",
                "none on the ten",
            ),
        ),
        run="commands.correspond:run",
        command=Command(
            "Correspondence as mbanani/probe3d scores it: SPair-71k PCK per category and viewpoint bin (evaluate_spair_correspondence.py), or NAVI "
            "recall by distance and rotation (evaluate_navi_correspondence.py), as the panel's kind says.",
            options=(
                "panel",
                "thresholds",
                "instances",
                "seed",
                "num_corr",
                "scale_factor",
                "json_path",
                "SCORED",
                "shard",
                Option("device", "NAVI: where the network runs, cpu or cuda."),
            ),
            table="results.tables:correspond",
            progress=("pairs", "correspond"),
        ),
        sections=("report.sections_correspond:correspond", "report.sections_navi:navi"),
        placement=("workers", "dask_address", "shard", "device"),  # pairs over workers, a cluster or shards; NAVI's network on --device
    )
)
