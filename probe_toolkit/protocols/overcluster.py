"""``overcluster``: k-means with many clusters on a panel's patch tokens, matched to its classes (NeCo's protocol); mIoU."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import SettingError, Settings, at_least
from .registry import Option, Protocol, Reads, Reference, on_panel, register, written_to


@dataclass(frozen=True)
class OverclusterSettings(Settings):
    k: tuple[int, ...] = (100, 300, 500)  # clusters (NeCo's overclustering table; Leopart's K = 500)
    pca_dim: int = 50  # NeCo configs: pca_dim
    seeds: int = 5  # NeCo configs: num_seeds (faiss seeds 0 .. seeds − 1), the mIoU averaged over them
    iterations: int = 100  # NeCo utils.py cluster(): niter
    restarts: int = 5  # nredo: the best of 5 runs is kept

    def check(self) -> None:
        if not self.k or len(set(self.k)) != len(self.k):
            raise SettingError("k", f"k {list(self.k)} must name each number of clusters once", "use e.g. k=(100, 300, 500)")
        for k in self.k:
            at_least("k", k, 2)
        at_least("pca_dim", self.pca_dim, 1)
        at_least("seeds", self.seeds, 1)
        at_least("iterations", self.iterations, 1)
        at_least("restarts", self.restarts, 1)


def execute(settings: OverclusterSettings, placement, *, store, panel, unseal=None, cache_dir=None, json_path=None, progress=None, **_):
    from ..commands.overcluster import run_overcluster

    return run_overcluster(store, panel, settings, unseal=unseal, cache_dir=cache_dir, json_path=json_path, progress=progress)


DIFFERENCES = (
    "Follows vpariza/NeCo experiments/overcluster/eval_overcluster.py and experiments/utils.py (normalize_and_transform, cluster, "
    "PredsmIoU): every patch token of the panel's images through the backbone's final norm, StandardScaler over all tokens, "
    "faiss.PCAMatrix to 50 dimensions, faiss.Kmeans (100 iterations, 5 restarts, seeds 0-4, faiss's defaults otherwise: at most 256 "
    "training points per centroid), cluster maps and label maps nearest-resized to 100 × 100, 255 ignored; many-to-one matching by "
    "precision when k exceeds the classes, Hungarian (linear_sum_assignment on 1 − IoU, unmatched clusters to background) when k "
    "equals them; mIoU the mean over all 21 VOC classes (a class without pixels counts 0), averaged over the seeds. What differs, item "
    "by item: "
    "(1) the images are the store's hbird512 view, squashed to 512 × 512 with PIL's bilinear filter and normalised with "
    "open-hummingbird-eval's std (0.229, 0.224, 0.255), where NeCo squashes to 448 × 448 with ImageNet's std: 32 × 32 tokens per "
    "image at /16 instead of 28 × 28 (a /14 network reads the view's top-left 504 px); the label maps are squashed nearest to the "
    "view (512) and then to 100 × 100, where NeCo goes through 448; "
    "(2) the standardisation is computed in float64 over all tokens at once (NeCo's StandardScaler.partial_fit over blocks of "
    "100,000 rows agrees to float32 rounding); "
    "(3) the issue's 'Hungarian-matched mIoU' is NeCo's code only at k = the number of classes: at k = 100, 300, 500 NeCo matches "
    "many-to-one by precision, and probe does the same, recording the matching used for each k; "
    "(4) only VOC segmentation panels are scored (NeCo's ADE20K path, ignore index 0, is marked unverified in its own code); "
    "(5) one BLAS / OpenMP thread, so the clusters do not depend on the machine's cores; "
    "(6) labels are read once, through the ledger, after every clustering is done."
)

PROTOCOL = register(Protocol(
    name="overcluster",
    summary="Overclustering: k-means (k = 100, 300, 500) on a panel's patch tokens, clusters matched to its classes, VOC mIoU (NeCo's protocol).",
    settings=OverclusterSettings,
    reads=Reads(arrays=("tokens_hbird512",), views=("hbird512",), labels=True, panel_kinds=("voc-segmentation",)),
    results=("overcluster",),
    references=(
        Reference("Pariza et al., Near, far: Patch-ordering enhances vision foundation models' scene understanding (NeCo, ICLR 2025)",
                  "vpariza/NeCo experiments/overcluster/eval_overcluster.py"),
        Reference("Ziegler & Asano, Self-Supervised Learning of Object Parts for Semantic Segmentation (Leopart, CVPR 2022)",
                  "vpariza/NeCo experiments/utils.py (PredsmIoU)"),
    ),
    differences=DIFFERENCES,
    execute=execute,
    command=on_panel(
        "Overclustering (NeCo): k-means on a panel's patch tokens, clusters matched to its classes; VOC mIoU at each k.",
        "A store holding (or beside a store holding) the panel's images in the hbird512 view.",
        "VOC segmentation panel whose images are clustered and whose label maps score the clusters (read only to score).",
        Option("k", "Numbers of clusters (NeCo: 100, 300, 500).", "ints", "100,300,500", example="100,300,500"),
        Option("pca_dim", "PCA dimensions before k-means (NeCo: 50).", "int", 50),
        Option("seeds", "k-means seeds 0 .. seeds − 1, the mIoU averaged over them (NeCo: 5).", "int", 5),
        Option("iterations", "k-means iterations (NeCo: 100).", "int", 100),
        Option("restarts", "k-means restarts, the best kept (NeCo: 5).", "int", 5),
        Option("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
        written_to("Also write the scores as JSON."),
        "cache", "quiet",
        table="results.tables_labelfree:overcluster",
        progress=("clusterings", "progress", "overcluster")),
    sections=("report.sections_labelfree:overcluster",),
    placement=(),  # one process: k-means in faiss on one thread
))
