"""What ``probe extract`` will write, decided before any image is read: its settings, each view's
arrays and shapes (the plan), the manifest, and each image's grid in the own-size views (from its
file header)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..infra import provenance
from ..infra.errors import ProbeError
from . import arrays, cache, grids, images, layout, own_size, parts, views
from .architectures import RULES, Arch, AttentionMode, Interpolation, resolve_interpolation
from .group import open_read

if TYPE_CHECKING:  # checkpoints imports torch: `probe extract` refuses bad options before it is imported
    from .checkpoints import Checkpoint

OnError = Literal["fail", "skip"]
RESAMPLES = tuple(images.RESAMPLE)
# Most images per zarr chunk. A chunk is the unit of writing and resume: a run's arrays are
# assembled and written whole per chunk, so one chunk's arrays are held in memory at once. At
# ViT-S/16 with the default views (tokens 224, attention 224, keys 480 in float16) an image
# takes about 1.3 MB, so 1024 images are about 1.3 GB (ViT-B, or --attention all: several GB);
# beyond that a chunk no longer fits a laptop, and resume granularity is lost for nothing.
MAX_CHUNK = 1024


def at_least(option: str, value: int | None, minimum: int, example: str) -> None:
    """Numeric options are checked where they enter: one line naming the option."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ProbeError(None, f"{option} {value!r} must be a whole number of at least {minimum}", f"use e.g. {option} {example}")


BLOCKS_FIX = "use e.g. --blocks 3,7,11 (0-based, as get_intermediate_layers counts), last4, all or last"


@dataclass(frozen=True)
class Settings:
    """Everything that decides a store's contents (recorded in its manifest).

    ``views``: view names (``224``, ``square@1024``, ``native``: ``store.views``); ``resample``: the
    square views' filter. ``blocks``: ``last`` (the default: today's stores), ``all``, ``last<N>``
    (``get_intermediate_layers(n=N)``) or 0-based indices (``(3, 7, 11)`` or ``"3,7,11"``);
    ``facets``: of ``store.layout.FACETS`` (None: what each view's family reads); ``attention``:
    explicit maps (``last``, ``all``) where a view reads attention, ``stats`` in every view, or
    ``none``. ``wanted``: the arrays a plan asks (``store.plan``, ``probe extract --for``), at the
    last block's names; they replace the views' defaults.
    """

    views: tuple[int | str, ...] = (224, 480)
    attention: AttentionMode = "last"
    dtype: str = "float16"
    chunk: int = 16
    interpolation: Interpolation = "auto"  # the checkpoint's own rule (architectures.resolve_interpolation)
    resample: str = "bicubic"
    blocks: str | tuple[int, ...] = "last"
    facets: tuple[str, ...] | None = None
    wanted: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.views and not self.wanted:
            raise ProbeError(None, "--views is empty", "use e.g. --views 224,480")
        for view in self.views:
            images.view_name(view)
        if self.attention not in ATTENTION:
            raise ProbeError(None, f"--attention {self.attention!r} is not one of {', '.join(ATTENTION)}", "use --attention last (or stats: no T x T map)")
        if self.dtype not in ("float16", "float32"):
            raise ProbeError(None, f"--dtype {self.dtype} is not float16 or float32", "use --dtype float16")
        at_least("--chunk", self.chunk, 1, "16")
        if self.chunk > MAX_CHUNK:  # refused here, before a store is created or an array allocated
            raise ProbeError(
                None,
                f"--chunk {self.chunk} is more than {MAX_CHUNK} images per chunk (a chunk's arrays are held in memory "
                f"whole while written: about 1.3 MB per image at ViT-S/16)",
                "use e.g. --chunk 16 (the default)",
            )
        if self.resample not in RESAMPLES:
            raise ProbeError(None, f"--resample {self.resample!r} is not one of {', '.join(RESAMPLES)}", "use --resample lanczos (MaskCut's filter) or bicubic")
        block_spec(self.blocks)
        for facet in self.facets or ():
            if facet not in layout.FACETS:
                raise ProbeError(None, f"--facets {facet} is not one of {', '.join(layout.FACETS)}", "use e.g. --facets tokens,normed,k")
        if self.facets is not None and not self.facets:
            raise ProbeError(None, "--facets is empty", "use e.g. --facets tokens,normed,k")

    @property
    def names(self) -> list[str]:
        """The canonical view names, in a fixed order."""
        given = {images.view_name(v) for v in self.views} | {layout.view_of(a) for a in self.wanted}
        return sorted(given, key=views.order)

    def requests(self, arch: Arch) -> dict[str, arrays.Request]:
        """What each view stores for a network of ``arch`` (its blocks and facets checked against it)."""
        blocks = resolve_blocks(self.blocks, arch.depth)
        if self.facets and "normed" in self.facets and not arch.final_norm:
            raise ProbeError(
                None, "--facets normed: the network has no final norm (SelfPatch-style), so normed tokens would be the tokens again", "drop normed from --facets"
            )
        out = {}
        for view in self.names:
            if self.wanted:
                mine = [layout.parse(a) for a in self.wanted if layout.view_of(a) == view]
                # a class token's array asked of a network without one: its patch tokens (whose mean is then the feature)
                asked = [a.kind if arch.class_token or not a.kind.startswith("cls_") else a.kind[len("cls_") :] for a in mine]
                kinds = tuple(
                    dict.fromkeys(
                        k
                        for k in asked
                        if not k.startswith("attention") and (arch.registers or not k.startswith("registers")) and (arch.family == "dinov3" or not k.endswith("_rope"))
                    )
                )
                if "normed" in kinds and not arch.final_norm:
                    kinds = tuple(dict.fromkeys("tokens" if k == "normed" else k for k in kinds))  # no final norm: the tokens are what it reads
                maps = "all" if any(a.kind == "attention_blocks" for a in mine) else "last" if any(a.kind == "attention" for a in mine) else "none"
                stats = any(a.kind.startswith("attention_") and a.kind != "attention_blocks" for a in mine) or self.attention == "stats"
                out[view] = arrays.Request(kinds, blocks, maps, stats)
                continue
            legacy = arrays.legacy_request(view, arch, self.attention)
            kinds = legacy.kinds if self.facets is None else arrays.default_kinds(view, arch, self.facets)
            out[view] = arrays.Request(kinds, blocks, legacy.maps, legacy.stats)
        return out


ATTENTION = ("last", "all", "none", "stats")


def block_spec(blocks: str | tuple[int, ...]) -> str | tuple[int, ...]:
    """``--blocks`` read before the network is known: ``last``, ``all``, ``last<N>`` or 0-based indices."""
    if isinstance(blocks, (tuple, list)):
        values = tuple(blocks)
    else:
        text = str(blocks).strip().lower()
        if text in ("last", "all") or (text.startswith("last") and text[4:].isdigit() and int(text[4:]) >= 1):
            return text
        try:
            values = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise ProbeError(None, f"--blocks {blocks!r} is not last, all, last<N> or 0-based block indices", BLOCKS_FIX) from None
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in values) or len(set(values)) != len(values):
        raise ProbeError(None, f"--blocks {blocks!r} is not last, all, last<N> or distinct 0-based block indices", BLOCKS_FIX)
    return tuple(sorted(int(v) for v in values))


def resolve_blocks(blocks: str | tuple[int, ...], depth: int) -> tuple[int, ...] | None:
    """The 0-based blocks ``blocks`` names in a network of ``depth`` blocks; None for the last block alone (the names every store has)."""
    spec = block_spec(blocks)
    if spec == "last":
        return None
    if spec == "all":
        chosen = tuple(range(depth))
    elif isinstance(spec, str):
        n = int(spec[4:])
        if n > depth:
            raise ProbeError(None, f"--blocks {spec}: the network has {depth} blocks", f"use --blocks last{depth} (or all)")
        chosen = tuple(range(depth - n, depth))
    else:
        chosen = spec
        if chosen[-1] >= depth:
            held = [str(b) for b in chosen if b < depth]
            example = ",".join(held) if held else str(depth - 1)
            raise ProbeError(
                None,
                f"--blocks {','.join(map(str, chosen))}: the network has {depth} blocks, 0..{depth - 1}",
                f"use e.g. --blocks {example} (0-based, as get_intermediate_layers counts), last{min(4, depth)}, all or last",
            )
    return None if chosen == (depth - 1,) else chosen


def patch_counts(arch: Arch, settings: Settings, own_patches: dict[str, int] | None = None) -> dict[str, int]:
    """Each view's patch dimension: rows x cols of a fixed view, the set's largest grid for an
    own-size view (``own_patches``: view -> that grid's patch count)."""
    out = {}
    for view in settings.names:
        if view in images.OWN_SIZE:
            out[view] = max(int((own_patches or {}).get(view, 0)), 1)
        else:
            rows, cols = images.fixed_grid(view, arch.patch)
            out[view] = rows * cols
    return out


def plan_arrays(arch: Arch, settings: Settings, own_patches: dict[str, int] | None = None) -> dict[str, arrays.Spec]:
    """Array names, dimension names, shapes (after ``image``) and attributes for these settings.

    Patch dimensions carry their view (``patch_224``, ``patch_480``, ``patch_native``, ...) because one
    xarray Dataset cannot hold two sizes of one dimension; ``cache.require`` hands arrays out
    with the plain name ``patch``.
    """
    plan: dict[str, arrays.Spec] = {}
    requests = settings.requests(arch)
    for view, patches in patch_counts(arch, settings, own_patches).items():
        plan.update(arrays.view_arrays(view, arch, patches, requests[view]))
    return plan


def build_manifest(checkpoint: Checkpoint, settings: Settings, refs: list[images.ImageRef], source: str, own_patches: dict[str, int] | None = None) -> dict:
    arch = checkpoint.arch
    counts = patch_counts(arch, settings, own_patches)
    plan = plan_arrays(arch, settings, own_patches)
    dinov3 = arch.family == "dinov3"
    norm = parts.record_final_norm(checkpoint.backbone, eps=1e-5 if dinov3 else parts.EPS)
    return {
        "kind": "probe-store",
        **provenance.stamp(),
        "checkpoint": checkpoint.describe(),
        "network": checkpoint.network,
        "arch": arch.as_dict(),
        "views": [images.manifest_view(v) for v in settings.names],
        "per_view": {v: view_facts(v, arch, counts[v], settings, plan) for v in settings.names},
        "interpolation": resolve_interpolation(settings.interpolation, arch),
        "interpolation_rule": RULES[resolve_interpolation(settings.interpolation, arch)],
        "attention": settings.attention if "224" in settings.names else "none",  # the 224 view's maps
        "attention_has_cls": arch.class_token,
        "attention_prefix": arch.prefix,  # tokens before the patches: class, then registers
        "registers": arch.registers,
        "dtype": settings.dtype,
        "chunk": settings.chunk,
        "image_source": source,
        "image_list_sha256": provenance.list_hash([r.id for r in refs]),
        "n_images": len(refs),
        "readout": {
            "tokens": "last block output, before any final norm; class token in cls_* arrays",
            "keys": "last block k = W_k LN1(z) + b_k, heads concatenated in head order",
            "attention": "last block softmax(q k^T / sqrt(head_dim)) per head, explicit, over every token (class, registers, patches)",
            "registers": "DINOv2 register tokens' last block output, in registers_* arrays, never among the patches",
            "layernorm_eps": 1e-5 if dinov3 else 1e-6,
            "gelu": "exact (erf)",
            **(
                {
                    "dinov3": "timm Eva (vit_*_patch16_dinov3): registers are the 4 storage tokens; keys_<view> before RoPE and "
                    "keys_rope_<view> after it (patch tokens; the class key is not rotated), the key bias masked to zero (bias_mask); attention over class, "
                    "storage and patch tokens after RoPE "
                    "(base 100, per-axis coordinates, patch tokens only), recomputed explicitly beside the fused kernel",
                    "native_views": "every view: RoPE is computed per grid, no position table is interpolated",
                }
                if dinov3
                else {}
            ),
        },
        "view_geometry": {
            **{v: arrays.geometry(v, settings.resample) for v in settings.names},
            "normalisation": "ImageNet mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)",
            "patch_grid": f"view side // {checkpoint.arch.patch}; pixels beyond the last whole patch unused",
        },
        **({"final_norm": norm} if norm is not None else {}),  # for DINO's k-NN feature, without the checkpoint (store.parts)
    }


def view_facts(view: str, arch: Arch, patches: int, settings: Settings, plan: dict[str, arrays.Spec]) -> dict:
    """The manifest's entry for one view: ``arrays.view_facts`` and the blocks and facets it holds."""
    request = settings.requests(arch)[view]
    facts = arrays.view_facts(view, arch, patches, settings.attention, settings.resample, [n for n in plan if layout.view_of(n) == view])
    if request.blocks is not None:
        facts["blocks"] = list(request.blocks)
    if settings.facets is not None or settings.wanted:
        facts["kinds"] = list(request.kinds)
    return facts


def kept_layout(path: Path, plan: dict) -> dict:
    """A view written before it held its register tokens (``registers_480`` came later) resumes
    without them: its finished images have none, so the store keeps the layout it was made with."""
    if not (path / "zarr.json").is_file():
        return plan
    group = open_read(path)
    present = set(cache.array_names(group))

    def started(view: str) -> bool:
        flag = f"done_{view}" if f"done_{view}" in present else "done"
        held = any(grids.view_of(a) == view for a in present if a not in cache.FLAGS and not a.startswith(cache.PER_VIEW))
        return held and bool(np.asarray(group[flag][:]).any())

    later = ("registers_", "keys_rope_")  # arrays added to a view's layout after stores were made with it
    return {name: spec for name, spec in plan.items() if not (name.startswith(later) and name not in present and started(grids.view_of(name)))}


def skippable(error: ProbeError) -> ProbeError:
    """An image's error as ``probe extract`` tells it: its fix, or ``--on-error skip`` (only extract
    has that flag; the image readers' own fixes do not name it, since segment and propagate read images too)."""
    if "--on-error" in error.fix:
        return error
    skip = "record it as failed with --on-error skip"
    return type(error)(error.where or None, error.problem, f"{error.fix}, or {skip}" if error.fix else skip)


def native_grids(refs: list[images.ImageRef], patch: int, on_error: OnError, views: tuple[str, ...] = (images.NATIVE,)) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each image's grid in each own-size view of ``views``, from its file header read once (0 x 0
    where it cannot have one, with skip)."""
    out = {v: (np.zeros(len(refs), dtype=np.int32), np.zeros(len(refs), dtype=np.int32)) for v in views}
    for i, ref in enumerate(refs):
        try:
            width, height = images.header_size(ref.path)
        except ProbeError as error:
            if on_error == "fail":
                raise skippable(error) from None
            continue
        for view, (rows, cols) in out.items():
            try:
                rows[i], cols[i] = own_grid(ref, width, height, patch, view)
            except ProbeError:
                if on_error == "fail":
                    raise
    return out


def own_grid(ref: images.ImageRef, width: int, height: int, patch: int, view: str) -> tuple[int, int]:
    """The image's grid in an own-size view. One smaller than a patch on a side is its file's
    error when cut (nothing of it is left) or padded (the native view has always refused it);
    resized, it becomes one patch on that side (``own_size.needs_whole_patch``)."""
    if own_size.needs_whole_patch(view) and (width < patch or height < patch):
        raise ProbeError(
            ref.path,
            f"is {width}x{height} px, smaller than one {patch}-px patch, so its {view} view has no patch",
            "remove it, or record it as failed with --on-error skip",
        )
    return images.native_grid(width, height, patch, view)
