"""Linear depth: probe's training step against the reference's training step, in one run.

The baseline is DINOv3's ``eval/depth/train.py`` ``IterBasedTrainer.train_on_batch`` written out
plainly for one rank: the frozen network's last block through its norm (``get_intermediate_layers``
as ``DinoVisionTransformerWrapper`` calls it, the backbone frozen), ``LinearHead`` as its modules
(BatchNorm, 1×1 ``nn.Conv2d``), ``FeaturesToDepth`` (256 linear bins, 'linear' normalisation), the
depth upsampled bilinearly to the truth, ``SigLoss`` over the pixels with a measurement (its warm-up
counter), backward, ``clip_grad_norm_(…, 35)``, AdamW and ``WarmupOneCycleLR`` (β1 its momentum).
probe's step is ``probe depth``'s: ``commands.depth.feature_fn`` (the network ``chunk`` crops at a
time, the block taken by a hook) and ``analyses.depth.train_step`` with one group (one rank). Both
get the same batch (random crops, truth with a band without measurement) and a head with the same
initial weights, and take the same schedule. Rounds are interleaved and medians compared; the ratio
is baseline seconds / probe seconds.

    python benchmarks/depth.py [--arch vit-s16] [--batch 16] [--crop 416,544] [--rounds 3] [--device cpu] [--record]

The published step is ViT-S/16, 16 crops of 416 × 544 (a GPU's job); ``--arch tiny --batch 2
--crop 96,128`` is the size for a CPU. ``--record`` appends the JSON line to
``benchmarks/records/depth.jsonl``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from probe_toolkit.analyses import depth as dep
from probe_toolkit.analyses import depth_published as pub
from probe_toolkit.commands.depth import feature_fn
from probe_toolkit.demo.samples import ARCHS
from probe_toolkit.store.backbone import normed_patch_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from segmentation import network, sync
from startup import cpu_model, emit

RECORDS = Path(__file__).resolve().parent / "records" / "depth.jsonl"


class ReferenceHead(nn.Module):
    """dinov3 LinearHead (use_batchnorm, no class token) and FeaturesToDepth, as their modules."""

    def __init__(self, bn: nn.BatchNorm2d, conv: nn.Conv2d):
        super().__init__()
        self.batchnorm_layer, self.conv_depth = bn, conv

    def forward(self, x):
        x = self.conv_depth(self.batchnorm_layer(x))
        bins = torch.linspace(pub.MIN_DEPTH, pub.MAX_DEPTH, x.shape[1], device=x.device)
        logit = torch.relu(x) + 0.1
        logit = logit / logit.sum(dim=1, keepdim=True)
        return torch.einsum("ikmn,k->imn", [logit, bins]).unsqueeze(dim=1)


class ReferenceSigLoss:
    """loss.SigLoss(warm_up=True, warm_iter=100) as written there, its counter included."""

    def __init__(self):
        self.counter = 0

    def __call__(self, pred, target, valid):
        g = torch.log(pred[valid] + 1e-3) - torch.log(target[valid] + 1e-3)
        d = 0.15 * torch.pow(torch.mean(g), 2)
        if self.counter < pub.SIGLOSS_WARMUP:
            self.counter += 1
        else:
            d += torch.var(g)
        return torch.abs(d) if d <= 0 else torch.sqrt(d)


def onecycle(step: int, lr: float, total: int, warmup: int) -> tuple[float, float]:
    """WarmupOneCycleLR's (lr, momentum) at ``step``, as its ``_compute_lr_momentum`` writes them."""

    def cos(a, b, pct):
        return b + (a - b) / 2.0 * (math.cos(math.pi * pct) + 1)

    if step < warmup:
        return lr / 1000.0 + lr * (1 + math.cos(math.pi * step / float(total))) / 2 * step / float(warmup), 0.0
    return cos(lr, lr / 25.0 / 1000.0, (step + 1) / float(total)), cos(0.85, 0.95, (step - warmup) / float(total - warmup))


def reference_step(model, head, loss_fn, optimizer, images, truth, patch, lr, beta1):
    for group in optimizer.param_groups:  # what the scheduler's step wrote
        group["lr"], group["betas"] = lr, (beta1, group["betas"][1])
    valid = truth != 0  # make_valid_mask(FULL, ignored_value 0)
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():  # the frozen backbone: no parameter asks for a gradient
        tokens = normed_patch_tokens(model, images)
        rows, cols = images.shape[-2] // patch, images.shape[-1] // patch
        feats = tokens.reshape(len(images), rows, cols, -1).permute(0, 3, 1, 2).contiguous()
    pred = head(feats)
    pred = F.interpolate(pred, size=truth.shape[2:], mode="bilinear", align_corners=False)
    loss = loss_fn(pred, truth, valid)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], pub.CLIP)
    optimizer.step()
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="vit-s16", choices=sorted(ARCHS))
    parser.add_argument("--batch", type=int, default=pub.BATCH * pub.REPLICAS)
    parser.add_argument("--crop", default="416,544", help="height,width")
    parser.add_argument("--chunk", type=int, default=pub.BATCH * pub.REPLICAS, help="crops per forward pass of probe's network")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--record", action="store_true", help=f"append the JSON line to {RECORDS.relative_to(RECORDS.parents[2])}")
    args = parser.parse_args()
    device = torch.device(args.device)
    crop = tuple(int(v) for v in args.crop.split(","))
    torch.manual_seed(0)
    arch = ARCHS[args.arch]
    model = network(arch, device)
    model.requires_grad_(False)
    images = torch.randn(args.batch, 3, *crop, device=device)
    truth = torch.rand(args.batch, 1, *crop, device=device) * 9 + 0.5
    truth[:, :, -crop[0] // 8 :] = 0  # a band without measurement
    preset = pub.PRESETS["dinov3"]
    head = dep.DepthHead(arch.width, preset, torch.Generator().manual_seed(0)).to(device)
    ref_head = ReferenceHead(copy.deepcopy(head.bn), copy.deepcopy(head.conv)).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=preset.lr, betas=preset.betas, weight_decay=preset.weight_decay)
    ref_optimizer = torch.optim.AdamW(ref_head.parameters(), lr=preset.lr, betas=preset.betas, weight_decay=preset.weight_decay)
    features = feature_fn(model, (arch.depth - 1,), True, args.chunk, device)
    loss_fn = ReferenceSigLoss()
    total, warmup = pub.ITERATIONS, pub.WARMUP
    times: dict[str, list[float]] = {"baseline": [], "probe": []}
    losses: dict[str, list[float]] = {"baseline": [], "probe": []}
    for r in range(args.rounds + 1):  # round 0 warms up
        step = warmup + r  # past the warm-ups: AdamW's β1 and SigLoss's variance term at work
        loss_fn.counter = pub.SIGLOSS_WARMUP
        lr, beta1 = onecycle(step, preset.lr, total, warmup)
        sync(device)
        start = time.perf_counter()
        losses["baseline"].append(reference_step(model, ref_head, loss_fn, ref_optimizer, images, truth, arch.patch, lr, beta1))
        sync(device)
        t_b = time.perf_counter() - start
        start = time.perf_counter()
        rate, momentum = dep.schedule(step, lr=preset.lr, iterations=total, warmup=warmup, kind=preset.schedule)
        losses["probe"].append(dep.train_step(head, optimizer, features(images), truth, rate, momentum, args.batch, warm=False))
        sync(device)
        t_p = time.perf_counter() - start
        if r:
            times["baseline"].append(t_b)
            times["probe"].append(t_p)
    base_s, probe_s = statistics.median(times["baseline"]), statistics.median(times["probe"])
    gap = max(abs(a - b) for a, b in zip(losses["baseline"], losses["probe"]))
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(f"{args.arch}, {args.batch} crops of {crop[0]}x{crop[1]} px; {device}; {os.cpu_count()} cores, {machine}")
    print(f"  reference train_on_batch (written out)   {base_s:8.3f} s/iteration   rounds {[round(t, 3) for t in times['baseline']]}")
    print(f"  probe depth's step                       {probe_s:8.3f} s/iteration   rounds {[round(t, 3) for t in times['probe']]}")
    print(f"  ratio {base_s / probe_s:.2f} (baseline seconds / probe seconds); largest loss difference over {len(losses['probe'])} steps {gap:.2e}")
    emit(
        {
            "benchmark": "depth",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine,
            "device": str(device),
            "cores": os.cpu_count(),
            "load": round(os.getloadavg()[0], 2),
            "arch": args.arch,
            "batch": args.batch,
            "crop": list(crop),
            "chunk": args.chunk,
            "rounds": args.rounds,
            "baseline_s": round(base_s, 4),
            "probe_s": round(probe_s, 4),
            "ratio": round(base_s / probe_s, 3),
            "loss_gap": gap,
            "torch": torch.__version__,
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
