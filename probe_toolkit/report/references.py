"""Numbers measured on other weights, printed beside ours so a reader sees at once how far apart they are.

Two kinds, each with where it comes from:

- the course's numbers for the released networks (Part 2 §2.6, Part 4 §4.8), measured by the
  course's bundle script on its own photographs (tag ``course``);
- the published anchors' numbers as gathered in ``shared/reference/decoders.md``, with that
  file's tags: ``[R]`` read in the repository, ``[T]`` third-party page, ``[I]`` issue thread,
  ``[M]`` recalled from the paper, not verified.

None of them was measured on the stores of a report: they are landmarks, not targets, and the
report labels every one "measured on other weights". Values are in the unit the report prints
(percent for shares and scores).
"""

from __future__ import annotations

from dataclasses import dataclass

OTHER_WEIGHTS = "measured on other weights"


@dataclass(frozen=True)
class Reference:
    """One published or course number; ``statistic`` names the measured quantity it sits beside."""

    statistic: str
    value: str  # as printed: "43.6 %", "< 25 %", "68.8"
    what: str  # network and setting it was measured on
    dataset: str
    source: str
    tag: str

    def cell(self) -> str:
        """The compact form used in a table's reference column."""
        return f"{self.value} ({self.what}, {self.dataset}; {self.cite()})"

    def cite(self) -> str:
        return self.source if self.tag == "course" else f"{self.source} {self.tag}"


COURSE_ATTENTION = (
    Reference("patch_share", "< 25 %", "released SelfPatch teacher", "the course's followed photograph", "course Part 2 §2.6", "course"),
    Reference("patch_share", "≈ 80 %", "converted DINO, no class token", "the course's followed photograph", "course Part 2 §2.6", "course"),
    Reference("patch_share", "a little over 50 %", "run 2's teacher after 20 epochs", "the course's followed photograph", "course Part 2 §2.6", "course"),
)

# the original DINO network's class-token row, head 1, on the course's photograph (Part 2 §2.6)
COURSE_CLS_TOP5 = Reference("cls_top5", "patches 63, 49, 35, 33, 47", "original DINO network (head 1)", "the course's followed photograph", "course Part 2 §2.6", "course")

COURSE_JACCARD = (
    Reference("jaccard", "45.9", "DINO ViT-S/16, 60 % of the class token's attention, max over heads", "PASCAL VOC12 val", "course Part 2 §2.6; decoders.md §6", "[I]"),
    Reference("jaccard", "27.3", "supervised ViT-S/16", "PASCAL VOC12 val", "course Part 2 §2.6", "course"),
    Reference("jaccard", "22.0", "random weights", "PASCAL VOC12 val", "course Part 2 §2.6", "course"),
)

COURSE_PREMISE = (
    Reference("top_in_window", "43.6 %", "released DINO + SelfPatch teacher, top 8", "the course's photographs, 224 px", "course Part 4 §4.8", "course"),
    Reference("top_distance", "2.65", "released DINO + SelfPatch teacher, top 8", "the course's photographs, 224 px", "course Part 4 §4.8", "course"),
    Reference("topk_in_window", "58.7 %", "released DINO + SelfPatch teacher, top 4", "the course's photographs, 224 px", "course Part 4 §4.8", "course"),
)

# the followed photograph's anchors (Part 4 §4.8): how many of the 8 most similar lie in the window
COURSE_ANCHORS = {34: 7, 0: 3}

# the published anchors (decoders.md), unsupervised object discovery with DINO features
ANCHORS = (
    Reference("corloc", "68.8", "TokenCut, DINO ViT-S/16", "VOC07 trainval", "TokenCut README", "[R]"),
    Reference("corloc", "72.1", "TokenCut, DINO ViT-S/16", "VOC12 trainval", "TokenCut README", "[R]"),
    Reference("corloc", "58.8", "TokenCut, DINO ViT-S/16", "COCO20k", "TokenCut README", "[R]"),
    Reference("corloc", "61.9", "LOST, DINO ViT-S/16", "VOC07 trainval", "LOST README", "[R]"),
    Reference("corloc", "64.0", "LOST, DINO ViT-S/16", "VOC12 trainval", "LOST README", "[R]"),
    Reference("corloc", "50.7", "LOST, DINO ViT-S/16", "COCO20k", "LOST README", "[R]"),
    Reference("corloc", "62.7", "Deep Spectral Methods, DINO ViT-S/16", "VOC07 trainval", "via TokenCut TPAMI margins", "[T]"),
    Reference("corloc", "66.4", "Deep Spectral Methods, DINO ViT-S/16", "VOC12 trainval", "via TokenCut TPAMI margins", "[T]"),
    Reference("corloc", "52.2", "Deep Spectral Methods, DINO ViT-S/16", "COCO20k", "paper", "[M]"),
    Reference("corloc", "72.5", "FOUND, DINO ViT-S/8 (trained 1×1 conv)", "VOC07 trainval", "paper", "[M]"),
    Reference("segm_AP", "2.2", "MaskCut, training-free", "COCO val2017 (mask AP)", "ProMerge README; CutLER #70", "[T]"),
    Reference("segm_AP", "1.7", "MaskCut, a user's reproduction", "COCO val2017 (mask AP)", "CutLER #70", "[I]"),
    Reference("segm_AP", "3.0", "MaskCut, training-free", "COCO20K", "third-party listing", "[T]"),
    Reference("bbox_AP", "2.4", "TokenCut, class-agnostic", "COCO val2017", "paperswithcode listing via CutLER", "[T]"),
    Reference("bbox_AP50", "4.8", "TokenCut, class-agnostic", "COCO val2017", "paperswithcode listing via CutLER", "[T]"),
    Reference("bbox_AP75", "1.9", "TokenCut, class-agnostic", "COCO val2017", "paperswithcode listing via CutLER", "[T]"),
    Reference("bbox_AP50", "21.9", "CutLER (a detector trained on MaskCut's masks)", "COCO val2017", "CutLER README", "[R]"),
    Reference("jaccard", "45.9", "DINO ViT-S/16 attention, 60 % mass", "PASCAL VOC12 val", "dino #54; course", "[I]"),
)


def for_statistic(name: str, table: tuple[Reference, ...]) -> list[Reference]:
    return [r for r in table if r.statistic == name]


def column(name: str, table: tuple[Reference, ...]) -> str:
    """Every reference for ``name`` in one table cell, grouped by method and source: one cited
    list of values per method ("–" when there is none)."""
    groups: dict[tuple[str, str], list[Reference]] = {}
    for r in for_statistic(name, table):
        groups.setdefault((r.what, r.cite()), []).append(r)
    if not groups:
        return "–"
    return "; ".join(f"{what}: {', '.join(f'{r.value} ({r.dataset})' for r in refs)} [{cite}]" for (what, cite), refs in groups.items())
