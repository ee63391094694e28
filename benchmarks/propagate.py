"""Frames per second of ``probe propagate``'s procedure against a plain per-frame torch loop, in one run.

Baseline: DINO's ``eval_video_segmentation.py`` procedure written out frame by frame — the plain
loop ``tests/test_propagate.py`` holds the toolkit against (one forward pass per frame, the window
built cell by cell once per sequence, the script's reshapes and in-place cut-off). Toolkit: the
same sequence through ``commands.propagate.sequence_features`` (frames batched through the
backbone) and ``analyses.propagation.propagate`` (the window built by broadcasting). Both start
from the decoded JPEG files and end with the labels at the original size; predictions must be
identical. A synthetic DAVIS sequence (``demo/video.py``); frames are sized by DINO's rule
(short side 480), so the grid is 30 × 40. Rounds interleaved, medians compared. Prints a table
and a JSON line.

    python benchmarks/propagate.py [--frames 6] [--rounds 2] [--arch tiny|vit-s16] [--full]

``--full``: ViT-S/16 (random weights), 12 frames, 3 rounds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_propagate import plain_propagation  # noqa: E402  (the tests' plain loop is the baseline)

from probe_toolkit.analyses import propagation  # noqa: E402
from probe_toolkit.commands.propagate import sequence_features  # noqa: E402
from probe_toolkit.demo.samples import ARCHS, write_checkpoint  # noqa: E402
from probe_toolkit.demo.video import write_davis  # noqa: E402
from probe_toolkit.store.backbone import Backbone  # noqa: E402
from probe_toolkit.store.checkpoints import load_checkpoint  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny")
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    if args.full:
        args.arch, args.frames, args.rounds = "vit-s16", 12, 3
    with tempfile.TemporaryDirectory() as tmp:
        root = write_davis(Path(tmp) / "DAVIS", {"shapes": args.frames}, size=(160, 120))
        checkpoint = write_checkpoint(Path(tmp) / "net.pth", "dino-full", ARCHS[args.arch], seed=0)
        model = Backbone.from_checkpoint(load_checkpoint(checkpoint))
        frames = sorted((root / "JPEGImages" / "480p" / "shapes").glob("*.jpg"))
        annotation = np.array(Image.open(root / "Annotations" / "480p" / "shapes" / "00000.png"))
        height, width = annotation.shape
        w, h = propagation.frame_size(width, height)
        patch = model.arch.patch
        rows, cols = h // patch, w // patch

        def toolkit() -> list[np.ndarray]:
            first = propagation.first_labels(annotation, rows, cols)
            stream = propagation.propagate(sequence_features(model, frames, torch.device("cpu")), first, rows, cols, patch, (width, height))
            return [p.labels for p in stream]

        times = {"plain": [], "toolkit": []}
        same = True
        for r in range(args.rounds + 1):  # round 0 warms up
            start = time.perf_counter()
            expected, _ = plain_propagation(model, frames, annotation)
            t_plain = time.perf_counter() - start
            start = time.perf_counter()
            got = toolkit()
            t_toolkit = time.perf_counter() - start
            same &= all(np.array_equal(a, b) for a, b in zip(got, expected)) and len(got) == len(expected)
            if r:
                times["plain"].append(t_plain)
                times["toolkit"].append(t_toolkit)
    n = args.frames - 1
    plain_s, toolkit_s = statistics.median(times["plain"]), statistics.median(times["toolkit"])
    print(f"{args.arch}, {args.frames} frames ({n} propagated) at {w}×{h} ({rows}×{cols} patches), torch {torch.get_num_threads()} threads")
    print(f"  plain per-frame loop   {n / plain_s:7.2f} frames/s   rounds {[round(t, 2) for t in times['plain']]} s")
    print(f"  probe propagate        {n / toolkit_s:7.2f} frames/s   rounds {[round(t, 2) for t in times['toolkit']]} s")
    print(f"  ratio {plain_s / toolkit_s:.2f}; predictions identical: {same}")
    print(
        json.dumps(
            {
                "benchmark": "propagate",
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "arch": args.arch,
                "frames": args.frames,
                "grid": [rows, cols],
                "rounds": args.rounds,
                "plain_fps": round(n / plain_s, 3),
                "toolkit_fps": round(n / toolkit_s, 3),
                "ratio": round(plain_s / toolkit_s, 3),
                "identical": bool(same),
            }
        )
    )
    if not same:
        raise SystemExit("predictions differ from the plain loop")


if __name__ == "__main__":
    main()
