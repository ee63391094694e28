"""The run: build student and teacher, then steps that read top to bottom, checkpoints, a JSONL log.

One step (``train_step``): schedules → the teacher's tokens of every crop of the step, without
gradient → per micro-batch: the rule's sets, the teacher's targets, the student's forward, the
loss parts, backward (gradients accumulate; DDP syncs on the last micro-batch) → clip each tensor
→ drop the prototype layers' gradients during the first epoch → AdamW → teacher EMA → centres.

The log (``log.jsonl``, one JSON object per step, main process) has the fields of ``LOG_FIELDS``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from probe_toolkit.infra import provenance
from probe_toolkit.infra.atomic import write_json
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.progress import bar
from probe_toolkit.store.checkpoint_files import sha256_file
from probe_toolkit.store.checkpoints import load_checkpoint, to_selfpatch

from . import hygiene, losses, rules, schedules, state
from .config import Config, config_path, load_config
from .data import make_batches
from .distributed import Dist, all_gather_objects, barrier, close, init_distributed
from .model import Network, Output, init_random, set_drop_path, training_arch
from .optim import cancel_last_layer, clip_per_tensor, ema_update, param_groups

LOG_FIELDS = {
    "step": "global optimiser step, from 0",
    "epoch": "epoch of the step, from 0",
    "loss": "total loss L = L_global + λ·L_patch (or λ·L_con), mean over micro-batches and processes",
    "loss_image": "L_global, DINO's image loss over the 18 pairs of views",
    "loss_patch": "SelfPatch's patch loss (rules selfpatch, threshold), else absent",
    "loss_contrastive": "the contrastive InfoNCE loss (rule contrastive), else absent",
    "positives_per_anchor": "mean number of positives per anchor (4 under selfpatch; 0-8 under threshold)",
    "anchors_without_positive": "share of anchors with no positive (threshold rule; left out of the patch loss)",
    "negatives_per_anchor": "mean number of valid negatives per anchor (contrastive rule)",
    "theta": "the threshold rule's batch-median θ (batch-median mode)",
    "lr_backbone": "learning rate of the backbone groups at this step",
    "lr_heads": "learning rate of the head groups at this step",
    "weight_decay": "weight decay of the decayed groups at this step",
    "momentum": "teacher EMA momentum used after this step",
    "teacher_temp": "the teacher's temperature this epoch (loss.warmup_teacher_temp -> loss.teacher_temp)",
    "grad_norm": "norm of all gradients before per-tensor clipping",
    "last_layer_frozen": "true while the prototype layers are held fixed",
    "step_time_s": "wall time of the step (data wait included)",
    "data_time_s": "time spent waiting for the step's micro-batches",
    "images_per_s": "images of the global batch / step_time_s",
    "time": "unix time at the end of the step",
}


@dataclass
class Run:
    """What a finished (or resumed-and-finished) run left in its folder."""

    dir: Path
    checkpoint: Path
    log: Path
    manifest: Path
    config: Path
    steps: int
    epochs: int
    last: dict[str, Any]


@dataclass
class Trainer:
    """Everything a step needs, in one place."""

    cfg: Config
    ctx: Dist
    student: Network
    teacher: Network
    model: torch.nn.Module  # the student, wrapped in DDP when distributed
    optimizer: torch.optim.Optimizer
    loss: losses.CentredLoss
    total_steps: int
    warmup_steps: int
    freeze_steps: int

    @property
    def patch_output(self) -> str | None:
        return {"selfpatch": "logits", "threshold": "logits", "contrastive": "embedding"}.get(self.cfg.rule.name)

    def autocast(self):
        dtype = self.cfg.run.precision
        if dtype == "auto":
            dtype = "bf16" if self.ctx.device.type == "cuda" else "fp32"
        return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def groups(crops: list[torch.Tensor], globals_only: bool = False) -> list[torch.Tensor]:
    """The 10 crops of a micro-batch as batched groups of one size: [2B globals, 8B locals]."""
    out = [torch.cat(crops[:2])]
    if len(crops) > 2 and not globals_only:
        out.append(torch.cat(crops[2:]))
    return out


def views(tensors: list[torch.Tensor | None], counts: list[int]) -> list:
    """Group outputs → one entry per crop (group i holds ``counts[i]`` crops stacked along dim 0)."""
    return [v for t, c in zip(tensors, counts) for v in (t.chunk(c) if t is not None else [None] * c)]


@dataclass
class Targets:
    """The teacher's side of one micro-batch, per crop."""

    image: list[torch.Tensor]
    patch: list[torch.Tensor] | None = None  # SelfPatch targets (B, N, Q) or embeddings (B, N, E)
    sets: list[rules.Selection] | None = None


def split_selection(sel: rules.Selection, count: int) -> list[rules.Selection]:
    parts = [t.chunk(count) if t is not None else [None] * count for t in (sel.positive, sel.positive_valid, sel.negative, sel.negative_valid)]
    return [rules.Selection(*p) for p in zip(*parts)]


@torch.no_grad()
def teacher_targets(t: Trainer, tokens: list[torch.Tensor], counts: list[int], theta: torch.Tensor | None) -> Targets:
    """The rule's sets from the teacher's raw tokens, then the teacher's heads: image scores and patch targets."""
    rule = t.cfg.rule
    if rule.name == "none":
        outs = [t.teacher.heads(x, patch=None) for x in tokens]
        return Targets(views([o.image for o in outs], counts[: len(outs)]))
    sets = [rules.select(x, rule, theta) for x in tokens]
    if rule.name == "contrastive":
        outs = [t.teacher.heads(x, patch="embedding") for x in tokens]
    else:
        # padding (-1) exists under the threshold rule and without the wrap; the mask keeps it out
        outs = [t.teacher.heads(x, "logits", s.positive, None if bool(s.positive_valid.all()) else s.positive_valid) for x, s in zip(tokens, sets)]
    per_crop = [p for s, c in zip(sets, counts) for p in split_selection(s, c)]
    return Targets(views([o.image for o in outs], counts), views([o.patch for o in outs], counts), per_crop)


def loss_parts(t: Trainer, student: list[Output], target: Targets, counts: list[int]) -> dict[str, torch.Tensor]:
    """L_global from the image tokens; the rule's patch term; the total."""
    rule = t.cfg.rule
    parts = {"loss_image": t.loss.image(views([o.image for o in student], counts), target.image)}
    patch = views([o.patch for o in student], counts)
    if rule.name in ("selfpatch", "threshold"):
        used = [s.positive_valid.any(-1) for s in target.sets]
        parts["loss_patch"] = t.loss.patch(patch, target.patch, used)
        parts["positives_per_anchor"] = torch.stack([s.positive_valid.float().sum(-1).mean() for s in target.sets]).mean()
        if rule.name == "threshold":
            parts["anchors_without_positive"] = torch.stack([(~u).float().mean() for u in used]).mean()
    elif rule.name == "contrastive":
        parts["loss_contrastive"] = torch.stack([losses.contrastive(s, tt, sel, rule.temperature) for s, tt, sel in zip(patch, target.patch, target.sets)]).mean()
        parts["negatives_per_anchor"] = torch.stack([s.negative_valid.float().sum(-1).mean() for s in target.sets]).mean()
    term = parts.get("loss_patch", parts.get("loss_contrastive"))
    parts["loss"] = parts["loss_image"] + rule.weight * term if term is not None else parts["loss_image"]
    return parts


def train_step(t: Trainer, micro_batches: list[list[torch.Tensor]], step: int, epoch: int) -> dict[str, Any]:
    cfg, device = t.cfg, t.ctx.device
    # 1. schedules, plain functions of the step
    wd = schedules.weight_decay(step, t.total_steps, cfg.optim.weight_decay, cfg.optim.weight_decay_end)
    momentum = schedules.teacher_momentum(step, t.total_steps, cfg.optim.momentum_teacher)
    t.loss.teacher_temp = schedules.teacher_temperature(epoch, cfg.loss.warmup_teacher_temp_epochs, cfg.loss.warmup_teacher_temp, cfg.loss.teacher_temp)
    for group in t.optimizer.param_groups:
        group["lr"] = schedules.learning_rate(step, t.total_steps, t.warmup_steps, group["peak"], cfg.optim.min_lr)
        group["weight_decay"] = wd if group["decay"] else 0.0
    # 2. the teacher's tokens of every crop of the step (no gradient): the rules read them
    crops = [[c.to(device, non_blocking=True) for c in mb] for mb in micro_batches]
    n_local = len(crops[0]) - 2
    globals_only = cfg.rule.name == "none"  # DINO's teacher sees the 2 global crops only
    counts = [2, n_local] if n_local else [2]
    with torch.no_grad(), t.autocast():
        teacher_tokens = [[t.teacher.tokens(g) for g in groups(mb, globals_only)] for mb in crops]
    theta = rules.batch_theta([x for mb in teacher_tokens for x in mb], cfg.rule, t.ctx.distributed)
    # 3. per micro-batch: targets, student forward, loss, backward (DDP syncs on the last one)
    sums: dict[str, float] = {}
    for i, mb in enumerate(crops):
        with t.autocast():
            target = teacher_targets(t, teacher_tokens[i], counts, theta)
        last = i == len(crops) - 1
        sync = contextlib.nullcontext() if (last or not t.ctx.distributed) else t.model.no_sync()
        with sync:
            with t.autocast():
                student = t.model(groups(mb), patch=t.patch_output)
                parts = loss_parts(t, student, target, counts)
            if not math.isfinite(parts["loss"].item()):
                raise ProbeError(
                    f"step {step}", f"loss is {parts['loss'].item()}", "lower the learning rate or check the data; the run stopped before writing anything wrong"
                )
            (parts["loss"] / len(crops)).backward()
        for name, value in parts.items():
            sums[name] = sums.get(name, 0.0) + value.item() / len(crops)
    # 4. update the student: clip each tensor, hold the prototypes in epoch 1, AdamW
    grad_norm = clip_per_tensor(t.student.parameters(), cfg.optim.clip_grad)
    frozen = step < t.freeze_steps
    if frozen:
        cancel_last_layer(t.student)
    t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    # 5. the teacher follows; the centres move once per step
    ema_update(t.teacher, t.student, momentum)
    t.loss.update_centres(t.ctx.distributed)
    record = {"step": step, "epoch": epoch, **reduce_mean(sums, t.ctx)}
    if theta is not None:
        record["theta"] = float(theta)
    lrs = {g["name"].split("/")[0]: g["lr"] for g in t.optimizer.param_groups}
    record.update(
        lr_backbone=lrs.get("backbone", 0.0),
        lr_heads=lrs.get("heads", 0.0),
        weight_decay=wd,
        momentum=momentum,
        teacher_temp=t.loss.teacher_temp,
        grad_norm=grad_norm,
        last_layer_frozen=frozen,
    )
    return record


def reduce_mean(values: dict[str, float], ctx: Dist) -> dict[str, float]:
    """Scalars averaged over processes (for the log)."""
    if not ctx.distributed:
        return values
    names = sorted(values)
    packed = torch.tensor([values[n] for n in names], dtype=torch.float64, device=ctx.device)
    torch.distributed.all_reduce(packed)
    return {n: float(v) / ctx.world for n, v in zip(names, packed.tolist())}


# ----------------------------------------------------------------------------------------------
# the run


RESUME_SECTIONS = ("init", "model", "rule", "loss", "optim", "data")
RESUME_FREE = {("data", "num_workers"), ("data", "images")}


def _differences(saved: dict, current: dict) -> list[str]:
    out = []
    for section in RESUME_SECTIONS:
        for key, value in current.get(section, {}).items():
            if (section, key) not in RESUME_FREE and saved.get(section, {}).get(key) != value:
                out.append(f"{section}.{key}: {saved.get(section, {}).get(key)!r} → {value!r}")
    return out


def rng_state(ctx: Dist) -> dict[str, list]:
    return {
        "torch": all_gather_objects(torch.get_rng_state(), ctx),
        "cuda": all_gather_objects(torch.cuda.get_rng_state_all() if ctx.device.type == "cuda" else [], ctx),
    }


def set_rng_state(saved: dict, ctx: Dist) -> bool:
    if len(saved.get("torch", [])) != ctx.world:
        return False
    torch.set_rng_state(saved["torch"][ctx.rank])
    if ctx.device.type == "cuda" and saved.get("cuda") and saved["cuda"][ctx.rank]:
        torch.cuda.set_rng_state_all(saved["cuda"][ctx.rank])
    return True


def weights_sha256(network: torch.nn.Module) -> str:
    """sha256 over a network's tensors in key order: equal on every process when DDP kept them in step."""
    digest = hashlib.sha256()
    for key, value in network.state_dict().items():
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _write_json(path: Path, data: Any) -> None:
    write_json(path, json.loads(json.dumps(data, default=str)), indent=2)


def _trim_log(log: Path, step: int) -> None:
    """Keep the log lines of steps before ``step`` (a resumed run rewrites what followed its checkpoint)."""
    if not log.exists():
        return
    kept = [line for line in log.read_text().splitlines() if line.strip() and json.loads(line)["step"] < step]
    tmp = log.with_name(f".{log.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(log)


def initial_checkpoint(cfg: Config):
    """The network ``init.checkpoint`` names, in SelfPatch's layout, or None for a random start."""
    if not cfg.init.checkpoint:
        return None
    checkpoint = load_checkpoint(cfg.init.checkpoint, network=cfg.init.network)
    return to_selfpatch(checkpoint) if checkpoint.arch.class_token else checkpoint  # DINO's backbone: drop class token, its position row and the final norm


def build_networks(cfg: Config, checkpoint=None) -> tuple[Network, Network, dict | None]:
    """Student and teacher with the same weights: random (trunc-normal 0.02) or from ``init.checkpoint``
    (read here unless the caller passes it, already read)."""
    init_info = None
    checkpoint = checkpoint if checkpoint is not None else initial_checkpoint(cfg)
    arch = checkpoint.arch if checkpoint else training_arch(cfg.model)
    student = Network(arch, cfg.model)
    init_random(student)
    if checkpoint is not None:
        loaded = state.load_init(student, checkpoint, cfg.init.heads)
        init_info = {**checkpoint.describe(), "loaded": loaded}
    if cfg.rule.name == "none":
        student.p_head.requires_grad_(False)  # no patch loss: the patch head is carried, not trained
    elif cfg.rule.name == "contrastive":
        student.p_head.last_layer.requires_grad_(False)  # the rule reads the bottleneck, never the prototypes
    teacher = Network(arch, cfg.model)
    teacher.load_state_dict(student.state_dict())
    teacher.requires_grad_(False)
    set_drop_path(student.backbone, cfg.model.drop_path)
    return student, teacher, init_info


def build_trainer(cfg: Config, ctx: Dist, steps_per_epoch: int) -> tuple[Trainer, dict | None]:
    """Networks (same seed on every process: same initial weights), DDP, AdamW groups, the loss and its centres."""
    torch.manual_seed(cfg.run.seed)
    checkpoint = initial_checkpoint(cfg)
    student, teacher, init_info = build_networks(cfg, checkpoint)
    student.to(ctx.device)
    teacher.to(ctx.device)
    model = DDP(student, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None) if ctx.distributed else student
    optimizer = torch.optim.AdamW(param_groups(student, cfg.optim))
    loss = losses.CentredLoss(cfg.model.image_prototypes, cfg.model.patch_prototypes, cfg.loss.teacher_temp, cfg.loss.student_temp, cfg.loss.center_momentum).to(
        ctx.device
    )
    if checkpoint is not None:
        init_info["centres"] = state.load_centres(loss, checkpoint, init_info["loaded"])
    torch.manual_seed(cfg.run.seed + ctx.rank)  # per-process randomness (stochastic depth)
    trainer = Trainer(
        cfg,
        ctx,
        student,
        teacher,
        model,
        optimizer,
        loss,
        total_steps=cfg.optim.epochs * steps_per_epoch,
        warmup_steps=cfg.optim.warmup_epochs * steps_per_epoch,
        freeze_steps=cfg.optim.freeze_last_layer * steps_per_epoch,
    )
    return trainer, init_info


def train(config: Config | str | Path, overrides: dict[str, Any] | list[str] | tuple = (), quiet: bool = True) -> Run:
    """Run (or resume) a training run; returns where its files are.

    ``config``: a Config, a TOML path, or a shipped name (``"tiny"``, ``"selfpatch"``, ...);
    ``overrides``: ``{"data.images": DIR, "run.out": DIR, "optim.epochs": 2}`` or ``["optim.epochs=2"]``.
    A run folder that already holds ``checkpoint.pth`` is resumed from it.
    """
    source = None if isinstance(config, Config) else str(config_path(config))
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    ctx = init_distributed(cfg.run.device)
    threads = torch.get_num_threads()
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    try:
        return _train(cfg, ctx, quiet, source)
    finally:
        torch.set_num_threads(threads)
        close(ctx)


def _train(cfg: Config, ctx: Dist, quiet: bool, source: str | None) -> Run:
    batches = make_batches(cfg.data, cfg.optim.batch_size, cfg.optim.micro_batch, ctx.rank, ctx.world, cfg.run.seed)  # a bad folder: before any file
    run_dir = Path(cfg.run.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: run_dir / name for name in ("config.json", "manifest.json", "log.jsonl")}
    latest = run_dir / state.LATEST
    dataset = batches.dataset
    steps_per_epoch = batches.steps_per_epoch
    watch = hygiene.Watch(
        run_dir=str(run_dir),
        images=frozenset(str(p.resolve()) for p in dataset.paths) | frozenset(str(p.absolute()) for p in dataset.paths),
        config=str(Path(source).resolve()) if source else None,
        checkpoints=frozenset(str(Path(p).resolve()) for p in (cfg.init.checkpoint,) if p) | ({str(latest)} if latest.exists() else set()),
    )
    batches.loader.worker_init_fn = watch.worker_init if cfg.data.num_workers else None
    image_hash = provenance.list_hash(dataset.ids)

    with watch:
        t, init_info = build_trainer(cfg, ctx, steps_per_epoch)
        student, teacher, optimizer, loss = t.student, t.teacher, t.optimizer, t.loss
        args = {**cfg.as_dict(), "arch": student.arch.as_dict(), "world_size": ctx.world, "steps_per_epoch": steps_per_epoch}
        start_epoch, step, rng_note = 0, 0, "seeded"
        if latest.exists():
            saved = state.read(latest)
            changed = _differences(saved["args"], args)
            if changed:
                raise ProbeError(latest, f"was written with other settings ({'; '.join(changed[:4])})", "resume with the run's own config, or start a new run.out")
            state.restore(saved, student, teacher, optimizer, loss, latest)
            start_epoch, step = int(saved["epoch"]), int(saved["step"])
            rng_note = "restored" if set_rng_state(saved["rng"], ctx) else "reseeded (the number of processes changed)"
            if ctx.main:
                _trim_log(paths["log.jsonl"], step)
        manifest = {
            **provenance.stamp(),
            "trainer": "probe-training",
            "run": cfg.run.name,
            "config_source": source,
            "init": init_info or {"random": "trunc-normal 0.02", "seed": cfg.run.seed},
            "arch": student.arch.as_dict(),
            "rule": cfg.rule.name,
            "world_size": ctx.world,
            "device": str(ctx.device),
            "steps_per_epoch": steps_per_epoch,
            "accumulation": batches.accumulation,
            "resumed_from": {"epoch": start_epoch, "step": step, "rng": rng_note} if step else None,
            "status": "running",
            "log_fields": LOG_FIELDS,
        }
        if ctx.main:
            _write_json(paths["config.json"], cfg.as_dict())
            _write_json(paths["manifest.json"], manifest)
        barrier(ctx)

        record: dict[str, Any] = {}
        student.train()
        teacher.train(False)
        with bar("images", quiet or not ctx.main) as progress:
            task = progress.add_task(cfg.run.name, total=(t.total_steps - step) * cfg.optim.batch_size)
            for epoch in range(start_epoch, cfg.optim.epochs):
                clock = time.perf_counter()
                for micro_batches in batches.epoch(epoch):
                    data_time = time.perf_counter() - clock
                    record = train_step(t, micro_batches, step, epoch)
                    elapsed = time.perf_counter() - clock
                    record.update(step_time_s=elapsed, data_time_s=data_time, images_per_s=cfg.optim.batch_size / elapsed, time=time.time())
                    if ctx.main:
                        with open(paths["log.jsonl"], "a") as log:
                            log.write(json.dumps(record) + "\n")
                    progress.advance(task, cfg.optim.batch_size)
                    step += 1
                    clock = time.perf_counter()
                done = epoch + 1
                if done % cfg.save.every == 0 or done == cfg.optim.epochs:
                    snapshot = state.checkpoint_state(student, teacher, optimizer, loss, done, step, args, rng_state(ctx))
                    if ctx.main:
                        state.save(snapshot, run_dir, done, cfg.save.keep)
                    barrier(ctx)
        replicas = {name: all_gather_objects(weights_sha256(net), ctx) for name, net in (("student", student), ("teacher", teacher))}
        if ctx.main:
            manifest.update(
                replicas=replicas,
                status="finished",
                finished=provenance.now(),
                steps=step,
                checkpoint={"path": str(latest), "sha256": sha256_file(latest)},
                label_hygiene=hygiene.summary(watch, image_hash, len(dataset)),
            )
            _write_json(paths["manifest.json"], manifest)
    return Run(run_dir, latest, paths["log.jsonl"], paths["manifest.json"], paths["config.json"], step, cfg.optim.epochs, record)
