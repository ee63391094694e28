"""``linear-segmentation``: a BatchNorm + 1×1 linear head trained on a frozen network's last-layer
patch tokens from augmented crops, scored by sliding windows, as DINOv3's ``eval/segmentation``
linear config and DINOv2's linear ADE20K head do it (``probe segment``). Beside ``linear``, which
fits a convex probe on stored tokens, this one runs the network on every crop."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import segment_published as seg
from ..infra.settings import AtLeast, Each, OneOf, Positive, SettingError, Within, setting
from .heads import PresetSettings
from .registry import CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register, train_val


@dataclass(frozen=True)
class SegmentSettings(PresetSettings):
    preset: str = setting("dinov3", "dinov3 (config-ade20k-linear-training.yaml) or dinov2 (its mmseg linear config).", OneOf(tuple(seg.PRESETS)))
    iterations: int = setting(seg.ITERATIONS, "Training iterations (published scheduler.total_iter / max_iters, a GPU job; fewer: a short run, marked so).", AtLeast(1))
    batch_size: int = setting(seg.BATCH, "Crops per iteration (published: 2 per GPU × 8 GPUs).", AtLeast(1))
    lr: float = setting(seg.LR, "AdamW learning rate (published optimizer.lr, both presets).", Positive())
    weight_decay: float | None = setting(None, "Default: the preset's (DINOv3 1e-3, DINOv2 1e-4).", AtLeast(0.0, integer=False))
    dropout: float | None = setting(None, "Channel dropout before the BatchNorm (default: the preset's, DINOv3 0.1, DINOv2 0).", Within(0.0, 1.0))
    warmup: int | None = setting(None, "Warm-up iterations (default: 1500 at 40000, the same share otherwise).", AtLeast(0))
    crop: int = setting(seg.CROP, "Training crop and sliding window in pixels (both presets).", AtLeast(1))
    size: int = setting(seg.SIZE, "Short side before the random ratio and at evaluation (both presets).", AtLeast(1))
    scale: tuple[float, float] = setting((0.5, 2.0), "low,high: random ratio of the short side (both presets).", Each(Positive()))
    stride: int = setting(seg.STRIDE, "Sliding-window stride (both presets).", AtLeast(1))
    flip: float = setting(0.5, "Horizontal-flip probability (both presets).", Within(0.0, 1.0, "[]"))
    photometric: bool = setting(True, "PhotoMetricDistortion of the crops (both presets).", cli="either")
    seed: int = setting(100, "Seed of the crops, the image order, the head's initial weights and dropout (DINOv3's SegmentationConfig.seed).", AtLeast(0))
    chunk: int = setting(seg.BATCH, "Crops per forward pass of the frozen network (memory only: BatchNorm sees the whole batch).", AtLeast(1))
    figure_images: int = setting(4, "Val images whose truth and prediction the record keeps for the report.", AtLeast(0))

    def check(self) -> None:
        if self.warmup is not None and self.warmup >= self.iterations:
            raise SettingError(
                "warmup",
                f"warmup {self.warmup} is not below iterations {self.iterations}: the whole run would be warm-up",
                f"give warmup below {self.iterations}, or leave it out (the published 1500/40000 share)",
            )
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]:
            raise SettingError("scale", f"scale {tuple(self.scale)} is not (low, high) with 0 < low ≤ high", "use e.g. scale=(0.5, 2.0)")
        if self.stride > self.crop:
            raise SettingError(
                "stride", f"stride {self.stride} exceeds the crop {self.crop}: windows would leave pixels unscored", f"give stride ≤ {self.crop} (published 341 at 512)"
            )

    @property
    def resolved(self) -> dict:
        """The values the run uses, the preset's filled in."""
        p = seg.PRESETS[self.preset]
        return {
            **self.as_dict(),
            "weight_decay": p.weight_decay if self.weight_decay is None else self.weight_decay,
            "dropout": p.dropout if self.dropout is None else self.dropout,
            "warmup": seg.published_warmup(self.iterations) if self.warmup is None else self.warmup,
            "decay": p.decay,
        }


DIFFERENCES = (
    Difference(
        "one process instead of 8 GPUs with SyncBatchNorm: the 16 crops of an iteration pass the head together; only the frozen network runs chunk crops at a time",
        "BatchNorm's statistics are then those of the global batch, as SyncBatchNorm's are; the batch itself cannot be split without changing them",
        "none beyond float rounding of the frozen network's outputs",
    ),
    Difference(
        "every random draw comes from generators seeded by seed: a crop's from numpy's generator keyed by (seed, sample), the order of "
        "images from one permutation per epoch keyed by (seed, epoch), the head's initial weights and dropout from torch Generators; the "
        "epoch boundary does not drop a last partial batch",
        "the reference draws from global generators per data-loader worker, so its crops depend on workers and threads",
        "the same seed gives other crops than the reference's; probe's do not depend on workers or threads",
    ),
    Difference(
        "the schedule is the reference's function of the iteration (DINOv3: WarmupOneCycleLR stepped after every iteration but the "
        "first; DINOv2: mmcv's poly with linear warm-up), evaluated at iterations; a shorter run scales the warm-up to the same share "
        "(3.75 %)",
        "a CPU runs a short schedule; the record and the table mark it short",
        "a short run's mIoU is not comparable with the published one",
    ),
    Difference(
        "the evaluation runs once, after the last iteration",
        "DINOv3 also evaluates every 5000 iterations and keeps the best, which selects on the val set (DINOv2 every 10,000)",
        "no selection on val: the number can be lower than a best-of-checkpoints one",
    ),
    Difference(
        "images are decoded by PIL for both presets; the dinov2 preset resizes and distorts with OpenCV as mmcv does",
        "mmcv decodes DINOv2's with OpenCV, which can differ by one level in a few JPEG pixels",
        "a few pixel values in a few JPEGs",
    ),
    Difference(
        "float32 throughout",
        "DINOv3's config is FLOAT32; the GradScaler its train.py still uses changes no finite number and skips only overflowing steps, "
        "which float32 gradients of this head do not reach",
        "none",
    ),
    Difference(
        "a network whose patch does not divide the window is centre-padded as DINOv2's CenterPadding does, with either preset",
        "DINOv3 evaluates /16 networks, which need none at 512",
        "none on a /16 network",
    ),
    Difference(
        "the train panel's label maps are read once, through the ledger, and held in memory for the run",
        "every label read is logged before it is returned",
        "none (about 7 GB for ADE20K's 20,210 maps)",
    ),
    Difference(
        "a crop larger than an image is allowed and padded (labels 255, pixels 0 after normalisation), as in the references; the "
        "record says which settings differ from the preset's published values",
        "as the references do",
        "none",
    ),
)

PROTOCOL = register(
    Protocol(
        name="linear-segmentation",
        summary="A BatchNorm + linear head trained on frozen last-layer patch tokens from augmented crops (DINOv3 / DINOv2 linear config); "
        "ADE20K or VOC mIoU by sliding windows.",
        settings=SegmentSettings,
        reads=Reads(source="checkpoint", labels=True, panel_kinds=("ade20k", "voc-segmentation")),
        results=("linear-segmentation",),
        references=(
            Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 dinov3/eval/segmentation/train.py"),
            Reference(
                "Oquab et al., DINOv2: Learning Robust Visual Features without Supervision (TMLR 2024)",
                "facebookresearch/dinov2 dinov2/eval/segmentation/models/decode_heads/linear_head.py",
            ),
        ),
        inputs=(
            Input("checkpoint", "The checkpoint whose frozen network runs on every crop (its store, under --cache or --store, keeps the record).", "checkpoint", True),
            *train_val(
                "ADE20K (or VOC) segmentation panel whose augmented crops train the head.",
                "Segmentation panel of the same data set, scored by sliding windows after training.",
                use="train the head",
            ),
            Input("store", "Store that keeps the record (default: the checkpoint's store for --network under --cache).", "path"),
            Input("network", "teacher or student.", default="teacher"),
            Input("unseal", "Reason to open a sealed test panel as --val (recorded in the ledger)."),
            json_input("Also write the scores and settings as JSON."),
            CACHE,
        ),
        result="results.segment_report:SegmentReport",
        differences=DIFFERENCES,
        run="commands.segment:run",
        command=Command(
            "Linear segmentation as DINOv3 and DINOv2 train it: a BatchNorm + linear head on frozen patch tokens; mIoU.",
            options=(
                "train",
                "val",
                "preset",
                "iterations",
                "batch_size",
                "lr",
                "weight_decay",
                "warmup",
                "crop",
                "size",
                "stride",
                "dropout",
                "scale",
                "flip",
                "photometric",
                "figure_images",
                "seed",
                "chunk",
                "store",
                "network",
                Option("device", "cpu, cuda or auto."),
                Option("workers", "Threads that decode and augment the crops (default 2)."),
                "unseal",
                "json_path",
                "cache",
                "quiet",
            ),
            table="results.tables:segmentation",
            progress=("steps", "segment"),
            name="segment",
        ),
        sections=("report.sections_dense:segmentation",),
        placement=("workers", "device"),  # one process: the head trains here; threads make the crops
    )
)
