"""``attention-masks``: DINO's per-head attention masks (the smallest set of patches holding 60 % of a row's mass)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import Settings, one_of, within
from .registry import Command, Option, Protocol, Reads, Reference, register, written_to


@dataclass(frozen=True)
class AttentionMasksSettings(Settings):
    mass: float = 0.6  # DINO's visualize_attention.py threshold
    row: str = "auto"  # auto, cls, aggregation (SelfPatch's ca_head) or mean of the patch rows
    partial: bool = False

    def check(self) -> None:
        within("mass", self.mass, 0.0, 1.0, closed="()")
        one_of("row", self.row, ("auto", "cls", "aggregation", "mean"))


def execute(settings: AttentionMasksSettings, placement, *, store, panel=None, unseal=None, cache_dir=None, json_path=None, on_block=None, **_):
    from ..commands.attention_masks import run_attention_masks

    return run_attention_masks(store, panel=panel, mass=settings.mass, row=settings.row, unseal=unseal, cache_dir=cache_dir, json_path=json_path,
                               partial=settings.partial, on_block=on_block, placement=placement)


PROTOCOL = register(Protocol(
    name="attention-masks",
    summary="DINO's attention masks: per head, the smallest set of patches holding 60 % of the row's mass; Jaccard per head and best head on a panel.",
    settings=AttentionMasksSettings,
    reads=Reads(arrays=("attention_224", "tokens_224"), views=("224",), labels=True, panel_kinds=("coco", "coco20k", "saliency")),
    results=("attention_masks",),
    references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino visualize_attention.py"),),
    differences=("Masks are kept at the patch grid (DINO upsamples them for display); the Jaccard follows the per-object variant of dino#54 beside the per-image one. "
                 "With storage or register tokens (DINOv3, DINOv2 with registers) the class token's row is taken over the patches alone, each "
                 "storage token's own row gives its own masks, and the result says where each prefix token looks (Darcet et al. 2024, Fig. 9)."),
    execute=execute,
    command=Command(
        help="DINO's attention masks (facebookresearch/dino visualize_attention.py): per head, 60 % of the mass; Jaccard per head and best head.",
        source="A store with attention_224 (or tokens_224 for SelfPatch's aggregation head).",
        options=(
            Option("panel", "Score the masks by Jaccard against this panel's objects (read through the ledger)."),
            Option("mass", "Share of the row's attention each head's mask holds (DINO: 0.6).", "float", 0.6),
            Option("row", "auto, cls (class token), aggregation (SelfPatch's ca_head) or mean (of the patch rows).", default="auto"),
            written_to("Also write the Jaccards and settings as JSON."),
            Option("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            Option("partial", "Use a store still being extracted (its finished images).", "bool", False),
            "cache", "quiet", "SHARDED"),
        table="results.tables:attention_masks",
        progress=("images", "on_block", "masks")),
    sections=("report.protocols:attention_masks",),
))
