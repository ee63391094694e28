"""``rank``: how many dimensions a block's tokens use: RankMe of the class and patch tokens, LiDAR where views allow."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import AtLeast, Each, SettingError, Settings, setting
from .registry import Command, Difference, Input, Protocol, Reads, Reference, json_input, register

SAMPLE_SIZES = (256, 512, 1024, 2560, 5120, 10240, 25600)  # analyses.rank.SAMPLE_SIZES (numpy-free here)


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass(frozen=True)
class RankSettings(Settings):
    view: str = setting("224", "The view whose tokens are measured (any sized view: 224, eval224, 96, short@448, hbird@448, ...).")
    tokens: tuple[str, ...] = setting(
        ("class", "patch"), "class,patch: which tokens are rows (one class token per image; every patch token).", parse=_names, spell=",".join
    )
    sizes: tuple[int, ...] = setting(SAMPLE_SIZES, "Rows of the sample-size curve (nested seeded subsets).", Each(AtLeast(2)))
    seed: int = setting(0, "Seed of the curve's nested subsets.", AtLeast(0))
    lidar: bool = setting(True, "LiDAR of the class tokens over the Hummingbird views, when the store holds them.", cli="either")
    partial: bool = setting(False, "Measure a store still being extracted (its finished images).")

    def check(self) -> None:
        from ..commands.token_rows import check_view

        check_view(self.view)
        if not self.tokens or any(t not in ("class", "patch") for t in self.tokens) or len(set(self.tokens)) != len(self.tokens):
            raise SettingError("tokens", f"tokens {list(self.tokens)} must name class and/or patch, each once", "use e.g. tokens=class,patch")


DIFFERENCES = (
    Difference(
        "the singular values are those of the R factor of a QR of the rows updated a chunk of images at a time in float64 (TSQR)",
        "RADIO's calc_rank_me takes torch.linalg.svdvals of the whole float64 matrix, n × D in memory",
        "none: the same values (benchmarks/labelfree.py: the same RankMe on 100,000 × 384 tokens), in D² memory",
    ),
    Difference(
        "RankMe is Garrido et al.'s p_k = σ_k / ‖σ‖₁ + ε (ε = 1e-7); the record also keeps RADIO's smooth_rank form (σ_k > 0 only, ε in the denominator)",
        "the paper defines the first; RADIO's code computes the second",
        "within D·ε·|log ε| of each other (6e-4 at D = 384)",
    ),
    Difference(
        "probe measures the class tokens of every image of the store and, beside them, every patch token as a row, and the estimator at 256 … 25,600 nested seeded rows",
        "RADIO measures the summary token of one regular view of n = 1000 images",
        "RankMe grows with the rows until they far outnumber the channels: compare stores at the same rows",
    ),
    Difference(
        "LiDAR follows calc_lidar (δ = 1e-8, Σ_w^-1/2 Σ_b Σ_w^-1/2) over the views the store holds of each image: hbird@S and its "
        "two augmented views (random resized crop 0.5-2, colour jitter: Hummingbird's)",
        "RADIO draws 1 regular + 99 RandAugment(3 ops) + RandomResizedCrop(0.5-1) views at 336 px, which a store does not hold",
        "with 3 views the within-image covariance is a coarse estimate: compare LiDAR only between stores extracted alike; a "
        "store without those views records no LiDAR and says why; LiDAR-EQ is not computed",
    ),
    Difference("the tokens are the block's outputs before the final norm", "a store keeps them so", "RADIO's summary comes after its own head"),
)

PROTOCOL = register(
    Protocol(
        name="rank",
        summary="RankMe of a block's class and patch tokens (exp of the entropy of the normalised singular values), its dependence on "
        "the number of rows, and LiDAR where the store holds several views of each image.",
        settings=RankSettings,
        reads=Reads(arrays=("tokens_224", "cls_tokens_224", "cls_tokens_hbird512", "cls_tokens_hbird512_aug0", "cls_tokens_hbird512_aug1"), views=("224",)),
        results=("rank",),
        references=(
            Reference(
                "Garrido et al., RankMe: Assessing the Downstream Performance of Pretrained Self-Supervised Representations by Their Rank (ICML 2023)",
                "NVlabs/RADIO examples/ssl_metrics.py (calc_rank_me, smooth_rank)",
            ),
            Reference(
                "Thilak et al., LiDAR: Sensing Linear Probing Performance in Joint Embedding SSL Architectures (ICLR 2024)",
                "NVlabs/RADIO examples/ssl_metrics.py (calc_lidar)",
            ),
        ),
        differences=DIFFERENCES,
        inputs=(
            Input("stores", "Stores written by probe extract (several: side by side, one record each).", "stores", True),
            json_input("Also write the numbers as JSON."),
        ),
        run="commands.rank:run",
        result="results.rank_report:RankReport",
        command=Command(
            "RankMe of a block's class and patch tokens, and LiDAR where the store holds several views of each image.",
            options=("view", "tokens", "sizes", "seed", "lidar", "json_path", "partial", "quiet"),
            table="results.tables_labelfree:rank",
            progress=("images", "rank"),
        ),
        sections=("report.sections_labelfree:rank",),
        placement=(),  # one process: its work is a few float64 matrix products, which BLAS spreads over the cores
    )
)
