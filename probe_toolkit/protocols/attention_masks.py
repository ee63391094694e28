"""``attention-masks``: DINO's per-head attention masks (the smallest set of patches holding 60 % of a row's mass)."""

from __future__ import annotations

from dataclasses import dataclass

from ..infra.settings import OneOf, Settings, Within, setting
from .registry import CACHE, Command, Difference, Input, Protocol, Reads, Reference, json_input, register

ROWS = ("auto", "cls", "aggregation", "mean")


@dataclass(frozen=True)
class AttentionMasksSettings(Settings):
    mass: float = setting(
        0.6, "Share of the row's attention each head's mask holds (DINO's visualize_attention.py --threshold in the paper's figures).", Within(0.0, 1.0, "()")
    )
    row: str = setting("auto", "auto, cls (class token), aggregation (SelfPatch's ca_head) or mean (of the patch rows).", OneOf(ROWS))
    partial: bool = setting(False, "Use a store still being extracted (its finished images).")


PROTOCOL = register(
    Protocol(
        name="attention-masks",
        summary="DINO's attention masks: per head, the smallest set of patches holding 60 % of the row's mass; Jaccard per head and best head on a panel.",
        settings=AttentionMasksSettings,
        inputs=(
            Input("store", "A store with attention_224 (or tokens_224 for SelfPatch's aggregation head).", "store", True),
            Input("panel", "Score the masks by Jaccard against this panel's objects (read through the ledger).", "panel", role="panel"),
            json_input("Also write the Jaccards and settings as JSON."),
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(arrays=("attention_224", "tokens_224"), views=("224",), labels=True, panel_kinds=("coco", "coco20k", "saliency")),
        results=("attention_masks",),
        result="results.masks_report:MasksReport",
        references=(Reference("Caron et al., Emerging Properties in Self-Supervised Vision Transformers (ICCV 2021)", "facebookresearch/dino visualize_attention.py"),),
        differences=(
            Difference(
                "masks are kept at the patch grid and compared with the objects in the 224 view (nearest-upsampled by the patch size)",
                "DINO upsamples its masks for display only, and its paper's evaluation code is private",
                "a Jaccard at the view's resolution, not at the image's",
            ),
            Difference(
                "the Jaccard is reported per head, for the best head per image, and per object (the variant of dino#54)",
                "the paper's figure does not say which of these it averages",
                "three numbers beside the published one; the per-object one is the paper's (dino#54)",
            ),
            Difference(
                "with storage or register tokens (DINOv3, DINOv2 with registers) the class token's row is taken over the patches alone, "
                "each storage token's own row gives its own masks, and the record says where each prefix token looks",
                "DINO has no such tokens; their attention would otherwise enter the class row's mass (Darcet et al. 2024, Fig. 9)",
                "on such networks, masks of the patches alone",
            ),
        ),
        run="commands.attention_masks:run",
        command=Command(
            "DINO's attention masks (facebookresearch/dino visualize_attention.py): per head, 60 % of the mass; Jaccard per head and best head.",
            options=("panel", "mass", "row", "json_path", "unseal", "partial", "cache", "quiet", "SHARDED"),
            table="results.tables:attention_masks",
            progress=("images", "masks"),
        ),
        sections=("report.protocols:attention_masks",),
        placement=("workers", "dask_address", "shard"),
    )
)
