"""Extraction as a plan: disk per image of each protocol's plan, memory of the attention statistics, time of --blocks all.

Three measurements on a random-weight ViT-S/16 (``probe make-checkpoint --arch vit-s16``; random
weights compress about as trained float16 features do, which are as incompressible: the
plan's uncompressed bytes are printed beside the disk):

- ``--disk``: bytes on disk per image (the data arrays' chunk files) of ``probe extract --for P``
  for each protocol P, against today's ``eval224`` view (``--views eval224 --attention none``,
  patch tokens and class token), and the extrapolation to ImageNet-1k's 1,281,167 train images.
- ``--memory``: peak resident memory of one image's extraction with ``--attention stats`` at
  ``square@S`` for S from ``--smallest`` to ``--largest`` px (256 to 16,384 patch tokens), beside the same
  extraction without attention (the baseline: the network alone) and the size the explicit maps of
  one block and of every block would take; then ``probe entropy --view square@S`` on that store.
  Each run is its own process; its peak is its high-water mark of resident memory (``VmHWM``).
  ``--depth D`` keeps the first D of ViT-S/16's 12 blocks (the time D/12 of the full network's): the
  statistics are computed block by block and keep a few numbers a query, so the other blocks add
  their weights and little else to the peak; run one size at both depths to measure what they add.
- ``--blocks``: seconds of ``--blocks all --facets tokens`` against ``--blocks last`` (the default)
  at 224 px, the same images, one after the other; the ratio is last / all.

    python benchmarks/plan.py --disk --memory --blocks [--images 8] [--largest 2048] [--record]
    python benchmarks/plan.py --memory --smallest 1024 --depth 1 --record  # 16,384 tokens on a 2-core machine, 4,096 at both depths
    python benchmarks/plan.py --memory --blocks --device cuda     # benchmarks/gpu.sh step 10 (GPU peak beside the host's)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit, options  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "plan.jsonl"
IMAGENET_TRAIN = 1_281_167
PROTOCOLS = ("knn", "linear", "decode", "entropy", "hummingbird", "neighbours", "correspond")
# the process's own peak (VmHWM: its address space's high-water mark; ru_maxrss would keep the forking parent's across exec)
PEAK = (
    "import sys; hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
    "sys.stdout.write('\\nPEAK %s\\n' % hwm)\n"
    "torch = sys.modules.get('torch')\n"
    "if torch is not None and torch.cuda.is_available():\n"
    "    sys.stdout.write('GPUPEAK %d\\n' % (torch.cuda.max_memory_allocated() // 1024))"
)


def base(load: float, depth: int = 12) -> dict:
    """The fields every record has; ``load`` is the 1-minute load when the run began, ``load_end`` when this record was written."""
    import torch

    arch = "vit-s16 (random weights)" if depth == 12 else f"vit-s16 (random weights, first {depth} of its 12 blocks)"
    return {
        "benchmark": "plan",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": cpu_model(),
        "cores": os.cpu_count(),
        "load": round(load, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "torch": torch.__version__,
        "arch": arch,
    }


GPU_PEAKS: list[int] = []  # the last command's peak of GPU memory allocated by torch, KiB (a CUDA run)


def probe(*args: str, cwd: Path) -> tuple[float, int]:
    """(wall seconds, peak resident KiB) of one ``probe`` command in a process of its own (a CUDA run's
    peak of GPU memory in ``GPU_PEAKS``)."""
    code = (
        f"import sys; sys.argv = ['probe', *{list(args)!r}]\nfrom probe_toolkit.cli import main\n"
        f"try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n{PEAK}"
    )
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"probe {' '.join(args)} failed: {run.stderr[-800:]}")
    peak = int(run.stdout.rsplit("\nPEAK ", 1)[1].split()[0])
    GPU_PEAKS[:] = [int(run.stdout.rsplit("GPUPEAK ", 1)[1].split()[0])] if "GPUPEAK " in run.stdout else []
    return seconds, peak


def data_bytes(store: Path) -> int:
    """Bytes of the chunk files of the store's data arrays (not the flags, grids or metadata)."""
    from probe_toolkit.store import cache

    total = 0
    for entry in store.iterdir():
        if entry.is_dir() and entry.name not in cache.FLAGS and not entry.name.startswith(cache.PER_VIEW) and entry.name != "results":
            total += sum(f.stat().st_size for f in (entry / "c").rglob("*") if f.is_file()) if (entry / "c").is_dir() else 0
    return total


def planned_bytes(store: Path) -> int:
    """The uncompressed bytes per image of the store's data arrays."""
    import numpy as np
    import zarr

    from probe_toolkit.store import cache

    group = zarr.open_group(store, mode="r")
    return sum(int(np.prod(a.shape[1:])) * a.dtype.itemsize for name, a in group.arrays() if name not in cache.FLAGS and not name.startswith(cache.PER_VIEW))


def disk(root: Path, ckpt: Path, folder: Path, n: int, keep: bool, load: float) -> None:
    runs = {"eval224 (today)": ["--views", "eval224", "--attention", "none"], **{f"--for {p}": ["--for", p] for p in PROTOCOLS}}
    measured = {}
    for label, extra in runs.items():
        store = root / f"{label.replace(' ', '_').replace('(', '').replace(')', '')}.zarr"
        seconds, _ = probe("extract", str(ckpt), "--images", str(folder), *extra, "--store", str(store), "--chunk", str(n), "-q", cwd=root)
        measured[label] = (data_bytes(store) / n, planned_bytes(store), seconds)
    today = measured["eval224 (today)"][0]
    for label, (on_disk, planned, seconds) in measured.items():
        emit(
            {
                **base(load),
                "measure": "disk",
                "plan": label,
                "images": n,
                "disk_bytes_per_image": round(on_disk),
                "planned_bytes_per_image": planned,
                "vs_eval224": round(on_disk / today, 4),
                "imagenet_train_gib": round(on_disk * IMAGENET_TRAIN / 2**30, 2),
                "seconds": round(seconds, 2),
            },
            RECORDS,
            keep,
        )


def memory(root: Path, ckpt: Path, folder: Path, sizes: tuple[int, int], keep: bool, load: float, device: str = "cpu", depth: int = 12) -> None:
    from probe_toolkit.store.architectures import VIT_S16

    one = root / "one"
    one.mkdir(exist_ok=True)
    first = sorted(folder.iterdir())[0]
    (one / first.name).write_bytes(first.read_bytes())
    size, largest = sizes
    while size <= largest:
        view = f"square@{size}"
        tokens = (size // 16) ** 2
        baseline_s, baseline_kib = probe(
            "extract",
            str(ckpt),
            "--images",
            str(one),
            "--views",
            view,
            "--attention",
            "none",
            "--store",
            str(root / f"none{size}.zarr"),
            "--batch-size",
            "1",
            "--chunk",
            "1",
            "--device",
            device,
            "-q",
            cwd=root,
        )
        gpu_none = GPU_PEAKS[0] if GPU_PEAKS else None
        stats_s, stats_kib = probe(
            "extract",
            str(ckpt),
            "--images",
            str(one),
            "--views",
            view,
            "--attention",
            "stats",
            "--store",
            str(root / f"stats{size}.zarr"),
            "--batch-size",
            "1",
            "--chunk",
            "1",
            "--device",
            device,
            "-q",
            cwd=root,
        )
        gpu_stats = GPU_PEAKS[0] if GPU_PEAKS else None
        entropy_s, entropy_kib = probe("entropy", str(root / f"stats{size}.zarr"), "--view", view, "--boot", "100", "-q", cwd=root)
        t = tokens + VIT_S16.prefix
        emit(
            {
                **base(load, depth),
                "measure": "memory",
                "view": view,
                "depth": depth,
                "tokens": tokens,
                "peak_none_mib": round(baseline_kib / 1024, 1),
                "peak_stats_mib": round(stats_kib / 1024, 1),
                "stats_over_none_mib": round((stats_kib - baseline_kib) / 1024, 1),
                "peak_entropy_mib": round(entropy_kib / 1024, 1),
                "explicit_map_one_block_mib": round(VIT_S16.heads * t * t * 4 / 2**20, 1),
                "explicit_maps_all_blocks_mib": round(depth * VIT_S16.heads * t * t * 4 / 2**20, 1),
                "seconds_none": round(baseline_s, 1),
                "seconds_stats": round(stats_s, 1),
                "seconds_entropy": round(entropy_s, 1),
                "device": device,
                **({"gpu_peak_none_mib": round(gpu_none / 1024, 1), "gpu_peak_stats_mib": round(gpu_stats / 1024, 1)} if gpu_stats else {}),
            },
            RECORDS,
            keep,
        )
        size *= 2


def blocks(root: Path, ckpt: Path, folder: Path, n: int, keep: bool, load: float, device: str = "cpu") -> None:
    last_s, _ = probe(
        "extract", str(ckpt), "--images", str(folder), "--views", "224", "--attention", "none", "--store", str(root / "last.zarr"), "--device", device, "-q", cwd=root
    )
    all_s, _ = probe(
        "extract",
        str(ckpt),
        "--images",
        str(folder),
        "--views",
        "224",
        "--attention",
        "none",
        "--blocks",
        "all",
        "--facets",
        "tokens",
        "--store",
        str(root / "all.zarr"),
        "--device",
        device,
        "-q",
        cwd=root,
    )
    emit(
        {
            **base(load),
            "measure": "blocks",
            "view": "224",
            "images": n,
            "seconds_last": round(last_s, 2),
            "seconds_all": round(all_s, 2),
            "ratio": round(last_s / all_s, 3),
            "disk_last_bytes_per_image": round(data_bytes(root / "last.zarr") / n),
            "disk_all_bytes_per_image": round(data_bytes(root / "all.zarr") / n),
            "device": device,
        },
        RECORDS,
        keep,
    )


def main() -> None:
    args = options(
        __doc__,
        {
            "images": "photographs (the sample photos, repeated)",
            "smallest": "smallest square view of --memory, px",
            "largest": "largest square view of --memory, px",
            "depth": "blocks of ViT-S/16 kept by --memory (12: all)",
        },
        RECORDS,
        disk=False,
        memory=False,
        blocks=False,
        images=8,
        smallest=256,
        largest=2048,
        depth=12,
        device="cpu",
    )
    from dataclasses import replace

    from probe_toolkit.demo.samples import sample_photos, write_checkpoint
    from probe_toolkit.store.architectures import VIT_S16

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="probe-plan-") as tmp:
        root = Path(tmp)
        ckpt = write_checkpoint(root / "vit-s16.pth", "dino-backbone", VIT_S16, seed=0)
        folder = root / "images"
        folder.mkdir()
        photos = sorted(sample_photos().glob("*.jpg"))
        for i in range(args.images):
            (folder / f"{i:03d}-{photos[i % len(photos)].name}").write_bytes(photos[i % len(photos)].read_bytes())
        if args.disk:
            disk(root, ckpt, folder, args.images, args.record, load)
        if args.memory:
            short = (
                ckpt if args.depth == VIT_S16.depth else write_checkpoint(root / f"vit-s16-{args.depth}.pth", "dino-backbone", replace(VIT_S16, depth=args.depth), seed=0)
            )
            memory(root, short, folder, (args.smallest, args.largest), args.record, load, args.device, args.depth)
        if args.blocks:
            blocks(root, ckpt, folder, args.images, args.record, load, args.device)
    print(json.dumps({"load_after": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
