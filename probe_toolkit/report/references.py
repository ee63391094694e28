"""Published numbers, each with its source, and the rule that decides where a report prints one.

Every number names where it was published: a repository and file (read there) or a paper and
its figure or table. A reference sits beside a measurement only when the measurement's
protocol and data match the reference's (``matches``); every other reference goes to the
report's "published elsewhere" table, never beside a score it cannot be compared with.

A measurement matches a reference when all of these hold:

- the metric is the same (``statistic``);
- the method's protocol is the same: the decoder preset (``tokencut`` is TokenCut's and LOST's
  graph on uncentred keys, no other preset is theirs), the view the keys were cut at (their
  code runs at each image's own size, zero-padded: view ``native``; DSM's cuts it to whole
  patches: view ``native_crop``; TokenCut's saliency script resizes it instead, view
  ``native_resized``, whose numbers are report.discovery's) and the architecture (ViT-S/16);
- the data are the same: the panel holds exactly the dataset's number of images and its name
  names the dataset (``voc07``, ``voc12``, ``coco20k``, ``val2017``).

No synthetic panel, no 480 view and no centred decoder meets that, so the demo's scores are
shown alone and every reference of this module lands in "published elsewhere".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

OTHER_WEIGHTS = "published elsewhere: other data or protocol"

# the published metrics a measurement can sit beside, with their labels in the report
LABELS = {
    "corloc": "CorLoc (%)",
    "bbox_AP50": "box AP50 (%)",
    "segm_AP": "mask AP (%)",
    "jaccard": "Jaccard of attention masks (%)",
}


@dataclass(frozen=True)
class Data:
    """A published dataset split: its name, how many images it holds, and tags that name it."""

    name: str
    images: int
    tags: tuple[str, ...]


VOC07 = Data("PASCAL VOC07 trainval", 5011, ("voc07", "voc2007"))
VOC12 = Data("PASCAL VOC12 trainval", 11540, ("voc12", "voc2012"))
COCO20K = Data("COCO20k (19,817 COCO train2014 images)", 19817, ("coco20k",))
COCO_VAL = Data("COCO val2017", 5000, ("val2017",))
VOC12_VAL = Data("PASCAL VOC12 val", 1449, ("voc12", "voc2012"))


@dataclass(frozen=True)
class Protocol:
    """How the number was measured: the decoder preset, the view of the keys, the architecture."""

    method: str  # as printed: "TokenCut", "LOST", ...
    preset: str | None  # the probe decoder preset that is this method, None when probe has none
    view: str = "native"
    arch: str = "ViT-S/16"


@dataclass(frozen=True)
class Reference:
    statistic: str  # the result key it may sit beside: "corloc", "bbox_AP50", ...
    value: float
    protocol: Protocol
    data: Data
    source: str  # "repository file" or "paper, figure/table"
    note: str = ""

    @property
    def label(self) -> str:
        return LABELS.get(self.statistic, self.statistic)

    def cell(self) -> str:
        return f"{self.value:g} ({self.protocol.method}, {self.protocol.arch}, {self.data.name}; {self.source})"


TOKENCUT = Protocol("TokenCut", "tokencut")
LOST = Protocol("LOST", None)
CUTLER = Protocol("CutLER (a detector trained on MaskCut's masks)", None, view="detector input")
DINO_ATTENTION = Protocol("DINO attention masks (60 % of the class token's mass, best head)", None, view="native")

PUBLISHED: tuple[Reference, ...] = (
    Reference("corloc", 68.8, TOKENCUT, VOC07, "YangtaoWANG95/TokenCut README.md"),
    Reference("corloc", 72.1, TOKENCUT, VOC12, "YangtaoWANG95/TokenCut README.md"),
    Reference("corloc", 58.8, TOKENCUT, COCO20K, "YangtaoWANG95/TokenCut README.md"),
    Reference("corloc", 61.9, LOST, VOC07, "valeoai/LOST README.md"),
    Reference("corloc", 64.0, LOST, VOC12, "valeoai/LOST README.md"),
    Reference("corloc", 50.7, LOST, COCO20K, "valeoai/LOST README.md"),
    Reference("bbox_AP50", 21.9, CUTLER, COCO_VAL, "facebookresearch/CutLER README.md", "class-agnostic, zero-shot"),
    Reference("jaccard", 45.9, DINO_ATTENTION, VOC12_VAL, "Caron et al., ICCV 2021, Fig. 4", "DINO ViT-S/16"),
    Reference("jaccard", 27.3, DINO_ATTENTION, VOC12_VAL, "Caron et al., ICCV 2021, Fig. 4", "supervised ViT-S/16"),
    Reference("jaccard", 22.0, DINO_ATTENTION, VOC12_VAL, "Caron et al., ICCV 2021, Fig. 4", "random weights"),
)


@dataclass(frozen=True)
class Measurement:
    """What a saved score was measured with, as far as its result records it."""

    statistic: str
    preset: str
    view: str
    arch: str
    images: int
    names: tuple[str, ...] = field(default_factory=tuple)  # the panel's name


def arch_name(arch: dict) -> str:
    """``ViT-S/16`` for width 384, depth 12, patch 16; the plain numbers otherwise."""
    known = {(384, 12): "ViT-S", (768, 12): "ViT-B", (192, 12): "ViT-Ti", (1024, 24): "ViT-L"}
    base = known.get((arch.get("width"), arch.get("depth")), f"width {arch.get('width')}, depth {arch.get('depth')}")
    return f"{base}/{arch.get('patch')}"


def _names_dataset(names: tuple[str, ...], data: Data) -> bool:
    text = " ".join(names).lower()
    return any(re.search(rf"(^|[^a-z0-9]){tag}($|[^a-z0-9])", text) for tag in data.tags)


def matches(ref: Reference, m: Measurement) -> bool:
    """Same metric, same protocol (preset, view, architecture) and same data (see the module doc)."""
    p = ref.protocol
    return (
        ref.statistic == m.statistic
        and p.preset is not None
        and p.preset == m.preset
        and p.view == m.view
        and p.arch == m.arch
        and ref.data.images == m.images
        and _names_dataset(m.names, ref.data)
    )


def beside(measurement: Measurement) -> list[Reference]:
    """The references a measurement may be printed beside (usually none)."""
    return [r for r in PUBLISHED if matches(r, measurement)]


def elsewhere(shown: set[Reference]) -> list[Reference]:
    """Every reference not printed beside a measurement, once each, in the table's order."""
    return [r for r in dict.fromkeys(PUBLISHED) if r not in shown]
