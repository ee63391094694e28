"""``propagate``: DAVIS-2017 semi-supervised label propagation, scored as davis2017-evaluation does."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses.tracking import PRESETS, SHAPE, SHORT_SIDE, TEMPERATURE, Frames  # DINO's eval_video_segmentation.py, DINOv3's segmentation_tracking notebook
from ..infra.settings import AtLeast, OneOf, Positive, Settings, setting
from .registry import CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register


@dataclass(frozen=True)
class PropagateSettings(Settings):
    n_last_frames: int = setting(
        7, "Previous frames in the context besides the first (DINO's eval_video_segmentation.py; the DINOv3 notebook's MAX_CONTEXT_LENGTH).", AtLeast(1)
    )
    size_mask_neighborhood: int = setting(12, "Window radius in patches (both: DINO's square window, the notebook's circle; 0: no window).", AtLeast(0))
    topk: int = setting(5, "Sources per target patch, chosen over all context frames (both).", AtLeast(1))
    subset: str = setting("val", "ImageSets/2017/<set>.txt lists the sequences.")
    preset: str = setting(
        "dino", "dino (eval_video_segmentation.py) or dinov3-tracking (DINOv3's segmentation_tracking notebook: short side 960, circular window, T 0.2).", OneOf(PRESETS)
    )
    temperature: float | None = setting(None, "Affinity temperature (default: the preset's, DINO 0.1, DINOv3 0.2).", Positive())
    short_side: int | None = setting(None, "Frames' short side in pixels (default: the preset's, DINO 480, DINOv3 960).", AtLeast(16))

    @property
    def affinity_temperature(self) -> float:
        """The temperature the run uses: the one given, else the preset's."""
        return TEMPERATURE[self.preset] if self.temperature is None else self.temperature

    @property
    def frame_short_side(self) -> int:
        return SHORT_SIDE[self.preset] if self.short_side is None else self.short_side

    def frames(self, patch: int) -> Frames:
        return Frames(self.preset, self.frame_short_side, patch)

    def record(self) -> dict:
        """The values the run used, as its record states them (the preset's filled in)."""
        return {
            "preset": self.preset,
            "n_last_frames": self.n_last_frames,
            "size_mask_neighborhood": self.size_mask_neighborhood,
            "window": SHAPE[self.preset],
            "topk": self.topk,
            "temperature": self.affinity_temperature,
            "short_side": self.frame_short_side,
            "subset": self.subset,
        }


PROTOCOL = register(
    Protocol(
        name="propagate",
        summary="DAVIS-2017 label propagation from the first frame's masks through the last block's patch tokens; J&F as davis2017-evaluation.",
        settings=PropagateSettings,
        reads=Reads(source="checkpoint", labels=True, panel_kinds=("davis",)),
        results=("davis",),
        references=(
            Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino eval_video_segmentation.py"),
            Reference("Siméoni et al., DINOv3 (2025)", "facebookresearch/dinov3 notebooks/segmentation_tracking.ipynb"),
            Reference("Pont-Tuset et al., The 2017 DAVIS Challenge", "davisvideochallenge/davis2017-evaluation"),
        ),
        inputs=(
            Input("checkpoint", "Checkpoint file (any layout probe extract reads).", "checkpoint", True),
            Input("davis", "DAVIS-2017 folder: JPEGImages/480p, Annotations/480p, ImageSets/2017.", "path", True),
            Input("out", "Where the indexed PNGs (one folder per sequence) and the J&F tables go.", "path", True),
            Input("sequences", "Only this sequence (repeatable).", "strs"),
            Input("network", "teacher or student.", default="teacher"),
            Input("score", "Write the predictions only; read no annotation but the first frames'.", "negated", default=True),
            Input("store", "Save results/davis here (default: the checkpoint's store, when it exists).", "path"),
            json_input("Also write the J&F tables and settings as JSON."),
            CACHE,
        ),
        result="results.propagation_report:PropagationReport",
        differences=(
            Difference(
                "a sequence's forward passes are batched 8 frames at a time",
                "the script runs one frame per pass; batching changes no frame's tokens beyond float rounding",
                "none beyond float rounding",
            ),
            Difference("the soft patch-level segmentation of every frame is kept in the record (soft_<sequence>)", "the script discards it; the report draws it", "none"),
            Difference(
                "DINO's preset reads frames as the reference does (cv2.imread, cv2.resize INTER_LINEAR on the 8-bit frame, BGR → RGB)",
                "the same pixels as the script",
                "none",
            ),
            Difference(
                "preset dinov3-tracking follows DINOv3's notebooks/segmentation_tracking.ipynb (frames of short side 960, each side rounded up "
                "to the patch, bicubic, std 0.229; circular window; temperature 0.2; nearest upsampling), scored by davis2017-evaluation",
                "the notebook has no DAVIS scoring of its own; its values were checked one by one at commit 6876159",
                "a J&F the DINOv3 paper does not publish for this notebook",
            ),
        ),
        run="commands.propagate:run",
        command=Command(
            "DAVIS-2017 label propagation (facebookresearch/dino eval_video_segmentation.py), scored as davis2017-evaluation does.",
            options=(
                "davis",
                "out",
                "n_last_frames",
                "size_mask_neighborhood",
                "topk",
                "subset",
                "preset",
                "temperature",
                "short_side",
                "sequences",
                "network",
                "score",
                "store",
                Option("device", "auto, cpu or cuda."),
                Option("workers", "Local processes, one sequence and one torch thread each (default: every core; one on a GPU)."),
                "dask_address",
                Option("shard", "i/n: this process's share of the sequences (default from torchrun RANK/WORLD_SIZE); the last to finish scores."),
                "json_path",
                "cache",
                "quiet",
            ),
            table="results.tables:propagate",
            progress=("frames", "propagate"),
        ),
        sections=("report.protocols:propagation",),
        placement=("workers", "dask_address", "shard", "device"),
        placement_defaults={"device": "auto"},
    )
)
