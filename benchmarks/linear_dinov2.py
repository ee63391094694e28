"""DINOv2's linear protocol at ImageNet shape: probe's training loop against linear.py's written out, the same batches.

``probe linear-dinov2`` trains the grid of 52 classifiers (n_last_blocks 1 and 4, avgpool off and
on, 13 rates) on stored features (``analyses/linear_dinov2.py``); facebookresearch/dinov2's
``eval_linear`` builds the same 52 ``LinearClassifier``s into a ``ModuleDict`` and sums the
cross-entropies of its items (``AllClassifiers.forward``). At batch 128 two scaled rates print
alike (``lr_0_00001``) in each of the 4 (blocks, avgpool) groups, so the dict holds 48: the
replaced classifier keeps its optimiser group but is never trained. Both loops run here in one
process on random features of ViT-S/16's width (4 class tokens + the mean patch token, 384 each)
and ImageNet's 1,000 classes, on ``--device``, in interleaved rounds. The figure is iterations per
second and the ratio (probe / reference); the check pairs classifier i of probe's grid with the
i-th classifier the reference built (the replaced ones included) and prints the largest absolute
difference of their weights and biases, and of the summed loss every iteration. The full protocol
is 12,500 iterations (10 epochs × 1,250): the record extrapolates its time.

    python benchmarks/linear_dinov2.py [--device cpu|cuda] [--images 20000] [--iterations 40] [--rounds 3] [--record]
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit, header, options  # noqa: E402  (the processor's name and the record, as every benchmark writes them)

RECORDS = Path(__file__).resolve().parent / "records" / "linear_dinov2.jsonl"


def main() -> None:
    args = options(__doc__, record=RECORDS, device="cpu", images=20000, iterations=40, rounds=3, classes=1000, width=384)

    import torch
    import torch.nn as nn

    from probe_toolkit.analyses import linear_dinov2 as ld

    generator = torch.Generator().manual_seed(0)
    cls_blocks = torch.randn(args.images, 4, args.width, generator=generator)
    means = torch.randn(args.images, args.width, generator=generator)
    labels = torch.randint(0, args.classes, (args.images,), generator=generator)
    classifiers = ld.grid()
    kind = {c.name: c for c in classifiers}  # a name's (blocks, avgpool) are the same for both classifiers that share it

    def reference(iterations: int) -> tuple[list, list[float]]:
        """eval_linear's loop: every classifier built into a ModuleDict (a repeated name replaces the earlier there),
        SGD over all their param groups, cosine schedule, the summed losses of the dict's items."""
        torch.manual_seed(0)  # probe's init_seed=0 generator draws the same numbers as the global one seeded 0
        device = torch.device(args.device)
        dict_, groups, built = nn.ModuleDict(), [], []
        for c in classifiers:
            width = ld.linear_input(cls_blocks[:1], means[:1], c.blocks, c.avgpool).shape[1]
            layer = nn.Linear(width, args.classes)
            layer.weight.data.normal_(mean=0.0, std=0.01)
            layer.bias.data.zero_()
            layer = layer.to(device)
            dict_[c.name] = layer
            groups.append({"params": layer.parameters(), "lr": c.scaled})
            built.append(layer)
        optimizer = torch.optim.SGD(groups, momentum=0.9, weight_decay=0)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, iterations, eta_min=0)
        order = ld.sampler(args.images, 0)
        x_cls, x_mean, y = cls_blocks.to(device), means.to(device), labels.to(device)
        losses = []
        for _ in range(iterations):
            batch = torch.tensor(list(itertools.islice(order, ld.BATCH_SIZE)), device=device)
            loss = sum(
                nn.CrossEntropyLoss()(layer(ld.linear_input(x_cls[batch], x_mean[batch], kind[name].blocks, kind[name].avgpool)), y[batch])
                for name, layer in dict_.items()
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.item()))
        return built, losses

    def ours(iterations: int) -> tuple[list, list[float]]:
        training = ld.train(cls_blocks, means, labels, classifiers, args.classes, epochs=1, epoch_length=iterations, device=args.device, init_seed=0)
        return training.weights, training.losses

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {"probe": [], "reference": []}
    last = {}
    for fn in (ours, reference):  # one untimed iteration of each: the first call's allocations and kernel choices
        fn(1)
    for _ in range(args.rounds):
        for name, fn in (("probe", ours), ("reference", reference)):
            sync()
            start = time.perf_counter()
            last[name] = fn(args.iterations)
            sync()
            times[name].append(time.perf_counter() - start)
    (probe_layers, probe_losses), (reference_layers, reference_losses) = last["probe"], last["reference"]
    assert len(probe_layers) == len(reference_layers) == len(classifiers)
    with torch.no_grad():
        weight_difference = max(max(float((a.weight - b.weight).abs().max()), float((a.bias - b.bias).abs().max())) for a, b in zip(probe_layers, reference_layers))
    loss_difference = max(abs(a - b) for a, b in zip(probe_losses, reference_losses))
    probe_ips = args.iterations / statistics.median(times["probe"])
    reference_ips = args.iterations / statistics.median(times["reference"])
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_model()
    print(
        f"{'loop':10} {'iterations/s':>12}   ({len(classifiers)} classifiers, {len(ld.evaluated(classifiers))} trained, batch {ld.BATCH_SIZE}, "
        f"{args.classes} classes, width {args.width}, {args.images} images, {device_name}, load {os.getloadavg()[0]:.2f})"
    )
    print(
        f"{'probe':10} {probe_ips:12.2f}\n{'reference':10} {reference_ips:12.2f}\nratio {probe_ips / reference_ips:.3f}; "
        f"after {args.iterations} iterations max |weight difference| {weight_difference:.3g}, max |loss difference| {loss_difference:.3g}; "
        f"the full 12,500 iterations: {12500 / probe_ips / 60:.1f} min"
    )
    emit(
        {
            **header("linear_dinov2"),
            "device": device_name,
            "torch": torch.__version__,
            "images": args.images,
            "iterations": args.iterations,
            "rounds": args.rounds,
            "classes": args.classes,
            "width": args.width,
            "probe_iterations_per_s": round(probe_ips, 3),
            "reference_iterations_per_s": round(reference_ips, 3),
            "ratio": round(probe_ips / reference_ips, 3),
            "max_weight_difference": weight_difference,
            "max_loss_difference": loss_difference,
            "full_protocol_minutes": round(12500 / probe_ips / 60, 1),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
