"""Object discovery: ``decode`` (label-free masks by a normalized cut on the keys, with the
presets of TokenCut, MaskCut, LOST and DSM), ``score`` (COCO AP, CorLoc, saliency scores on a
panel) and ``decode-sweep`` (the best setting chosen on a val panel)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses.decoder_settings import TIES
from ..infra.settings import SettingError, Settings, at_least, one_of, within
from ..store import views
from .registry import Command, Option, Protocol, Reads, Reference, on_panel, register, written_to

KEY_VIEWS = tuple(v.name for v in views.TABLE if any(a.startswith("keys_") for a in v.arrays))  # the views whose keys the decoders cut


def key_view(settings) -> None:
    """The view as the table spells it (``native-crop`` → ``native_crop``), and one with keys."""
    name = views.canonical(settings.view)
    if name not in KEY_VIEWS:
        raise SettingError("view", f"view {settings.view!r} holds no keys: the decoders cut {', '.join(KEY_VIEWS)}", "pick one of those views")
    object.__setattr__(settings, "view", name)
PRESET_NAMES = ("centred", "tokencut", "maskcut", "lost", "dsm")

# options decode and decode-sweep share (their commands are explicit: cli/discovery.py)
VIEW = Option("view", "480 (default), native: each image at its own size, zero-padded to the patch (TokenCut's and LOST's main_*.py), native_crop: cut to whole "
                      "patches (DSM's extract/extract.py), or native_resized: resized with LANCZOS to round(side/p) patches (TokenCut's "
                      "unsupervised_saliency_detection/get_saliency.py).")
KEYS = Option("keys", "plain: the keys before RoPE (every network's; the default, measured better for cuts on DINOv3); rope: a DINOv3 store's keys after RoPE, "
                      "as its attention uses them.", default="plain")

REFERENCES = (
    Reference("Wang et al., Self-Supervised Transformers for Unsupervised Object Discovery using Normalized Cut (CVPR 2022)",
              "YangtaoWANG95/TokenCut main_tokencut.py, object_discovery.py"),
    Reference("Wang et al., Cut and Learn for Unsupervised Object Detection and Instance Segmentation (CVPR 2023)", "facebookresearch/CutLER maskcut/maskcut.py"),
    Reference("Siméoni et al., Localizing Objects with Self-Supervised Transformers and no Labels (BMVC 2021)", "valeoai/LOST main_lost.py, object_discovery.py"),
    Reference("Melas-Kyriazi et al., Deep Spectral Methods (CVPR 2022)", "lukemelas/deep-spectral-segmentation extract/extract.py"),
)


@dataclass(frozen=True)
class DecodeSettings(Settings):
    preset: str | None = None  # None: the sweep's settings file when there is one, else centred
    tau: float | None = None
    eps: float | None = None
    masks: int | None = None
    center: bool | None = None
    color_lambda: float | None = None
    ties: str | None = None  # lost: how equal degrees rank (analyses/lost.py TIES); None: the preset's (argsort, LOST's order)
    view: str = "480"
    refine: str | None = None  # bilateral: TokenCut's bilateral solver before saliency scores
    settings_file: str | None = None
    keys: str = "plain"  # DINOv3: plain (before RoPE, measured better for cuts) or rope (after RoPE, as its attention uses them); store.views.KEY_KINDS

    def check(self) -> None:
        if self.preset is not None:
            one_of("preset", self.preset, PRESET_NAMES)
        if self.tau is not None:
            within("tau", self.tau, -1.0, 1.0)
        if self.eps is not None:
            within("eps", self.eps, 0.0, 1.0, closed="()")
        if self.masks is not None:
            at_least("masks", self.masks, 1)
        if self.color_lambda is not None:
            at_least("color_lambda", self.color_lambda, 0.0)
        if self.ties is not None:
            one_of("ties", self.ties, TIES)
        key_view(self)
        one_of("keys", self.keys, views.KEY_KINDS)
        if self.refine is not None:
            one_of("refine", self.refine, ("bilateral",))


def _decoder_settings(settings: DecodeSettings, cache_dir):
    from ..commands.decode import resolve_settings

    overrides = dict(tau=settings.tau, eps=settings.eps, masks=settings.masks, center=settings.center, color_lambda=settings.color_lambda,
                     ties=settings.ties)
    return resolve_settings(preset=settings.preset, overrides=overrides, settings_file=settings.settings_file, cache_dir=cache_dir)


def decode(settings: DecodeSettings, placement, *, store, panel=None, unseal=None, out=None, cache_dir=None, on_start=None, **_):
    from ..commands.decode import run_decode

    chosen, source = _decoder_settings(settings, cache_dir)
    size = int(settings.view) if settings.view == "480" else settings.view
    report = run_decode(store, chosen, settings_source=source, size=size, out=out, panel=panel, unseal=unseal, cache_dir=cache_dir,
                        on_start=on_start, refine=settings.refine, placement=placement, keys=settings.keys)
    report.extra.setdefault("settings_source", source)
    return report


def stream(settings: DecodeSettings, placement, *, checkpoint, images, batch_size=16, chunk=16, cache_dir=None, on_start=None, **_):
    """``decode CKPT --images DIR``: keys kept in memory batch by batch, only masks written."""
    from ..commands.stream import run_stream

    chosen, source = _decoder_settings(settings, cache_dir)
    size = int(settings.view) if settings.view == "480" else settings.view
    report = run_stream(checkpoint, images, chosen, size=size, batch_size=batch_size, chunk=chunk, cache_dir=cache_dir, settings_source=source,
                        on_start=on_start, placement=placement, keys=settings.keys)
    report.chosen = chosen
    return report


@dataclass(frozen=True)
class ScoreSettings(Settings):
    """Scoring has no free parameter: COCO's evaluator, class-agnostic, as TokenCut and LOST score."""


def score(settings: ScoreSettings, placement, *, masks_file, panel, unseal=None, cache_dir=None, allow_partial=False, **_):
    from ..commands.decode_scores import run_score

    return run_score(masks_file, panel, unseal=unseal, cache_dir=cache_dir, allow_partial=allow_partial)


@dataclass(frozen=True)
class SweepSettings(Settings):
    grid: str | None = None  # TOML grid; default 148 settings
    metric: str = "segm_AP"
    view: str = "480"
    settings_out: str | None = None
    keys: str = "plain"

    def check(self) -> None:
        key_view(self)
        one_of("keys", self.keys, views.KEY_KINDS)


def sweep(settings: SweepSettings, placement, *, store, panel, unseal=None, cache_dir=None, on_start=None, **_):
    from ..commands.decode_sweep import run_sweep

    size = int(settings.view) if settings.view == "480" else settings.view
    return run_sweep(store, panel, grid=settings.grid, metric=settings.metric, settings_out=settings.settings_out, unseal=unseal, cache_dir=cache_dir,
                     on_start=on_start, size=size, placement=placement, keys=settings.keys)


register(Protocol(
    name="decode",
    summary="Label-free object masks by a normalized cut on the keys (TokenCut, MaskCut, LOST, DSM presets); scored when a panel is given.",
    settings=DecodeSettings,
    reads=Reads(arrays=tuple(f"keys_{v}" for v in KEY_VIEWS), views=KEY_VIEWS, labels=True, panel_kinds=("coco", "voc", "coco20k", "saliency"),
                stores=("keys_480",)),
    results=("decoder", "scores_<panel>", "saliency_<panel>"),
    references=REFERENCES,
    differences="Every preset reproduces its repository's masks on the same keys; eigenvectors are computed by scipy's eigsh (or torch's eigh) and certified, "
                "and an image whose eigengap is too small is flagged degenerate rather than decided by solver noise. "
                "LOST ranks equal degrees as its torch.argsort does on the CPU (libstdc++'s introsort order, reproduced without torch; "
                "--ties lowest-index ranks them by patch index); LOST's own GPU runs (PyTorch 1.7.1) sorted ties in CUDA's order, not reproduced. "
                "DINOv3 (no published object discovery; facebookresearch/dinov3#213 asks for TokenCut): its keys before RoPE by default "
                "(keys: plain), measured better for cuts than those after RoPE (keys: rope; benchmarks/dinov3_keys.py, docs/checkpoints.md).",
    execute=decode,
    command=Command(
        help="Label-free object masks by a normalized cut on the keys; scored only if --panel is given.",
        source="A store with keys_480 (probe extract --views 480), or a checkpoint with --images.",
        options=(
            Option("size", "Fixed view whose keys to cut (keys_<size>); --view overrides it.", "int", 480),
            VIEW,
            # streaming (decode-stream): checkpoint + images → masks, keys kept in memory only
            Option("images", "Stream this folder through the checkpoint (STORE is then a checkpoint); only masks are written.", "path"),
            Option("batch_size", "With --images: images per forward pass.", "int", 16),
            Option("chunk", "With --images: images per chunk (the unit of resume and sharding).", "int", 16),
            Option("preset", "centred (default: centred keys, TokenCut's graph), tokencut, maskcut, lost (valeoai/LOST) or dsm (deep-spectral-segmentation)."),
            Option("tau", "Link patches whose key cosine is above τ (preset: 0.2; maskcut 0.15).", "float"),
            Option("eps", "Weight of the other edges (1e-5).", "float"),
            Option("masks", "Masks per image: MaskCut's loop when > 1.", "int"),
            Option("center", "Subtract each image's mean key (centred preset: on).", "either"),
            Option("settings_file", "Settings file (default <cache>/decoder-settings.json from the sweep).", "path"),
            Option("out", "COCO results JSON (default <store>/results/decoder-masks.json).", "path"),
            written_to("Write a summary JSON here."),
            Option("refine", "bilateral: TokenCut's bilateral-solver refinement before saliency scores (+ BS)."),
            Option("color_lambda", "dsm: weight of DSM's KNN colour affinity (0, off, as published).", "float"),
            Option("ties", "lost: how equal degrees rank: argsort (the preset: as LOST's own torch.argsort orders them on the CPU) or "
                           "lowest-index (by patch index)."),
            KEYS, "panel", "allow_partial", "unseal", "cache", "quiet", "PLACEMENT"),
        table="results.tables:decode",
        explicit=True),
    sections=("report.sections_decoder:decoder", "report.pictures:decoder_cuts", "report.sections_decoder:scores"),
))
register(Protocol(
    name="decode-stream",
    summary="decode on a checkpoint and an image folder: keys kept in memory batch by batch, only masks written.",
    settings=DecodeSettings,
    reads=Reads(views=KEY_VIEWS, source="checkpoint"),
    results=("decoder",),
    references=REFERENCES,
    differences="As decode; the keys are never written.",
    execute=stream,
    source="checkpoint",
    placement=("workers", "dask_address", "shard", "backend", "device"),  # the cut runs on the workers, one BLAS thread each
))
register(Protocol(
    name="score",
    summary="Score a masks file on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU, or saliency scores.",
    settings=ScoreSettings,
    reads=Reads(labels=True, panel_kinds=("coco", "voc", "coco20k", "saliency"), source="masks"),
    results=("scores_<panel>", "saliency_<panel>"),
    references=REFERENCES[:1] + REFERENCES[2:3],
    differences="pycocotools' COCOeval with one category; CorLoc as LOST counts it (IoU ≥ 0.5 with any box).",
    execute=score,
    source="masks_file",
    command=on_panel("Score masks on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU.", "COCO results JSON written by probe decode.",
                     "Registered panel to score on.", "allow_partial", "unseal", written_to("Write the scores as JSON here."), "cache",
                     table="results.tables:score", explicit=True),
    placement=(),  # scoring reads a masks file and a panel in this process
))
register(Protocol(
    name="decode-sweep",
    summary="Decode a grid of settings, read the val panel's labels once, and keep the best setting.",
    settings=SweepSettings,
    reads=Reads(arrays=tuple(f"keys_{v}" for v in KEY_VIEWS), views=KEY_VIEWS, labels=True, panel_kinds=("coco", "voc", "coco20k"), stores=("keys_480",)),
    results=("sweep_<panel>",),
    references=REFERENCES,
    differences="The published methods fix their settings by hand; the sweep chooses them on a val panel only (a test panel is sealed).",
    execute=sweep,
    command=on_panel(
        "Decode a grid of settings, read the panel's labels once, and keep the best setting.",
        "A store with keys_480.",
        "Validation panel to choose the settings on.",
        Option("grid", "TOML grid (lists for preset, center, tau, eps, masks); default 148 settings.", "path"),
        Option("metric", "Score that picks the best setting.", default="segm_AP"),
        Option("settings_out", "Where to write the best settings (default <cache>/decoder-settings.json).", "path"),
        VIEW, KEYS,
        Option("top", "Rows of the table to print (best first).", "int", 20),
        written_to("Write the whole table as JSON here."),
        "allow_partial", "unseal", "cache", "quiet", "PLACEMENT",
        table="results.tables:sweep", explicit=True),
))
