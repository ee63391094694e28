"""Every view, defined once: a family at a size (``square@480``, ``short@224``, ``eval@224``,
``hbird@512``), or an own-size view; how an image becomes its input, the filter, the grid rule,
the arrays it yields by default, and the published code it follows.

``FAMILIES`` is the one table: extraction (``store.images``), the grids (``store.grids``), the
cache, the decoders, ``probe list``, the CLI's help and the documentation read it. A view is named
``<family>@<size>`` (Hummingbird's augmented memory views ``hbird@<size>_aug<epoch>``); the views
stores held before sizes were free keep their names as aliases (``ALIASES``: ``480`` is
``square@480``, ``224`` is ``short@224``, ``eval224`` is ``eval@224``, ``hbird512`` is
``hbird@512``, ``square800`` is ``padded@800``), so every store written before reads unchanged:
a view's arrays are named by its canonical name, which is the alias where one exists.

Torch-free plain data. ``view(name)`` accepts the command-line spellings (``native-crop``,
``SQUARE@1024``) and the aliases' sizes as integers (``--size 480``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..infra.settings import Constraint, SettingError


@dataclass(frozen=True)
class Family:
    name: str
    rule: str  # how the image becomes the network's input; ``{S}`` the size, ``{R}`` eval's resize
    filter: str  # the resampling filter
    grid: str  # how the patch grid follows from the image
    reads: tuple[str, ...]  # what extraction stores for it by default (facets; "attention": the maps)
    reference: str  # the published code it follows
    sized: bool = True  # False: each image at its own size


FAMILIES: tuple[Family, ...] = (
    Family(
        "short",
        "short side {S}, centre crop {S}",
        "bicubic",
        "{S}/p square",
        ("tokens", "attention"),
        "facebookresearch/dino visualize_attention.py (224); alinlab/SelfPatch local crops (96)",
    ),
    Family(
        "eval",
        "short side {R}, centre crop {S}",
        "bicubic",
        "{S}/p square",
        ("tokens",),
        "facebookresearch/dino eval_knn.py, eval_linear.py (Resize(256), CenterCrop(224); at other sizes crop_pct 0.875, "
        "short side ⌊S·256/224⌋, as timm's eval transform)",
    ),
    Family(
        "square", "squashed to {S} × {S}", "bicubic (lanczos with --resample, CutLER maskcut.py)", "{S}/p square", ("keys",), "facebookresearch/CutLER maskcut/maskcut.py"
    ),
    Family(
        "hbird",
        "squashed to {S} × {S}; std (0.229, 0.224, 0.255) as published; memory views hbird@{S}_aug<epoch>: colour jitter on the "
        "whole image, normalised, then a random resized crop (scale 0.5-2) of the float tensor to {S} × {S}",
        "bilinear",
        "{S}/p square",
        ("tokens",),
        "vpariza/open-hummingbird-eval hbird/utils/transforms.py (get_hbird_val_transforms, get_hbird_train_transforms)",
    ),
    Family(
        "padded",
        "padded with white at right and bottom to a square, resized to {S} × {S}; zero-padded about the centre to whole patches",
        "bicubic",
        "⌈{S}/p⌉ square",
        ("tokens",),
        "mbanani/probe3d evals/datasets/spair.py, evals/models/utils.py",
    ),
    Family(
        "native",
        "own size, zero-padded at right and bottom to whole patches",
        "none",
        "⌈side/p⌉",
        ("keys", "tokens"),
        "YangtaoWANG95/TokenCut main_tokencut.py; valeoai/LOST main_lost.py",
        sized=False,
    ),
    Family(
        "native_crop",
        "own size, cut at right and bottom to whole patches",
        "none",
        "⌊side/p⌋",
        ("keys", "tokens"),
        "lukemelas/deep-spectral-segmentation extract/extract.py",
        sized=False,
    ),
    Family(
        "native_resized",
        "own size, resized to round(side/p) patches",
        "LANCZOS",
        "round(side/p), at least 1",
        ("keys", "tokens"),
        "YangtaoWANG95/TokenCut unsupervised_saliency_detection/get_saliency.py",
        sized=False,
    ),
)
FAMILY = {f.name: f for f in FAMILIES}
SIZED = tuple(f.name for f in FAMILIES if f.sized)
OWN_SIZE = tuple(f.name for f in FAMILIES if not f.sized)
HBIRD_EPOCHS = 2  # Hummingbird's memory views per size: one per augmentation epoch (the published VOC table uses two)

# the names views had before sizes were free: (family, size, augmentation epoch or None)
ALIASES: dict[str, tuple[str, int, int | None]] = {
    "96": ("short", 96, None),
    "224": ("short", 224, None),
    "eval224": ("eval", 224, None),
    "480": ("square", 480, None),
    "hbird512": ("hbird", 512, None),
    "hbird512_aug0": ("hbird", 512, 0),
    "hbird512_aug1": ("hbird", 512, 1),
    "square800": ("padded", 800, None),
}
# stores keep the aliases' default arrays as they were (the short family's 96 view is SelfPatch's local crop: no attention)
ALIAS_READS = {"96": ("tokens",)}
NAMES = ("96", "224", "eval224", "480", "hbird512", "hbird512_aug0", "hbird512_aug1", "native", "native_crop", "native_resized", "square800")
_PATTERN = re.compile(r"^([a-z_]+)@(\d+)(?:_aug(\d+))?$")
# an array's view at its end: ``tokens_square@1024``, ``keys_rope_hbird@448_aug1``
_SIZED_SUFFIX = re.compile(r"_((?:" + "|".join(SIZED) + r")@\d+(?:_aug\d+)?)$")


@dataclass(frozen=True)
class View:
    name: str  # canonical: the alias where one exists, else family@size (arrays are named by it)
    family: str
    size: int | None = None  # None for the own-size views
    epoch: int | None = None  # Hummingbird's memory views: the augmentation epoch

    @property
    def fixed(self) -> bool:
        return FAMILY[self.family].sized

    @property
    def spelled(self) -> str:
        """The family spelling (``square@480``), alias or not."""
        if not self.fixed:
            return self.name
        return f"{self.family}@{self.size}" + (f"_aug{self.epoch}" if self.epoch is not None else "")

    @property
    def alias(self) -> str | None:
        return self.name if self.name in ALIASES else None

    @property
    def reads(self) -> tuple[str, ...]:
        return ALIAS_READS.get(self.name, FAMILY[self.family].reads)

    @property
    def resize(self) -> int | None:
        """The short side before the centre crop (short, eval), else None."""
        if self.family == "short":
            return self.size
        if self.family == "eval":
            return self.size * 256 // 224
        return None

    @property
    def rule(self) -> str:
        family = FAMILY[self.family]
        if self.epoch is not None:
            return (
                f"colour jitter on the whole image, normalised, then a random resized crop (scale 0.5-2) of the float tensor to "
                f"{self.size} × {self.size}; epoch {self.epoch} of the memory"
            )
        text = family.rule.format(S=self.size, R=self.resize)
        return text.split("; memory views")[0] if self.family == "hbird" else text

    @property
    def filter(self) -> str:
        return FAMILY[self.family].filter

    @property
    def grid(self) -> str:
        return FAMILY[self.family].grid.format(S=self.size)

    @property
    def reference(self) -> str:
        return FAMILY[self.family].reference

    @property
    def arrays(self) -> tuple[str, ...]:
        """Its default arrays' names (facets at the last block; the 224 view's maps as ``attention_224``)."""
        out: list[str] = []
        for facet in self.reads:
            if facet == "attention":
                out += [f"attention_{self.name}", f"attention_blocks_{self.name}"]
            else:
                out += [f"{facet}_{self.name}"] + ([f"cls_{facet}_{self.name}"] if self.fixed else [])
        return tuple(out)


def _known() -> str:
    return ", ".join(NAMES) + "; or family@size: " + ", ".join(f"{f}@S" for f in SIZED)


def canonical(name: int | str) -> str:
    """The store's name of a view given as typed (``480``, ``square@480`` → ``480``; ``native-crop``; ``SQUARE@1024`` → ``square@1024``)."""
    return view(name).name


def view(name: int | str) -> View:
    """The view a name or alias stands for; a ``SettingError`` naming the views for anything else."""
    text = str(name).strip().lower().replace("-", "_")
    if text in ALIASES:
        family, size, epoch = ALIASES[text]
        return View(text, family, size, epoch)
    if text in OWN_SIZE:
        return View(text, text)
    found = _PATTERN.match(text)
    if found and found.group(1) in SIZED and int(found.group(2)) > 0 and (found.group(3) is None or found.group(1) == "hbird"):
        family, size = found.group(1), int(found.group(2))
        epoch = int(found.group(3)) if found.group(3) is not None else None
        alias = next((a for a, spec in ALIASES.items() if spec == (family, size, epoch)), None)
        return View(alias or (f"{family}@{size}" + (f"_aug{epoch}" if epoch is not None else "")), family, size, epoch)
    raise SettingError("view", f"view {name!r} is not one of {_known()}", "pick a view that `probe list` names, e.g. square@1024")


def is_view(name: str) -> bool:
    try:
        view(name)
    except SettingError:
        return False
    return True


@dataclass(frozen=True)
class ViewName(Constraint):
    """A protocol setting naming a view (``--view``): an alias, a family at a size, or an own-size view."""

    text = "a view: 224, 480, eval224, ..., a family at a size (square@1024, eval@448) or native, native_crop, native_resized"

    def holds(self, value: Any) -> bool:
        return isinstance(value, (str, int)) and not isinstance(value, bool) and is_view(str(value))

    def example(self) -> Any:
        return "224"

    def invalid(self) -> tuple[Any, ...]:
        return ("512", "square@big")


def check_size(name: str, patch: int) -> tuple[str, str] | None:
    """(problem, fix) where view ``name`` does not fit a /``patch`` network: a size that is not a
    multiple of the patch, the fix naming the nearest that are; None where it fits. The aliases
    keep their rule: at /14 the 480 view reads the 34 whole patches from its top left, as before
    sizes were free; the padded family is centre-padded to whole patches."""
    spec = view(name)
    if not spec.fixed or spec.alias or spec.family == "padded" or spec.size % patch == 0:
        return None
    low, high = spec.size // patch * patch, -(-spec.size // patch) * patch
    suffix = f"_aug{spec.epoch}" if spec.epoch is not None else ""
    nearest = " or ".join(f"{spec.family}@{s}{suffix}" for s in (low, high) if s > 0)
    return f"view {spec.spelled}: {spec.size} px is not a multiple of the network's {patch}-px patch", f"use {nearest}"


def help_text() -> str:
    """``probe extract --views``' help, from the tables."""
    families = "; ".join(f"{f.name}@S ({FAMILY[f.name].rule.format(S='S', R='⌊S·256/224⌋').split(';')[0]}: {', '.join(r for r in f.reads)})" for f in FAMILIES if f.sized)
    aliases = ", ".join(f"{a} = {view(a).spelled}" for a in ALIASES)
    return (
        f"Views to read (a later run may add views to a store). A family at a size S, a multiple of the patch: {families}; Hummingbird's memory "
        f"views hbird@S_aug0, hbird@S_aug1. Each image at its own size: {', '.join(OWN_SIZE)} (keys, tokens). The names of before: {aliases}. "
        "`probe list` shows each view's rule and the code it follows."
    )


def hbird_views(size: int, epochs: int = HBIRD_EPOCHS) -> tuple[str, ...]:
    """Hummingbird's views at ``size``: the query view, then one memory view per augmentation epoch (canonical names)."""
    return (canonical(f"hbird@{size}"), *(canonical(f"hbird@{size}_aug{e}") for e in range(epochs)))


def order(name: str) -> tuple[int, int, int, int]:
    """Where a view sorts: the aliases in their order, then by family, size and epoch."""
    if name in NAMES:
        return (0, NAMES.index(name), 0, 0)
    spec = view(name)
    return (1, [f.name for f in FAMILIES].index(spec.family), spec.size or 0, -1 if spec.epoch is None else spec.epoch)


@dataclass(frozen=True)
class Listed:
    """One row of ``probe list``'s views and of the views page: a family (or own-size view) with its aliases."""

    name: str  # ``square@S``, ``native``
    aliases: tuple[str, ...]
    rule: str
    filter: str
    grid: str
    reads: tuple[str, ...]
    reference: str
    fixed: bool

    @property
    def alias_text(self) -> str:
        """``224 = short@224, 96 = short@96``: the names of before that are its sizes."""
        return ", ".join(f"{a} = {view(a).spelled}" for a in self.aliases)


def listed() -> tuple[Listed, ...]:
    """Every family and own-size view, from ``FAMILIES``, with the names of before that are its sizes."""
    out = []
    for family in FAMILIES:
        aliases = tuple(a for a, (f, _, _) in ALIASES.items() if f == family.name)
        rule = family.rule.format(S="S", R="⌊S·256/224⌋")
        out.append(
            Listed(
                f"{family.name}@S" if family.sized else family.name, aliases, rule, family.filter, family.grid.format(S="S"), family.reads, family.reference, family.sized
            )
        )
    return tuple(out)


# the named views as they were listed before sizes were free
TABLE: tuple[View, ...] = tuple(view(n) for n in NAMES)
BY_NAME = {v.name: v for v in TABLE}
FIXED = tuple(v.name for v in TABLE if v.fixed)
JOINED = tuple(v for v in NAMES if "_" in v)  # names an array suffix cannot split at its last underscore


def of_array(array: str) -> str:
    """The view an array belongs to (``keys_native_crop`` → ``native_crop``, ``tokens_square@1024`` → ``square@1024``)."""
    sized = _SIZED_SUFFIX.search(array)
    if sized:
        return sized.group(1)
    return next((v for v in JOINED if array.endswith(f"_{v}")), array.rsplit("_", 1)[-1])


# which keys the decoders cut: ``keys_<view>`` (before RoPE; the only keys of a position-table network) or
# DINOv3's ``keys_rope_<view>`` (after RoPE, as its attention uses them). The default is the keys before RoPE:
# a cut compares keys with keys, and RoPE makes k_i · k_j depend on where i and j lie (a rotation by their
# offset); on DINOv3 networks TokenCut and LOST masks came out worse after RoPE (benchmarks/dinov3_keys.py).
KEY_KINDS = ("plain", "rope")
KEY_VIEWS = tuple(v.name for v in TABLE if any(a.startswith("keys_") for a in v.arrays))  # the views whose keys the decoders cut


def keys_array(arch: dict[str, Any], view: str, keys: str = "plain") -> str:
    """The array of the keys ``keys`` asks for in a store of network ``arch`` (its manifest's ``arch``);
    ValueError for keys after RoPE of a network without RoPE."""
    if keys not in KEY_KINDS:
        raise ValueError(f"keys {keys!r} is not one of {', '.join(KEY_KINDS)}")
    if keys == "rope" and arch.get("family") != "dinov3":
        raise ValueError("its network has a position table, not RoPE")
    return f"keys_rope_{view}" if keys == "rope" else f"keys_{view}"
