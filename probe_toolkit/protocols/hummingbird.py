"""``hummingbird``: dense in-context retrieval (Balažević et al., NeurIPS 2023) as
vpariza/open-hummingbird-eval runs it: a memory of patch features and label distributions from
augmented train views, 30 nearest patches per query patch, soft label transfer, mIoU."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import hummingbird_published as hb
from ..infra.settings import AtLeast, Each, OneOf, Positive, SettingError, Settings, setting
from ..store import views
from .registry import CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register, train_val

FULL = None  # a memory holding every patch of every memory view
VIEWS = tuple(v.name for v in views.TABLE if v.name.startswith("hbird512"))  # the query view, then one memory view per augmentation epoch
MEMORY_VIEWS = tuple(v for v in VIEWS if "_aug" in v)


def memory_text(sizes: tuple[int | None, ...]) -> str:
    """``memory`` as the command line spells it: ``102400,1024000,full``."""
    return ",".join("full" if size is FULL else str(size) for size in sizes)


def memory_sizes(text: str) -> tuple[int | None, ...]:
    """``102400,1024000,full`` → (102400, 1024000, None): the command line's spelling of ``memory``."""
    sizes: list[int | None] = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        try:
            sizes.append(None if part == "full" else int(part))
        except ValueError:
            raise SettingError("memory", f"memory {part!r} is not a number of patches or full", "use e.g. memory=102400,1024000,10240000,full") from None
    return tuple(sizes)


@dataclass(frozen=True)
class HummingbirdSettings(Settings):
    memory: tuple[int | None, ...] = setting(
        hb.PUBLISHED_MEMORY_SIZES,
        "Memory sizes in patches, all in one run; full: every patch (open-hummingbird-eval's README.md VOC table: 1024·10², 10³, 10⁴).",
        Each(AtLeast(1), none=True, distinct=True),
        parse=memory_sizes,
        spell=memory_text,
    )
    k: int = setting(hb.K, "Nearest memory patches per query patch (open-hummingbird-eval's n_neighbours).", AtLeast(1))
    temperature: float = setting(hb.TEMPERATURE, "Softmax temperature of the label transfer (open-hummingbird-eval's beta).", Positive())
    augmentation_epochs: int = setting(
        hb.AUGMENTATION_EPOCHS, "Augmented views of each train image in the memory (README.md: two).", OneOf(tuple(range(1, len(MEMORY_VIEWS) + 1)))
    )
    seed: int = setting(hb.SEED, "Seed of the bounded memory's draws (eval.py's seed).", AtLeast(0))
    matching: str = setting("identity", "Headline mIoU: identity (predictions are labels) or hungarian (the reference's matching).", OneOf(hb.MATCHINGS))
    figure_images: int = setting(4, "Val images whose ground truth and transferred labels the record keeps for the report.", AtLeast(0))
    size: int = setting(
        hb.INPUT_SIZE,
        "Input size in pixels, the views hbird@S and hbird@S_aug<e> (open-hummingbird-eval's input_size: its README "
        "runs DINO at 512 and DINOv2 at 504; hbird_evaluation's default is 224).",
        AtLeast(16),
    )


DIFFERENCES = (
    Difference(
        "normalisation std (0.229, 0.224, 0.255) in the hbird512 views",
        "the reference's 0.255 for blue (ImageNet's is 0.225): the published numbers were measured on those inputs",
        "none against the reference",
    ),
    Difference(
        "mIoU averages over all 21 VOC classes (151 on ADE20K, its label 0 'other' among them), a class absent from truth and "
        "prediction counting 0, as the reference does",
        "the reference's PredsmIoU; the record keeps each class's IoU",
        "on a subset of VOC val the mIoU is lower than a mean over the classes present; none on the full val",
    ),
    Difference(
        "both the identity mIoU (predictions are labels: no matching; the headline by default, matching='identity') and the "
        "reference's Hungarian-matched mIoU are reported",
        "the reference matches predicted to true classes although its predictions are already labels",
        "the matched mIoU can only be larger; the headline is the identity one unless matching='hungarian'",
    ),
    Difference(
        "retrieval is exact: each cosine the float32 rounding of the float64 product (numpy screens each block in float32 and "
        "settles near-ties in float64) with a running top-k, equal cosines ranked by bank row "
        "(--backend torch on --device cpu or cuda: the same neighbours and cosines, bit for bit)",
        "the reference's default, ScaNN, is approximate, and its faiss path builds GPU indexes only",
        "the number an exhaustive search gives, independent of batch, block, workers and placement; it can differ from a ScaNN run",
    ),
    Difference(
        "the bounded memory keeps the patches of the rarest classes of each view (summed class frequency times a uniform draw, "
        "lowest first), with draws from numpy's generator seeded by seed",
        "the reference draws from torch's global generator",
        "the same seed picks other patches than the reference",
    ),
    Difference(
        "the augmentations' draws come from a generator keyed by (123, epoch, file name)",
        "torch's and Python's global generators would make the crops depend on data-loader workers",
        "reproducible crops, other than the reference's on the same seed",
    ),
    Difference(
        "at size 512 (the default, the README's for DINO) a /14 network reads the 512 view's top-left 36 × 36 patches (504 px) and is "
        "scored there; size 504 resizes every view to 504 px, as the reference runs DINOv2",
        "the hbird512 views (and every store made before sizes) are 512 px squares",
        "at size 512, a /14 network's number on 504 px crops, not resized images; none at size 504",
    ),
    Difference(
        "rows are normalised with a 1e-12 floor on the norm (torch's F.normalize)",
        "the reference divides by the bare norm of the bank rows",
        "none, except that a zero row gives zeros here and NaN in the reference",
    ),
)

PROTOCOL = register(
    Protocol(
        name="hummingbird",
        summary="Dense in-context retrieval (Hummingbird): label maps transferred from a memory of train patches by their 30 nearest neighbours; VOC or ADE20K mIoU.",
        settings=HummingbirdSettings,
        reads=Reads(arrays=tuple(f"tokens_{v}" for v in VIEWS), views=VIEWS, labels=True, panel_kinds=("voc-segmentation", "ade20k"), panel_sibling=True),
        results=("hummingbird",),
        references=(
            Reference("Balažević et al., Towards In-context Scene Understanding (NeurIPS 2023)", "vpariza/open-hummingbird-eval hbird/hbird_eval.py"),
            Reference("Pariza et al., open-hummingbird-eval 2.0 (README.md: VOC mIoU at memory 1024·10², 10³, 10⁴)", "vpariza/open-hummingbird-eval eval.py"),
        ),
        inputs=(
            Input("store", "A store holding (or beside a store holding) both panels' images in the hbird512 views.", "store", True),
            *train_val(
                "Segmentation panel (VOC or ADE20K) whose augmented views make the memory (VOC trainaug, as published).",
                "Segmentation panel of the same data set whose patches are labelled from the memory and scored.",
                use="hold the memory",
            ),
            json_input("Also write the scores and settings as JSON."),
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE,
        ),
        result="results.hummingbird_report:HummingbirdReport",
        differences=DIFFERENCES,
        run="commands.hummingbird:run",
        command=Command(
            "Hummingbird dense retrieval (vpariza/open-hummingbird-eval): VOC or ADE20K mIoU at each memory size.",
            options=(
                "train",
                "val",
                "size",
                "memory",
                "k",
                "temperature",
                "augmentation_epochs",
                "seed",
                "matching",
                "figure_images",
                "json_path",
                Option("backend", "scipy: the numpy search; torch: the same search in torch on --device (same neighbours)."),
                Option("device", "cpu or cuda (--backend torch): where the memory is searched."),
                "work_memory",
                "SCORED",
                "shard",
            ),
            table="results.tables:hummingbird",
            progress=("images", "hummingbird"),
        ),
        sections=("report.sections_dense:hummingbird",),
        placement=("workers", "dask_address", "shard", "backend", "device", "work_memory"),  # val images over workers, a cluster or shards; the search on --device
    )
)
