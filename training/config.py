"""A run's settings: TOML in, ``--set section.key=value`` on top, one resolved copy saved with the run.

The loss, heads, augmentations, schedules' shapes, clipping and EMA are those of SelfPatch's released
code (alinlab/SelfPatch ``main_selfpatch.py``, Yun et al., CVPR 2022) and DINO's (facebookresearch/dino
``main_dino.py``); the run's scale is set to continue a released network (separate backbone and head
learning rates without the batch/256 scaling, 20 epochs, batch 256, bf16, a checkpoint every 5
epochs), not to reproduce their from-scratch runs. Each config in ``training/configs/`` states only
what differs.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from probe_toolkit.infra.errors import ProbeError

CONFIGS = Path(__file__).parent / "configs"
RULES = ("selfpatch", "threshold", "contrastive", "none")
THETA_MODES = ("batch-median", "crop-quantile")


@dataclass
class RunCfg:
    name: str = "run"
    out: str = "runs/run"  # the run folder: config, manifest, log, checkpoints
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16
    threads: int = 0  # torch CPU threads during the run; 0 leaves torch's setting


@dataclass
class DataCfg:
    images: str = ""  # a folder of images; nothing else in it is read
    local_crops: int = 8  # SelfPatch: 2 global + 8 local
    global_scale: list[float] = field(default_factory=lambda: [0.25, 1.0])  # SelfPatch (DINO: 0.4-1)
    local_scale: list[float] = field(default_factory=lambda: [0.05, 0.25])  # SelfPatch (DINO: 0.05-0.4)
    global_size: int = 224
    local_size: int = 96
    num_workers: int = 0


@dataclass
class InitCfg:
    checkpoint: str = ""  # "" = random init (trunc-normal 0.02); else a DINO / SelfPatch / probe-training file
    network: str = "teacher"  # which network of a full checkpoint starts both student and teacher
    heads: bool = True  # load ca/c/p heads when the file has them (SelfPatch full, probe-training)


@dataclass
class ModelCfg:
    # the backbone's shape when initialised at random; a checkpoint brings its own
    width: int = 384
    depth: int = 12
    heads: int = 6
    patch: int = 16
    mlp_hidden: int = 1536
    # heads after the backbone (SelfPatch: out_dim 65536, out_dim_selfpatch 4096, DINOHead 2048/256)
    image_prototypes: int = 65536
    patch_prototypes: int = 4096
    head_hidden: int = 2048
    bottleneck: int = 256
    aggregation_blocks: int = 2
    drop_path: float = 0.1  # student backbone only; SelfPatch hard-codes 0.1
    norm_last_layer: bool = True  # prototype lengths g fixed at 1 (SelfPatch's default)


@dataclass
class RuleCfg:
    name: str = "selfpatch"  # selfpatch | threshold | contrastive | none (image loss only: DINO)
    weight: float = 0.1  # λ in L = L_global + λ·L_patch (SelfPatch 0.1) or λ·L_con
    k: int = 4  # positives per anchor (SelfPatch k_num; contrastive top k)
    wrap: bool = True  # SelfPatch's window wraps around the grid (modulo indexing)
    theta_mode: str = "batch-median"  # threshold rule: batch-median | crop-quantile
    quantile: float = 0.5  # threshold rule, crop-quantile mode
    negative_quantile: float = 0.2  # contrastive: negatives at or below the crop's 20th percentile
    max_negatives: int = 48
    temperature: float = 0.2  # contrastive InfoNCE temperature


@dataclass
class LossCfg:
    teacher_temp: float = 0.04  # after the warm-up (DINO's and SelfPatch's default 0.04, constant)
    warmup_teacher_temp: float = 0.04  # the first epoch's; linear to teacher_temp over the warm-up epochs
    warmup_teacher_temp_epochs: int = 0  # DINO's default 0 (its ViT-S/16 recipe: 0.04 -> 0.07 over 30)
    student_temp: float = 0.1
    center_momentum: float = 0.9


@dataclass
class OptimCfg:
    batch_size: int = 256  # images per optimiser step, over all processes
    micro_batch: int = 32  # images per forward; accumulation = batch / (micro × processes)
    epochs: int = 20
    warmup_epochs: int = 10
    lr_backbone: float = 1e-5  # backbone peak 1e-5, heads 1e-4 (continuing a released network)
    lr_heads: float = 1e-4
    min_lr: float = 1e-6
    weight_decay: float = 0.04  # DINO/SelfPatch: cosine 0.04 -> 0.4 on weights, 0 on biases and norms
    weight_decay_end: float = 0.4
    clip_grad: float = 3.0  # per tensor, as DINO's clip_gradients
    freeze_last_layer: int = 1  # epochs with the prototype layers held fixed
    momentum_teacher: float = 0.996  # EMA, cosine to 1 over the run


@dataclass
class SaveCfg:
    every: int = 5  # epochs between checkpoints; the last epoch is always saved
    keep: bool = True  # also keep checkpoint{epoch:04}.pth beside the latest checkpoint.pth


@dataclass
class Config:
    run: RunCfg = field(default_factory=RunCfg)
    data: DataCfg = field(default_factory=DataCfg)
    init: InitCfg = field(default_factory=InitCfg)
    model: ModelCfg = field(default_factory=ModelCfg)
    rule: RuleCfg = field(default_factory=RuleCfg)
    loss: LossCfg = field(default_factory=LossCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    save: SaveCfg = field(default_factory=SaveCfg)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)


def _coerce(where: str, value: Any, kind: Any) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, Path):
            return str(value)
    elif getattr(kind, "__origin__", None) is list:
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            return [float(v) for v in value]
    raise ProbeError(where, f"value {value!r} is not a {getattr(kind, '__name__', kind)}", "fix the config or the --set value")


def from_dict(data: dict[str, Any], source: str = "config") -> Config:
    """Build a Config; unknown sections or keys are an error that names them."""
    config = Config()
    for section, values in data.items():
        if section not in {f.name for f in fields(Config)}:
            raise ProbeError(source, f"unknown section [{section}]", f"sections are {[f.name for f in fields(Config)]}")
        if not isinstance(values, dict):
            raise ProbeError(source, f"[{section}] is not a table", "write it as a TOML table")
        target = getattr(config, section)
        hints = get_type_hints(type(target))
        for key, value in values.items():
            if key not in hints:
                raise ProbeError(source, f"unknown key {section}.{key}", f"keys of [{section}] are {sorted(hints)}")
            setattr(target, key, _coerce(f"{source}: {section}.{key}", value, hints[key]))
    validate(config, source)
    return config


def _known(section: str, key: str, where: str) -> None:
    """An override's section and key are the config's, or one line naming the override."""
    sections = {f.name: f for f in fields(Config)}
    if section not in sections:
        raise ProbeError(where, f"{section}.{key}: unknown section [{section}]", f"sections are {sorted(sections)}")
    hints = get_type_hints(type(getattr(Config(), section)))
    if key not in hints:
        raise ProbeError(where, f"unknown key {section}.{key}", f"keys of [{section}] are {sorted(hints)}")


def validate(config: Config, source: str = "config") -> None:
    if config.rule.name not in RULES:
        raise ProbeError(source, f"rule.name {config.rule.name!r} is not one of {RULES}", f"pick one of {', '.join(RULES)}")
    if config.rule.theta_mode not in THETA_MODES:
        raise ProbeError(source, f"rule.theta_mode {config.rule.theta_mode!r} is not one of {THETA_MODES}", f"pick one of {', '.join(THETA_MODES)}")
    o = config.optim
    if o.batch_size % o.micro_batch:
        raise ProbeError(source, f"optim.batch_size {o.batch_size} is not a multiple of optim.micro_batch {o.micro_batch}", "change one of them")
    if o.epochs < 1 or o.warmup_epochs < 0 or o.warmup_epochs > o.epochs:
        raise ProbeError(source, f"epochs {o.epochs} / warmup_epochs {o.warmup_epochs} do not fit", "need 0 <= warmup_epochs <= epochs, epochs >= 1")
    if not 0 <= config.loss.warmup_teacher_temp_epochs <= o.epochs:
        raise ProbeError(
            source,
            f"loss.warmup_teacher_temp_epochs {config.loss.warmup_teacher_temp_epochs} does not fit {o.epochs} epochs",
            "need 0 <= loss.warmup_teacher_temp_epochs <= optim.epochs",
        )
    if min(config.loss.teacher_temp, config.loss.warmup_teacher_temp, config.loss.student_temp) <= 0:
        raise ProbeError(source, "a loss temperature is not positive", "temperatures divide the scores: give values > 0 (DINO: 0.04 teacher, 0.1 student)")
    if config.init.network not in ("teacher", "student"):
        raise ProbeError(source, f"init.network {config.init.network!r} is not teacher or student", "pick one")
    if not 0 < config.rule.negative_quantile < 1:
        raise ProbeError(source, "rule.negative_quantile must lie in (0, 1)", "the contrastive rule uses 0.2")


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value``; the value is read as TOML (numbers, booleans, lists), else as a string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ProbeError("--set", f"{text!r} is not section.key=value", "e.g. --set optim.epochs=2")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def config_path(name_or_path: str | Path) -> Path:
    """A path, or the name of a shipped config (``tiny`` → ``training/configs/tiny.toml``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = CONFIGS / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    raise ProbeError(path, "no such config file", f"pass a TOML file or one of {sorted(p.stem for p in CONFIGS.glob('*.toml'))}")


def load_config(name_or_path: str | Path, overrides: dict[str, Any] | list[str] | tuple = ()) -> Config:
    """Read a TOML config and apply overrides (``{"optim.epochs": 2}`` or ``["optim.epochs=2"]``)."""
    path = config_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ProbeError(path, f"is not valid TOML ({error})", "fix the syntax") from None
    pairs = overrides.items() if isinstance(overrides, dict) else (parse_override(o) for o in overrides)
    for dotted, value in pairs:
        section, _, key = dotted.partition(".")
        _known(section, key, "--set" if not isinstance(overrides, dict) else "overrides")  # named as given, not as the file's
        data.setdefault(section, {})[key] = value
    return from_dict(data, str(path))
