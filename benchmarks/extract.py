"""Throughput of ``probe extract`` against a bare timm forward of the same ViT, in one run.

For each view (224: tokens + attention; 480: keys) the whole ``extract`` call is timed against
``vit.forward_features`` (timm's own fused attention) on already-decoded tensors of the same
images, with the same batch size and the same torch threads, in one process. Rounds are
interleaved (the order alternates) and medians compared, after one warm-up round, so a noisy
machine slows both sides alike. Three ratios per view:

- ``whole``: the whole call, fixed costs included (checkpoint read and sha256, building the
  network, creating the store) beside per-image work (decode, resize, forward with the readout
  hooks, float16, finiteness, zarr compression and writes);
- ``images``: the per-image work only (``Report.seconds["images"]``), fixed costs left out: what
  a large set converges to;
- ``cpu``: CPU seconds (every thread) of the bare forward over those of the whole call, which a
  machine shared with other work disturbs least.

The 224 view stores each head's attention over every token, which only an explicit softmax
forms (the bare forward's fused kernel never does): that is part of what is measured.

The bare forward runs in a process of its own, as a user's script would: glibc's allocator
there keeps its default rule (``mallopt`` settings are process-wide and cannot be undone, so it
must not share a process with the probe). The probe side runs under the command line's settings
(``probe`` pins glibc's mmap threshold at start-up, ``infra.memory.keep_memory_flat``; extraction
then reuses its blocks, ``infra.memory.reusing_blocks``). ``--bare-reuse`` gives the bare side
the same block reuse, which leaves the probe's own costs beside the forward.
On the CPU the probe's forward pass runs as one single-threaded stream per torch thread, each on
its share of a batch (``store.streams``); the bare side is timm's forward as a user calls it, every
operation split over torch's threads.

    python benchmarks/extract.py [--arch vit-s16|vit-s8|vit-b16|vit-b8|dinov2-s14-reg|dinov3-s16|dinov3-b16|...] [--full] [--threads 1] [--record]
    python benchmarks/extract.py --decoding [--images-224 96] [--rounds 3]
    python benchmarks/extract.py --budget [--arch vit-s16] [--images-224 64] [--rounds 3]
    python benchmarks/extract.py --host [--images-224 256] [--rounds 2] [--decoders 2]
    python benchmarks/extract.py --tolerance --device cuda [--images-224 32] [--arch vit-s16]

``--threads 1`` leaves one core of two free beside the forward pass, as every GPU node does.
``--device cuda`` (the default where a GPU is visible) runs both sides on the GPU: the bare
forward on tensors already decoded onto it, timed until its last batch finishes; extraction
decodes on the host's cores and copies each batch over, as it runs for users (on a GPU the
ratio says how much of the network's speed the whole pipeline keeps).
``--decoding`` measures what a fast (GPU) forward pass waits for: images decoded and cut per
second by extraction's own loading, on one thread against one per core (``--decoders``), and
images written per second by its writer, one run at a time against several at once.

``--host`` measures what a GPU's fast forward pass shares its process with: extraction of ViT-S/16's
arrays at 224 px (tokens, keys and each head's attention; ``--host-size 480``: keys; a network of ViT-S/16's shape with one
block, so the forward pass is small, as on a GPU) with images decoded and runs written on
threads against processes (``extract(processes=...)``, the default beside a GPU), in CPU
milliseconds per image of the command's own process: on a GPU that process's Python lock is what
the loop launching the network's kernels waits on. The stores must be byte-identical.

``--tolerance`` states how far a GPU's store lies from the CPU's: the same images extracted
(views 224 and 480, attention maps) on the CPU and on ``--device``, every array compared: the
largest difference over the array's largest magnitude, and the share of stored values that
differ. The CPU paths give the same bytes whatever their threads or processes (the tests hold
them); a GPU's kernels (cuDNN's TF32 convolution of the patch embedding, fused attention, another
summation order) round otherwise, so its store is equal within what this prints.

``--budget`` says where a CPU extraction's time goes at 224 px, per image in CPU milliseconds on
one thread, each stage alone: timm's bare forward, extraction's forward with its readout and
float16 copies (``forward_view``), decoding and cutting (``load_run``), and writing the run
(``StoreWriter.write_views``). Where the forward pass takes every core, decoding and writing can
only take cores from it, so bare forward / (extraction's forward + decoding + writing) bounds the
224 ratio there.

The default is a short run (8 images at 224 and 2 at 480, one timed round, under about a
minute for ViT-S/16 on two cores), where the fixed costs weigh on ``whole``; ``--full`` times
128 images at 224 and 32 at 480 over 3 rounds, where they are amortised.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from probe_toolkit.demo.samples import sample_photos, write_checkpoint
from probe_toolkit.infra.memory import keep_memory_flat, reusing_blocks
from probe_toolkit.store import images
from probe_toolkit.store.architectures import DINOV3_B16, DINOV3_RELEASED, DINOV3_S16, RELEASED
from probe_toolkit.store.backbone import Backbone
from probe_toolkit.store.checkpoints import load_checkpoint
from probe_toolkit.store.extract import SAVERS, Settings, extract

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import cpu_model, emit  # noqa: E402  (the benchmarks' shared record helpers)

RECORDS = Path(__file__).resolve().parent / "records" / "extract.jsonl"

# the released sizes, and DINOv3's (timm's Eva with RoPE: the bare side is that same timm model) by their
# registry names and the short names dinov3-s16 / dinov3-b16
ARCHS = {**RELEASED, **DINOV3_RELEASED, "dinov3-s16": DINOV3_S16, "dinov3-b16": DINOV3_B16}


def image_folder(root: Path, count: int) -> Path:
    folder = root / f"images-{count}"
    folder.mkdir()
    photos = sorted(sample_photos().glob("*.jpg"))
    for i in range(count):
        shutil.copy(photos[i % len(photos)], folder / f"{i:05d}-{photos[i % len(photos)].name}")
    return folder


def decoded(folder: Path, size: int, patch: int) -> torch.Tensor:
    """The bare side's input: the images decoded and cut as extract cuts them, before timing."""
    side = size // patch * patch  # timm wants whole patches (480 px at /14: 476)
    return torch.stack([images.views(images.load_image(r.path), (size,))[size][:, :side, :side] for r in images.list_images(folder)])


def bare_worker(connection, checkpoint: Path, plan: dict[int, tuple[Path, int]], threads: int | None, reuse: bool, device: str = "cpu") -> None:
    """The bare side's process: builds a timm model per view from the same file, decodes the
    inputs (onto ``device``, as a user's script that holds them there would), then runs
    ``bare_forward`` for each view it is sent until it is sent None."""
    from contextlib import nullcontext

    if threads:
        torch.set_num_threads(threads)
    loaded = load_checkpoint(checkpoint)
    bare, inputs = {}, {}
    for size, (folder, _) in plan.items():
        # the same weights, the same position table: a timm model built for this input size
        model = Backbone.from_checkpoint(loaded)
        vit = model.vit
        if loaded.arch.family != "dinov3":  # DINOv3's Eva computes RoPE per grid: any multiple of the patch as it is
            vit.pos_embed = torch.nn.Parameter(_pos(model, size))
            vit.patch_embed.strict_img_size = False
        bare[size] = vit.eval().to(device)
        inputs[size] = decoded(folder, size, loaded.arch.patch).to(device)
    with reusing_blocks() if reuse else nullcontext():
        connection.send("ready")
        while (size := connection.recv()) is not None:
            connection.send(bare_forward(bare[size], inputs[size], plan[size][1]))


def bare_forward(vit: torch.nn.Module, tensors: torch.Tensor, batch: int) -> dict[str, float]:
    """Images per second of timm's forward, wall and CPU (every thread); on a GPU, until its
    last batch has finished."""
    cuda = tensors.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(tensors.device)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for i in range(0, len(tensors), batch):
            vit.forward_features(tensors[i : i + batch])
    if cuda:
        torch.cuda.synchronize(tensors.device)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"wall": len(tensors) / wall, "cpu": len(tensors) / cpu}


def probe_extract(checkpoint: Path, folder: Path, size: int, batch: int, root: Path, tag: str, decoders: int | None = None, device: str = "cpu") -> dict[str, float]:
    """Images per second of ``extract`` into a new store on ``device``: whole call, per-image part, CPU."""
    settings = Settings(views=(size,), attention="last" if size == 224 else "none", chunk=batch)
    n = len(images.list_images(folder))
    start, cpu = time.perf_counter(), time.process_time()
    report = extract(checkpoint, folder, settings=settings, store=root / f"{tag}.zarr", batch_size=batch, decoders=decoders, quiet=True, device=device)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    shutil.rmtree(root / f"{tag}.zarr")
    seconds = getattr(report, "seconds", None) or {"images": wall, "setup": 0.0}  # (an older probe, for a before/after run)
    return {"wall": n / wall, "images": n / seconds["images"], "cpu": n / cpu, "setup_s": seconds["setup"]}


SHORT = {"images_224": 8, "images_480": 2, "rounds": 1}
FULL = {"images_224": 128, "images_480": 32, "rounds": 3}


def layout_of(name: str) -> str:
    arch = ARCHS[name]
    if arch.family == "dinov3":
        return "dinov3-official"
    return "dinov2-reg-backbone" if arch.registers else "dinov2-backbone" if arch.layerscale else "dino-backbone"


def decoding(count: int, rounds: int) -> None:
    """What a fast forward pass waits for: images decoded and cut per second by ``load_run``
    (extraction's own loading, runs of 16, the 224 and 480 views) on one decoding thread
    against one per core, interleaved rounds, medians; the decoded runs must be identical."""
    from concurrent.futures import ThreadPoolExecutor

    from probe_toolkit.store.extract_load import load_run

    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    settings = Settings(views=(224, 480))
    with tempfile.TemporaryDirectory() as tmp:
        refs = images.list_images(image_folder(Path(tmp), count))

        def decode_all(threads: int) -> tuple[float, list]:
            with reusing_blocks(), ThreadPoolExecutor(threads) as pool:  # as extraction's loop runs
                start = time.perf_counter()
                runs = [load_run(refs[a : a + 16], settings.names, settings, 16, None, "fail", pool) for a in range(0, len(refs), 16)]
                return len(refs) / (time.perf_counter() - start), runs

        rates: dict[int, list[float]] = {1: [], cores: []}
        for r in range(rounds + 1):  # round 0 warms up
            for n in (1, cores) if r % 2 else (cores, 1):
                rate, runs = decode_all(n)
                if r:
                    rates[n].append(rate)
        one, many = (statistics.median(rates[n]) for n in (1, cores))
        serial, parallel = decode_all(1)[1], decode_all(cores)[1]
        same = all(torch.equal(a.fixed[v][1], b.fixed[v][1]) for a, b in zip(serial, parallel) for v in a.fixed)
        write_one, write_many, written_same = writing(Path(tmp), count, rounds, cores)
    print(
        f"decoding and cutting images (224 + 480 views, {count} images, {rounds} rounds): 1 thread {one:.1f} img/s, "
        f"{cores} threads {many:.1f} img/s: {many / one:.2f}x; pixels identical: {same}"
    )
    print(
        f"writing runs of 16 (ViT-S/16 at 224 px: tokens + attention, float16, zstd): 1 run at a time {write_one:.1f} img/s, "
        f"{min(cores, SAVERS)} at once {write_many:.1f} img/s: {write_many / write_one:.2f}x; chunks identical: {written_same}"
    )
    print(
        json.dumps(
            {
                "benchmark": "extract-decoding",
                "images": count,
                "rounds": rounds,
                "threads": cores,
                "one_img_s": round(one, 2),
                "many_img_s": round(many, 2),
                "speedup": round(many / one, 3),
                "identical": same,
                "write_one_img_s": round(write_one, 2),
                "write_many_img_s": round(write_many, 2),
                "write_identical": written_same,
                "machine": f"{platform.processor() or platform.machine()}, {cores} cores",
            }
        )
    )


def budget(arch_name: str, count: int, rounds: int) -> None:
    """Per-image CPU milliseconds of each extraction stage at 224 px on one thread (``--budget``):
    interleaved rounds after a warm-up, medians; prints the bound they set on the 224 ratio when
    the forward pass takes every core."""
    import numpy as np

    from probe_toolkit.store import layout
    from probe_toolkit.store.create import create_store
    from probe_toolkit.store.extract_forward import forward_view
    from probe_toolkit.store.extract_load import load_run
    from probe_toolkit.store.extract_plan import plan_arrays

    torch.set_num_threads(1)
    arch = ARCHS[arch_name]
    settings = Settings(views=(224,), attention="last", chunk=16)
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp, reusing_blocks(), torch.inference_mode():
        root = Path(tmp)
        refs = images.list_images(image_folder(root, count))
        loaded = load_checkpoint(write_checkpoint(root / "random.pth", layout_of(arch_name), arch))
        backbone = Backbone.from_checkpoint(loaded).eval()
        vit = Backbone.from_checkpoint(loaded).vit.eval()
        runs = [load_run(refs[a : a + 16], ["224"], settings, arch.patch, None, "fail") for a in range(0, count, 16)]
        plan = plan_arrays(arch, settings)
        names = [name for name in plan if layout.view_of(name) == "224"]
        outputs = [forward_view(backbone, run.fixed["224"][1], names, settings, 16, cpu, lambda n: None) for run in runs]
        stores = iter(range(10**6))

        def write_all() -> None:
            writer = create_store(root / f"w{next(stores)}.zarr", {"chunk": 16, "dtype": "float16", "views": [224]}, [r.id for r in refs], plan)
            for a, out in zip(range(0, count, 16), outputs):
                n = len(next(iter(out.values())))
                writer.write_views(a, {"224": (out, np.zeros(n, bool))}, np.full((n, 2), 224))

        stages = {
            "bare forward": lambda: [vit.forward_features(run.fixed["224"][1]) for run in runs],
            "extraction's forward": lambda: [forward_view(backbone, run.fixed["224"][1], names, settings, 16, cpu, lambda n: None) for run in runs],
            "decoding and cutting": lambda: [load_run(refs[a : a + 16], ["224"], settings, arch.patch, None, "fail") for a in range(0, count, 16)],
            "writing": write_all,
        }
        times: dict[str, list[float]] = {name: [] for name in stages}
        for r in range(rounds + 1):  # round 0 warms up
            for name, stage in list(stages.items()) if r % 2 else list(stages.items())[::-1]:
                start = time.process_time()
                stage()
                if r:
                    times[name].append(1000 * (time.process_time() - start) / count)
    ms = {name: statistics.median(t) for name, t in times.items()}
    for name, value in ms.items():
        print(f"{name:24s} {value:7.2f} ms CPU per image (one thread, {count} images, {rounds} rounds)")
    forward = ms["extraction's forward"]
    bound = ms["bare forward"] / (forward + ms["decoding and cutting"] + ms["writing"])
    print(
        f"bound on the 224 ratio where the forward takes every core: {bound:.3f} (extraction's forward / bare forward on one thread: {forward / ms['bare forward']:.3f})"
    )
    print(
        json.dumps(
            {
                "benchmark": "extract-budget",
                "arch": arch_name,
                "images": count,
                "rounds": rounds,
                "ms_per_image": {k: round(v, 3) for k, v in ms.items()},
                "bound_224": round(bound, 3),
                "machine": f"{platform.processor() or platform.machine()}, 1 thread",
            }
        )
    )


def tolerance(arch_name: str, count: int, device: str) -> None:
    """``--tolerance``: the same images extracted on the CPU and on ``device``; for every array the
    largest difference over the largest magnitude, and the share of values that differ."""
    import numpy as np
    import zarr

    arch = ARCHS[arch_name]
    settings = Settings(views=(224, 480), attention="last", chunk=16)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = image_folder(root, count)
        checkpoint = write_checkpoint(root / "random.pth", layout_of(arch_name), arch)
        stores = {}
        for where in ("cpu", device):
            stores[where] = root / f"{where}.zarr"
            extract(checkpoint, folder, settings=settings, store=stores[where], quiet=True, device=where)
        groups = {where: zarr.open_group(path, mode="r") for where, path in stores.items()}
        for name in sorted(groups["cpu"].array_keys()):
            a, b = groups["cpu"][name][:], groups[device][name][:]
            if a.dtype.kind != "f":
                rows[name] = {"equal": bool(np.array_equal(a, b))}
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            scale = float(np.nanmax(np.abs(a64))) or 1.0
            rows[name] = {"max_abs_over_max": float(np.nanmax(np.abs(a64 - b64)) / scale), "share_differing": float(np.mean(a != b))}
    gpu = torch.cuda.get_device_name() if device == "cuda" else device
    for name, row in rows.items():
        print(
            f"{name:28s} "
            + (
                "equal"
                if row.get("equal")
                else "differ"
                if "equal" in row
                else f"largest difference {row['max_abs_over_max']:.2e} of the largest value; {100 * row['share_differing']:.1f} % of values differ"
            )
        )
    print(
        json.dumps(
            {
                "benchmark": "extract-tolerance",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "arch": arch_name,
                "images": count,
                "device": gpu,
                "torch": torch.__version__,
                "arrays": rows,
            }
        )
    )


def host(count: int, rounds: int, decoders: int, size: int = 224) -> None:
    """``--host``: CPU ms per image of the command's own process (and wall img/s) of extraction at
    224 px with attention, decoding and writing on threads against processes; interleaved rounds
    after a warm-up, medians; the stores' arrays must be byte-identical."""
    from dataclasses import replace

    import zarr

    torch.set_num_threads(1)
    arch = replace(RELEASED["vit-s16"], depth=1)  # ViT-S/16's arrays, one block's forward
    settings = Settings(views=(size,), attention="last" if size == 224 else "none", chunk=64)
    measured: dict[str, list[tuple[float, float]]] = {"threads": [], "processes": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = image_folder(root, count)
        checkpoint = write_checkpoint(root / "one-block.pth", "dino-backbone", arch)
        stores = {}
        for r in range(rounds + 1):  # round 0 warms up (and starts the forkserver)
            for mode in ("threads", "processes") if r % 2 else ("processes", "threads"):
                store = root / f"{mode}-{r}.zarr"
                start, cpu = time.perf_counter(), time.process_time()
                extract(checkpoint, folder, settings=settings, store=store, batch_size=64, decoders=decoders, processes=mode == "processes", quiet=True, device="cpu")
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                if r:
                    measured[mode].append((1000 * cpu / count, count / wall))
                stores[mode] = store
        # the forward pass alone (and its device copies), on the same decoded images: what is left is the host's part
        from probe_toolkit.store import layout
        from probe_toolkit.store.extract_forward import forward_view
        from probe_toolkit.store.extract_load import load_run
        from probe_toolkit.store.extract_plan import plan_arrays

        backbone = Backbone.from_checkpoint(load_checkpoint(checkpoint)).eval()
        names = [name for name in plan_arrays(arch, settings) if layout.view_of(name) == str(size)]
        refs = images.list_images(folder)
        runs = [load_run(refs[a : a + 64], [str(size)], settings, 16, None, "fail").fixed[str(size)][1] for a in range(0, count, 64)]
        forward = []
        with torch.inference_mode(), reusing_blocks():
            for r in range(rounds + 1):
                cpu = time.process_time()
                for pixels in runs:
                    forward_view(backbone, pixels, names, settings, 64, torch.device("cpu"), lambda n: None)
                if r:
                    forward.append(1000 * (time.process_time() - cpu) / count)
        groups = {mode: zarr.open_group(path, mode="r") for mode, path in stores.items()}
        same = sorted(groups["threads"].array_keys()) == sorted(groups["processes"].array_keys()) and all(
            groups["threads"][k][:].tobytes() == groups["processes"][k][:].tobytes() for k in groups["threads"].array_keys()
        )
    ms = {mode: statistics.median(m[0] for m in v) for mode, v in measured.items()}
    ms["forward"] = statistics.median(forward)
    host_ms = {mode: ms[mode] - ms["forward"] for mode in measured}
    rate = {mode: statistics.median(m[1] for m in v) for mode, v in measured.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for mode in measured:
        print(
            f"{mode:9s}: {ms[mode]:6.2f} ms CPU per image in the command's process, of which {host_ms[mode]:5.2f} beside the forward pass "
            f"({ms['forward']:.2f}); {rate[mode]:7.1f} img/s wall ({count} images at {size} px, {decoders} decoders, {rounds} rounds)"
        )
    print(f"the command's own CPU per image beside the forward pass, processes / threads: {host_ms['processes'] / host_ms['threads']:.3f}; stores byte-identical: {same}")
    print(
        json.dumps(
            {
                "benchmark": "extract-host",
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "size": size,
                "images": count,
                "rounds": rounds,
                "decoders": decoders,
                "own_cpu_ms_per_image": {k: round(v, 3) for k, v in ms.items()},
                "host_ms_per_image": {k: round(v, 3) for k, v in host_ms.items()},
                "img_s": {k: round(v, 2) for k, v in rate.items()},
                "identical": same,
                "machine": f"{platform.processor() or platform.machine()}, {cores} cores",
            }
        )
    )


def writing(root: Path, count: int, rounds: int, cores: int) -> tuple[float, float, bool]:
    """Images per second of ``StoreWriter.write_views`` (the extraction's writer) over runs of 16
    of one fixed float16 payload, one run at a time against ``min(cores, SAVERS)`` at once, into
    fresh stores; the stores' chunks must be byte-identical."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from probe_toolkit.store.create import create_store
    from probe_toolkit.store.extract_plan import plan_arrays

    arch, settings = RELEASED["vit-s16"], Settings(views=(224,))
    plan = plan_arrays(arch, settings)
    rng = np.random.default_rng(0)
    data = {name: rng.random((16, *shape), dtype=np.float32).astype(np.float16) for name, (_, shape) in plan.items()}
    ids = [f"{i:05d}" for i in range(count)]
    savers = min(cores, SAVERS)

    def write_all(threads: int, tag: str) -> float:
        store = root / f"w{tag}.zarr"
        writer = create_store(store, {"chunk": 16, "dtype": "float16", "views": [224]}, ids, plan)
        runs = range(0, count, 16)
        with reusing_blocks(), ThreadPoolExecutor(threads) as pool:
            start = time.perf_counter()
            list(
                pool.map(
                    lambda a: writer.write_views(
                        a, {"224": ({k: v[: min(16, count - a)] for k, v in data.items()}, np.zeros(min(16, count - a), bool))}, np.full((min(16, count - a), 2), 224)
                    ),
                    runs,
                )
            )
            return count / (time.perf_counter() - start)

    rates: dict[int, list[float]] = {1: [], savers: []}
    for r in range(rounds + 1):
        for n in (1, savers) if r % 2 else (savers, 1):
            rate = write_all(n, f"{n}-{r}")
            if r:
                rates[n].append(rate)
    chunks = [
        sorted(
            (p.relative_to(root / f"w{n}-1.zarr"), p.read_bytes())
            for p in (root / f"w{n}-1.zarr").rglob("*")
            if p.is_file() and "c" in p.relative_to(root / f"w{n}-1.zarr").parts
        )
        for n in (1, savers)
    ]
    return statistics.median(rates[1]), statistics.median(rates[savers]), bool(chunks[0]) and chunks[0] == chunks[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=list(ARCHS), default="vit-s16", help="released size, random weights in its own layout")
    parser.add_argument("--full", action="store_true", help="the long run (128 + 32 images, 3 rounds)")
    parser.add_argument("--images-224", type=int, default=None)
    parser.add_argument("--images-480", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads on both sides (default: torch's own); 1 measures CPU work cleanly on a shared machine")
    parser.add_argument("--bare-reuse", action="store_true", help="the bare side reuses freed blocks as extraction does (infra.memory.reusing_blocks)")
    parser.add_argument("--decoding", action="store_true", help="images decoded and cut per second: one thread against one per core")
    parser.add_argument("--host", action="store_true", help="CPU per image of the command's own process: decoding and writing on threads against processes")
    parser.add_argument("--decoders", type=int, default=2, help="--host: decoding threads or processes")
    parser.add_argument("--host-size", type=int, choices=(224, 480), default=224, help="--host: the view (224: tokens, keys, attention; 480: keys)")
    parser.add_argument("--budget", action="store_true", help="per-image CPU of each stage at 224 px on one thread, and the bound they set")
    parser.add_argument("--tolerance", action="store_true", help="the same images extracted on the CPU and on --device, every array compared")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="both sides' device (auto: a visible GPU, else the CPU); the bare side's inputs wait on it already decoded",
    )
    parser.add_argument("--batch", type=int, default=None, help="images per forward pass on both sides (default 16 at 224, 8 at 480)")
    parser.add_argument("--record", action="store_true", help="append the JSON line to benchmarks/records/extract.jsonl")
    args = parser.parse_args()
    keep_memory_flat()  # as the command line does (probe_toolkit.cli.main)
    if args.decoding:
        return decoding(args.images_224 or 96, args.rounds or 3)
    if args.host:
        return host(args.images_224 or 256, args.rounds or 2, args.decoders, args.host_size)
    if args.budget:
        return budget(args.arch, args.images_224 or 64, args.rounds or 3)
    if args.tolerance:
        return tolerance(args.arch, args.images_224 or 32, "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    mode = FULL if args.full else SHORT
    n224 = args.images_224 if args.images_224 is not None else mode["images_224"]
    n480 = args.images_480 if args.images_480 is not None else mode["images_480"]
    rounds = args.rounds if args.rounds is not None else mode["rounds"]
    arch = ARCHS[args.arch]
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = write_checkpoint(root / f"{args.arch}_random.pth", layout_of(args.arch), arch)
        plan = {224: (image_folder(root, n224), min(args.batch or 16, n224)), 480: (image_folder(root, n480), min(args.batch or 8, n480))}
        ours, theirs = multiprocessing.get_context("spawn").Pipe()
        worker = multiprocessing.get_context("spawn").Process(target=bare_worker, args=(theirs, checkpoint, plan, args.threads, args.bare_reuse, device), daemon=True)
        worker.start()
        assert ours.recv() == "ready"

        def bare_side(size: int) -> dict[str, float]:
            ours.send(size)
            return ours.recv()

        results: dict[int, dict[str, list[dict[str, float]]]] = {s: {"probe": [], "bare": []} for s in plan}
        for r in range(rounds + 1):  # round 0 warms up
            for size, (folder, batch) in plan.items():
                sides = [
                    ("bare", lambda size=size: bare_side(size)),
                    ("probe", lambda size=size, folder=folder, batch=batch, r=r: probe_extract(checkpoint, folder, size, batch, root, f"s{size}-r{r}", device=device)),
                ]
                for side, run in sides if r % 2 else sides[::-1]:  # the order alternates
                    measured = run()
                    if r:
                        results[size][side].append(measured)
        ours.send(None)
        worker.join()
    line = {
        "benchmark": "extract",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "arch": args.arch,
        "mode": "full" if args.full else "short",
        "images_224": n224,
        "images_480": n480,
        "rounds": rounds,
        "machine": f"{cpu_model()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "bare_allocator": "reusing blocks" if args.bare_reuse else "glibc default",
    }
    for size, res in results.items():
        med = {side: {k: statistics.median(m[k] for m in res[side]) for k in res[side][0]} for side in res}
        probe, base = med["probe"], med["bare"]
        ratios = {"whole": probe["wall"] / base["wall"], "images": probe["images"] / base["wall"], "cpu": probe["cpu"] / base["cpu"]}
        print(
            f"{args.arch} {size} px: probe extract {probe['wall']:.2f} img/s whole ({probe['images']:.2f} per-image part, setup {probe['setup_s']:.2f} s), "
            f"bare timm forward {base['wall']:.2f} img/s; ratios whole {ratios['whole']:.2f}, images {ratios['images']:.2f}, cpu {ratios['cpu']:.2f}"
        )
        line[f"ratio_{size}"] = round(ratios["whole"], 3)
        line[f"ratio_{size}_images"] = round(ratios["images"], 3)
        line[f"ratio_{size}_cpu"] = round(ratios["cpu"], 3)
        line[f"probe_{size}_img_s"] = round(probe["wall"], 3)
        line[f"probe_{size}_setup_s"] = round(probe["setup_s"], 3)
        line[f"bare_{size}_img_s"] = round(base["wall"], 3)
    line["load"] = round(os.getloadavg()[0], 2)  # the 1-minute load at the end: a shared machine's ratio says so
    emit(line, RECORDS, args.record)


def _pos(model: Backbone, size: int) -> torch.Tensor:
    from probe_toolkit.store.backbone import interpolate_pos_embed

    return interpolate_pos_embed(model.vit.pos_embed.detach(), size // model.arch.patch, model.arch.pos_prefix, model.interpolation)


if __name__ == "__main__":
    main()
