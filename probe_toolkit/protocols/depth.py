"""``linear-depth``: a linear head trained on a frozen network's patch tokens to predict NYUv2 depth
as 256 bins, from augmented crops, scored on whole images with a test-time flip, as DINOv3's
``eval/depth`` (``config-nyu.yaml``) does it, DINOv2's ``lin.1`` / ``lin.4`` heads as presets
(``probe depth``). Like ``linear-segmentation``, it runs the network on every crop."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import depth_published as pub
from ..infra.settings import AtLeast, Each, OneOf, Positive, SettingError, setting
from .heads import PresetSettings
from .registry import CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register, train_val


@dataclass(frozen=True)
class DepthSettings(PresetSettings):
    preset: str = setting("dinov3", "dinov3 (config-nyu.yaml), dinov2-lin1 or dinov2-lin4 (DINOv2's linear heads).", OneOf(tuple(pub.PRESETS)))
    iterations: int = setting(pub.ITERATIONS, "Training iterations (scheduler.total_iter 38400, a GPU job; fewer: a short run, marked so).", AtLeast(1))
    batch_size: int = setting(pub.BATCH, "Crops per GPU of the reference (bs 2).", AtLeast(2, why="SigLoss's variance needs two pixels of a group; the reference's is 2"))
    replicas: int = setting(
        pub.REPLICAS, "GPUs whose losses the reference averages under DDP (n_gpus 8); one process computes them all, BatchNorm seeing every crop.", AtLeast(1)
    )
    lr: float | None = setting(None, "AdamW learning rate (default: the preset's, DINOv3 3e-4, DINOv2 1e-4).", Positive())
    weight_decay: float | None = setting(None, "AdamW weight decay (default: the preset's, DINOv3 1e-4, DINOv2 1e-2).", AtLeast(0.0, integer=False))
    warmup: int | None = setting(None, "Warm-up iterations (default: 12800 at 38400, the same share of another schedule).", AtLeast(0))
    crop: tuple[int, ...] = setting(pub.CROP, "height,width of the random training crop (transforms.train.random_crop 416,544).", Each(AtLeast(1)))
    tta: bool = setting(True, "Average the val image's prediction with its mirror's (eval.use_tta).", cli="either")
    seed: int = setting(pub.SEED, "Seed of the crops, the image order and the head's initial weights (config-nyu.yaml seed 321).", AtLeast(0))
    chunk: int = setting(pub.BATCH * pub.REPLICAS, "Crops per forward pass of the frozen network (memory only).", AtLeast(1))
    figure_images: int = setting(4, "Val images whose photograph, truth and prediction the record keeps for the report.", AtLeast(0))

    def check(self) -> None:
        if len(self.crop) != 2:
            raise SettingError("crop", requirement="height,width: two whole numbers", value=tuple(self.crop), example=pub.CROP)
        if self.warmup is not None and self.warmup >= self.iterations:
            raise SettingError(
                "warmup",
                requirement=f"an integer below iterations ({self.iterations}): else the whole run is warm-up",
                value=self.warmup,
                example=pub.published_warmup(self.iterations),
            )

    @property
    def resolved(self) -> dict:
        """The values the run uses, the preset's filled in."""
        p = pub.PRESETS[self.preset]
        return {
            **self.as_dict(),
            "crop": list(self.crop),
            "lr": p.lr if self.lr is None else self.lr,
            "weight_decay": p.weight_decay if self.weight_decay is None else self.weight_decay,
            "warmup": pub.published_warmup(self.iterations) if self.warmup is None else self.warmup,
            "schedule": p.schedule,
        }


DIFFERENCES = (
    Difference(
        "one process instead of 8 GPUs: the loss of each group of batch_size crops is computed apart and the groups averaged, and "
        "BatchNorm's statistics are those of all batch_size × replicas crops; the frozen network runs `chunk` crops per pass",
        "DDP averages the gradients of each GPU's SigLoss over its 2 crops, while SyncBatchNorm sees all 16",
        "none: the same gradient",
    ),
    Difference(
        "every random draw comes from generators seeded by `seed`: a crop's from numpy's generator keyed by (seed, sample), the image "
        "order from one permutation per epoch keyed by (seed, epoch), the head's initial weights from a torch Generator; the epoch "
        "boundary does not drop a last partial batch",
        "the reference draws from numpy's and torch's global generators per data-loader worker",
        "other crops than the reference's for the same seed; probe's do not depend on workers or threads",
    ),
    Difference(
        "a run of fewer than 38,400 iterations keeps the warm-up's share (a third) and is marked as a short schedule",
        "the published schedule is a GPU's job",
        "a short run is not comparable with the published numbers, and says so",
    ),
    Difference(
        "the evaluation runs once, after the last iteration", "the reference also validates every 1,600 iterations (without the flip), which changes no weight", "none"
    ),
    Difference(
        "float32 throughout; ColorAug's colour product in float64, as NumPy 2 makes it in the reference, the image cast to float32 for the network",
        "the reference runs the depther under torch.autocast in the dtype of the model's training config (bfloat16 where its "
        "compute_precision.param_dtype is bf16); NumPy 1 keeps ColorAug in float32",
        "rounding only",
    ),
    Difference(
        "predictions are clamped to [1e-3, 10] m before the metrics, as metrics.py's caller does", "a mean of bins over [1e-3, 10] m never leaves that range", "none"
    ),
    Difference(
        "DINOv2 presets: the optimiser and schedule of DINOv2's NYU linear config as copied in ywyue/FiT3D "
        "(evaluation/baseline_configs/vits_nyu_depth_linear_config.py: AdamW lr 1e-4, weight decay 0.01, mmcv cosine to 1e-8 of the "
        "rate, 12,800 linear warm-up iterations from 1e-3 of it, OneCycle momentum); max_depth 10 where dinov2/hub/depthers.py builds "
        "its linear heads with max_depth 80 whatever weights they load; lin.4 reads blocks [2, 5, 8, 11] of 12 as the hub does",
        "DINOv2's own config (dinov2_vits14_nyu_linear_config.py) is on dl.fbaipublicfiles.com, outside its repository",
        "the DINOv2 presets are as exact as that copy",
    ),
    Difference(
        "DINOv2 presets: no GradientLoss",
        "the config adds GradientLoss (weight 0.5), but dinov2/eval/depth/models/losses/gradientloss.py slices the batch and channel "
        "axes of a (B, 1, H, W) map, which at 2 crops per GPU leaves nothing to sum",
        "none: it adds 0",
    ),
    Difference(
        "DINOv2 presets: DINOv3's crops (transforms.py) and metrics (metrics.py); the test-time flip averaged at the head's grid",
        "DINOv2's mmcv pipeline (Monocular-Depth-Estimation-Toolbox) rotates and colours with its own functions, does not clamp "
        "predictions and gives SILog NaN (not 0) for an image without a valid pixel; it averages the flip after upsampling",
        "crops drawn otherwise; the flip's order changes rounding only (bilinear upsampling commutes with the average and the mirror)",
    ),
    Difference(
        "the depth maps are read once through the ledger and hashed; each is read again when its crop is made and refused unless its "
        "bytes are those the ledger entry covers",
        "24,231 maps of about 600 kB would not fit in memory",
        "none",
    ),
    Difference(
        "a network whose patch does not divide the crop is centre-padded (DINOv3's and DINOv2's CenterPadding)",
        "DINOv3 evaluates /16 networks, which need none at 416 × 544 and 480 × 640",
        "none at /16",
    ),
)

PROTOCOL = register(
    Protocol(
        name="linear-depth",
        summary="A linear head trained on frozen patch tokens to predict NYUv2 depth as 256 bins (DINOv3 config-nyu.yaml; DINOv2 lin.1 / lin.4); "
        "RMSE, AbsRel, δ1..δ3 on the Eigen crop.",
        settings=DepthSettings,
        inputs=(
            Input("checkpoint", "The checkpoint whose frozen network runs on every crop (its store, under --cache or --store, keeps the record).", "checkpoint", True),
            *train_val(
                "NYU panel (--nyu, --split train) whose augmented crops train the head.", "NYU panel (--split test) scored on whole images.", use="train the head"
            ),
            Input("store", "Store that keeps the record (default: the checkpoint's store for --network under --cache).", "path"),
            Input("network", "teacher or student.", default="teacher"),
            json_input("Also write the scores and settings as JSON."),
            Input("unseal", "Reason to open a sealed test panel as --val (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(source="checkpoint", labels=True, panel_kinds=("nyu",)),
        results=("linear-depth",),
        references=(
            Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 dinov3/eval/depth/train.py (commit 6876159)"),
            Reference(
                "Oquab et al., DINOv2: Learning Robust Visual Features without Supervision (TMLR 2024)", "facebookresearch/dinov2 dinov2/hub/depthers.py (commit b8931f7)"
            ),
        ),
        differences=DIFFERENCES,
        run="commands.depth:run",
        result="results.depth_report:DepthReport",
        command=Command(
            "Linear depth on NYUv2 as DINOv3 (and DINOv2) train it: a linear head over 256 depth bins on frozen patch tokens; RMSE.",
            options=(
                "train",
                "val",
                "preset",
                "iterations",
                "batch_size",
                "replicas",
                "lr",
                "weight_decay",
                "warmup",
                "crop",
                "tta",
                "figure_images",
                "seed",
                "chunk",
                "store",
                "network",
                Option("device", "cpu, cuda or auto: where the network and the head run."),
                Option("workers", "Threads that decode and augment the crops (default 2)."),
                "unseal",
                "json_path",
                "cache",
                "quiet",
            ),
            table="results.tables_depth:depth",
            progress=("steps", "depth"),
            name="depth",
        ),
        sections=("report.sections_depth:depth",),
        placement=("workers", "device"),  # one process: the head trains here; threads make the crops
        placement_defaults={"device": "auto"},
    )
)
