"""What each view contributes to a store: its arrays, their shapes, and the facts the manifest keeps.

One table for every view, so extraction, the manifest and ``probe info`` agree: 224 gives tokens
(and attention), eval224 tokens (the k-NN and linear features of DINO's evaluation transform, so no
attention), 480 keys, 96 tokens, the own-size views (native, padded; native_crop, cut; native_resized, resized) keys and
tokens; a register model's views each give their register tokens' last-block output too
(``registers_<view>``). A view's patch count follows from the view and the checkpoint's patch size
(224 at /16: 14 x 14, at /8: 28 x 28); an own-size view's patch dimension is the largest grid of the set.
"""

from __future__ import annotations

from typing import Any

from . import hbird_views, images, own_size
from .architectures import Arch

# what one forward pass of each view is read for
READS = {"96": ("tokens",), "224": ("tokens", "attention"), images.EVAL: ("tokens",), "480": ("keys",), images.SQUARE: ("tokens",),
         **{view: ("tokens",) for view in hbird_views.VIEWS},
         **{view: ("keys", "tokens") for view in images.OWN_SIZE}}

# what each kind of array holds, by its name before _<view> (the docs' "What it reads" says it per protocol);
# nothing is pooled: timm's own global_pool (average for its DINOv2 / DINOv3 models) is never read
HOLDS = {
    "tokens": "the last block's patch tokens, before the final norm",
    "cls_tokens": "the last block's class token, before the final norm (probe knn applies the norm, as DINO and DINOv3 read it)",
    "keys": "the last block's patch keys W_k LN1(z) + b_k, heads concatenated",
    "cls_keys": "the class token's key",
    "keys_rope": "the patch keys after RoPE (DINOv3)",
    "attention": "the last block's softmax(q kᵀ/√d) per head, over every token",
    "attention_blocks": "every block's softmax(q kᵀ/√d) per head",
    "registers": "the register (DINOv2) or storage (DINOv3) tokens' last-block output",
}


def holds(array: str) -> str:
    """What an array holds (``HOLDS`` by the longest kind its name starts with)."""
    kinds = sorted((k for k in HOLDS if array.startswith(k + "_")), key=len)
    return HOLDS[kinds[-1]] if kinds else ""


GEOMETRY = {
    "96": "short side 96 (PIL bicubic), centre crop 96",
    "224": "short side 224 (PIL bicubic, long side truncated), centre crop 224",
    images.EVAL: "short side 256 (PIL bicubic, long side truncated), centre crop 224 "
                 "(facebookresearch/dino eval_knn.py, eval_linear.py: Resize(256, interpolation=3), CenterCrop(224))",
    "480": "squash to 480x480 (PIL {resample})",
    images.SQUARE: "padded with white at the right and bottom to a square, resized to 800x800 (PIL bicubic), normalised, "
                   "zero-padded about the centre to whole patches (mbanani/probe3d evals/datasets/spair.py, evals/models/utils.py center_padding)",
    hbird_views.VAL: "squash to 512x512 (PIL bilinear), mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.255) as published "
                     "(vpariza/open-hummingbird-eval hbird/utils/transforms.py get_hbird_val_transforms)",
    **{view: f"random resized crop, scale (0.5, 2), ratio (3/4, 4/3), to 512x512 (PIL bilinear), colour jitter 0.1 each with p 0.5, "
             f"std (0.229, 0.224, 0.255); draws seeded by ({hbird_views.SEED}, epoch {hbird_views.epoch(view)}, file name) "
             f"(vpariza/open-hummingbird-eval get_hbird_train_transforms)" for view in hbird_views.AUGMENTED},
    "native": "own size, normalised, zero-padded at the right and bottom to ceil(h/p) x ceil(w/p) patches "
              "(TokenCut main_tokencut.py, LOST main_lost.py)",
    images.NATIVE_CROP: "own size, normalised, cut at the right and bottom to floor(h/p) x floor(w/p) patches, top left kept "
                        "(lukemelas/deep-spectral-segmentation extract/extract.py, object-localization/main.py --eigenseg)",
    images.NATIVE_RESIZED: "whole image resized (PIL LANCZOS) to round(w/p)*p x round(h/p)*p, at least one patch a side, normalised "
                           "(TokenCut unsupervised_saliency_detection/utils.py resize_pil, get_saliency.py)",
}


def view_arrays(view: str, arch: Arch, patches: int, attention: str) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Array names, dimension names and shapes (after ``image``) of one view with ``patches`` patches."""
    plan: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    d, cls = arch.width, arch.class_token
    reads = READS[view]
    for kind in ("tokens", "keys"):
        if kind in reads:
            plan[f"{kind}_{view}"] = ((f"patch_{view}", "channel"), (patches, d))
            if cls:
                plan[f"cls_{kind}_{view}"] = (("channel",), (d,))
    if "keys" in reads and arch.family == "dinov3":  # the patch keys after RoPE too (the class key is not rotated)
        plan[f"keys_rope_{view}"] = ((f"patch_{view}", "channel"), (patches, d))
    if arch.registers:  # DINOv2's register tokens' output, kept out of the patch arrays, in every view
        plan[f"registers_{view}"] = (("register", "channel"), (arch.registers, d))
    if "attention" in reads and attention != "none":
        t = patches + arch.prefix  # class token, then registers, then patches
        plan[f"attention_{view}"] = (("head", "query", "key"), (arch.heads, t, t))
        if attention == "all":
            plan[f"attention_blocks_{view}"] = (("block", "head", "query", "key"), (arch.depth, arch.heads, t, t))
    return plan


def view_facts(view: str, arch: Arch, patches: int, attention: str, resample: str) -> dict[str, Any]:
    """The manifest's entry for one view (``per_view``): grid, filter, attention, arrays."""
    facts: dict[str, Any] = {"patch": arch.patch, "patches": patches, "geometry": geometry(view, resample)}
    if view in images.OWN_SIZE:
        facts.update(rows=None, cols=None, grid=f"per image, in grid_rows_{view} / grid_cols_{view}")
    else:
        rows, cols = images.fixed_grid(view, arch.patch)
        facts.update(rows=rows, cols=cols)
    facts["resample"] = (resample if view == "480" else own_size_resample(view) if view in images.OWN_SIZE
                         else "bilinear" if view in hbird_views.VIEWS else "bicubic")
    facts["attention"] = attention if "attention" in READS[view] else "none"
    facts["arrays"] = sorted(view_arrays(view, arch, patches, attention))
    return facts


def own_size_resample(view: str) -> str:
    """The filter an own-size view resamples with: LANCZOS resized (TokenCut's ``resize_pil``), none padded or cut."""
    return "lanczos" if own_size.rule(view) == own_size.RESIZE else "none"


def geometry(view: str, resample: str = "bicubic") -> str:
    return GEOMETRY[view].format(resample=resample)
