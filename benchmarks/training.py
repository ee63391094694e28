"""Step time of the trainer: the tiny config and full ViT-S/16 at micro-batch 32, with images/s.

Each size runs real optimiser steps (teacher tokens, selection, targets, student forward and
backward, clipping, AdamW, EMA, centres) on one fixed synthetic batch of 2 × 224 + 8 × 96 crops.
The baseline, measured in the same process on the same crops, is the irreducible part of a step:
a forward and backward of the student's backbone alone; ``ratio`` = step / baseline says what the
heads, the rule and the update add on top.

    python benchmarks/training.py [--sizes tiny,vit-s16] [--steps 3] [--full-steps 2] [--rule selfpatch] [--json out.jsonl]

Prints a line per size and one JSON line (appended to ``--json`` when given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training import load_config  # noqa: E402
from training.distributed import Dist, pick_device  # noqa: E402
from training.loop import build_trainer, train_step  # noqa: E402


def crops(micro: int, accumulation: int, device: torch.device, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    make = lambda size: torch.randn(micro, 3, size, size, generator=g).to(device)  # noqa: E731
    return [[make(224), make(224)] + [make(96) for _ in range(8)] for _ in range(accumulation)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(size: str, steps: int, rule: str, device: torch.device, micro: int, batch: int) -> dict:
    sets = {"data.images": "unused", "rule.name": rule, "optim.warmup_epochs": 0, "optim.epochs": 100, "optim.freeze_last_layer": 0, "run.device": device.type}
    if size == "tiny":
        cfg = load_config("tiny", sets)
        micro, batch = cfg.optim.micro_batch, cfg.optim.batch_size
    else:
        cfg = load_config("selfpatch", {**sets, "optim.micro_batch": micro, "optim.batch_size": batch})
    ctx = Dist(0, 1, 0, device)
    t, _ = build_trainer(cfg, ctx, steps_per_epoch=1)
    data = crops(micro, batch // micro, device)
    times = []
    for step in range(steps):
        sync(device)
        start = time.perf_counter()
        train_step(t, data, step=step, epoch=1)
        sync(device)
        times.append(time.perf_counter() - start)
    # baseline: the student's backbone alone, forward and backward on the same crops
    base = []
    for _ in range(max(1, min(steps, 2))):
        sync(device)
        start = time.perf_counter()
        for mb in data:
            with t.autocast():
                out = sum(t.student.backbone(torch.cat(g)).float().square().mean() for g in (mb[:2], mb[2:]))
            out.backward()
        sync(device)
        base.append(time.perf_counter() - start)
        t.student.zero_grad(set_to_none=True)
    kept = times[1:] if len(times) > 1 else times  # the first step warms allocators and kernels up
    step_s = statistics.median(kept)
    base_s = statistics.median(base)
    return {
        "size": size,
        "rule": rule,
        "batch": batch,
        "micro_batch": micro,
        "steps_timed": len(kept),
        "step_s": round(step_s, 4),
        "first_step_s": round(times[0], 4),
        "images_per_s": round(batch / step_s, 3),
        "baseline_backbone_fwd_bwd_s": round(base_s, 4),
        "ratio_step_to_baseline": round(step_s / base_s, 3),
        "parameters": sum(p.numel() for p in t.student.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,vit-s16")
    parser.add_argument("--steps", type=int, default=4, help="steps of the tiny config (the first is not timed)")
    parser.add_argument("--full-steps", type=int, default=2, help="steps at ViT-S/16 (the first is not timed when > 1)")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32, help="images per step at ViT-S/16 (a batch of 256 runs as 8 × 32)")
    parser.add_argument("--rule", default="selfpatch")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", type=Path, default=None, help="also append the JSON line to this file")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)
    device = pick_device(options.device)
    results = []
    for size in options.sizes.split(","):
        steps = options.steps if size == "tiny" else options.full_steps
        result = measure(size, steps, options.rule, device, options.micro_batch, options.batch)
        results.append(result)
        print(
            f"{size:8s} rule={result['rule']:11s} batch {result['batch']:4d} (micro {result['micro_batch']:3d}): "
            f"{result['step_s']:9.3f} s/step  {result['images_per_s']:8.2f} images/s  "
            f"(backbone fwd+bwd {result['baseline_backbone_fwd_bwd_s']:.3f} s, ratio {result['ratio_step_to_baseline']:.2f})",
            flush=True,
        )
    line = {
        "benchmark": "training",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "torch": torch.__version__,
        },
        "results": results,
    }
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        with open(options.json, "a") as handle:
            handle.write(json.dumps(line) + "\n")
    print(json.dumps(line))


if __name__ == "__main__":
    main()
