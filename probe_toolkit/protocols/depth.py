"""``linear-depth``: a linear head trained on a frozen network's patch tokens to predict NYUv2 depth
as 256 bins, from augmented crops, scored on whole images with a test-time flip, as DINOv3's
``eval/depth`` (``config-nyu.yaml``) does it, DINOv2's ``lin.1`` / ``lin.4`` heads as presets
(``probe depth``). Like ``linear-segmentation``, it runs the network on every crop."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses import depth_published as pub
from ..infra.settings import SettingError, at_least, one_of, positive
from .heads import PresetSettings, checkpoint_options, one_process
from .registry import (
    UNSEAL_VAL,
    Option,
    Protocol,
    Reads,
    Reference,
    on_train_val,
    register,
    written_to,
)


@dataclass(frozen=True)
class DepthSettings(PresetSettings):
    preset: str = "dinov3"  # dinov3 (config-nyu.yaml), dinov2-lin1 or dinov2-lin4 (DINOv2's linear heads)
    iterations: int = pub.ITERATIONS  # scheduler.total_iter: 38400 (fewer: a short run, marked so)
    batch_size: int = pub.BATCH  # crops per GPU: bs 2
    replicas: int = pub.REPLICAS  # GPUs whose losses DDP averages: n_gpus 8 (BatchNorm sees all their crops)
    lr: float | None = None  # None: the preset's (DINOv3 3e-4, DINOv2 1e-4)
    weight_decay: float | None = None  # None: the preset's (DINOv3 1e-4, DINOv2 1e-2)
    warmup: int | None = None  # None: 12800 iterations at 38400, the same share of another schedule
    crop: tuple[int, int] = pub.CROP  # random training crop (height, width): 416 × 544
    tta: bool = True  # eval.use_tta: the val image and its mirror, averaged
    seed: int = pub.SEED  # config-nyu.yaml seed
    chunk: int = pub.BATCH * pub.REPLICAS  # crops per forward pass of the frozen network (memory only)
    figure_images: int = 4  # val images whose photograph, truth and prediction the record keeps for the report

    def check(self) -> None:
        one_of("preset", self.preset, tuple(pub.PRESETS))
        at_least("iterations", self.iterations, 1)
        at_least("batch_size", self.batch_size, 2, why="SigLoss's variance needs two pixels; the reference's is 2")
        at_least("replicas", self.replicas, 1)
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if value is not None:
                (positive if name == "lr" else at_least)(name, value, *(() if name == "lr" else (0,)))
        if self.warmup is not None:
            at_least("warmup", self.warmup, 0)
            if self.warmup >= self.iterations:
                raise SettingError("warmup", f"warmup {self.warmup} is not below iterations {self.iterations}: the whole run would be warm-up",
                                   f"give warmup below {self.iterations}, or leave it out (the published 12800/38400 share)")
        if len(self.crop) != 2 or not all(isinstance(v, int) and v >= 1 for v in self.crop):
            raise SettingError("crop", f"crop {tuple(self.crop)} is not (height, width) in whole pixels", "use e.g. crop=(416, 544)")
        at_least("seed", self.seed, 0)
        at_least("chunk", self.chunk, 1)
        at_least("figure_images", self.figure_images, 0)

    @property
    def resolved(self) -> dict:
        """The values the run uses, the preset's filled in."""
        p = pub.PRESETS[self.preset]
        return {**self.as_dict(), "crop": list(self.crop), "lr": p.lr if self.lr is None else self.lr,
                "weight_decay": p.weight_decay if self.weight_decay is None else self.weight_decay,
                "warmup": pub.published_warmup(self.iterations) if self.warmup is None else self.warmup, "schedule": p.schedule}


def execute(settings: DepthSettings, placement, *, checkpoint, train, val, store=None, network="teacher", unseal=None, cache_dir=None,
            json_path=None, progress=None, **_):
    from ..commands.depth import run_depth

    one_process("linear-depth", placement)
    return run_depth(checkpoint, train, val, settings, store=store, network=network, unseal=unseal, cache_dir=cache_dir, json_path=json_path,
                     progress=progress, placement=placement)


DIFFERENCES = (
    "Follows DINOv3's eval/depth (facebookresearch/dinov3 commit 6876159: configs/config-nyu.yaml, config.py, train.py, eval.py, loss.py, "
    "metrics.py, transforms.py, datasets/datasets_utils.py, models/__init__.py, models/linear_head.py, models/encoder.py, schedulers.py) with "
    "preset dinov3: last-block patch tokens through the backbone's norm, BatchNorm + 1×1 convolution to 256 bins over [1e-3, 10] m with "
    "'linear' normalisation, SigLoss (100 warm-up iterations), AdamW lr 3e-4 β (0.9, 0.99) weight decay 1e-4 under WarmupOneCycleLR (12,800 "
    "warm-up iterations of 38,400, β1 its momentum), gradient norm clipped at 35, 2 crops × 8 GPUs of 416 × 544 after NYUCrop, rotation, "
    "flip and ColorAug; evaluation on the whole 640 × 480 image with its mirror, truth outside (1e-3, 10) m and outside the Eigen crop "
    "ignored, metrics per image averaged over images. Presets dinov2-lin1 and dinov2-lin4 change the head as facebookresearch/dinov2 "
    "dinov2/hub/depthers.py builds it (commit b8931f7): the class token concatenated to every patch token, no backbone norm, no BatchNorm "
    "(BNHead's is commented out), features upsampled 4× bilinearly before the convolution, nn.Conv2d's own initialisation, lin.4 reading "
    "blocks [2, 5, 8, 11] of 12 (not the last four); and the optimiser as DINOv2's NYU linear config gives it in the copy in ywyue/FiT3D "
    "(evaluation/baseline_configs/vits_nyu_depth_linear_config.py; DINOv2's own file is on dl.fbaipublicfiles.com, outside its repository): "
    "AdamW lr 1e-4 β (0.9, 0.999) weight decay 0.01, mmcv cosine annealing to 1e-8 of the rate with 12,800 linear warm-up iterations from "
    "1e-3 of it, OneCycle momentum. What differs, item by item: "
    "(1) one process instead of 8 GPUs: the loss of each group of batch_size crops is computed apart and the groups averaged, which is "
    "the gradient DDP averages, and BatchNorm's statistics are those of all the crops, as SyncBatchNorm's are; the frozen network runs "
    "`chunk` crops at a time (memory only); "
    "(2) every random draw comes from generators seeded by `seed`: a crop's from numpy's generator keyed by (seed, sample), the order "
    "of images from one permutation per epoch keyed by (seed, epoch), the head's initial weights from a torch Generator; the reference "
    "draws from numpy's and torch's global generators per data-loader worker, so the same seed gives other crops, and probe's do not "
    "depend on workers or threads; the epoch boundary does not drop a last partial batch; "
    "(3) a run of fewer than 38,400 iterations scales the warm-up to the same share (a third) and is marked as a short schedule; "
    "(4) the evaluation runs once, after the last iteration (the reference also validates every 1,600 iterations without the flip, "
    "which changes no weight); "
    "(5) float32 throughout: the reference runs the depther under torch.autocast in the dtype of the model's training config "
    "(bfloat16 where its compute_precision.param_dtype is bf16); the colour augmentation's product is float64 as NumPy 2 makes it "
    "in the reference (NumPy 1 keeps float32), the image cast to float32 for the network as autocast does; "
    "(6) predictions are never clamped in fact: a mean of bins over [1e-3, 10] m stays inside the range the metrics clamp to; "
    "(7) DINOv2's config adds a GradientLoss (weight 0.5) whose dinov2/eval/depth/models/losses/gradientloss.py slices the batch and channel "
    "axes of a (B, 1, H, W) map, which at 2 crops per GPU leaves nothing to sum: it adds 0 and is left out; its hub builds the heads with "
    "max_depth 80 whatever the weights, where the NYU config trains over [1e-3, 10] m: the presets use 10; DINOv2's mmcv pipeline "
    "(Monocular-Depth-Estimation-Toolbox) rotates and colours with its own functions, and its metrics do not clamp predictions and give "
    "SILog NaN for an image without valid pixels: the presets use DINOv3's crops and metrics, and the test-time flip is averaged at the "
    "head's grid, not after upsampling (bilinear upsampling commutes with the average and the mirror); "
    "(8) the depth maps are read once through the ledger and hashed; each is read again when its crop is made, and refused unless its "
    "bytes are those the ledger entry covers (24,231 maps would not fit in memory); "
    "(9) a network whose patch does not divide the crop is centre-padded as DINOv3's and DINOv2's CenterPadding do; a record says "
    "which settings differ from the preset's published values."
)

PROTOCOL = register(Protocol(
    name="linear-depth",
    summary="A linear head trained on frozen patch tokens to predict NYUv2 depth as 256 bins (DINOv3 config-nyu.yaml; DINOv2 lin.1 / lin.4); "
            "RMSE, AbsRel, δ1..δ3 on the Eigen crop.",
    settings=DepthSettings,
    reads=Reads(source="checkpoint", labels=True, panel_kinds=("nyu",)),
    results=("linear-depth",),
    references=(
        Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 dinov3/eval/depth/train.py"),
        Reference("Oquab et al., DINOv2: Learning Robust Visual Features without Supervision (TMLR 2024)", "facebookresearch/dinov2 dinov2/hub/depthers.py"),
    ),
    differences=DIFFERENCES,
    execute=execute,
    source="checkpoint",
    placement=("workers", "dask_address", "shard", "device"),
    command=on_train_val(
        "Linear depth on NYUv2 as DINOv3 (and DINOv2) train it: a linear head over 256 depth bins on frozen patch tokens; RMSE.",
        "The checkpoint whose frozen network runs on every crop (its store, under --cache or --store, keeps the record).",
        "NYU panel (--nyu, --split train) whose augmented crops train the head.",
        "NYU panel (--split test) scored on whole images after training.",
        Option("preset", "dinov3 (config-nyu.yaml), dinov2-lin1 or dinov2-lin4 (DINOv2's linear heads).", default="dinov3"),
        Option("iterations", "Training iterations (published: 38400, a GPU job; fewer: a short run, marked so).", "int", pub.ITERATIONS),
        Option("batch_size", "Crops per GPU of the reference (published: 2).", "int", pub.BATCH),
        Option("replicas", "GPUs whose losses the reference averages (published: 8); one process computes them all.", "int", pub.REPLICAS),
        Option("lr", "AdamW learning rate (default: the preset's, DINOv3 3e-4, DINOv2 1e-4).", "float"),
        Option("weight_decay", "Default: the preset's (DINOv3 1e-4, DINOv2 1e-2).", "float"),
        Option("warmup", "Warm-up iterations (default: 12800 at 38400, the same share otherwise).", "int"),
        Option("crop", "height,width of the random training crop (published 416,544).", "ints", "416,544", example="416,544"),
        Option("tta", "Average the val image's prediction with its mirror's (published: on).", "either", True),
        Option("figure_images", "Val images whose photograph, truth and prediction the record keeps for the report.", "int", 4),
        Option("seed", "Seed of the crops, the image order and the head's initial weights (DINOv3: 321).", "int", pub.SEED),
        Option("chunk", "Crops per forward pass of the frozen network (memory only).", "int", pub.BATCH * pub.REPLICAS),
        *checkpoint_options(),
        UNSEAL_VAL,
        written_to("Also write the scores and settings as JSON."),
        "cache", "quiet",
        table="results.tables_depth:depth",
        progress=("steps", "progress", "depth"),
        name="depth"),
    sections=("report.sections_depth:depth",),
))
