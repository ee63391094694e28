"""Reading a DINOv3 checkpoint's network: timm's ``Eva`` built on the meta device, with timm's
initialising fills skipped (``store.dinov3._FillsSkippedOnMeta``) against timm's own build, in one run.

A checkpoint read builds the network twice on the meta device (the shapes the file is checked
against, ``checkpoint_arch.expected_shapes``; the network its tensors are assigned to,
``Dinov3Backbone.from_checkpoint``). ``Eva`` has no option to leave its initialisers out, and on
meta tensors each fill runs through torch's Python reference kernels. The baseline is the same
``build_dinov3`` with the skipping mode replaced by a null context (timm's own build, every fill
run). CPU seconds of one build, medians of ``--rounds`` interleaved rounds (the order alternates),
after one warm-up build of each, per released size.

    python benchmarks/dinov3_build.py [--rounds 7] [--sizes vit-s16-dinov3,vit-l16-dinov3] [--record]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import emit, header, options  # noqa: E402  (the benchmarks' shared record helpers)

RECORDS = Path(__file__).resolve().parent / "records" / "dinov3-build.jsonl"


def main() -> None:
    args = options(__doc__, record=RECORDS, rounds=7, sizes="vit-s16-dinov3,vit-l16-dinov3")
    from probe_toolkit.store import dinov3
    from probe_toolkit.store.architectures import DINOV3_RELEASED

    skipping = dinov3._FillsSkippedOnMeta

    def build_seconds(arch, skip: bool) -> float:
        dinov3._FillsSkippedOnMeta = skipping if skip else contextlib.nullcontext
        try:
            start = time.process_time()
            dinov3.build_dinov3(arch, device="meta")
            return time.process_time() - start
        finally:
            dinov3._FillsSkippedOnMeta = skipping

    rows = {}
    for name in (s.strip() for s in args.sizes.split(",") if s.strip()):
        arch = DINOV3_RELEASED[name]
        build_seconds(arch, True), build_seconds(arch, False)  # warm-up: timm imported, kernels registered
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for skip in (True, False) if r % 2 else (False, True):
                times[skip].append(build_seconds(arch, skip))
        skipped, timms = statistics.median(times[True]), statistics.median(times[False])
        rows[name] = {"skipped_cpu_s": round(skipped, 4), "timm_cpu_s": round(timms, 4), "ratio": round(timms / skipped, 2)}
        print(f"{name:18s} meta build: fills skipped {skipped * 1000:6.1f} ms CPU, timm's own {timms * 1000:6.1f} ms ({timms / skipped:.1f}x)")
    emit({**header("dinov3-build"), "rounds": args.rounds, "rows": rows}, RECORDS, args.record)


if __name__ == "__main__":
    main()
