"""``rank``: how many dimensions a block's tokens use: RankMe of the class and patch tokens, LiDAR where views allow."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import SettingError, Settings, at_least, one_of
from .registry import Command, Option, Protocol, Reads, Reference, register, written_to

SAMPLE_SIZES = (256, 512, 1024, 2560, 5120, 10240, 25600)  # analyses.rank.SAMPLE_SIZES (numpy-free here)


def _views() -> tuple[str, ...]:
    from ..commands.token_rows import token_views

    return token_views()


@dataclass(frozen=True)
class RankSettings(Settings):
    view: str = "224"  # the view whose tokens are measured (one grid for every image)
    tokens: tuple[str, ...] = ("class", "patch")  # class tokens (one row per image), patch tokens (one row per patch)
    sizes: tuple[int, ...] = SAMPLE_SIZES  # rows of the sample-size curve (nested seeded subsets)
    seed: int = 0  # seed of the curve's subsets
    lidar: bool = True  # LiDAR of the class tokens when the store holds the hbird512 views of its images
    partial: bool = False  # measure a store still being extracted

    def check(self) -> None:
        one_of("view", self.view, _views())
        if not self.tokens or any(t not in ("class", "patch") for t in self.tokens) or len(set(self.tokens)) != len(self.tokens):
            raise SettingError("tokens", f"tokens {list(self.tokens)} must name class and/or patch, each once", "use e.g. tokens=('class', 'patch')")
        for n in self.sizes:
            at_least("sizes", n, 2)
        at_least("seed", self.seed, 0)


def execute(settings: RankSettings, placement, *, stores, json_path=None, progress=None, **_):
    from ..commands.rank import run_rank

    return run_rank(list(stores), settings, json_path=json_path, progress=progress)


DIFFERENCES = (
    "RankMe as Garrido et al. (ICML 2023) define it, p_k = σ_k / ‖σ‖₁ + ε with ε = 1e-7, on the embeddings as they are (not centred, "
    "as the paper and RADIO's calc_rank_me); the record also keeps RADIO's smooth_rank form (σ_k > 0 only, ε in the denominator), "
    "within D·ε·|log ε| of it. What differs, item by item: "
    "(1) the singular values are the square roots of the eigenvalues of ZᵀZ accumulated in float64 a chunk of images at a time, where "
    "RADIO takes torch.linalg.svdvals of the whole float64 matrix: the same values to float64 rounding of the small ones "
    "(benchmarks/labelfree.py), in D² memory instead of n × D; "
    "(2) RADIO measures the summary (class) token of one regular view of n = 1000 images; probe measures the class tokens of every "
    "image of the store and, beside them, every patch token as a row, and states the estimator's dependence on the number of rows "
    "(the curve at 256 … 25,600 nested seeded rows); "
    "(3) LiDAR follows calc_lidar (between-image and within-image covariances, δ = 1e-8, Σ_w^-1/2 Σ_b Σ_w^-1/2) but over the views the "
    "store holds of each image: hbird512 and its augmented hbird512_aug0/1 (random resized crop 0.5-2, colour jitter: Hummingbird's), "
    "3 views where RADIO draws 1 regular + 99 RandAugment(3 ops) + RandomResizedCrop(0.5-1) views at 336 px; with so few views the "
    "within-image covariance is a coarse estimate, so the LiDAR figure is comparable only between stores extracted alike; a store "
    "without those views records no LiDAR and says why; LiDAR-EQ (its equivariant, homography-warped variant) is not computed; "
    "(4) tokens are the block's outputs before the final norm (RADIO's summary comes after its own head)."
)

PROTOCOL = register(Protocol(
    name="rank",
    summary="RankMe of a block's class and patch tokens (exp of the entropy of the normalised singular values), its dependence on "
            "the number of rows, and LiDAR where the store holds several views of each image.",
    settings=RankSettings,
    reads=Reads(arrays=("tokens_224", "cls_tokens_224", "cls_tokens_hbird512", "cls_tokens_hbird512_aug0", "cls_tokens_hbird512_aug1"),
                views=("224",)),
    results=("rank",),
    references=(
        Reference("Garrido et al., RankMe: Assessing the Downstream Performance of Pretrained Self-Supervised Representations by Their Rank (ICML 2023)",
                  "NVlabs/RADIO examples/ssl_metrics.py (calc_rank_me, smooth_rank)"),
        Reference("Thilak et al., LiDAR: Sensing Linear Probing Performance in Joint Embedding SSL Architectures (ICLR 2024)",
                  "NVlabs/RADIO examples/ssl_metrics.py (calc_lidar)"),
    ),
    differences=DIFFERENCES,
    execute=execute,
    source="stores",
    command=Command(
        help="RankMe of a block's class and patch tokens, and LiDAR where the store holds several views of each image.",
        source="Stores written by probe extract (several: side by side, one record each).",
        options=(
            Option("view", "The view whose tokens are measured (224, eval224, 96, hbird512, square800).", default="224"),
            Option("tokens", "class,patch: which tokens are rows (one class token per image; every patch token).", "parse", "class,patch",
                   parse=lambda text: tuple(t.strip() for t in text.split(",") if t.strip())),
            Option("sizes", "Rows of the sample-size curve.", "ints", ",".join(map(str, SAMPLE_SIZES)), example="256,1024,25600"),
            Option("seed", "Seed of the curve's nested subsets.", "int", 0),
            Option("lidar", "LiDAR over the hbird512 views when the store holds them.", "either", True),
            written_to("Also write the numbers as JSON."),
            "partial", "quiet"),
        table="results.tables_labelfree:rank",
        progress=("images", "progress", "rank")),
    sections=("report.sections_labelfree:rank",),
    placement=(),  # one process: its work is a few float64 matrix products, which BLAS spreads over the cores
))
