"""A scale run anyone can repeat on a CPU: synthetic panels of 1 k, 10 k and 100 k images, a tiny network, extract → knn → decode → hummingbird → segment.

Each size is one folder under ``--root`` (kept between runs: a size already done is read back, a
size stopped half-way resumes where it stopped, as ``probe extract`` resumes a store): a VOC2012
layout of synthetic scenes (``JPEGImages/``, ``SegmentationClass/``, ``ImageSets/Segmentation``
with 80 % train and 20 % val), two COCO files over the same images (each image's box and class,
for ``probe knn``'s panels), a tiny random network (width 32, depth 1, patch 32: a small store,
about 60 KB an image), and four commands run as a user runs them, each a fresh ``probe`` process:

1. ``probe extract`` of every image in the views the three protocols read (224; 480; hbird512
   and one augmented memory view);
2. ``probe knn`` (COCO panels: each image's largest category), k = 10, 20;
3. ``probe decode --preset tokencut`` (label-free, every image);
4. ``probe hummingbird`` (the VOC panels) with the published 1024·10² memory and one
   augmentation epoch;
5. ``probe segment`` (the VOC panels; 20 iterations of 4 crops, windows of 32 px: what grows with
   the set is reading the train panel's label maps, a portion at a time after one ledger entry
   that hashes them all, and scoring every val image), timed per image of the whole set.

For each command: wall seconds per image of the set (the whole set for extract and decode, the
val images for knn and hummingbird), CPU seconds per image (every process of the run: with ``--dask`` the
cluster's workers too, whose share is their CPU time's difference around the command), the peak
memory of the command's whole process tree (the largest sum of resident sets, sampled every 0.2 s
with psutil) and of its largest process. The tree's peak counts the worker processes a run starts,
which is fewer on a small set (k-NN's 200 val images of the 1 k set are one block, computed in the
command's own process; 2,000 are two, on two workers), so the flat-scale target holds each
per-image time and each process's peak within 1.3× from 1 k to 100 k. k-NN's exact search is O(train) per query: its per-image time grows with the set by
design (a few microseconds per train image here), and is printed, not held to the target; its
panels here are COCO files, read an entry at a time keeping each image's class
(``labels/coco_classes.py``), and the label-hygiene files (``labels/hash_files.py``) likewise; the
ids it keeps for its record are fixed-width text, and the folder listings and label reads are let
go before the search, so what grows with the set is a few bytes of id per image.

``--dask`` runs knn, decode and hummingbird on a dask.distributed cluster of local workers (one
thread each, ``--workers`` of them, dask's worker profiler off: it keeps an hour of stack samples,
so a worker grows with the run's length) instead of local processes; the cluster's workers are the
process tree's too (segment has no cluster placement: its ``--workers`` decoding threads stay in
its process). ``--sizes`` picks the sizes (default 1000,10000; 100000 on a machine with the
hours it takes: about an hour of extraction alone on two quiet cores). ``--stages`` picks the
commands (default all five; extract runs first where a size has no store yet, as the others read it)
and the record holds only those.

    python benchmarks/scale.py [--root /tmp/probe-scale] [--sizes 1000,10000] [--stages knn,decode] [--again] [--dask] [--record]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit, header, options  # noqa: E402

RECORDS = Path(__file__).resolve().parent / "records" / "scale.jsonl"
SIDE = (64, 48)  # synthetic photographs' width, height
CLASSES = 20  # VOC's object classes (label 0 is the background)
VIEWS = "224,480,hbird512,hbird512_aug0"
MEMORY = 102400  # open-hummingbird-eval's first published memory size (1024·10²)
STAGES = ("extract", "knn", "decode", "hummingbird", "segment")


def scene(i: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int], int]:
    """Image i: (pixels, label map, box (x, y, w, h), class), from its own generator."""
    rng = np.random.default_rng(i)
    w, h = SIDE
    cls = int(rng.integers(1, CLASSES + 1))
    pixels = rng.normal(110, 25, (h, w, 3))
    label = np.zeros((h, w), np.uint8)
    bw, bh = int(rng.integers(16, 40)), int(rng.integers(12, 32))
    x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
    label[y : y + bh, x : x + bw] = cls
    pixels[y : y + bh, x : x + bw] = ((cls * 47) % 256, (cls * 91) % 256, (cls * 23) % 256)
    return pixels.clip(0, 255).astype(np.uint8), label, (x, y, bw, bh), cls


def write_data(folder: Path, n: int) -> None:
    """The VOC layout and the two COCO files of ``n`` scenes (skipped when already written)."""
    from PIL import Image

    done = folder / "data.done"
    if done.exists():
        return
    voc = folder / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True, exist_ok=True)
    ids = [f"s{i:06d}" for i in range(n)]
    split = int(0.8 * n)
    coco = {"train": {"images": [], "annotations": []}, "val": {"images": [], "annotations": []}}
    for i, name in enumerate(ids):
        pixels, label, box, cls = scene(i)
        Image.fromarray(pixels).save(voc / "JPEGImages" / f"{name}.jpg", quality=90)
        Image.fromarray(label, mode="L").save(voc / "SegmentationClass" / f"{name}.png")
        part = coco["train" if i < split else "val"]
        part["images"].append({"id": i + 1, "file_name": f"{name}.jpg", "width": SIDE[0], "height": SIDE[1]})
        part["annotations"].append({"id": i + 1, "image_id": i + 1, "category_id": cls, "bbox": [float(v) for v in box], "area": float(box[2] * box[3]), "iscrowd": 0})
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("".join(f"{name}\n" for name in ids[:split]))
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_text("".join(f"{name}\n" for name in ids[split:]))
    categories = [{"id": c, "name": f"class{c}"} for c in range(1, CLASSES + 1)]
    for role, part in coco.items():
        (folder / f"coco-{role}.json").write_text(json.dumps({**part, "categories": categories}))
    done.write_text(str(n))


class TreeMemory:
    """The largest sum of resident sets of a process and its descendants, and the largest resident
    set of any one of them, sampled in a thread."""

    def __init__(self, pid: int, also: list[int] | None = None):
        import psutil

        self.roots = [psutil.Process(pid)] + [psutil.Process(p) for p in (also or [])]
        self.peak = self.largest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for root in self.roots:
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                    except psutil.Error:
                        continue
                    total += rss
                    self.largest = max(self.largest, rss)
            self.peak = max(self.peak, total)
            self._stop.wait(0.2)

    def stop(self) -> tuple[float, float]:
        """(the tree's peak, the largest process's peak), MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20, self.largest / 2**20


def cluster_cpu(pids: list[int]) -> float:
    """CPU seconds used so far by a dask cluster's worker processes (``pids``) and their
    descendants: they outlive each command, so ``RUSAGE_CHILDREN`` (which counts children once
    they are waited for) never sees them, and a stage's share is the difference around it."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def timed(args: list[str], env: dict, also: list[int] | None = None) -> dict:
    """(wall s, CPU s of the command's processes and of the cluster's workers ``also``, peak MiB of
    its process tree and of its largest process) of one ``probe`` run."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cluster_before = cluster_cpu(also or [])
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "probe_toolkit", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = TreeMemory(proc.pid, also)
    out, err = proc.communicate()
    peak, largest = memory.stop()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"probe {' '.join(args)} failed ({proc.returncode}): {err[-1500:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) + cluster_cpu(also or []) - cluster_before
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_mib": round(peak, 1), "process_peak_mib": round(largest, 1)}


def run_size(
    root: Path, n: int, env: dict, workers: int, dask_address: str | None, cluster_pids: list[int], chosen: tuple[str, ...] = STAGES, again: bool = False
) -> dict:
    """Every stage at one size; a stage whose result is in ``stages.json`` is not run again (unless ``again`` and chosen)."""
    from dataclasses import replace

    from probe_toolkit.demo.samples import TINY, write_checkpoint

    folder = root / f"n{n}"
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    write_data(folder, n)
    data_s = time.perf_counter() - start
    checkpoint = folder / "tiny.pth"
    if not checkpoint.exists():
        write_checkpoint(checkpoint, "dino-full", replace(TINY, width=32, depth=1, heads=1, patch=32, mlp_hidden=64, pos_grid=7), seed=0)
    cache, store = folder / "cache", folder / "store.zarr"
    voc = folder / "VOC2012"
    if not (cache / "panels.toml").exists():
        for name, args in (
            ("voc-train", ["--voc-segmentation", voc, "--split", "train", "--role", "train"]),
            ("voc-val", ["--voc-segmentation", voc, "--split", "val", "--role", "val"]),
            ("coco-train", ["--annotations", folder / "coco-train.json", "--images", voc / "JPEGImages", "--role", "train"]),
            ("coco-val", ["--annotations", folder / "coco-val.json", "--images", voc / "JPEGImages", "--role", "val"]),
        ):
            subprocess.run(
                [sys.executable, "-m", "probe_toolkit", "panel", "add", name, *map(str, args), "--cache", str(cache)], env=env, check=True, capture_output=True
            )
    stages_file = folder / ("stages-dask.json" if dask_address else "stages.json")
    stages = json.loads(stages_file.read_text()) if stages_file.exists() else {}
    place = ["--dask-address", dask_address] if dask_address else ["--workers", str(workers)]
    val = n - int(0.8 * n)
    plan = {
        "extract": (
            [
                "extract",
                str(checkpoint),
                "--images",
                str(voc / "JPEGImages"),
                "--views",
                VIEWS,
                "--attention",
                "none",
                "--store",
                str(store),
                "--device",
                "cpu",
                "-q",
                "--cache",
                str(cache),
            ],
            n,
        ),
        "knn": (["knn", str(store), "--train", "coco-train", "--val", "coco-val", "--k", "10,20", "-q", "--cache", str(cache), *place], val),
        "decode": (["decode", str(store), "--preset", "tokencut", "-q", "--cache", str(cache), *place], n),
        "hummingbird": (
            [
                "hummingbird",
                str(store),
                "--train",
                "voc-train",
                "--val",
                "voc-val",
                "--memory",
                str(MEMORY),
                "--augmentation-epochs",
                "1",
                "-q",
                "--cache",
                str(cache),
                *place,
            ],
            val,
        ),
        "segment": (
            [
                "segment",
                str(checkpoint),
                "--train",
                "voc-train",
                "--val",
                "voc-val",
                "--store",
                str(store),
                *("--crop", "32", "--size", "32", "--stride", "21", "--iterations", "20", "--batch-size", "4"),
                *("--device", "cpu", "--workers", str(workers), "-q", "--cache", str(cache)),
            ],
            n,
        ),
    }
    if dask_address:
        stages.setdefault("extract", json.loads((folder / "stages.json").read_text())["extract"] if (folder / "stages.json").exists() else None)
    for name, (args, images) in plan.items():
        if (stages.get(name) and not (again and name in chosen)) or (name not in chosen and (name != "extract" or (folder / "store.zarr").exists())):
            continue
        if name == "extract" and store.exists():  # a finished store extracts nothing: timed, it would say 1 ms an image
            shutil.rmtree(store)  # (the benchmark's own store; the later stages read the one made now)
        found = timed(args, env, cluster_pids if dask_address and name != "extract" else None)
        stages[name] = {
            **found,
            "images": images,
            "wall_ms_per_image": round(1e3 * found["wall_s"] / images, 3),
            "cpu_ms_per_image": round(1e3 * found["cpu_s"] / images, 3),
        }
        stages_file.write_text(json.dumps(stages, indent=1))  # a later run resumes after the last finished stage
        print(
            f"  n = {n:,}: {name:12s} {stages[name]['wall_ms_per_image']:8.2f} ms/image wall, {stages[name]['cpu_ms_per_image']:8.2f} ms/image CPU, "
            f"peak {stages[name]['peak_mib']:8.1f} MiB (largest process {stages[name]['process_peak_mib']:8.1f}; {images:,} images)",
            flush=True,
        )
    return {"n": n, "data_s": round(data_s, 1), "stages": {name: stages.get(name) for name in chosen}}


def main() -> None:
    args = options(
        __doc__,
        {
            "root": "folder of the runs (kept: sizes done are read back)",
            "sizes": "comma-separated image counts",
            "dask": "knn, decode and hummingbird on a local dask cluster",
            "workers": "local processes or dask workers",
            "stages": f"comma-separated commands of {','.join(STAGES)} (a size's finished ones are read back)",
            "again": "run the chosen stages again where a size has them (after a change to the code they run)",
        },
        RECORDS,
        root="/tmp/probe-scale",
        sizes="1000,10000",
        stages=",".join(STAGES),
        again=False,
        dask=False,
        workers=2,
        note="",
    )
    chosen = tuple(args.stages.split(","))
    if set(chosen) - set(STAGES):
        raise SystemExit(f"--stages: {', '.join(sorted(set(chosen) - set(STAGES)))} is none of {', '.join(STAGES)}")
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    sizes = [int(s) for s in args.sizes.split(",")]
    cluster = client = None
    pids: list[int] = []
    if args.dask:
        import dask
        from distributed import Client, LocalCluster

        # dask's own statistical profiler samples each worker's stack every 10 ms and keeps an
        # hour of it: a worker's memory then grows with the run's length (decode at 100 k images: about
        # 10 MiB a minute), whatever the task. Off, so that the record measures probe's memory.
        dask.config.set({"distributed.worker.profile.enabled": False})
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        pids = [int(p) for p in client.run(os.getpid).values()]
    try:
        results = [run_size(root, n, env, args.workers, cluster.scheduler_address if cluster else None, pids, chosen, args.again) for n in sizes]
    finally:
        if client is not None:
            client.close()
            cluster.close()
    print(
        f"per-image time and peak memory against the smallest size ({sizes[0]:,}); target: within 1.3× ({cpu_model()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}{', dask cluster' if args.dask else ''})"
    )
    base = results[0]["stages"]
    for r in results[1:]:
        for name, s in r["stages"].items():
            if not s or not base.get(name):
                continue
            per = "process_peak_mib" if "process_peak_mib" in s and "process_peak_mib" in base[name] else "peak_mib"
            t, m = s["cpu_ms_per_image"] / base[name]["cpu_ms_per_image"], s[per] / base[name][per]
            note = " (exact k-NN: O(train) per query, not held to the target)" if name == "knn" else ("" if max(t, m) <= 1.3 else "  OVER 1.3x")
            print(f"  n = {r['n']:>7,} {name:12s} CPU per image {t:5.2f}×, peak memory {m:5.2f}× ({'largest process' if per != 'peak_mib' else 'tree'}){note}")
    emit(
        {
            **header("scale"),
            "dask": bool(args.dask),
            "cpu_counts": "the command's processes and the dask cluster's workers" if args.dask else "the command's processes",
            **({"dask_worker_profiler": False} if args.dask else {}),
            "workers": args.workers,
            "stages": list(chosen),
            "views": VIEWS,
            "memory": MEMORY,
            "network": "tiny DINO (width 32, depth 1, patch 32), random weights",
            "sizes": results,
            **({"note": args.note} if args.note else {}),
        },
        RECORDS,
        args.record,
    )


if __name__ == "__main__":
    main()
