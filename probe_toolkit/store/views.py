"""Every view, defined once: its name, how an image becomes its input, the filter, the grid
rule, the arrays it yields, and the published code it follows.

Torch-free plain data, read by extraction (``store.images``), the grids (``store.grids``), the
cache, the decoders, ``probe list`` and the CLI's help. ``view(name)`` accepts the command-line
spellings (``native-crop``) and the fixed views' sizes as integers (``--size 480``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..infra.settings import SettingError


@dataclass(frozen=True)
class View:
    name: str
    rule: str  # how the image becomes the network's input
    filter: str  # the resampling filter
    grid: str  # how the patch grid follows from the image
    arrays: tuple[str, ...]  # what extraction writes for it
    reference: str  # the published code it follows
    fixed: bool = True  # one size for every image (False: each image at its own size)


TABLE: tuple[View, ...] = (
    View("96", "short side 96, centre crop 96", "bicubic", "96/p square", ("tokens_96",), "alinlab/SelfPatch (local crops)"),
    View("224", "short side 224, centre crop 224", "bicubic", "224/p square", ("tokens_224", "cls_tokens_224", "attention_224", "attention_blocks_224"),
         "facebookresearch/dino visualize_attention.py"),
    View("eval224", "short side 256, centre crop 224", "bicubic", "224/p square", ("tokens_eval224", "cls_tokens_eval224"), "facebookresearch/dino eval_knn.py"),
    View("480", "squashed to 480 × 480", "bicubic (lanczos with --resample, CutLER maskcut.py)", "480/p square", ("keys_480", "cls_keys_480"),
         "facebookresearch/CutLER maskcut/maskcut.py"),
    View("hbird512", "squashed to 512 × 512; std (0.229, 0.224, 0.255) as published", "bilinear", "512/p square", ("tokens_hbird512", "cls_tokens_hbird512"),
         "vpariza/open-hummingbird-eval hbird/utils/transforms.py (get_hbird_val_transforms)"),
    View("hbird512_aug0", "random resized crop (scale 0.5-2) to 512 × 512, colour jitter; epoch 0 of the memory", "bilinear", "512/p square",
         ("tokens_hbird512_aug0", "cls_tokens_hbird512_aug0"), "vpariza/open-hummingbird-eval hbird/utils/transforms.py (get_hbird_train_transforms)"),
    View("hbird512_aug1", "random resized crop (scale 0.5-2) to 512 × 512, colour jitter; epoch 1 of the memory", "bilinear", "512/p square",
         ("tokens_hbird512_aug1", "cls_tokens_hbird512_aug1"), "vpariza/open-hummingbird-eval hbird/utils/transforms.py (get_hbird_train_transforms)"),
    View("native", "own size, zero-padded at right and bottom to whole patches", "none", "⌈side/p⌉", ("keys_native", "tokens_native"),
         "YangtaoWANG95/TokenCut main_tokencut.py; valeoai/LOST main_lost.py", fixed=False),
    View("native_crop", "own size, cut at right and bottom to whole patches", "none", "⌊side/p⌋", ("keys_native_crop", "tokens_native_crop"),
         "lukemelas/deep-spectral-segmentation extract/extract.py", fixed=False),
    View("native_resized", "own size, resized to round(side/p) patches", "LANCZOS", "round(side/p), at least 1", ("keys_native_resized", "tokens_native_resized"),
         "YangtaoWANG95/TokenCut unsupervised_saliency_detection/get_saliency.py", fixed=False),
    View("square800", "padded with white at right and bottom to a square, resized to 800 × 800; zero-padded about the centre to whole patches",
         "bicubic", "⌈800/p⌉ square", ("tokens_square800", "cls_tokens_square800"), "mbanani/probe3d evals/datasets/spair.py, evals/models/utils.py"),
)
BY_NAME = {v.name: v for v in TABLE}
NAMES = tuple(BY_NAME)
FIXED = tuple(v.name for v in TABLE if v.fixed)
OWN_SIZE = tuple(v.name for v in TABLE if not v.fixed)
JOINED = tuple(v for v in NAMES if "_" in v)  # names an array suffix cannot split at its last underscore


def canonical(name: int | str) -> str:
    """The table's name of a view given as typed (``480``, ``native-crop``, ``NATIVE``)."""
    text = str(name).strip().lower().replace("-", "_")
    if text not in BY_NAME:
        raise SettingError("view", f"view {name!r} is not one of {', '.join(NAMES)}", "pick a view that `probe list` names")
    return text


def view(name: int | str) -> View:
    return BY_NAME[canonical(name)]


def of_array(array: str) -> str:
    """The view an array belongs to (``keys_native_crop`` → ``native_crop``)."""
    return next((v for v in JOINED if array.endswith(f"_{v}")), array.rsplit("_", 1)[-1])


# which keys the decoders cut: ``keys_<view>`` (before RoPE; the only keys of a position-table network) or
# DINOv3's ``keys_rope_<view>`` (after RoPE, as its attention uses them). The default is the keys before RoPE:
# a cut compares keys with keys, and RoPE makes k_i · k_j depend on where i and j lie (a rotation by their
# offset); on DINOv3 networks TokenCut and LOST masks came out worse after RoPE (benchmarks/dinov3_keys.py).
KEY_KINDS = ("plain", "rope")


def keys_array(arch: dict[str, Any], view: str, keys: str = "plain") -> str:
    """The array of the keys ``keys`` asks for in a store of network ``arch`` (its manifest's ``arch``);
    ValueError for keys after RoPE of a network without RoPE."""
    if keys not in KEY_KINDS:
        raise ValueError(f"keys {keys!r} is not one of {', '.join(KEY_KINDS)}")
    if keys == "rope" and arch.get("family") != "dinov3":
        raise ValueError("its network has a position table, not RoPE: its keys have no form after RoPE")
    return f"keys_rope_{view}" if keys == "rope" else f"keys_{view}"
