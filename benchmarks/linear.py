"""Fit time and score of the dense linear probe against scikit-learn's LogisticRegression, in one run.

Both solve the same problem on the same features: L2-regularised multinomial logistic regression
on standardised float32 tokens, mean cross-entropy + wd/2·‖W‖² for the probe (full-batch L-BFGS in
torch) and C = 1/(wd·n) for scikit-learn (lbfgs, its default solver). Features are synthetic
(image, patch, channel) tokens at ViT-S/16 size (384 channels, 196 patches): class directions
under Gaussian noise with a shared offset, a background class covering most patches, as a
panel's tokens would. Rounds are interleaved and medians compared (differences
under about 15 % are noise on this machine). Prints the table and a JSON line.

    python benchmarks/linear.py [--train-images 100] [--val-images 25] [--classes 8] [--rounds 5]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from probe_toolkit.analyses import linear
from probe_toolkit.protocols.linear import LinearSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, options  # noqa: E402  (the processor's name and the command line, as every benchmark has them)


def tokens(n_images: int, classes: int, rng: np.random.Generator, directions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Background on 70 % of patches, the other classes sharing the rest; class means 2.5 noise sd apart."""
    p = np.full(classes, 0.3 / (classes - 1))
    p[0] = 0.7
    labels = rng.choice(classes, size=(n_images, 196), p=p)
    x = 2.5 / np.sqrt(2) * directions[labels] + rng.normal(0, 1, (n_images, 196, directions.shape[1])) + 2.0
    return x.astype(np.float32), labels


def scores(labels: np.ndarray, predicted: np.ndarray, classes: int) -> tuple[float, float]:
    conf = linear.confusion(labels, predicted, classes)
    return linear.mean_iou(conf), linear.accuracy(conf)


def main() -> None:
    args = options(__doc__, train_images=100, val_images=25, classes=8, channels=384, weight_decay=1e-3, rounds=5)
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    directions = np.linalg.qr(rng.normal(0, 1, (args.channels, args.classes)))[0].T  # orthonormal class directions
    x_train, y_train = tokens(args.train_images, args.classes, rng, directions)
    x_val, y_val = tokens(args.val_images, args.classes, rng, directions)
    rows = x_train.reshape(-1, args.channels)
    mean, scale = linear.standardiser(rows)
    z_train, z_val = (rows - mean) / scale, ((x_val - mean) / scale).reshape(-1, args.channels)
    n = len(rows)
    settings = LinearSettings()
    times: dict[str, list[float]] = {"probe": [], "sklearn": []}
    result: dict[str, tuple[float, float]] = {}
    iterations = 0
    for r in range(args.rounds + 1):  # round 0 warms up
        start = time.perf_counter()
        probe = linear.fit_patch_probe(rows, y_train.ravel(), args.classes, args.weight_decay, settings)
        t_probe = time.perf_counter() - start
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a ConvergenceWarning at max_iter is reported through n_iter_
            reference = LogisticRegression(C=1.0 / (args.weight_decay * n), max_iter=settings.epochs).fit(z_train, y_train.ravel())
        t_sklearn = time.perf_counter() - start
        iterations = int(reference.n_iter_[0])
        if r:
            times["probe"].append(t_probe)
            times["sklearn"].append(t_sklearn)
        result["probe"] = scores(y_val.ravel(), probe.predict(x_val).ravel(), args.classes)
        result["sklearn"] = scores(y_val.ravel(), reference.predict(z_val), args.classes)
    agree = float((probe.predict(x_val).ravel() == reference.predict(z_val)).mean())
    probe_s, sklearn_s = statistics.median(times["probe"]), statistics.median(times["sklearn"])
    print(f"{n:,} train patches × {args.channels} channels, {args.classes} classes, weight decay {args.weight_decay:g} (C = {1 / (args.weight_decay * n):.4g})")
    for name, seconds in (("probe (torch L-BFGS)", probe_s), ("sklearn LogisticRegression", sklearn_s)):
        key = "probe" if name.startswith("probe") else "sklearn"
        print(
            f"  {name:28s} fit {seconds:7.3f} s (median of {args.rounds}; rounds {[round(t, 3) for t in times[key]]})   "
            f"val mIoU {100 * result[key][0]:.2f} %, accuracy {100 * result[key][1]:.2f} %"
        )
    print(f"  speed ratio sklearn/probe {sklearn_s / probe_s:.2f}; predictions agree on {100 * agree:.2f} % of val patches; sklearn iterations {iterations}")
    line = {
        "benchmark": "linear",
        "machine": f"{cpu_model()}, torch {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "train_patches": n,
        "channels": args.channels,
        "classes": args.classes,
        "weight_decay": args.weight_decay,
        "rounds": args.rounds,
        "probe_fit_s": round(probe_s, 4),
        "sklearn_fit_s": round(sklearn_s, 4),
        "speedup": round(sklearn_s / probe_s, 3),
        "probe_val_miou": round(result["probe"][0], 5),
        "sklearn_val_miou": round(result["sklearn"][0], 5),
        "probe_val_accuracy": round(result["probe"][1], 5),
        "sklearn_val_accuracy": round(result["sklearn"][1], 5),
        "prediction_agreement": round(agree, 5),
        "sklearn_iterations": iterations,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
