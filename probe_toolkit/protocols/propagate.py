"""``propagate``: DAVIS-2017 semi-supervised label propagation, scored as davis2017-evaluation does."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, at_least
from .registry import Protocol, Reads, Reference, register


@dataclass(frozen=True)
class PropagateSettings(Settings):
    n_last_frames: int = 7  # DINO eval_video_segmentation.py
    size_mask_neighborhood: int = 12
    topk: int = 5
    subset: str = "val"

    def check(self) -> None:
        at_least("n_last_frames", self.n_last_frames, 1)
        at_least("size_mask_neighborhood", self.size_mask_neighborhood, 0)
        at_least("topk", self.topk, 1)


def execute(settings: PropagateSettings, placement, *, checkpoint, davis, out, network="teacher", sequences=None, score=True, store=None,
            cache_dir=None, json_path=None, on_frame=None, **_):
    from ..commands.propagate import Settings as Run
    from ..commands.propagate import run_propagate

    s = settings
    return run_propagate(checkpoint, davis, out, settings=Run(s.n_last_frames, s.size_mask_neighborhood, s.topk, s.subset), network=network,
                         sequences=sequences, score=score, store=store, cache_dir=cache_dir, json_path=json_path, on_frame=on_frame, placement=placement)


PROTOCOL = register(Protocol(
    name="propagate",
    summary="DAVIS-2017 label propagation from the first frame's masks through the last block's patch tokens; J&F as davis2017-evaluation.",
    settings=PropagateSettings,
    reads=Reads(source="checkpoint", labels=True, panel_kinds=("davis",)),
    results=("davis",),
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino eval_video_segmentation.py"),
                Reference("Pont-Tuset et al., The 2017 DAVIS Challenge", "davisvideochallenge/davis2017-evaluation")),
    differences="Frames are resampled in float where the reference reads them with OpenCV on 8-bit images: F may differ in the third decimal.",
    execute=execute,
    source="checkpoint",
))
