"""``propagate``: DAVIS-2017 semi-supervised label propagation, scored as davis2017-evaluation does."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses.tracking import PRESETS, SHORT_SIDE, TEMPERATURE  # DINO's eval_video_segmentation.py, DINOv3's segmentation_tracking notebook
from ..infra.settings import Settings, at_least, one_of, positive
from .registry import REQUIRED, Command, Option, Protocol, Reads, Reference, register, written_to


@dataclass(frozen=True)
class PropagateSettings(Settings):
    n_last_frames: int = 7  # DINO eval_video_segmentation.py; the DINOv3 notebook's MAX_CONTEXT_LENGTH = 7
    size_mask_neighborhood: int = 12  # both: 12 patches (DINO's square window, the notebook's circle)
    topk: int = 5  # both: 5
    subset: str = "val"
    preset: str = "dino"
    temperature: float | None = None  # None: the preset's
    short_side: int | None = None  # None: the preset's

    def check(self) -> None:
        at_least("n_last_frames", self.n_last_frames, 1)
        at_least("size_mask_neighborhood", self.size_mask_neighborhood, 0)
        at_least("topk", self.topk, 1)
        one_of("preset", self.preset, PRESETS)
        if self.temperature is not None:
            positive("temperature", self.temperature)
        if self.short_side is not None:
            at_least("short_side", self.short_side, 16)


def execute(settings: PropagateSettings, placement, *, checkpoint, davis, out, network="teacher", sequences=None, score=True, store=None,
            cache_dir=None, json_path=None, on_frame=None, **_):
    from ..commands.propagate import Settings as Run
    from ..commands.propagate import run_propagate

    s = settings
    run = Run(s.n_last_frames, s.size_mask_neighborhood, s.topk, s.subset, s.preset, TEMPERATURE[s.preset] if s.temperature is None else s.temperature,
              SHORT_SIDE[s.preset] if s.short_side is None else s.short_side)
    return run_propagate(checkpoint, davis, out, settings=run, network=network,
                         sequences=sequences, score=score, store=store, cache_dir=cache_dir, json_path=json_path, on_frame=on_frame, placement=placement)


PROTOCOL = register(Protocol(
    name="propagate",
    summary="DAVIS-2017 label propagation from the first frame's masks through the last block's patch tokens; J&F as davis2017-evaluation.",
    settings=PropagateSettings,
    reads=Reads(source="checkpoint", labels=True, panel_kinds=("davis",)),
    results=("davis",),
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino eval_video_segmentation.py"),
                Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 notebooks/segmentation_tracking.ipynb"),
                Reference("Pont-Tuset et al., The 2017 DAVIS Challenge", "davisvideochallenge/davis2017-evaluation")),
    differences=("DINO's preset reads frames as the reference reads them (cv2.imread, cv2.resize INTER_LINEAR on the 8-bit frame, BGR → RGB), "
                 "but a sequence's forward passes are batched 8 frames at a time where the script runs one frame per pass. "
                 "The soft patch-level segmentation of every frame is kept in the record (soft_<sequence>), which the script discards. "
                 "--preset dinov3-tracking follows DINOv3's notebooks/segmentation_tracking.ipynb, which has no DAVIS scoring of its own: its "
                 "frames (short side 960, each side rounded up to the patch, bicubic, std 0.229), circular window, temperature 0.2 and nearest "
                 "upsampling, scored by davis2017-evaluation as DINO's preset is; the notebook's values checked one by one at commit 6876159."),
    execute=execute,
    source="checkpoint",
    command=Command(
        help="DAVIS-2017 label propagation (facebookresearch/dino eval_video_segmentation.py), scored as davis2017-evaluation does.",
        source="Checkpoint file (any layout probe extract reads).",
        options=(
            Option("davis", "DAVIS-2017 folder: JPEGImages/480p, Annotations/480p, ImageSets/2017.", "path", REQUIRED),
            Option("out", "Where the indexed PNGs (one folder per sequence) and the J&F tables go.", "path", REQUIRED),
            Option("n_last_frames", "Previous frames in the context besides the first (DINO: 7).", "int", 7),
            Option("size_mask_neighborhood", "Window radius in patches (DINO: 12; 0: no window).", "int", 12),
            Option("topk", "Sources per target patch, chosen over all context frames (DINO: 5).", "int", 5),
            Option("subset", "ImageSets/2017/<set>.txt lists the sequences.", default="val"),
            Option("preset", "dino (eval_video_segmentation.py) or dinov3-tracking (DINOv3's segmentation_tracking notebook: short side 960, circular window, T 0.2).",
                   default="dino"),
            Option("temperature", "Affinity temperature (default: the preset's, DINO 0.1, DINOv3 0.2).", "float"),
            Option("short_side", "Frames' short side in pixels (default: the preset's, DINO 480, DINOv3 960).", "int"),
            Option("sequences", "Only this sequence (repeatable).", "strs"),
            Option("network", "teacher or student.", default="teacher"),
            Option("score", "Write the predictions only; read no annotation but the first frames'.", "negated", True),
            Option("store", "Save results/davis here (default: the checkpoint's store, when it exists).", "path"),
            Option("device", "auto, cpu or cuda.", default="auto"),
            Option("workers", "Local processes, one sequence and one torch thread each (default: every core; one on a GPU).", "int"),
            "dask_address",
            Option("shard", "i/n: this process's share of the sequences (default from torchrun RANK/WORLD_SIZE); the last to finish scores."),
            written_to("Also write the J&F tables and settings as JSON."),
            "cache", "quiet"),
        table="results.tables:propagate",
        progress=("frames", "on_frame", "propagate")),
    sections=("report.protocols:propagation",),
    placement=("workers", "dask_address", "shard", "device"),
))
