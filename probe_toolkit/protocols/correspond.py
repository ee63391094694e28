"""``correspond``: SPair-71k semantic keypoint correspondence (PCK by viewpoint bin) and NAVI multiview correspondence (recall
by distance and by relative rotation), as mbanani/probe3d scores them; the panel's kind chooses which."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import SettingError, Settings, at_least, one_of
from .registry import Option, Protocol, Reads, Reference, on_panel, register, written_to

SPAIR_SEED = 20  # evals/datasets/spair.py random.seed(20)
NAVI_SEED = 8  # evals/datasets/navi.py generate_instance_pairs: torch.manual_seed(8)


@dataclass(frozen=True)
class CorrespondSettings(Settings):
    thresholds: tuple[float, ...] = (0.05, 0.10, 0.15)  # SPair: 0.10 is evaluate_spair_correspondence.py thresh; 0.05 and 0.15 beside it
    instances: int = 200  # SPair: configs/spair_correspondence.yaml num_instances (0: every pair)
    seed: int | None = None  # None: the panel's reference seed (SPair 20, NAVI 8)
    num_corr: int = 1000  # NAVI: configs/navi_correspondence.yaml num_corr
    scale_factor: float = 0.25  # NAVI: configs/navi_correspondence.yaml scale_factor

    def check(self) -> None:
        if not self.thresholds:
            raise SettingError("thresholds", "thresholds must hold at least one threshold", "use e.g. thresholds (0.05, 0.1, 0.15)")
        for t in self.thresholds:
            if not 0 < float(t) <= 1:
                raise SettingError("thresholds", f"thresholds must lie in (0, 1] (fractions of the target box's larger side), not {t}", "use e.g. 0.1")
        at_least("instances", self.instances, 0)
        if self.seed is not None:
            at_least("seed", self.seed, 0)
        at_least("num_corr", self.num_corr, 1)
        one_of("scale_factor", self.scale_factor, (1.0, 0.5, 0.25, 0.125))


def _not_for(settings: CorrespondSettings, names: tuple[str, ...], kind: str, fix: str) -> None:
    """A setting of the other data set, given for this panel's: refused (it would change nothing)."""
    default = CorrespondSettings()
    for name in names:
        if getattr(settings, name) != getattr(default, name):
            raise SettingError(name, f"{name} applies to the other data set's panels, not to a {kind} panel", fix)


def execute(settings: CorrespondSettings, placement, *, store, panel, unseal=None, cache_dir=None, json_path=None, progress=None, **_):
    from dataclasses import replace

    from ..labels.navi import KIND as NAVI
    from ..labels.panels import get_panel

    if get_panel(panel, cache_dir).kind == NAVI:
        from ..commands.correspond_navi import run_correspond_navi

        _not_for(settings, ("thresholds", "instances"), "NAVI", "drop it: NAVI is scored at 1, 2, 5 cm and 5, 25, 50 px (probe3d)")
        return run_correspond_navi(store, panel, replace(settings, seed=NAVI_SEED if settings.seed is None else settings.seed), unseal=unseal,
                                   cache_dir=cache_dir, json_path=json_path, progress=progress, placement=placement)
    from ..commands.correspond import run_correspond

    _not_for(settings, ("num_corr", "scale_factor"), "SPair-71k", "drop it: it sets NAVI's matching")
    if placement.device != "cpu":
        raise SettingError("device", "a SPair-71k panel is scored on the store's tokens, on the CPU", "drop --device (it runs NAVI's network)")
    return run_correspond(store, panel, thresholds=settings.thresholds, instances=settings.instances, seed=SPAIR_SEED if settings.seed is None else settings.seed,
                          unseal=unseal, cache_dir=cache_dir, json_path=json_path, progress=progress, placement=placement)


NAVI_DIFFERENCES = (
    "NAVI: the network of the store's checkpoint runs on the views probe3d's NAVI dataset makes (the image cut to the square around its "
    "object, whose pixels are the depth map's: labels, so the views are made after the ledger entry, never stored), one image per forward "
    "pass where the reference batches four pairs. Objects, collections and images are taken in sorted order before the pairs are drawn "
    "(torch.manual_seed(8), torch.multinomial), where the reference takes glob's and os.listdir's order (the file system's), so the pairs "
    "are reproducible. Nearest neighbours are exact (float64 products of the unit features, equal cosines to the lower index) where the "
    "reference's faiss GpuIndexFlatL2 computes float32 distances on a GPU; equal ratio-test weights keep the lower source pixel where "
    "torch.topk leaves ties open. A pair whose object covers fewer than num_corr pixels at 128 x 128 keeps all of them, where the "
    "reference's torch.stack of the pairs fails. The reference prints ten numbers (recall at 1, 2, 5 cm, at 5, 25, 50 px, and the 2 cm "
    "recall in four rotation bins); probe keeps them all, and the mean of the four bins beside them (see docs/commands/correspond.md on "
    "NVlabs/RADIO#148)."
)

PROTOCOL = register(Protocol(
    name="correspond",
    summary="Correspondence as probe3d scores it: SPair-71k keypoints (PCK by viewpoint bin) or NAVI multiview pairs (recall at 1/2/5 cm, "
            "5/25/50 px, by relative rotation).",
    settings=CorrespondSettings,
    reads=Reads(arrays=("tokens_square800",), views=("square800",), labels=True, panel_kinds=("spair", "navi"), panel_sibling=True),
    results=("correspond", "correspond-navi"),
    references=(Reference("El Banani et al., Probing the 3D Awareness of Visual Foundation Models (CVPR 2024)",
                          "mbanani/probe3d evaluate_spair_correspondence.py, evaluate_navi_correspondence.py, evals/datasets/spair.py, navi.py"),
                Reference("Min et al., SPair-71k: A Large-scale Benchmark for Semantic Correspondence (2019)", "SPair-71k release (PairAnnotation, ImageAnnotation)"),
                Reference("Jampani et al., NAVI: Category-Agnostic Image Collections with High-Quality 3D Shape and Pose Annotations (NeurIPS 2023)",
                          "google/navi navi_v1 release")),
    differences=("SPair-71k: pairs are taken in sorted file order before the seeded shuffle, where the reference shuffles glob's order (which the file "
                 "system decides), so the 200 pairs sampled per category and bin are reproducible. The tokens are those the store holds "
                 "(float16 unless extracted with --dtype float32), where the reference runs the network in float32. The reference prints PCK at "
                 "0.10 alone; 0.05 and 0.15 are computed from the same errors. Its keypoint confusion matrix is not kept, and the "
                 "segmentation masks it loads (unused at its default mask_feats=False) are not read. " + NAVI_DIFFERENCES),
    execute=execute,
    command=on_panel(
        "Correspondence as mbanani/probe3d scores it: SPair-71k PCK per category and viewpoint bin (evaluate_spair_correspondence.py), or NAVI "
        "recall by distance and rotation (evaluate_navi_correspondence.py), as the panel's kind says.",
        "A store: for SPair-71k, holding the panel's images in the square800 view (probe extract --panel NAME --views square800); for NAVI, "
        "any store of the network (its checkpoint runs on the NAVI views; the record is saved in it).",
        "A SPair-71k panel (probe panel add NAME --spair DIR --split test) or a NAVI one (probe panel add NAME --navi DIR --split test).",
        Option("thresholds", "SPair: PCK thresholds, fractions of the target box's larger side (probe3d: 0.1).", "floats", "0.05,0.1,0.15",
               example="0.05,0.1,0.15"),
        Option("instances", "SPair: pairs sampled per category and viewpoint bin (probe3d: 200; 0: every pair).", "int", 200),
        Option("seed", "Seed of the pairs (probe3d: SPair's random.seed(20), NAVI's torch.manual_seed(8)).", "int"),
        Option("num_corr", "NAVI: correspondences kept per pair, by ratio-test weight (probe3d: 1000).", "int", 1000),
        Option("scale_factor", "NAVI: resolution of the matching, a fraction of the 512 view (probe3d: 0.25).", "float", 0.25),
        written_to("Also write the tables and settings as JSON."),
        "SCORED",
        "shard",
        Option("device", "NAVI: where the network runs, cpu or cuda.", default="cpu"),
        table="results.tables:correspond",
        progress=("pairs", "progress", "correspond")),
    sections=("report.sections_correspond:correspond", "report.sections_navi:navi"),
    placement=("workers", "dask_address", "shard", "device"),
))
