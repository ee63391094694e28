"""Linear segmentation: probe's training step against the reference's training step, in one run.

The baseline is DINOv3's ``eval/segmentation/train.py`` ``train_step`` written out plainly: the
frozen network's last-layer tokens through its norm under ``torch.inference_mode`` (the
``ModelWithIntermediateLayers`` of the linear decoder), the ``LinearHead`` as its modules
(``nn.Dropout2d``, BatchNorm, 1×1 ``nn.Conv2d``), bilinear upsampling of the logits to the labels,
cross-entropy averaged over every pixel, backward, ``clip_grad_norm_(…, inf)``, AdamW. probe's
step is ``probe segment``'s: ``commands.segment.feature_fn`` (the network ``chunk`` crops at a time)
and ``analyses.segment.train_step``. Both get the same batch (random crops and labels, 255 in a
band) and a head with the same initial weights; dropout is off in both so that their losses can be
compared. Rounds are interleaved and medians compared; the ratio is baseline seconds / probe seconds.

    python benchmarks/segmentation.py [--arch vit-s16] [--batch 16] [--crop 512] [--rounds 3] [--device cpu] [--record]

The published step is ViT-S/16, 16 crops of 512 px (a GPU's job); ``--arch tiny --batch 2
--crop 128`` is the size for a CPU. ``--record`` appends the JSON line to
``benchmarks/records/segmentation.jsonl``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from probe_toolkit.analyses import segment as seg
from probe_toolkit.commands.segment import feature_fn
from probe_toolkit.demo.samples import ARCHS
from probe_toolkit.store.backbone import Backbone, normed_patch_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit  # noqa: E402  (the processor's name and the record, as every benchmark writes them)

RECORDS = Path(__file__).resolve().parent / "records" / "segmentation.jsonl"


def network(arch, device):
    if arch.family == "dinov3":
        from probe_toolkit.store.dinov3 import Dinov3Backbone

        return Dinov3Backbone(arch).to(device).eval()
    return Backbone(arch).to(device).eval()


class ReferenceHead(nn.Module):
    """dinov3 LinearHead as its modules: Dropout2d, BatchNorm, 1×1 convolution."""

    def __init__(self, bn: nn.BatchNorm2d, conv: nn.Conv2d):
        super().__init__()
        self.dropout = nn.Dropout2d(0.0)
        self.batchnorm_layer, self.conv = bn, conv

    def forward(self, x):
        return self.conv(self.batchnorm_layer(self.dropout(x)))


def reference_step(model, head, optimizer, images, gt, patch):
    optimizer.zero_grad(set_to_none=True)
    with torch.inference_mode():
        tokens = normed_patch_tokens(model, images)
        rows, cols = images.shape[-2] // patch, images.shape[-1] // patch
        feats = tokens.reshape(len(images), rows, cols, -1).permute(0, 3, 1, 2).contiguous()
    pred = head(feats.clone())  # out of inference mode for autograd, as the decoder's input
    pred = F.interpolate(pred, size=gt.shape[-2:], mode="bilinear", align_corners=False)
    loss = F.cross_entropy(pred, gt, ignore_index=255, reduction="none").mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), float("inf"))
    optimizer.step()
    return float(loss.detach())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="vit-s16", choices=sorted(ARCHS))
    parser.add_argument("--batch", type=int, default=seg.BATCH)
    parser.add_argument("--crop", type=int, default=seg.CROP)
    parser.add_argument("--chunk", type=int, default=seg.BATCH, help="crops per forward pass of probe's network")
    parser.add_argument("--classes", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--record", action="store_true", help=f"append the JSON line to {RECORDS.relative_to(RECORDS.parents[2])}")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    arch = ARCHS[args.arch]
    model = network(arch, device)
    model.requires_grad_(False)
    images = torch.randn(args.batch, 3, args.crop, args.crop, device=device)
    gt = torch.randint(0, args.classes, (args.batch, args.crop, args.crop), device=device)
    gt[:, : args.crop // 8] = 255
    head = seg.LinearHead(arch.width, args.classes, 0.0, torch.Generator().manual_seed(0)).to(device)
    ref_head = ReferenceHead(copy.deepcopy(head.bn), copy.deepcopy(head.conv)).to(device)
    optimizer = seg.make_optimizer(head, 1e-3)
    ref_optimizer = torch.optim.AdamW(ref_head.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-3)
    features = feature_fn(model, arch.patch, args.chunk, device)
    times: dict[str, list[float]] = {"baseline": [], "probe": []}
    losses: dict[str, list[float]] = {"baseline": [], "probe": []}
    for r in range(args.rounds + 1):  # round 0 warms up
        sync(device)
        start = time.perf_counter()
        losses["baseline"].append(reference_step(model, ref_head, ref_optimizer, images, gt, arch.patch))
        sync(device)
        t_b = time.perf_counter() - start
        start = time.perf_counter()
        losses["probe"].append(seg.train_step(head, optimizer, features(images), gt, 1e-3))
        sync(device)
        t_p = time.perf_counter() - start
        if r:
            times["baseline"].append(t_b)
            times["probe"].append(t_p)
    base_s, probe_s = statistics.median(times["baseline"]), statistics.median(times["probe"])
    gap = max(abs(a - b) for a, b in zip(losses["baseline"], losses["probe"]))
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    print(f"{args.arch}, {args.batch} crops of {args.crop} px, {args.classes} classes; {device}; {os.cpu_count()} cores, {machine}")
    print(f"  reference train_step (written out)   {base_s:8.3f} s/iteration   rounds {[round(t, 3) for t in times['baseline']]}")
    print(f"  probe segment's step                 {probe_s:8.3f} s/iteration   rounds {[round(t, 3) for t in times['probe']]}")
    print(f"  ratio {base_s / probe_s:.2f} (baseline seconds / probe seconds); largest loss difference over {len(losses['probe'])} steps {gap:.2e}")
    emit(
        {
            "benchmark": "segmentation",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine,
            "device": str(device),
            "cores": os.cpu_count(),
            "load": round(os.getloadavg()[0], 2),
            "arch": args.arch,
            "batch": args.batch,
            "crop": args.crop,
            "chunk": args.chunk,
            "classes": args.classes,
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
