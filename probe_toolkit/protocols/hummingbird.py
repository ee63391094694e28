"""``hummingbird``: dense in-context retrieval (Balažević et al., NeurIPS 2023) as
vpariza/open-hummingbird-eval runs it: a memory of patch features and label distributions from
augmented train views, 30 nearest patches per query patch, soft label transfer, mIoU."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import hummingbird_published as hb
from ..infra.settings import SettingError, Settings, at_least, one_of, positive
from ..store import views
from .registry import Option, Protocol, Reads, Reference, on_train_val, register, written_to

FULL = None  # a memory holding every patch of every memory view
VIEWS = tuple(v.name for v in views.TABLE if v.name.startswith("hbird512"))  # the query view, then one memory view per augmentation epoch
MEMORY_VIEWS = tuple(v for v in VIEWS if "_aug" in v)


@dataclass(frozen=True)
class HummingbirdSettings(Settings):
    memory: tuple[int | None, ...] = hb.PUBLISHED_MEMORY_SIZES  # patches in the bank; None: every patch (README.md VOC table: 1024·10², 10³, 10⁴)
    k: int = hb.K  # hbird_eval.py n_neighbours
    temperature: float = hb.TEMPERATURE  # hbird_eval.py _cross_attention beta
    augmentation_epochs: int = hb.AUGMENTATION_EPOCHS  # memory views per train image (README.md: two)
    seed: int = hb.SEED  # draws of the bounded memory (eval.py seeds 123)
    matching: str = "identity"  # the headline mIoU: identity (predictions are labels) or the reference's hungarian
    figure_images: int = 4  # val images whose ground truth and transferred labels the record keeps for the report

    def check(self) -> None:
        if not self.memory:
            raise SettingError("memory", "memory is empty", "use e.g. memory=(102400,) or None for every patch")
        for size in self.memory:
            if size is not FULL:
                at_least("memory", size, 1)
        if len(set(self.memory)) != len(self.memory):
            raise SettingError("memory", f"memory {list(self.memory)} repeats a size", "give each size once")
        at_least("k", self.k, 1)
        positive("temperature", self.temperature)
        one_of("augmentation_epochs", self.augmentation_epochs, range(1, len(MEMORY_VIEWS) + 1))
        at_least("seed", self.seed, 0)
        one_of("matching", self.matching, hb.MATCHINGS)
        at_least("figure_images", self.figure_images, 0)


def memory_sizes(text: str) -> tuple[int | None, ...]:
    """``102400,1024000,full`` → (102400, 1024000, None): the command line's spelling of ``memory``."""
    sizes: list[int | None] = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        try:
            sizes.append(None if part == "full" else int(part))
        except ValueError:
            raise SettingError("memory", f"memory {part!r} is not a number of patches or full", "use e.g. memory=102400,1024000,10240000,full") from None
    return tuple(sizes)


def execute(settings: HummingbirdSettings, placement, *, store, train, val, unseal=None, cache_dir=None, json_path=None, progress=None, **_):
    from ..commands.hummingbird import run_hummingbird

    return run_hummingbird(store, train, val, settings, unseal=unseal, cache_dir=cache_dir, json_path=json_path, progress=progress, placement=placement)


DIFFERENCES = (
    "Follows open-hummingbird-eval 2.0 (commit 5e79da2): 512 px views, the memory from two augmented epochs of the train images "
    "(random resized crop, scale 0.5-2, colour jitter), 30 neighbours, softmax of cos / 0.02 over their label distributions, bilinear "
    "upsampling, one confusion matrix over all val pixels with 255 ignored, and patch tokens through the backbone's final norm "
    "(DINO's get_intermediate_layers, DINOv2's x_norm_patchtokens). What differs, item by item: "
    "(1) normalisation std (0.229, 0.224, 0.255): probe follows the reference's 0.255 for blue (ImageNet's is 0.225) in its hbird512 "
    "views, because the published numbers were measured on those inputs; "
    "(2) mIoU averages over all 21 VOC classes (151 on ADE20K, its label 0 'other' among them) as the reference does (a class absent "
    "from truth and prediction counts 0; on the full VOC val every class is present, so this only matters on subsets, and the record "
    "keeps each class's IoU); "
    "(3) the reference's Hungarian matching of predicted to true classes runs although predictions are already labels: probe reports "
    "both, identity (no matching, the headline by default: matching='identity') and the matched mIoU, which can only be larger; "
    "(4) retrieval is exact (blocked float64 products with a running top-k; equal cosines rank by bank row, the lower first) where "
    "the reference's default, ScaNN, is approximate and its faiss path builds GPU indexes only, so probe's number is the one an "
    "exhaustive search gives, and it does not depend on batch size, block size, workers or placement; --backend torch (--device cpu "
    "or cuda) runs the same search in torch, products in float64 there too (full-rate on H100/H200-class GPUs), ranked by int64 keys "
    "of (cosine, bank row), so its neighbours and cosines are the numpy search's bit for bit (a float32 or TF32 product on a GPU "
    "would round in the kernel's order and could swap neighbours whose cosines differ in the last bit); "
    "(5) the bounded memory keeps, as the reference does, the patches of the rarest classes of each view (score = summed class "
    "frequency times a uniform draw, lowest first), with draws from numpy's generator seeded by `seed` instead of torch's global "
    "generator, so the same seed picks other patches than the reference; "
    "(6) the augmentations' draws come from a generator keyed by (123, epoch, file name), not torch's and Python's global "
    "generators, so crops are reproducible and the store does not depend on data-loader workers; "
    "(7) a /14 network reads the 512 view's top-left 36 × 36 patches (504 px) and is scored there, where the reference resizes "
    "DINOv2's inputs to 504 px."
)

PROTOCOL = register(Protocol(
    name="hummingbird",
    summary="Dense in-context retrieval (Hummingbird): label maps transferred from a memory of train patches by their 30 nearest neighbours; VOC or ADE20K mIoU.",
    settings=HummingbirdSettings,
    reads=Reads(arrays=tuple(f"tokens_{v}" for v in VIEWS), views=VIEWS, labels=True, panel_kinds=("voc-segmentation", "ade20k")),
    results=("hummingbird",),
    references=(
        Reference("Balažević et al., Towards In-context Scene Understanding (NeurIPS 2023)", "vpariza/open-hummingbird-eval hbird/hbird_eval.py"),
        Reference("Pariza et al., open-hummingbird-eval 2.0 (README.md: VOC mIoU at memory 1024·10², 10³, 10⁴)", "vpariza/open-hummingbird-eval eval.py"),
    ),
    differences=DIFFERENCES,
    execute=execute,
    command=on_train_val(
        "Hummingbird dense retrieval (vpariza/open-hummingbird-eval): VOC or ADE20K mIoU at each memory size.",
        "A store holding (or beside a store holding) both panels' images in the hbird512 views.",
        "Segmentation panel (VOC or ADE20K) whose augmented views make the memory (VOC trainaug, as published).",
        "Segmentation panel of the same data set whose patches are labelled from the memory and scored.",
        Option("memory", "Memory sizes in patches, all in one run; full: every patch (published: 1024·10², 10³, 10⁴).",
               default="102400,1024000,10240000", parse=memory_sizes),
        Option("k", "Nearest memory patches per query patch (open-hummingbird-eval: 30).", "int", 30),
        Option("temperature", "Softmax temperature of the label transfer (open-hummingbird-eval: 0.02).", "float", 0.02),
        Option("augmentation_epochs", "Augmented views of each train image in the memory: 1 or 2 (published: 2).", "int", 2),
        Option("seed", "Seed of the bounded memory's draws (eval.py: 123).", "int", 123),
        Option("matching", "Headline mIoU: identity (predictions are labels) or hungarian (the reference's matching).", default="identity"),
        written_to("Also write the scores and settings as JSON."),
        Option("backend", "scipy: the numpy search; torch: the same search in torch on --device (same neighbours).", default="scipy"),
        Option("device", "cpu or cuda (--backend torch): where the memory is searched.", default="cpu"),
        "SCORED",
        "shard",
        table="results.tables:hummingbird",
        progress=("images", "progress", "hummingbird")),
    sections=("report.sections_dense:hummingbird",),
    placement=("workers", "dask_address", "shard", "backend", "device"),  # the val images spread over workers, a cluster or shards; the search on --device
))
