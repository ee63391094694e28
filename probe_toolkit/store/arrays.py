"""What each view contributes to a store: its arrays, their shapes, and the facts the manifest keeps.

One place for every view, so extraction, the manifest and ``probe info`` agree. What a view
stores is a ``Request``: array kinds (``tokens``, ``cls_tokens``, ``registers``, ``keys``,
``cls_keys``, ``keys_rope``, ``normed``, ``queries``, ``values``, ...: ``store.layout``) at some
blocks, the explicit attention maps, the attention statistics. By default a view stores what its
family reads (``store.views``): the short family tokens and attention (the 96 view tokens), eval
tokens, square keys, Hummingbird's and padded views tokens, the own-size views keys and tokens; a
register model's views each give their register tokens' output too (``registers_<view>``);
``--facets`` and ``--blocks`` choose otherwise, ``--for`` asks the protocols (``store.plan``).
A view's patch count follows from the view and the checkpoint's patch size (224 at /16: 14 x 14,
at /8: 28 x 28); an own-size view's patch dimension is the largest grid of the set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import hbird_views, images, layout, own_size, views
from .architectures import Arch

STATS_DTYPE = "float32"  # attention statistics are kept in float32 whatever --dtype (entropy to 1e-5)

# what each kind of array holds, by its name before _<view> (the docs' "What it reads" says it per protocol);
# nothing is pooled: timm's own global_pool (average for its DINOv2 / DINOv3 models) is never read
HOLDS = {
    "tokens": "patch tokens of the block read (the last unless the run names one), before the final norm",
    "cls_tokens": "the class token of the block read, before the final norm (probe knn applies the norm, as DINO and DINOv3 read it)",
    "keys": "the patch keys W_k LN1(z) + b_k of the block read, heads concatenated",
    "cls_keys": "the class token's key",
    "keys_rope": "the patch keys after RoPE (DINOv3)",
    "attention": "the block's softmax(q kᵀ/√d) per head, over every token",
    "attention_blocks": "every block's softmax(q kᵀ/√d) per head",
    "registers": "the register (DINOv2) or storage (DINOv3) tokens' output",
}


def holds(array: str) -> str:
    """What an array holds (``HOLDS`` by the longest kind its name starts with)."""
    kinds = sorted((k for k in HOLDS if array.startswith(k + "_")), key=len)
    return HOLDS[kinds[-1]] if kinds else ""


GEOMETRY = {  # the aliases' geometry, as stores have recorded it
    "96": "short side 96 (PIL bicubic), centre crop 96",
    "224": "short side 224 (PIL bicubic, long side truncated), centre crop 224",
    images.EVAL: "short side 256 (PIL bicubic, long side truncated), centre crop 224 "
    "(facebookresearch/dino eval_knn.py, eval_linear.py: Resize(256, interpolation=3), CenterCrop(224))",
    "480": "squash to 480x480 (PIL {resample})",
    images.SQUARE: "padded with white at the right and bottom to a square, resized to 800x800 (PIL bicubic), normalised, "
    "zero-padded about the centre to whole patches (mbanani/probe3d evals/datasets/spair.py, evals/models/utils.py center_padding)",
    hbird_views.VAL: "squash to 512x512 (PIL bilinear), mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.255) as published "
    "(vpariza/open-hummingbird-eval hbird/utils/transforms.py get_hbird_val_transforms)",
    "native": "own size, normalised, zero-padded at the right and bottom to ceil(h/p) x ceil(w/p) patches (TokenCut main_tokencut.py, LOST main_lost.py)",
    images.NATIVE_CROP: "own size, normalised, cut at the right and bottom to floor(h/p) x floor(w/p) patches, top left kept "
    "(lukemelas/deep-spectral-segmentation extract/extract.py, object-localization/main.py --eigenseg)",
    images.NATIVE_RESIZED: "whole image resized (PIL LANCZOS) to round(w/p)*p x round(h/p)*p, at least one patch a side, normalised "
    "(TokenCut unsupervised_saliency_detection/utils.py resize_pil, get_saliency.py)",
}
FAMILY_GEOMETRY = {  # any other size of a family
    "short": "short side {S} (PIL bicubic, long side truncated), centre crop {S}",
    "eval": "short side {R} (PIL bicubic, long side truncated), centre crop {S} (facebookresearch/dino eval_knn.py's Resize(256), CenterCrop(224) "
    "at crop_pct 0.875: short side floor(S * 256 / 224))",
    "square": "squash to {S}x{S} (PIL {resample})",
    "padded": "padded with white at the right and bottom to a square, resized to {S}x{S} (PIL bicubic), normalised, "
    "zero-padded about the centre to whole patches (mbanani/probe3d evals/datasets/spair.py, evals/models/utils.py center_padding)",
    "hbird": "squash to {S}x{S} (PIL bilinear), mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.255) as published "
    "(vpariza/open-hummingbird-eval hbird/utils/transforms.py get_hbird_val_transforms)",
}


@dataclass(frozen=True)
class Request:
    """What one view stores: array ``kinds`` at each of ``blocks`` (None: the last), the explicit
    maps (``maps``: none, last, all) and every block's attention statistics (``stats``)."""

    kinds: tuple[str, ...]
    blocks: tuple[int, ...] | None = None
    maps: str = "none"
    stats: bool = False


def default_kinds(view: str, arch: Arch, facets: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The kinds a view stores: its family's reads (``facets`` None), or the facets asked, each with
    its class token's and (register networks) its registers' rows; DINOv3's q and k also after
    RoPE (patch tokens only: the prefix is not rotated)."""
    out: list[str] = []
    if facets is None:
        reads = views.view(view).reads
        if "tokens" in reads:
            out += ["tokens", "cls_tokens"]
        if "keys" in reads:
            out += ["keys", "cls_keys"] + (["keys_rope"] if arch.family == "dinov3" else [])
        out += ["registers"] if arch.registers else []  # the register tokens' output in every view, as stores always held
    else:
        for facet in facets:
            for kind in layout.facet_kinds(facet, arch.family):
                out.append(kind)
                if not kind.endswith("_rope"):
                    out += [f"cls_{kind}"] + ([("registers" if kind == "tokens" else f"registers_{kind}")] if arch.registers else [])
    return tuple(k for k in dict.fromkeys(out) if arch.class_token or not k.startswith("cls_"))


def attention_dims(view: str, unit: str) -> tuple[str, str]:
    """The query and key dimensions of a view's attention arrays: ``query``, ``key`` for the 224
    view as stores have always named them, ``query_<unit>``, ``key_<unit>`` elsewhere (one Dataset
    holds one size of a dimension)."""
    return ("query", "key") if view == "224" else (f"query_{unit}", f"key_{unit}")


Spec = tuple[tuple[str, ...], tuple[int, ...], dict[str, Any]]  # dims and shape after ``image``; attributes (dtype, block, facet)


def view_arrays(view: str, arch: Arch, patches: int, request: Request, part: int = 0) -> dict[str, Spec]:
    """Array names, dimension names, shapes (after ``image``) and attributes of one view with ``patches`` patches."""
    plan: dict[str, Spec] = {}
    unit = layout.unit(view, part)
    d, tokens = arch.width, patches + arch.prefix
    for block in request.blocks or (None,):
        held = arch.depth - 1 if block is None else block
        for kind in request.kinds:
            name = layout.named(kind, view, block, arch.depth, part)
            facet = layout.ArrayName(kind, view).facet
            attrs = {"block": held, **({"facet": facet} if facet else {})}
            if kind.startswith("cls_"):
                plan[name] = (("channel",), (d,), attrs)
            elif kind.startswith("registers"):
                plan[name] = (("register", "channel"), (arch.registers, d), attrs)
            else:
                plan[name] = ((f"patch_{unit}", "channel"), (patches, d), attrs)
    query, key = attention_dims(view, unit)
    if request.maps != "none":
        plan[f"attention_{unit}"] = (("head", query, key), (arch.heads, tokens, tokens), {"block": arch.depth - 1})
        if request.maps == "all":
            plan[f"attention_blocks_{unit}"] = (("block", "head", query, key), (arch.depth, arch.heads, tokens, tokens), {})
    if request.stats:
        stats = {
            "entropy": (("block", "head", query), (arch.depth, arch.heads, tokens)),
            "distance": (("block", "head", f"patch_{unit}"), (arch.depth, arch.heads, patches)),
            "topk": (("block", "head", query, "topk"), (arch.depth, arch.heads, tokens, 3)),
        }
        if arch.class_token:
            stats["cls"] = (("block", "head", key), (arch.depth, arch.heads, tokens))
        if arch.registers:
            stats["storage"] = (("block", "head", "register", key), (arch.depth, arch.heads, arch.registers, tokens))
        for stat, (dims, shape) in stats.items():
            plan[f"attention_{stat}_{unit}"] = (dims, shape, {"dtype": STATS_DTYPE})
    return plan


def legacy_request(view: str, arch: Arch, attention: str) -> Request:
    """What a view stored before blocks and facets were chosen: its family's kinds at the last block,
    the maps where it reads attention, and (``--attention stats``) the statistics in any view."""
    reads = views.view(view).reads
    maps = attention if attention in ("last", "all") and "attention" in reads else "none"
    return Request(default_kinds(view, arch), None, maps, attention == "stats")


def view_facts(view: str, arch: Arch, patches: int, attention: str, resample: str, names: list[str] | None = None) -> dict[str, Any]:
    """The manifest's entry for one view (``per_view``): grid, filter, attention, arrays."""
    facts: dict[str, Any] = {"patch": arch.patch, "patches": patches, "geometry": geometry(view, resample)}
    spec = views.view(view)
    if not spec.fixed:
        facts.update(rows=None, cols=None, grid=f"per image, in grid_rows_{view} / grid_cols_{view}")
    else:
        rows, cols = images.fixed_grid(view, arch.patch)
        facts.update(rows=rows, cols=cols)
    facts["resample"] = resample if spec.family == "square" else own_size_resample(view) if not spec.fixed else "bilinear" if spec.family == "hbird" else "bicubic"
    facts["attention"] = attention if ("attention" in spec.reads or attention == "stats") else "none"
    if names is None:
        names = list(view_arrays(view, arch, patches, legacy_request(view, arch, attention)))
    facts["arrays"] = sorted(names)
    if spec.epoch is not None:
        facts["augmentation"] = hbird_views.ORDER
    return facts


def own_size_resample(view: str) -> str:
    """The filter an own-size view resamples with: LANCZOS resized (TokenCut's ``resize_pil``), none padded or cut."""
    return "lanczos" if own_size.rule(view) == own_size.RESIZE else "none"


def geometry(view: str, resample: str = "bicubic") -> str:
    spec = views.view(view)
    if view in GEOMETRY:
        return GEOMETRY[view].format(resample=resample)
    if spec.epoch is not None:
        return hbird_views.geometry_text(spec.size, spec.epoch)
    return FAMILY_GEOMETRY[spec.family].format(S=spec.size, R=spec.resize, resample=resample)
