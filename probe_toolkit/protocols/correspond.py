"""``correspond``: SPair-71k semantic keypoint correspondence (PCK by viewpoint bin), as mbanani/probe3d scores it."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import SettingError, Settings, at_least
from .registry import Option, Protocol, Reads, Reference, on_panel, register, written_to


@dataclass(frozen=True)
class CorrespondSettings(Settings):
    thresholds: tuple[float, ...] = (0.05, 0.10, 0.15)  # 0.10: evaluate_spair_correspondence.py thresh; 0.05 and 0.15 beside it
    instances: int = 200  # configs/spair_correspondence.yaml num_instances (0: every pair)
    seed: int = 20  # evals/datasets/spair.py random.seed(20)

    def check(self) -> None:
        if not self.thresholds:
            raise SettingError("thresholds", "thresholds must hold at least one threshold", "use e.g. thresholds (0.05, 0.1, 0.15)")
        for t in self.thresholds:
            if not 0 < float(t) <= 1:
                raise SettingError("thresholds", f"thresholds must lie in (0, 1] (fractions of the target box's larger side), not {t}", "use e.g. 0.1")
        at_least("instances", self.instances, 0)


def execute(settings: CorrespondSettings, placement, *, store, panel, unseal=None, cache_dir=None, json_path=None, progress=None, **_):
    from ..commands.correspond import run_correspond

    return run_correspond(store, panel, thresholds=settings.thresholds, instances=settings.instances, seed=settings.seed, unseal=unseal,
                          cache_dir=cache_dir, json_path=json_path, progress=progress, placement=placement)


PROTOCOL = register(Protocol(
    name="correspond",
    summary="SPair-71k keypoint correspondence: each source keypoint's token matched to the nearest target patch; PCK by viewpoint bin.",
    settings=CorrespondSettings,
    reads=Reads(arrays=("tokens_square800",), views=("square800",), labels=True, panel_kinds=("spair",), panel_sibling=True),
    results=("correspond",),
    references=(Reference("El Banani et al., Probing the 3D Awareness of Visual Foundation Models (CVPR 2024)",
                          "mbanani/probe3d evaluate_spair_correspondence.py, evals/datasets/spair.py"),
                Reference("Min et al., SPair-71k: A Large-scale Benchmark for Semantic Correspondence (2019)", "SPair-71k release (PairAnnotation, ImageAnnotation)")),
    differences=("Pairs are taken in sorted file order before the seeded shuffle, where the reference shuffles glob's order (which the file "
                 "system decides), so the 200 pairs sampled per category and bin are reproducible. The tokens are those the store holds "
                 "(float16 unless extracted with --dtype float32), where the reference runs the network in float32. The reference prints PCK at "
                 "0.10 alone; 0.05 and 0.15 are computed from the same errors. Its keypoint confusion matrix is not kept, and the "
                 "segmentation masks it loads (unused at its default mask_feats=False) are not read."),
    execute=execute,
    command=on_panel(
        "SPair-71k keypoint correspondence (mbanani/probe3d evaluate_spair_correspondence.py): PCK per category and viewpoint bin.",
        "A store holding the panel's images in the square800 view (probe extract --panel NAME --views square800).",
        "A SPair-71k panel (probe panel add NAME --spair DIR --split test).",
        Option("thresholds", "PCK thresholds, fractions of the target box's larger side (probe3d: 0.1).", "floats", "0.05,0.1,0.15", example="0.05,0.1,0.15"),
        Option("instances", "Pairs sampled per category and viewpoint bin (probe3d: 200; 0: every pair).", "int", 200),
        Option("seed", "Seed of the pairs' shuffle (probe3d: random.seed(20)).", "int", 20),
        written_to("Also write the PCK tables and settings as JSON."),
        "SCORED",
        "shard",
        table="results.tables:correspond",
        progress=("pairs", "progress", "correspond")),
    sections=("report.sections_correspond:correspond",),
    placement=("workers", "dask_address", "shard"),
))
