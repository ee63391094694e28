"""``linear-segmentation``: a BatchNorm + 1×1 linear head trained on a frozen network's last-layer
patch tokens from augmented crops, scored by sliding windows, as DINOv3's ``eval/segmentation``
linear config and DINOv2's linear ADE20K head do it (``probe segment``). Beside ``linear``, which
fits a convex probe on stored tokens, this one runs the network on every crop."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import segment_published as seg
from ..infra.settings import SettingError, at_least, one_of, positive, within
from .heads import PresetSettings, checkpoint_options, one_process
from .registry import UNSEAL_VAL, Option, Protocol, Reads, Reference, on_train_val, register, written_to


@dataclass(frozen=True)
class SegmentSettings(PresetSettings):
    preset: str = "dinov3"  # dinov3 (config-ade20k-linear-training.yaml) or dinov2 (its mmseg linear config)
    iterations: int = seg.ITERATIONS  # scheduler.total_iter / max_iters: 40000 (fewer: a short run, marked so)
    batch_size: int = seg.BATCH  # 2 per GPU × 8 GPUs
    lr: float = seg.LR  # optimizer.lr 1e-3 (both)
    weight_decay: float | None = None  # None: the preset's (DINOv3 1e-3, DINOv2 1e-4)
    dropout: float | None = None  # None: the preset's channel dropout before the BatchNorm (DINOv3 0.1, DINOv2 0)
    warmup: int | None = None  # None: 1500 iterations at 40000, the same share of another schedule
    crop: int = seg.CROP  # training crop and sliding window: 512 (both)
    size: int = seg.SIZE  # short side before the random ratio, and at evaluation: 512 (both)
    scale: tuple[float, float] = (0.5, 2.0)  # random ratio of the short side (both)
    stride: int = seg.STRIDE  # sliding-window stride: 341 (both)
    flip: float = 0.5  # horizontal-flip probability (both)
    photometric: bool = True  # PhotoMetricDistortion (both)
    seed: int = 100  # DINOv3 config.py SegmentationConfig.seed
    chunk: int = seg.BATCH  # crops per forward pass of the frozen network (memory only: BatchNorm sees the whole batch)
    figure_images: int = 4  # val images whose truth and prediction the record keeps for the report

    def check(self) -> None:
        one_of("preset", self.preset, tuple(seg.PRESETS))
        at_least("iterations", self.iterations, 1)
        at_least("batch_size", self.batch_size, 1)
        positive("lr", self.lr)
        if self.weight_decay is not None:
            at_least("weight_decay", self.weight_decay, 0)
        if self.dropout is not None:
            within("dropout", self.dropout, 0.0, 1.0)
        if self.warmup is not None:
            at_least("warmup", self.warmup, 0)
            if self.warmup >= self.iterations:
                raise SettingError("warmup", f"warmup {self.warmup} is not below iterations {self.iterations}: the whole run would be warm-up",
                                   f"give warmup below {self.iterations}, or leave it out (the published 1500/40000 share)")
        at_least("crop", self.crop, 1)
        at_least("size", self.size, 1)
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]:
            raise SettingError("scale", f"scale {tuple(self.scale)} is not (low, high) with 0 < low ≤ high", "use e.g. scale=(0.5, 2.0)")
        at_least("stride", self.stride, 1)
        if self.stride > self.crop:
            raise SettingError("stride", f"stride {self.stride} exceeds the crop {self.crop}: windows would leave pixels unscored",
                               f"give stride ≤ {self.crop} (published 341 at 512)")
        within("flip", self.flip, 0.0, 1.0, closed="[]")
        at_least("seed", self.seed, 0)
        at_least("chunk", self.chunk, 1)
        at_least("figure_images", self.figure_images, 0)

    @property
    def resolved(self) -> dict:
        """The values the run uses, the preset's filled in."""
        p = seg.PRESETS[self.preset]
        return {**self.as_dict(), "weight_decay": p.weight_decay if self.weight_decay is None else self.weight_decay,
                "dropout": p.dropout if self.dropout is None else self.dropout,
                "warmup": seg.published_warmup(self.iterations) if self.warmup is None else self.warmup, "decay": p.decay}


def execute(settings: SegmentSettings, placement, *, checkpoint, train, val, store=None, network="teacher", unseal=None, cache_dir=None,
            json_path=None, progress=None, **_):
    from ..commands.segment import run_segment

    one_process("linear-segmentation", placement)
    return run_segment(checkpoint, train, val, settings, store=store, network=network, unseal=unseal, cache_dir=cache_dir,
                       json_path=json_path, progress=progress, placement=placement)


DIFFERENCES = (
    "Follows DINOv3's eval/segmentation linear training (commit 6876159: config-ade20k-linear-training.yaml, train.py, transforms.py, "
    "inference.py, metrics.py, models/heads/linear_head.py) with preset dinov3, and DINOv2's mmsegmentation linear config "
    "(dinov2_vits14_ade20k_linear_config.py: BNHead, AdamW weight decay 1e-4, poly schedule, no dropout, CenterPadding) with preset dinov2: "
    "crops of 512 at a random short side of 512 × [0.5, 2), cat_max_ratio 0.75, flip 0.5, photometric distortion, last-layer patch tokens "
    "through the backbone's norm, BatchNorm + 1×1 convolution, cross-entropy averaged over every pixel (255 ignored), AdamW lr 1e-3, "
    "1500 warm-up iterations from 1e-6 of the rate, 40,000 iterations of 16 crops, sliding windows 512 / 341, mIoU as nanmean over "
    "classes (a class neither labelled nor predicted does not count; one predicted but absent counts 0). What differs, item by item: "
    "(1) one process instead of 8 GPUs with SyncBatchNorm: the 16 crops of an iteration pass the head together, so BatchNorm's statistics "
    "are those of the global batch, as SyncBatchNorm's are; only the frozen network runs `chunk` crops at a time (its outputs do not "
    "depend on that beyond float rounding); the batch size itself cannot be split without changing the numbers, since BatchNorm's statistics are the batch's; "
    "(2) every random draw comes from generators seeded by `seed`: a crop's from numpy's generator keyed by (seed, sample), the order of "
    "images from one permutation per epoch keyed by (seed, epoch), the head's initial weights and its channel dropout from torch "
    "Generators; the reference draws from global generators per data-loader worker, so the same seed gives other crops than the "
    "reference's, and probe's do not depend on data-loader workers or threads; the epoch boundary does not drop a last partial batch; "
    "(3) the schedule is the reference's function of the iteration (DINOv3: WarmupOneCycleLR stepped after every iteration but the first, "
    "so iterations 0 and 1 share its first rate; DINOv2: mmcv's poly with linear warm-up), evaluated at `iterations`; a run of fewer "
    "than 40,000 iterations scales the warm-up to the same share (3.75 %) and is marked as a short schedule in its record and table; "
    "(4) the evaluation runs once, after the last iteration (DINOv3 also evaluates every 5000 iterations and keeps the best, which "
    "selects on the val set; DINOv2 every 10,000); "
    "(5) images are decoded by PIL for both presets (mmcv decodes DINOv2's with OpenCV, which can differ by one level in a few JPEG "
    "pixels); the dinov2 preset resizes and distorts with OpenCV as mmcv does; "
    "(6) float32 throughout (DINOv3's config: FLOAT32; the GradScaler its train.py still uses multiplies the loss by a power of two and divides the gradients by it, "
    "which changes no finite number, and skips a step whose gradients overflow, which float32 gradients of this head do not); "
    "(7) a network whose patch does not divide the window is centre-padded as DINOv2's CenterPadding does, with either preset (DINOv3 "
    "evaluates /16 networks, which need none at 512); "
    "(8) the train panel's label maps are read once, through the ledger, and held in memory for the run (about 7 GB for ADE20K's 20,210); "
    "(9) a crop larger than an image is allowed and padded, as in the references (labels 255, pixels 0 after normalisation); a record "
    "says which settings differ from the preset's published values."
)

PROTOCOL = register(Protocol(
    name="linear-segmentation",
    summary="A BatchNorm + linear head trained on frozen last-layer patch tokens from augmented crops (DINOv3 / DINOv2 linear config); "
            "ADE20K or VOC mIoU by sliding windows.",
    settings=SegmentSettings,
    reads=Reads(source="checkpoint", labels=True, panel_kinds=("ade20k", "voc-segmentation")),
    results=("linear-segmentation",),
    references=(
        Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 dinov3/eval/segmentation/train.py"),
        Reference("Oquab et al., DINOv2: Learning Robust Visual Features without Supervision (TMLR 2024)",
                  "facebookresearch/dinov2 dinov2/eval/segmentation/models/decode_heads/linear_head.py"),
    ),
    differences=DIFFERENCES,
    execute=execute,
    source="checkpoint",
    command=on_train_val(
        "Linear segmentation as DINOv3 and DINOv2 train it: a BatchNorm + linear head on frozen patch tokens; mIoU.",
        "The checkpoint whose frozen network runs on every crop (its store, under --cache or --store, keeps the record).",
        "ADE20K (or VOC) segmentation panel whose augmented crops train the head.",
        "Segmentation panel of the same data set, scored by sliding windows after training.",
        Option("preset", "dinov3 (config-ade20k-linear-training.yaml) or dinov2 (its mmseg linear config).", default="dinov3"),
        Option("iterations", "Training iterations (published: 40000, a GPU job; fewer: a short run, marked so).", "int", seg.ITERATIONS),
        Option("batch_size", "Crops per iteration (published: 2 × 8 GPUs = 16).", "int", seg.BATCH),
        Option("lr", "AdamW learning rate (published: 1e-3).", "float", seg.LR),
        Option("weight_decay", "Default: the preset's (DINOv3 1e-3, DINOv2 1e-4).", "float"),
        Option("warmup", "Warm-up iterations (default: 1500 at 40000, the same share otherwise).", "int"),
        Option("crop", "Training crop and sliding window in pixels (published: 512).", "int", seg.CROP),
        Option("size", "Short side before the random ratio and at evaluation (published: 512).", "int", seg.SIZE),
        Option("stride", "Sliding-window stride (published: 341).", "int", seg.STRIDE),
        Option("dropout", "Channel dropout before the BatchNorm (default: the preset's, DINOv3 0.1, DINOv2 0).", "float"),
        Option("scale", "low,high: random ratio of the short side (published 0.5,2.0).", "floats", "0.5,2.0", example="0.5,2.0"),
        Option("flip", "Horizontal-flip probability (published 0.5).", "float", 0.5),
        Option("photometric", "PhotoMetricDistortion of the crops (published: on).", "either", True),
        Option("figure_images", "Val images whose truth and prediction the record keeps for the report.", "int", 4),
        Option("seed", "Seed of the crops, the image order, the head's initial weights and dropout (DINOv3: 100).", "int", 100),
        Option("chunk", "Crops per forward pass of the frozen network (memory only).", "int", seg.BATCH),
        *checkpoint_options(),
        UNSEAL_VAL,
        written_to("Also write the scores and settings as JSON."),
        "cache", "quiet",
        table="results.tables:segmentation",
        progress=("steps", "progress", "segment"),
        name="segment"),
    sections=("report.sections_dense:segmentation",),
))
