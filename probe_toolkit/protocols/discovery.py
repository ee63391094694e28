"""Object discovery: ``decode`` (label-free masks by a normalized cut on the keys, with the
presets of TokenCut, MaskCut, LOST and DSM), ``score`` (COCO AP, CorLoc, saliency scores on a
panel) and ``decode-sweep`` (the best setting chosen on a val panel).

A decode's settings are what the user asks (``DecodeSettings``: a preset and the values that
override it, each None for the preset's); the decoder reads them resolved (``commands.decode.
resolve_settings``: options over the sweep's settings file over the preset's values), the one
form the analyses and every record take (``analyses.decoder_settings.Settings``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analyses.decoder_settings import TIES
from ..infra.settings import AtLeast, OneOf, SettingError, Settings, Within, setting
from ..labels.coco_metrics import SWEEP_METRICS
from ..store import views
from .registry import ALLOW_PARTIAL, CACHE, Command, Difference, Input, Option, Protocol, Reads, Reference, json_input, register

KEY_VIEWS = views.KEY_VIEWS
PRESET_NAMES = ("centred", "tokencut", "maskcut", "lost", "dsm")
VIEW_HELP = (
    "480 (default), native: each image at its own size, zero-padded to the patch (TokenCut's and LOST's main_*.py), native_crop: cut to whole "
    "patches (DSM's extract/extract.py), or native_resized: resized with LANCZOS to round(side/p) patches (TokenCut's "
    "unsupervised_saliency_detection/get_saliency.py)."
)
KEYS_HELP = (
    "plain: the keys before RoPE (every network's; the default, measured better for cuts on DINOv3); rope: a DINOv3 store's keys after RoPE, as its attention uses them."
)


def key_view(settings) -> None:
    """The view as the table spells it (``native-crop`` → ``native_crop``), and one with keys."""
    name = views.canonical(settings.view)
    if name not in KEY_VIEWS:
        raise SettingError("view", f"view {settings.view!r} holds no keys: the decoders cut {', '.join(KEY_VIEWS)}", "pick one of those views")
    object.__setattr__(settings, "view", name)


REFERENCES = (
    Reference(
        "Wang et al., Self-Supervised Transformers for Unsupervised Object Discovery using Normalized Cut (CVPR 2022)",
        "YangtaoWANG95/TokenCut main_tokencut.py, object_discovery.py",
    ),
    Reference("Wang et al., Cut and Learn for Unsupervised Object Detection and Instance Segmentation (CVPR 2023)", "facebookresearch/CutLER maskcut/maskcut.py"),
    Reference("Siméoni et al., Localizing Objects with Self-Supervised Transformers and no Labels (BMVC 2021)", "valeoai/LOST main_lost.py, object_discovery.py"),
    Reference("Melas-Kyriazi et al., Deep Spectral Methods (CVPR 2022)", "lukemelas/deep-spectral-segmentation extract/extract.py"),
)

DECODE_DIFFERENCES = (
    Difference(
        "eigenvectors are computed by scipy's eigsh (or torch's eigh) and certified; an image whose eigengap is too small is flagged degenerate",
        "the references take whichever vector their solver returns",
        "a degenerate image's mask is flagged, not decided by solver noise",
    ),
    Difference(
        "LOST ranks equal degrees as its torch.argsort does on the CPU (libstdc++'s introsort order, reproduced without torch; "
        "--ties lowest-index ranks them by patch index)",
        "LOST's own GPU runs (PyTorch 1.7.1) sorted ties in CUDA's order, which is not reproduced",
        "a LOST seed can differ from a GPU run's where degrees tie",
    ),
    Difference(
        "DINOv3's keys are cut before RoPE by default (keys: plain); keys: rope cuts those after it",
        "DINOv3 publishes no object discovery (facebookresearch/dinov3#213 asks for TokenCut); plain keys measured better for cuts "
        "(benchmarks/dinov3_keys.py, docs/checkpoints.md)",
        "a DINOv3 number with no published counterpart",
    ),
)


@dataclass(frozen=True)
class DecodeSettings(Settings):
    preset: str | None = setting(
        None,
        "centred (default: centred keys, TokenCut's graph), tokencut, maskcut, lost (valeoai/LOST) or dsm "
        "(deep-spectral-segmentation); without it, the sweep's settings file when there is one.",
        OneOf(PRESET_NAMES),
    )
    tau: float | None = setting(None, "Link patches whose key cosine is above τ (default: the preset's, 0.2; maskcut 0.15).", Within(-1.0, 1.0))
    eps: float | None = setting(None, "Weight of the other edges (default: the preset's, 1e-5).", Within(0.0, 1.0, "()"))
    masks: int | None = setting(None, "Masks per image: MaskCut's loop when > 1 (default: the preset's).", AtLeast(1))
    center: bool | None = setting(None, "Subtract each image's mean key (default: the preset's; centred: on).", cli="either")
    color_lambda: float | None = setting(None, "dsm: weight of DSM's KNN colour affinity (default: the preset's; off, as published).", AtLeast(0.0, integer=False))
    ties: str | None = setting(
        None, "lost: how equal degrees rank: argsort (the preset: as LOST's own torch.argsort orders them on the CPU) or lowest-index (by patch index).", OneOf(TIES)
    )
    view: str = setting("480", VIEW_HELP)
    refine: str | None = setting(None, "bilateral: TokenCut's bilateral-solver refinement before saliency scores (+ BS).", OneOf(("bilateral",)))
    settings_file: str | None = setting(None, "Settings file (default <cache>/decoder-settings.json from the sweep).", cli="path")
    keys: str = setting("plain", KEYS_HELP, OneOf(views.KEY_KINDS))

    def check(self) -> None:
        key_view(self)

    def overrides(self) -> dict:
        """The values given over the preset's (None: the preset's)."""
        return dict(tau=self.tau, eps=self.eps, masks=self.masks, center=self.center, color_lambda=self.color_lambda, ties=self.ties)


@dataclass(frozen=True)
class ScoreSettings(Settings):
    """Scoring has no free parameter: COCO's evaluator, class-agnostic, as TokenCut and LOST score."""


@dataclass(frozen=True)
class SweepSettings(Settings):
    grid: str | None = setting(None, "TOML grid (lists for preset, center, tau, eps, masks); default 148 settings.", cli="path")
    metric: str = setting("segm_AP", "Score that picks the best setting.", OneOf(SWEEP_METRICS))
    view: str = setting("480", VIEW_HELP)
    settings_out: str | None = setting(None, "Where to write the best settings (default <cache>/decoder-settings.json).", cli="path")
    keys: str = setting("plain", KEYS_HELP, OneOf(views.KEY_KINDS))

    def check(self) -> None:
        key_view(self)


register(
    Protocol(
        name="decode",
        summary="Label-free object masks by a normalized cut on the keys (TokenCut, MaskCut, LOST, DSM presets); scored when a panel is given.",
        settings=DecodeSettings,
        inputs=(
            Input("store", "A store with keys_480 (probe extract --views 480), or a checkpoint with --images.", "store", True),
            Input("panel", "Score on this registered panel (its labels are read through the ledger).", "panel", role="panel"),
            Input("out", "COCO results JSON (default <store>/results/decoder-masks.json).", "path"),
            json_input("Write a summary JSON here."),
            ALLOW_PARTIAL,
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(arrays=tuple(f"keys_{v}" for v in KEY_VIEWS), views=KEY_VIEWS, labels=True, panel_kinds=("coco", "voc", "coco20k", "saliency"), stores=("keys_480",)),
        results=("decoder", "scores_<panel>", "saliency_<panel>"),
        result="results.decode_report:DecodeReport",
        references=REFERENCES,
        differences=DECODE_DIFFERENCES,
        run="commands.decode:run",
        command=Command(
            help="Label-free object masks by a normalized cut on the keys; scored only if --panel is given.",
            options=(
                Option("size", "Old spelling of --view for a fixed view (--size 224: --view 224); refused beside another --view.", "int"),
                "view",
                # streaming (decode-stream): checkpoint + images → masks, keys kept in memory only
                Option("images", "Stream this folder through the checkpoint (STORE is then a checkpoint); only masks are written.", "path"),
                Option("batch_size", "With --images: images per forward pass (default: decode-stream's).", "int"),
                Option("chunk", "With --images: images per chunk, the unit of resume and sharding (default: decode-stream's).", "int"),
                "preset",
                "tau",
                "eps",
                "masks",
                "center",
                "settings_file",
                "out",
                "json_path",
                "refine",
                "color_lambda",
                "ties",
                "keys",
                "panel",
                "allow_partial",
                "unseal",
                "cache",
                "quiet",
                "PLACEMENT",
            ),
            table="results.tables:decode",
            progress=("images", "decode"),
            explicit=True,
        ),
        sections=("report.sections_decoder:decoder", "report.pictures:decoder_cuts", "report.sections_decoder:scores"),
    )
)
register(
    Protocol(
        name="decode-stream",
        summary="decode on a checkpoint and an image folder: keys kept in memory batch by batch, only masks written.",
        settings=DecodeSettings,
        inputs=(
            Input("checkpoint", "A checkpoint whose network streams the images.", "checkpoint", True),
            Input("images", "Stream this folder through the checkpoint; only masks are written.", "path", True),
            Input("batch_size", "Images per forward pass.", "int", default=16),
            Input("chunk", "Images per chunk (the unit of resume and sharding).", "int", default=16),
            Input("network", "teacher or student.", default="teacher"),
            Input("store", "The masks store (default: one per checkpoint, network and view under the cache).", "path"),
            Input("stop_after", "Process at most this many chunks now; the rest resumes on the next run.", "int"),
            json_input("Write a summary JSON here."),
            CACHE,
        ),
        reads=Reads(views=KEY_VIEWS, source="checkpoint"),
        results=("decoder",),
        result="results.stream_report:StreamReport",
        references=REFERENCES,
        differences=(*DECODE_DIFFERENCES, Difference("the keys are never written", "a stream holds one batch's keys at a time", "none")),
        run="commands.stream:run",
        placement=("workers", "dask_address", "shard", "backend", "device"),  # the cut runs on the workers, one BLAS thread each
    )
)
register(
    Protocol(
        name="score",
        summary="Score a masks file on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU, or saliency scores.",
        settings=ScoreSettings,
        inputs=(
            Input("masks_file", "COCO results JSON written by probe decode.", "masks", True),
            Input("panel", "Registered panel to score on.", "panel", True, "panel"),
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            json_input("Write the scores as JSON here."),
            CACHE,
            Input("allow_partial", "Score masks of only some of the panel's images (masks of none are refused either way).", "bool", default=False),
        ),
        reads=Reads(labels=True, panel_kinds=("coco", "voc", "coco20k", "saliency"), source="masks"),
        results=("scores_<panel>", "saliency_<panel>"),
        result="results.score_report:ScoreReport",
        references=REFERENCES[:1] + REFERENCES[2:3],
        differences=(
            Difference(
                "pycocotools' COCOeval with one category; CorLoc as LOST counts it (IoU ≥ 0.5 with any box)",
                "class-agnostic discovery, as TokenCut and LOST score it",
                "none",
            ),
        ),
        run="commands.decode_scores:run",
        command=Command(
            "Score masks on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU.",
            options=("panel", "allow_partial", "unseal", "json_path", "cache"),
            table="results.tables:score",
            explicit=True,
        ),
        placement=(),  # scoring reads a masks file and a panel in this process
    )
)
register(
    Protocol(
        name="decode-sweep",
        summary="Decode a grid of settings, read the val panel's labels once, and keep the best setting.",
        settings=SweepSettings,
        inputs=(
            Input("store", "A store with keys_480.", "store", True),
            Input("panel", "Validation panel to choose the settings on.", "panel", True, "panel"),
            json_input("Write the whole table as JSON here."),
            ALLOW_PARTIAL,
            Input("unseal", "Reason to open a sealed test panel (recorded in the ledger)."),
            CACHE,
        ),
        reads=Reads(arrays=tuple(f"keys_{v}" for v in KEY_VIEWS), views=KEY_VIEWS, labels=True, panel_kinds=("coco", "voc", "coco20k"), stores=("keys_480",)),
        results=("sweep_<panel>",),
        result="results.sweep_report:SweepReport",
        references=REFERENCES,
        differences=(
            Difference(
                "the sweep chooses the settings on a val panel only (a test panel is sealed)",
                "the published methods fix their settings by hand",
                "settings chosen on val, never on the scores they are judged by",
            ),
        ),
        run="commands.decode_sweep:run",
        command=Command(
            "Decode a grid of settings, read the panel's labels once, and keep the best setting.",
            options=(
                "panel",
                "grid",
                "metric",
                "settings_out",
                "view",
                "keys",
                Option("top", "Rows of the table to print (best first).", "int", 20),
                "json_path",
                "allow_partial",
                "unseal",
                "cache",
                "quiet",
                "PLACEMENT",
            ),
            table="results.tables:sweep",
            progress=("images", "sweep"),
            explicit=True,
        ),
    )
)
