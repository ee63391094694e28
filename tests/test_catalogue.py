"""The catalogue of bad inputs and faults: every case drives the real CLI (``cli.main``, in this
process) and asserts what README's "Guarantees" promise:

- the exit status (2 bad input, 1 integrity failure, 130 interrupted);
- exactly one line on stderr, naming the file or option, and no traceback;
- nothing left behind that a rerun or another command would read (the cache, the store and the
  output folders are as they were, apart from lock files and temporary names the next run sweeps);
- the rerun with the corrected input succeeds (exit 0).

Fixtures are built once per module: a tiny checkpoint, four small synthetic scenes, one store,
a train and a val panel. Cluster cases run on a real local dask cluster (threads, one process).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shlex
import shutil
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import fix_commands
import numpy as np
import pytest
from conftest import scenes_folder

from probe_toolkit import cli
from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.infra import cluster as cluster_side
from probe_toolkit.infra import litter
from probe_toolkit.infra.runner import Where, per_image
from probe_toolkit.results import records
from probe_toolkit.store import cache, create, writer
from probe_toolkit.store.checkpoint_files import sha256_file

# ----------------------------------------------------------------------------------------------
# running the CLI in this process


@dataclass
class Result:
    code: int | str
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def probe(*args, env: dict[str, str] | None = None) -> Result:
    """``probe ARGS`` through ``cli.main`` (exit status, stdout, stderr); a traceback is a result too."""
    out, err = io.StringIO(), io.StringIO()
    argv, saved = sys.argv, {k: os.environ.get(k) for k in (env or {})}
    sys.argv = ["probe", *map(str, args)]
    os.environ.update(env or {})
    code: int | str = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            cli.main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - a traceback is what the catalogue exists to catch
        err.write(traceback.format_exc())
        code = "traceback"
    finally:
        sys.argv = argv
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Result(code, out.getvalue(), err.getvalue())


def tree(*roots: Path) -> dict[str, int]:
    """Every path under ``roots`` with its size (lock files aside: they hold nothing)."""
    found = {}
    for root in roots:
        if root.is_file():
            found[str(root)] = root.stat().st_size
        elif root.is_dir():
            for path in root.rglob("*"):
                if not path.name.endswith(".lock"):
                    found[str(path)] = path.stat().st_size if path.is_file() else -1
    return found


def litter_in(*roots: Path) -> list[str]:
    return [p for p in tree(*roots) if any(litter.is_litter(part) for part in Path(p).parts)]


# ----------------------------------------------------------------------------------------------
# the module's world: checkpoint, scenes, store, panels

SCENES = {  # name: ((width, height), boxes)
    "a.png": ((96, 80), [(16, 16, 64, 56)]),
    "b.png": ((80, 96), [(8, 24, 56, 88)]),
    "c.png": ((112, 80), [(40, 8, 96, 64)]),
    "d.png": ((80, 80), [(8, 8, 40, 40), (48, 48, 72, 72)]),
}


def coco(names: list[str], **changes) -> dict:
    data = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "box"}]}
    for i, name in enumerate(names, 1):
        (w, h), boxes = SCENES[name]
        data["images"].append({"id": i, "file_name": name, "width": w, "height": h})
        for x0, y0, x1, y1 in boxes:
            data["annotations"].append(
                {
                    "id": len(data["annotations"]) + 1,
                    "image_id": i,
                    "category_id": 1,
                    "iscrowd": 0,
                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                }
            )
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalogue")
    images = scenes_folder(root, SCENES)
    small = root / "small"
    small.mkdir()
    for name in ("a.png", "b.png"):
        shutil.copy(images / name, small / name)
    world = SimpleNamespace(root=root, images=images, small=small, cache=root / "cache", ckpt=write_checkpoint(root / "tiny.pth", "dino-full", TINY, seed=0))
    world.count = iter(range(10_000))
    world.fresh = lambda stem="s": root / "stores" / f"{stem}-{next(world.count)}" / "teacher.zarr"
    q = ["--cache", world.cache, "-q"]
    world.q = q
    made = probe("extract", world.ckpt, "--images", images, "--views", "224,480", "--chunk", "2", "--batch-size", "2", *q)
    assert made.code == 0, made.err
    world.store = cache.store_path(world.cache, world.ckpt.stem, sha256_file(world.ckpt), "teacher")
    (root / "train.json").write_text(json.dumps(coco(["a.png", "b.png"])))
    (root / "val.json").write_text(json.dumps(coco(["c.png", "d.png"])))
    for name, role in (("tr", "train"), ("va", "val"), ("sealed", "test")):
        source = "train.json" if role == "train" else "val.json"
        folder = images
        if role == "test":  # other pixels under the val panel's names: no panel shares an image with another role
            folder = root / "held"
            folder.mkdir()
            from PIL import Image

            for n in ("c.png", "d.png"):
                Image.open(images / n).transpose(Image.Transpose.ROTATE_180).save(folder / n)
        assert probe("panel", "add", name, "--annotations", root / source, "--images", folder, "--role", role, "--cache", world.cache).code == 0
    assert probe("decode", world.store, "--panel", "va", *q).code == 0
    world.masks = world.store / "results" / "decoder-masks.json"
    yield world
    for cluster in getattr(world, "clusters", []):
        cluster.close()


# ----------------------------------------------------------------------------------------------
# the cases

Args = Callable[[SimpleNamespace], list]


@dataclass
class Case:
    id: str
    bad: Args
    code: int
    needles: tuple[str, ...]
    fix: Args | None
    setup: Callable | None = None  # (w, monkeypatch) -> None, undone before the fix
    after: Callable | None = None  # (w) -> None, the user's correction between the two runs
    xfail: str | None = None
    resumable: bool = False  # the failed run may leave a consistent, unfinished store that the rerun completes
    printed_fix: bool = False  # the line's own command is the fix: run as printed (it must succeed) before ``after`` and the rerun
    roots: Callable[[SimpleNamespace], list[Path]] = field(default=lambda w: [w.cache, w.root / "stores", w.root / "out"])


def extract(w, *more, store=None, images=None):
    return ["extract", w.ckpt, "--images", images or w.small, "--views", "224", "--store", store or w.fresh(), *more, *w.q]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def panel_file(name: str, data) -> Callable:
    """A val panel whose annotation file broke after it was registered (``data``: dict, or raw
    text): ``panel add`` checks the file field by field, so it is added sound and then overwritten."""

    def setup(w, monkeypatch):
        path = w.root / "bad" / f"{name}.json"
        write(path, (w.root / "val.json").read_text())
        assert probe("panel", "add", name, "--annotations", path, "--images", w.images, "--role", "val", "--replace", "--cache", w.cache).code == 0
        write(path, data if isinstance(data, str) else json.dumps(data))

    return setup


def repair_panel(name: str) -> Callable:
    def after(w):
        assert probe("panel", "add", name, "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--replace", "--cache", w.cache).code == 0

    return after


CASES = [
    # --- probe extract: options ---
    Case("batch-size-0", lambda w: extract(w, "--batch-size", "0"), 2, ("--batch-size",), lambda w: extract(w, "--batch-size", "2")),
    Case("batch-size-negative", lambda w: extract(w, "--batch-size", "-4"), 2, ("--batch-size",), lambda w: extract(w, "--batch-size", "2")),
    Case("chunk-0", lambda w: extract(w, "--chunk", "0"), 2, ("--chunk",), lambda w: extract(w, "--chunk", "2")),
    Case("decoders-0", lambda w: extract(w, "--decoders", "0"), 2, ("--decoders",), lambda w: extract(w, "--decoders", "2")),
    Case("limit-negative", lambda w: extract(w, "--limit", "-1"), 2, ("--limit",), lambda w: extract(w, "--limit", "1")),
    Case("views-unknown", lambda w: extract(w, "--views", "123"), 2, ("--views",), lambda w: extract(w)),
    Case("dtype-unknown", lambda w: extract(w, "--dtype", "float64"), 2, ("--dtype",), lambda w: extract(w, "--dtype", "float32")),
    Case("attention-unknown", lambda w: extract(w, "--attention", "some"), 2, ("--attention",), lambda w: extract(w, "--attention", "none")),
    Case("interp-unknown", lambda w: extract(w, "--interp", "nearest"), 2, ("--interp",), lambda w: extract(w, "--interp", "timm")),
    Case("on-error-unknown", lambda w: extract(w, "--on-error", "maybe"), 2, ("--on-error",), lambda w: extract(w, "--on-error", "skip")),
    Case("shard-out-of-range", lambda w: extract(w, "--shard", "3/2"), 2, ("shard 3/2",), lambda w: extract(w, "--shard", "0/1")),
    Case("shard-not-i-n", lambda w: extract(w, "--shard", "half"), 2, ("--shard",), lambda w: extract(w, "--shard", "0/1")),
    Case("network-unknown", lambda w: extract(w, "--network", "pupil"), 2, ("pupil",), lambda w: extract(w, "--network", "student")),
    Case("device-unknown", lambda w: extract(w, "--device", "tpu"), 2, ("--device",), lambda w: extract(w, "--device", "cpu")),
    Case("device-cuda-without-gpu", lambda w: extract(w, "--device", "cuda"), 2, ("--device cuda",), lambda w: extract(w, "--device", "cpu")),
    Case("neither-images-nor-panel", lambda w: ["extract", w.ckpt, "--store", w.fresh(), *w.q], 2, ("--images",), lambda w: extract(w)),
    Case("both-images-and-panel", lambda w: extract(w, "--panel", "va"), 2, ("--panel",), lambda w: extract(w)),
    Case(
        "panel-unknown",
        lambda w: ["extract", w.ckpt, "--panel", "nope", "--store", w.fresh(), *w.q],
        2,
        ("nope",),
        lambda w: ["extract", w.ckpt, "--panel", "va", "--views", "224", "--store", w.fresh(), *w.q],
    ),
    # --- probe extract: paths ---
    Case(
        "store-is-a-file",
        lambda w: extract(w, store=write(w.root / "out" / "file.zarr", "x")),
        2,
        ("file.zarr", "is a file"),
        lambda w: extract(w),
        after=lambda w: (w.root / "out" / "file.zarr").unlink(),
    ),
    Case(
        "cache-root-is-a-file",
        lambda w: ["extract", w.ckpt, "--images", w.small, "--views", "224", "--cache", write(w.root / "out" / "cachefile", "x"), "-q"],
        2,
        ("cachefile", "is a file"),
        lambda w: ["extract", w.ckpt, "--images", w.small, "--views", "224", "--cache", w.root / "out" / "cache2", "-q"],
    ),
    Case(
        "probe-cache-env-is-a-file",
        lambda w: ["panel", "list"],
        2,
        ("envfile", "PROBE_CACHE"),
        lambda w: ["panel", "list", "--cache", w.cache],
        setup=lambda w, mp: mp.setenv("PROBE_CACHE", str(write(w.root / "out" / "envfile", "x"))),
    ),
    Case("images-folder-missing", lambda w: extract(w, images=w.root / "nowhere"), 2, ("nowhere",), lambda w: extract(w)),
    Case(
        "images-folder-empty",
        lambda w: extract(w, images=w.root / "out" / "empty"),
        2,
        ("empty",),
        lambda w: extract(w),
        setup=lambda w, mp: (w.root / "out" / "empty").mkdir(parents=True, exist_ok=True),
    ),
    Case(
        "corrupt-image",
        lambda w: extract(w, images=w.root / "out" / "corrupt"),
        2,
        ("broken.png",),
        lambda w: extract(w, images=w.root / "out" / "corrupt"),
        setup=lambda w, mp: (shutil.copytree(w.small, w.root / "out" / "corrupt", dirs_exist_ok=True), write(w.root / "out" / "corrupt" / "broken.png", b"\x89PNG\r\n")),
        after=lambda w: (w.root / "out" / "corrupt" / "broken.png").unlink(),
    ),
    Case(
        "checkpoint-missing",
        lambda w: ["extract", w.root / "none.pth", "--images", w.small, "--store", w.fresh(), *w.q],
        2,
        ("none.pth", "Hugging Face Hub repository (org/name"),
        lambda w: extract(w),
    ),
    Case(
        "checkpoint-not-a-checkpoint",
        lambda w: ["extract", write(w.root / "out" / "text.pth", "hello"), "--images", w.small, "--store", w.fresh(), *w.q],
        2,
        ("text.pth",),
        lambda w: extract(w),
    ),
    Case(
        "checkpoint-truncated",
        lambda w: ["extract", w.root / "out" / "cut.pth", "--images", w.small, "--store", w.fresh(), *w.q],
        2,
        ("cut.pth",),
        lambda w: extract(w),
        setup=lambda w, mp: write(w.root / "out" / "cut.pth", w.ckpt.read_bytes()[: w.ckpt.stat().st_size // 2]),
    ),
    Case(
        "store-of-other-settings",
        lambda w: ["extract", w.ckpt, "--images", w.images, "--views", "224,480", "--dtype", "float32", "--chunk", "2", *w.q],
        2,
        ("dtype",),
        lambda w: ["extract", w.ckpt, "--images", w.images, "--views", "224,480", "--dtype", "float32", "--store", w.fresh(), *w.q],
    ),
    Case(
        "full-disk-creating-a-store",
        lambda w: extract(w, store=w.root / "stores" / "disk" / "teacher.zarr"),
        2,
        ("disk/teacher.zarr", "disk space"),
        lambda w: extract(w, store=w.root / "stores" / "disk" / "teacher.zarr"),
        setup=lambda w, mp: mp.setattr(create, "consolidate", _enospc),
    ),
    Case(
        "full-disk-writing-a-chunk",
        lambda w: extract(w, store=w.root / "stores" / "chunk" / "teacher.zarr"),
        2,
        ("disk space",),
        lambda w: extract(w, store=w.root / "stores" / "chunk" / "teacher.zarr"),
        setup=lambda w, mp: mp.setattr(writer.StoreWriter, "write_views", _enospc),
        resumable=True,
    ),
    Case(
        "ctrl-c-during-extract",
        lambda w: extract(w, "--chunk", "1", store=w.root / "stores" / "int" / "teacher.zarr"),
        130,
        ("resumable", "rerun"),
        lambda w: extract(w, "--chunk", "1", store=w.root / "stores" / "int" / "teacher.zarr"),
        setup=lambda w, mp: _interrupt_second_chunk(mp),
        resumable=True,
    ),
    # --- analyses: stores and options ---
    Case("entropy-not-a-store", lambda w: ["entropy", w.root, "-q"], 2, ("not a probe store",), lambda w: ["entropy", w.store, "--boot", "100", "-q"]),
    Case("entropy-boot-0", lambda w: ["entropy", w.store, "--boot", "0", "-q"], 2, ("--boot",), lambda w: ["entropy", w.store, "--boot", "100", "-q"]),
    Case(
        "entropy-patch-outside",
        lambda w: ["entropy", w.store, "--patch", "999", "--boot", "100", "-q"],
        2,
        ("--patch",),
        lambda w: ["entropy", w.store, "--patch", "34", "--boot", "100", "-q"],
    ),
    Case(
        "entropy-image-unknown",
        lambda w: ["entropy", w.store, "--patch", "3", "--image", "zz.png", "--boot", "100", "-q"],
        2,
        ("zz.png",),
        lambda w: ["entropy", w.store, "--patch", "3", "--image", "a.png", "--boot", "100", "-q"],
    ),
    Case(
        "entropy-incomplete-store",
        lambda w: ["entropy", w.root / "stores" / "part" / "teacher.zarr", "--boot", "100", "-q"],
        2,
        ("incomplete", "--partial"),
        lambda w: ["entropy", w.root / "stores" / "part" / "teacher.zarr", "--boot", "100", "--partial", "-q"],
        setup=lambda w, mp: _partial_store(w),
    ),
    Case(
        "neighbours-grid-without-view",
        lambda w: ["neighbours", w.store, "--grid", "6", "--boot", "100", "-q"],
        2,
        ("--grid 6",),
        lambda w: ["neighbours", w.store, "--grid", "14", "--boot", "100", "-q"],
    ),
    Case("neighbours-grid-unknown", lambda w: ["neighbours", w.store, "--grid", "7", "-q"], 2, ("--grid",), lambda w: ["neighbours", w.store, "--boot", "100", "-q"]),
    Case("neighbours-top-0", lambda w: ["neighbours", w.store, "--top", "0", "-q"], 2, ("--top",), lambda w: ["neighbours", w.store, "--boot", "100", "-q"]),
    Case("neighbours-k-0", lambda w: ["neighbours", w.store, "--k", "0", "-q"], 2, ("--k",), lambda w: ["neighbours", w.store, "--boot", "100", "-q"]),
    Case(
        "neighbours-distance-unknown",
        lambda w: ["neighbours", w.store, "--distance", "manhattan", "-q"],
        2,
        ("--distance",),
        lambda w: ["neighbours", w.store, "--distance", "euclidean", "--boot", "100", "-q"],
    ),
    Case(
        "full-disk-saving-results",
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        2,
        ("results/entropy", "could not be written"),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        setup=lambda w, mp: mp.setattr("probe_toolkit.store.plain.write", _enospc),
    ),
    # entropy writes with store.plain
    Case(
        "full-disk-saving-results-through-xarray",
        lambda w: ["attention-masks", w.store, "-q"],
        2,
        ("results/attention_masks", "could not be written"),
        lambda w: ["attention-masks", w.store, "-q"],
        setup=lambda w, mp: mp.setattr("xarray.Dataset.to_zarr", _enospc),
    ),
    Case(
        "json-into-a-folder",
        lambda w: ["entropy", w.store, "--boot", "100", "--json", w.root / "out", "-q"],
        2,
        (str(Path("out")),),
        lambda w: ["entropy", w.store, "--boot", "100", "--json", w.root / "out" / "e.json", "-q"],
        setup=lambda w, mp: (w.root / "out").mkdir(exist_ok=True),
        roots=lambda w: [w.root / "out"],
    ),
    # --- dask ---
    Case(
        "dask-address-malformed",
        lambda w: ["entropy", w.store, "--dask-address", "garbage", "-q"],
        2,
        ("garbage",),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
    ),
    Case(
        "dask-address-closed-port",
        lambda w: ["entropy", w.store, "--dask-address", f"tcp://127.0.0.1:{_closed_port()}", "-q"],
        2,
        ("no dask scheduler answers",),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
    ),
    Case(
        "dask-address-not-a-scheduler",
        lambda w: ["entropy", w.store, "--dask-address", w.listener, "-q"],
        2,
        ("tcp://127.0.0.1",),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        setup=lambda w, mp: _listener(w),
    ),
    Case(
        "dask-scheduler-without-workers",
        lambda w: ["entropy", w.store, "--dask-address", w.empty_cluster, "-q"],
        2,
        ("no workers",),
        lambda w: ["entropy", w.store, "--boot", "100", "--dask-address", w.cluster, "-q"],
        setup=lambda w, mp: _clusters(w),
    ),
    Case(
        "dask-worker-cannot-read-the-store",
        lambda w: ["entropy", w.store, "--boot", "100", "--dask-address", w.cluster, "-q"],
        1,
        ("dask worker", "cannot read the store"),
        lambda w: ["entropy", w.store, "--boot", "100", "--dask-address", w.cluster, "-q"],
        setup=lambda w, mp: _hide_store_after_open(w, mp),
    ),
    Case(
        "dask-workers-all-die",
        lambda w: ["neighbours", w.store, "--boot", "100", "--dask-address", w.dying, "-q"],
        2,
        ("no workers left",),
        lambda w: ["neighbours", w.store, "--boot", "100", "-q"],
        setup=lambda w, mp: _workers_die(w, mp),
    ),
    Case(
        "dask-scheduler-dies-mid-run",
        lambda w: ["neighbours", w.store, "--boot", "100", "--dask-address", w.doomed, "-q"],
        2,
        ("mid-run",),
        lambda w: ["neighbours", w.store, "--boot", "100", "-q"],
        setup=lambda w, mp: _scheduler_dies(w, mp),
    ),
    # --- decode, score, sweep ---
    Case("decode-not-a-store", lambda w: ["decode", w.root, *w.q], 2, ("not a probe store",), lambda w: ["decode", w.store, *w.q]),
    Case(
        "decode-without-keys",
        lambda w: ["decode", w.root / "stores" / "k224" / "teacher.zarr", *w.q],
        2,
        ("--views 480",),
        lambda w: ["decode", w.store, *w.q],
        setup=lambda w, mp: _store_224(w),
    ),
    Case(
        "decode-preset-unknown", lambda w: ["decode", w.store, "--preset", "fancy", *w.q], 2, ("--preset",), lambda w: ["decode", w.store, "--preset", "tokencut", *w.q]
    ),
    Case("decode-tau-outside", lambda w: ["decode", w.store, "--tau", "2", *w.q], 2, ("--tau",), lambda w: ["decode", w.store, "--tau", "0.2", *w.q]),
    Case("decode-eps-0", lambda w: ["decode", w.store, "--eps", "0", *w.q], 2, ("--eps",), lambda w: ["decode", w.store, "--eps", "1e-5", *w.q]),
    Case("decode-masks-0", lambda w: ["decode", w.store, "--masks", "0", *w.q], 2, ("--masks",), lambda w: ["decode", w.store, "--masks", "1", *w.q]),
    Case("decode-threads-0", lambda w: ["decode", w.store, "--threads", "0", *w.q], 2, ("--threads",), lambda w: ["decode", w.store, "--threads", "1", *w.q]),
    Case(
        "decode-size-unknown",
        lambda w: ["decode", w.store, "--size", "333", *w.q],
        2,
        ("view '333'", "is not one of"),
        lambda w: ["decode", w.store, "--size", "480", *w.q],
    ),
    Case("decode-settings-missing", lambda w: ["decode", w.store, "--settings", w.root / "none.json", *w.q], 2, ("none.json",), lambda w: ["decode", w.store, *w.q]),
    Case(
        "decode-settings-not-settings",
        lambda w: ["decode", w.store, "--settings", write(w.root / "out" / "s.json", "[1]"), *w.q],
        2,
        ("s.json",),
        lambda w: ["decode", w.store, *w.q],
    ),
    Case("decode-panel-unknown", lambda w: ["decode", w.store, "--panel", "nope", *w.q], 2, ("nope",), lambda w: ["decode", w.store, "--panel", "va", *w.q]),
    Case(
        "decode-sealed-panel",
        lambda w: ["decode", w.store, "--panel", "sealed", *w.q],
        2,
        ("sealed", "--unseal"),
        lambda w: ["decode", _held_store(w), "--panel", "sealed", "--unseal", "final numbers", *w.q],
    ),  # its own images' store (issue 46)
    Case(
        "score-not-json",
        lambda w: ["score", write(w.root / "out" / "m.json", "{"), "--panel", "va", "--cache", w.cache],
        2,
        ("m.json",),
        lambda w: ["score", w.masks, "--panel", "va", "--cache", w.cache],
    ),
    Case(
        "score-masks-of-another-run",
        lambda w: ["score", w.masks, "--panel", "va", "--cache", w.cache],
        1,
        ("decoder-masks.json", "different"),
        lambda w: ["score", w.masks, "--panel", "va", "--cache", w.cache],
        setup=lambda w, mp: _interrupted_decode(w),
        after=lambda w: _redecode(w),
    ),
    Case(
        "sweep-metric-unknown",
        lambda w: ["decode-sweep", w.store, "--panel", "va", "--metric", "best", "--grid", _grid(w), "--settings-out", w.root / "out" / "b.json", *w.q],
        2,
        ("--metric",),
        lambda w: ["decode-sweep", w.store, "--panel", "va", "--grid", _grid(w), "--settings-out", w.root / "out" / "b.json", *w.q],
    ),
    Case(
        "sweep-grid-not-toml",
        lambda w: ["decode-sweep", w.store, "--panel", "va", "--grid", write(w.root / "bad" / "g.toml", "tau = ["), *w.q],
        2,
        ("g.toml",),
        lambda w: ["decode-sweep", w.store, "--panel", "va", "--grid", _grid(w), "--settings-out", w.root / "out" / "b.json", *w.q],
    ),
    Case(
        "sweep-top-0",
        lambda w: ["decode-sweep", w.store, "--panel", "va", "--top", "0", "--grid", _grid(w), *w.q],
        2,
        ("--top",),
        lambda w: ["decode-sweep", w.store, "--panel", "va", "--top", "3", "--grid", _grid(w), "--settings-out", w.root / "out" / "b.json", *w.q],
    ),
    # --- panels and their labels ---
    Case(
        "panel-name-bad",
        lambda w: ["panel", "add", "no spaces", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
        2,
        ("no spaces",),
        lambda w: ["panel", "add", "spaces", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "panel-role-bad",
        lambda w: ["panel", "add", "r", "--annotations", w.root / "val.json", "--images", w.images, "--role", "dev", "--cache", w.cache],
        2,
        ("--role",),
        lambda w: ["panel", "add", "r", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "panel-annotations-missing",
        lambda w: ["panel", "add", "m", "--annotations", w.root / "no.json", "--images", w.images, "--role", "val", "--cache", w.cache],
        2,
        ("no.json",),
        lambda w: ["panel", "add", "m", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "panel-images-not-a-folder",
        lambda w: ["panel", "add", "f", "--annotations", w.root / "val.json", "--images", w.root / "val.json", "--role", "val", "--cache", w.cache],
        2,
        ("val.json",),
        lambda w: ["panel", "add", "f", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "panel-exists",
        lambda w: ["panel", "add", "va", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
        2,
        ("--replace",),
        lambda w: ["panel", "add", "va", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--replace", "--cache", w.cache],
    ),
    Case(
        "annotations-not-json",
        lambda w: ["score", w.masks, "--panel", "p1", "--cache", w.cache],
        2,
        ("p1.json",),
        lambda w: ["score", w.masks, "--panel", "p1", "--cache", w.cache],
        setup=panel_file("p1", "{not json"),
        after=repair_panel("p1"),
    ),
    Case(
        "annotations-name-missing-files",
        lambda w: ["score", w.masks, "--panel", "p2", "--cache", w.cache],
        2,
        ("p2.json", "gone.png"),
        lambda w: ["score", w.masks, "--panel", "p2", "--cache", w.cache],
        setup=panel_file("p2", coco(["c.png", "d.png"], images=[*coco(["c.png", "d.png"])["images"], {"id": 9, "file_name": "gone.png", "width": 8, "height": 8}])),
        after=repair_panel("p2"),
    ),
    Case(
        "annotations-unknown-image-id",
        lambda w: ["score", w.masks, "--panel", "p3", "--cache", w.cache],
        2,
        ("p3.json", "image id 77"),
        lambda w: ["score", w.masks, "--panel", "p3", "--cache", w.cache],
        setup=panel_file(
            "p3",
            coco(
                ["c.png", "d.png"],
                annotations=[
                    *coco(["c.png", "d.png"])["annotations"],
                    {"id": 50, "image_id": 77, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": [[0, 0, 1, 0, 1, 1]], "area": 1, "iscrowd": 0},
                ],
            ),
        ),
        after=repair_panel("p3"),
    ),
    Case(
        "annotations-size-disagrees",
        lambda w: ["score", w.masks, "--panel", "p4", "--cache", w.cache],
        2,
        ("p4.json", "c.png", "112×80"),
        lambda w: ["score", w.masks, "--panel", "p4", "--cache", w.cache],
        setup=panel_file(
            "p4", coco(["c.png", "d.png"], images=[dict(im, width=224, height=224) if im["file_name"] == "c.png" else im for im in coco(["c.png", "d.png"])["images"]])
        ),
        after=repair_panel("p4"),
    ),
    Case(
        "panels-of-two-roles-share-images",
        lambda w: ["score", w.root / "copycat-masks.json", "--panel", "copycat", "--cache", w.cache],
        2,
        ("copycat", "same content"),
        lambda w: ["score", w.masks, "--panel", "va", "--cache", w.cache],
        setup=lambda w, mp: _copycat(w),
        after=lambda w: _copycat(w, undo=True),
    ),
    Case(
        "panels-toml-corrupt",
        lambda w: ["panel", "list", "--cache", w.root / "out" / "c3"],
        2,
        ("panels.toml",),
        lambda w: ["panel", "list", "--cache", w.root / "out" / "c3"],
        setup=lambda w, mp: write(w.root / "out" / "c3" / "panels.toml", "[broken"),
        after=lambda w: (w.root / "out" / "c3" / "panels.toml").unlink(),
    ),
    Case(
        "linear-level-unknown",
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--level", "pixel", *w.q],
        2,
        ("--level",),
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--level", "image", *w.q],
    ),
    Case(
        "linear-epochs-0",
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--epochs", "0", *w.q],
        2,
        ("--epochs",),
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--epochs", "3", *w.q],
    ),
    # --- ledger ---
    Case(
        "ledger-line-edited",
        lambda w: ["ledger", "verify", "--cache", w.cache],
        1,
        ("ledger.jsonl",),
        lambda w: ["ledger", "verify", "--cache", w.cache],
        setup=lambda w, mp: _tamper(w, "edit"),
        after=lambda w: _tamper(w, "restore"),
    ),
    Case(
        "ledger-line-deleted",
        lambda w: ["ledger", "verify", "--cache", w.cache],
        1,
        ("ledger.jsonl",),
        lambda w: ["ledger", "verify", "--cache", w.cache],
        setup=lambda w, mp: _tamper(w, "delete"),
        after=lambda w: _tamper(w, "restore"),
    ),
    # --- report, info, doctor, the rest ---
    Case(
        "report-not-a-store",
        lambda w: ["report", w.root, "--out", w.root / "out" / "r"],
        2,
        ("not a probe store",),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r", "--cache", w.cache],
    ),
    Case(
        "report-patch-outside",
        lambda w: ["report", _store_224(w), "--patch", "999", "--out", w.root / "out" / "r", "--cache", w.cache],
        2,
        ("--patch",),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r", "--cache", w.cache],
    ),
    Case(
        "report-follow-unknown",
        lambda w: ["report", _store_224(w), "--follow", "zz.png", "--out", w.root / "out" / "r", "--cache", w.cache],
        2,
        ("--follow",),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r", "--cache", w.cache],
    ),
    Case(
        "report-out-is-a-file",
        lambda w: ["report", _store_224(w), "--out", write(w.root / "out" / "rfile", "x"), "--cache", w.cache],
        2,
        ("rfile",),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r", "--cache", w.cache],
    ),
    Case(
        "full-disk-writing-the-report",
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r3", "--cache", w.cache],
        2,
        ("r3", "No space left"),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r", "--cache", w.cache],
        setup=lambda w, mp: mp.setattr("probe_toolkit.report.markdown.render", _enospc),
    ),
    Case("info-not-a-store", lambda w: ["info", w.root], 2, ("not a probe store",), lambda w: ["info", w.store]),
    Case(
        "doctor-required-check-fails",
        lambda w: ["doctor", "--cache", w.cache],
        1,
        ("required check",),
        lambda w: ["doctor", "--cache", w.cache],
        setup=lambda w, mp: mp.setattr(
            "probe_toolkit.demo.doctor.library_versions",
            lambda: {}.fromkeys(("torch", "timm", "zarr", "xarray", "pycocotools", "numpy", "scipy", "scikit-learn"), "absent"),
        ),
    ),
    Case(
        "convert-source-missing",
        lambda w: ["convert", w.root / "none.pth", w.root / "out" / "c.pth"],
        2,
        ("none.pth",),
        lambda w: ["convert", w.ckpt, w.root / "out" / "c.pth"],
    ),
    Case(
        "make-checkpoint-layout-unknown",
        lambda w: ["make-checkpoint", w.root / "out" / "m.pth", "--layout", "odd"],
        2,
        ("--layout",),
        lambda w: ["make-checkpoint", w.root / "out" / "m.pth"],
    ),
    # --- files the user owns: never lost ---
    Case(
        "report-into-a-users-folder",
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "mine", "--cache", w.cache],
        2,
        ("out/mine", "not probe's output folder", "pick a new --out"),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "mine-report", "--cache", w.cache],
        setup=lambda w, mp: _users_folder(w.root / "out" / "mine"),
    ),
    Case(
        "report-over-a-users-file-in-its-folder",
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "own", "--cache", w.cache],
        2,
        ("own/report.html", "not a file probe wrote", "pick a new --out"),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "own", "--cache", w.cache],
        setup=lambda w, mp: _users_file_in_own_folder(w),
        after=lambda w: (w.root / "out" / "own" / "report.html").unlink(),
    ),
    Case(
        "make-checkpoint-exists",
        lambda w: ["make-checkpoint", w.root / "out" / "exists.pth"],
        2,
        ("exists.pth", "already exists", "--force"),
        lambda w: ["make-checkpoint", w.root / "out" / "exists.pth", "--force"],
        setup=lambda w, mp: write(w.root / "out" / "exists.pth", "my file"),
    ),
    Case(
        "convert-onto-its-source",
        lambda w: ["convert", w.ckpt, w.ckpt],
        2,
        ("tiny.pth", "source file", "another path"),
        lambda w: ["convert", w.ckpt, w.root / "out" / "conv.pth"],
        roots=lambda w: [w.ckpt, w.root / "out"],
    ),
    Case(
        "convert-onto-its-source-by-a-link-with-force",
        lambda w: ["convert", w.ckpt, w.root / "out" / "link.pth", "--force"],
        2,
        ("link.pth", "source file"),
        lambda w: ["convert", w.ckpt, w.root / "out" / "conv-forced.pth", "--force"],
        setup=lambda w, mp: _link(w.root / "out" / "link.pth", w.ckpt),
        roots=lambda w: [w.ckpt, w.root / "out"],
    ),
    Case(
        "convert-onto-its-source-spelled-otherwise",
        lambda w: ["convert", w.ckpt, w.root / "out" / ".." / w.ckpt.name],
        2,
        ("source file",),
        lambda w: ["convert", w.ckpt, w.root / "out" / "conv-2.pth"],
        roots=lambda w: [w.ckpt, w.root / "out"],
    ),
    Case(
        "convert-out-exists",
        lambda w: ["convert", w.ckpt, w.root / "out" / "taken.pth"],
        2,
        ("taken.pth", "already exists", "--force"),
        lambda w: ["convert", w.ckpt, w.root / "out" / "taken.pth", "--force"],
        setup=lambda w, mp: write(w.root / "out" / "taken.pth", "my file"),
    ),
    # --- numbers without meaning ---
    Case(
        "entropy-boot-1",
        lambda w: ["entropy", w.store, "--boot", "1", "-q"],
        2,
        ("--boot", "1 resamples", "the floor is 100"),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
    ),
    Case("entropy-boot-2", lambda w: ["entropy", w.store, "--boot", "2", "-q"], 2, ("--boot", "floor is 100"), lambda w: ["entropy", w.store, "--boot", "100", "-q"]),
    Case(
        "neighbours-boot-99",
        lambda w: ["neighbours", w.store, "--boot", "99", "-q"],
        2,
        ("--boot", "floor is 100"),
        lambda w: ["neighbours", w.store, "--boot", "100", "-q"],
    ),
    Case("chunk-absurd", lambda w: extract(w, "--chunk", "100000000"), 2, ("--chunk 100000000", "1024"), lambda w: extract(w, "--chunk", "2")),
    # --- refusals that need no compute come before any compute and any ledger line ---
    Case(
        "knn-k-above-the-train-panel",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1,50", *w.q],
        2,
        ("--k", "50 exceeds the 6 train images", "ktr", "--k 1"),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1,3", *w.q],
    ),
    Case(
        "knn-sealed-val-panel",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "ksealed", *w.q],
        2,
        ("ksealed", "sealed", "--unseal"),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "ksealed", "--unseal", "final numbers", *w.q],
    ),
    Case(
        "knn-one-panel-for-both",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "ktr", *w.q],
        2,
        ("--train and --val",),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", *w.q],
    ),
    Case(
        "knn-val-holds-a-train-image",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kcopy", *w.q],
        2,
        ("kcopy", "shares 1 images", "ktr"),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", *w.q],
    ),
    Case(
        "linear-sealed-val-panel",
        lambda w: ["linear", w.store, "--train", "tr", "--val", "sealed", "--level", "image", *w.q],
        2,
        ("sealed", "--unseal"),
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--level", "image", *w.q],
    ),
    Case(
        "linear-one-panel-for-both",
        lambda w: ["linear", w.store, "--train", "tr", "--val", "tr", "--level", "image", *w.q],
        2,
        ("--train and --val",),
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--level", "image", *w.q],
    ),
]


# ----------------------------------------------------------------------------------------------
# the faults' machinery


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _interrupt_second_chunk(mp):
    from probe_toolkit.store.backbone import Backbone

    real, calls = Backbone.capture, []

    def capture(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    mp.setattr(Backbone, "capture", capture)


def _partial_store(w):
    path = w.root / "stores" / "part" / "teacher.zarr"
    if not path.exists():
        assert probe("extract", w.ckpt, "--images", w.small, "--views", "224", "--chunk", "1", "--limit", "1", "--store", path, *w.q).code == 0


def _users_folder(folder: Path) -> None:
    """A folder of the user's: their figure, their table, their report.md (no probe manifest)."""
    write(folder / "figures" / "fig1-my-result.jpg", b"my figure")
    write(folder / "tables" / "t1.tex", "my table")
    write(folder / "report.md", "my own report")


def _users_file_in_own_folder(w) -> None:
    """probe's report folder, in which the user put their own report.html (probe's manifest does
    not list it: here the report's own is taken off its list, as if the user had replaced it)."""
    from probe_toolkit.infra import owned

    folder = w.root / "out" / "own"
    assert probe("report", _store_224(w), "--out", folder, "--cache", w.cache).code == 0
    manifest = json.loads((folder / owned.MANIFEST).read_text())
    manifest["files"]["report"].remove("report.html")
    (folder / owned.MANIFEST).write_text(json.dumps(manifest))
    (folder / "report.html").write_text("my page")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(target)


def _knn_store(w) -> Path:
    """Class folders (3 classes: 2 train, 1 val, 1 test image each, and a val folder holding a
    copy of one train image), their store, panels ktr (train), kva (val), ksealed (test), kcopy (val)."""
    path = w.root / "stores" / "knn" / "teacher.zarr"
    if path.exists():
        return path
    from PIL import Image

    data = w.root / "kdata"
    colours = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
    for split, n in (("train", 2), ("val", 1), ("test", 1)):
        for c, (name, colour) in enumerate(colours.items()):
            for i in range(n):
                rng = np.random.default_rng(100 * c + 10 * i + {"train": 0, "val": 1, "test": 2}[split])
                pixels = np.clip(np.array(colour)[None, None] + rng.normal(0, 20, (48, 64, 3)), 0, 255).astype(np.uint8)
                (data / split / name).mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(data / split / name / f"{i}.png")
    for name in colours:  # kcopy: the val images, one of them swapped for a train image's copy
        shutil.copytree(data / "val" / name, data / "copy" / name)
    shutil.copy(data / "train" / "red" / "0.png", data / "copy" / "red" / "0.png")
    assert probe("extract", w.ckpt, "--images", data, "--views", "224", "--attention", "none", "--store", path, *w.q).code == 0
    for name, split, role in (("ktr", "train", "train"), ("kva", "val", "val"), ("ksealed", "test", "test"), ("kcopy", "copy", "val")):
        added = probe("panel", "add", name, "--classes-from-folders", data / split, "--role", role, "--cache", w.cache)
        assert added.code == 0, added.err
    return path


def _small_store(w, view: str, folder: str) -> Path:
    """A store of the small images in one view, extracted once per catalogue."""
    path = w.root / "stores" / folder / "teacher.zarr"
    if not path.exists():
        assert probe("extract", w.ckpt, "--images", w.small, "--views", view, "--store", path, *w.q).code == 0
    return path


def _held_store(w) -> Path:
    """The sealed panel's own images (other pixels under the val panel's names), extracted once."""
    path = w.root / "stores" / "held" / "teacher.zarr"
    if not path.exists():
        assert probe("extract", w.ckpt, "--images", w.root / "held", "--views", "224,480", "--store", path, *w.q).code == 0
    return path


def _store_224(w) -> Path:
    return _small_store(w, "224", "k224")


def _grid(w) -> Path:
    return write(w.root / "grid.toml", 'preset = ["tokencut"]\ncenter = [true]\ntau = [0.2]\nmasks = [1]\n')


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listener(w):
    """A port that accepts connections and never answers (not a scheduler)."""
    if getattr(w, "listener", None):
        return
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(8)], daemon=True).start()
    w.listener = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    w.keep = (server, held)


def _local_cluster(workers: int):
    from distributed import LocalCluster

    return LocalCluster(processes=False, n_workers=workers, threads_per_worker=1, dashboard_address=None)


def _clusters(w):
    if not getattr(w, "cluster", None):
        w.clusters = [_local_cluster(1), _local_cluster(0)]
        w.cluster, w.empty_cluster = (c.scheduler_address for c in w.clusters)


def _hide_store_after_open(w, mp):
    """The client opens the store; its workers then find nothing at that path (another machine)."""
    _clusters(w)
    real = cluster_side.connect
    hidden = w.store.with_name("hidden.zarr")

    def connect(address):
        w.store.rename(hidden)
        return real(address)

    mp.setattr(cluster_side, "connect", connect)
    w.restore_store = lambda: hidden.rename(w.store) if hidden.exists() else None


def _cluster_fails_after_connect(w, mp, attribute: str, fault: Callable) -> None:
    """A fresh one-worker cluster at ``w.<attribute>``; ``fault(cluster, client)`` strikes right
    after the command has connected (so before or while its chunks run)."""
    _clusters(w)
    local = _local_cluster(1)
    w.clusters.append(local)
    setattr(w, attribute, local.scheduler_address)
    real = cluster_side.connect
    mp.setattr(cluster_side, "STALL_SECONDS", 1.0)

    def connect(address):
        client = real(address)
        fault(local, client)
        return client

    mp.setattr(cluster_side, "connect", connect)


def _workers_die(w, mp):
    _cluster_fails_after_connect(w, mp, "dying", lambda cluster, client: [client.sync(worker.close) for worker in list(cluster.workers.values())])


def _scheduler_dies(w, mp):
    _cluster_fails_after_connect(w, mp, "doomed", lambda cluster, client: cluster.close())


def _interrupted_decode(w):
    """A decode killed between its writes: the masks of one run beside the metadata of another."""
    masks = json.loads(w.masks.read_text())
    for entry in masks:
        entry["score"] = 0.5
    w.masks.write_text(json.dumps(masks))


def _redecode(w):
    assert probe("decode", w.store, *w.q).code == 0


def _copycat(w, undo: bool = False):
    """A train panel holding a copy of a val image under another name, read once (so its images are known)."""
    folder = w.root / "copycat"
    if undo:  # the user replaces the panel by one without the copy
        assert (
            probe("panel", "add", "copycat", "--annotations", w.root / "train.json", "--images", w.images, "--role", "train", "--replace", "--cache", w.cache).code == 0
        )
        return
    folder.mkdir(exist_ok=True)
    shutil.copy(w.images / "a.png", folder / "a.png")
    shutil.copy(w.images / "c.png", folder / "copy-of-c.png")
    data = coco(["a.png", "c.png"])
    data["images"][1]["file_name"] = "copy-of-c.png"
    write(w.root / "copycat.json", json.dumps(data))
    assert probe("panel", "add", "copycat", "--annotations", w.root / "copycat.json", "--images", folder, "--role", "train", "--replace", "--cache", w.cache).code == 0
    masks = [dict(m, file_name="copy-of-c.png") for m in json.loads(w.masks.read_text()) if m["file_name"] == "c.png"]
    write(w.root / "copycat-masks.json", json.dumps(masks))  # masks of the copy (written elsewhere: no metadata)


_saved_ledger: dict[str, bytes] = {}


def _tamper(w, how: str):
    path = w.cache / "ledger.jsonl"
    if how == "restore":
        path.write_bytes(_saved_ledger.pop("ledger"))
        return
    _saved_ledger["ledger"] = data = path.read_bytes()
    lines = data.split(b"\n")
    if how == "edit":
        lines[0] = lines[0].replace(b'"purpose":"score"', b'"purpose":"scoreX"')
    else:
        del lines[0]
    path.write_bytes(b"\n".join(lines))


# ----------------------------------------------------------------------------------------------
# trust by construction: processes, numbers with meaning, outputs and messages that say the truth


def _env(**values: str) -> Callable:
    """Variables left in the user's shell (undone before the corrected rerun)."""

    def setup(w, mp):
        for key, value in values.items():
            mp.setenv(key, value)

    return setup


def _raise_os(code: int, message: str) -> Callable:
    def fail(*args, **kwargs):
        raise OSError(code, message)

    return fail


def _os_fault(target: str, code: int, message: str) -> Callable:
    return lambda w, mp: mp.setattr(target, _raise_os(code, message))


def _store_os_fault(code: int, message: str) -> Callable:
    return lambda w, mp: mp.setattr(create, "consolidate", _raise_os(code, message))


def _compressed(w, how: str) -> Path:
    import bz2
    import gzip

    path = w.root / "bad" / f"tiny-{how}.pth"
    if not path.exists():
        write(path, (gzip.compress if how == "gzip" else bz2.compress)(w.ckpt.read_bytes()))
    return path


def _lightning(w) -> Path:
    """A PyTorch Lightning checkpoint: the backbone under the module's attribute ``model.``."""
    import torch

    from probe_toolkit.demo.samples import make_checkpoint

    path = w.root / "bad" / "lightning.ckpt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {f"model.{k}": v for k, v in make_checkpoint("dino-backbone", TINY).items()}
        torch.save({"state_dict": state, "pytorch-lightning_version": "2.4.0", "epoch": 3}, path)
    return path


def _big_image(w) -> Path:
    """An 8000 × 8000 photograph (a flat PNG: small on disk, 250,000 patches in the native view)."""
    from PIL import Image

    folder = w.root / "big"
    if not (folder / "big.png").exists():
        folder.mkdir(exist_ok=True)
        Image.new("RGB", (8000, 8000), (90, 120, 30)).save(folder / "big.png")
    return folder


def _native_store(w) -> Path:
    return _small_store(w, "native", "native")


def _grown_folder(w) -> Path:
    """A store of a folder to which the user then added one image and from which they removed one."""
    folder = w.root / "grown"
    store = w.root / "stores" / "grown" / "teacher.zarr"
    if not store.exists():
        shutil.copytree(w.small, folder)
        assert probe("extract", w.ckpt, "--images", folder, "--views", "224", "--store", store, *w.q).code == 0
        shutil.copy(w.images / "c.png", folder / "new.png")
        (folder / "b.png").unlink()
    return store


def _voc(w) -> tuple[Path, Path]:
    """A VOC year folder over two of the scenes (boxes only, no masks), its panel ``vocp`` and a store of its JPEGImages."""
    from PIL import Image

    root = w.root / "VOC2007"
    store = w.root / "stores" / "voc" / "teacher.zarr"
    if store.exists():
        return root, store
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ids = []
    for name in ("c.png", "d.png"):
        (width, height), boxes = SCENES[name]
        stem = name[:-4]
        ids.append(stem)
        Image.open(w.images / name).convert("RGB").save(root / "JPEGImages" / f"{stem}.jpg", quality=95)
        objects = "".join(
            f"<object><name>box</name><difficult>0</difficult><truncated>0</truncated><bndbox><xmin>{x0 + 1}</xmin><ymin>{y0 + 1}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"
            for x0, y0, x1, y1 in boxes
        )
        write(root / "Annotations" / f"{stem}.xml", f"<annotation><size><width>{width}</width><height>{height}</height><depth>3</depth></size>{objects}</annotation>")
    write(root / "ImageSets" / "Main" / "trainval.txt", "\n".join(ids) + "\n")
    assert probe("panel", "add", "vocp", "--voc", root, "--role", "val", "--cache", w.cache).code == 0
    assert probe("extract", w.ckpt, "--images", root / "JPEGImages", "--views", "224,480", "--store", store, *w.q).code == 0
    return root, store


def _voc_store(w) -> Path:
    return _voc(w)[1]


SHELL_RANK = dict(RANK="1", WORLD_SIZE="2")

CASES += [
    # --- processes: torchrun's variables left in a shell shard nothing silently ---
    Case(
        "rank-and-world-size-left-in-the-shell",
        lambda w: extract(w),
        2,
        ("RANK=1 WORLD_SIZE=2", "torchrun did not start", "--shard 1/2"),
        lambda w: extract(w),
        setup=_env(**SHELL_RANK),
    ),
    Case("world-size-alone-left-in-the-shell", lambda w: extract(w), 2, ("WORLD_SIZE=3", "unset RANK and WORLD_SIZE"), lambda w: extract(w), setup=_env(WORLD_SIZE="3")),
    Case(
        "rank-left-in-the-shell-for-decode",
        lambda w: ["decode", w.store, *w.q],
        2,
        ("RANK=1 WORLD_SIZE=2", "torchrun"),
        lambda w: ["decode", w.store, *w.q],
        setup=_env(**SHELL_RANK),
    ),
    Case(
        "rank-left-in-the-shell-for-attention-masks",
        lambda w: ["attention-masks", w.store, "-q"],
        2,
        ("RANK=1 WORLD_SIZE=2",),
        lambda w: ["attention-masks", w.store, "-q"],
        setup=_env(**SHELL_RANK),
    ),
    Case(
        "rank-left-in-the-shell-for-entropy",
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        2,
        ("RANK=1 WORLD_SIZE=2",),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        setup=_env(**SHELL_RANK),
    ),
    Case(
        "rank-left-in-the-shell-for-knn",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1", *w.q],
        2,
        ("RANK=1 WORLD_SIZE=2",),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1", *w.q],
        setup=lambda w, mp: (_knn_store(w), _env(**SHELL_RANK)(w, mp)),
    ),
    # --- numbers without meaning: the file's shape, memory told before it is spent ---
    Case(
        "heads-contradict-the-file",
        lambda w: extract(w, "--heads", "4"),
        2,
        ("tiny.pth", "args.arch 'vit_small' has 2 heads", "not --heads 4", "omit --heads"),
        lambda w: extract(w),
    ),
    Case("heads-re-split-by-one", lambda w: extract(w, "--heads", "1"), 2, ("has 2 heads", "not --heads 1"), lambda w: extract(w, "--heads", "2")),
    Case("heads-0", lambda w: extract(w, "--heads", "0"), 2, ("--heads",), lambda w: extract(w)),
    Case(
        "native-view-of-an-8000px-image",
        lambda w: ["extract", w.ckpt, "--images", _big_image(w), "--views", "native", "--store", w.fresh(), *w.q],
        2,
        ("big.png", "250000 patches in the native view", "GB", "--views 480"),
        lambda w: ["extract", w.ckpt, "--images", _big_image(w), "--views", "480", "--store", w.fresh(), *w.q],
    ),
    Case(
        "entropy-boot-absurd",
        lambda w: ["entropy", w.store, "--boot", "100000000", "-q"],
        2,
        ("--boot must be", "(got 100000000)", "ceiling of 100000", "GB"),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
    ),
    Case(
        "neighbours-boot-absurd",
        lambda w: ["neighbours", w.store, "--boot", "1000000", "-q"],
        2,
        ("--boot must be", "(got 1000000)", "ceiling"),
        lambda w: ["neighbours", w.store, "--boot", "100", "-q"],
    ),
    # --- outputs that say what was computed ---
    Case(
        "attention-masks-on-a-voc-panel",
        lambda w: ["attention-masks", _voc_store(w), "--panel", "vocp", "--cache", w.cache, "-q"],
        2,
        ("vocp", "is a voc panel", "attention-masks reads coco"),
        lambda w: ["attention-masks", _voc_store(w), "-q"],
    ),
    Case(
        "attention-masks-on-a-class-panel",
        lambda w: ["attention-masks", _knn_store(w), "--panel", "kva", "--cache", w.cache, "-q"],
        2,
        ("kva", "is a classes panel", "attention-masks reads coco"),
        lambda w: ["attention-masks", w.store, "--panel", "va", "--cache", w.cache, "-q"],
    ),
    Case(
        "row-aggregation-without-ca-head",
        lambda w: ["attention-masks", w.store, "--row", "aggregation", "-q"],
        2,
        ("ca_head", "--row cls"),
        lambda w: ["attention-masks", w.store, "--row", "cls", "-q"],
    ),
    Case(
        "attention-masks-row-unknown",
        lambda w: ["attention-masks", w.store, "--row", "diagonal", "-q"],
        2,
        ("--row",),
        lambda w: ["attention-masks", w.store, "--row", "mean", "-q"],
    ),
    Case(
        "attention-masks-mass-0",
        lambda w: ["attention-masks", w.store, "--mass", "0", "-q"],
        2,
        ("--mass",),
        lambda w: ["attention-masks", w.store, "--mass", "0.6", "-q"],
    ),
    Case(
        "attention-masks-mass-1",
        lambda w: ["attention-masks", w.store, "--mass", "1", "-q"],
        2,
        ("--mass",),
        lambda w: ["attention-masks", w.store, "--mass", "0.6", "-q"],
    ),
    Case(
        "attention-masks-panel-unknown",
        lambda w: ["attention-masks", w.store, "--panel", "nope", "--cache", w.cache, "-q"],
        2,
        ("nope",),
        lambda w: ["attention-masks", w.store, "--panel", "va", "--cache", w.cache, "-q"],
    ),
    Case(
        "attention-masks-sealed-panel",
        lambda w: ["attention-masks", w.store, "--panel", "sealed", "--cache", w.cache, "-q"],
        2,
        ("sealed", "--unseal"),
        lambda w: ["attention-masks", w.store, "--panel", "va", "--cache", w.cache, "-q"],
    ),
    # --- messages that point the right way ---
    Case(
        "decode-a-store-of-native-keys",
        lambda w: ["decode", _native_store(w), *w.q],
        2,
        ("keys_480", "holds keys_native", "--view native"),
        lambda w: ["decode", _native_store(w), "--view", "native", *w.q],
    ),
    Case(
        "decode-view-not-extracted",
        lambda w: ["decode", w.store, "--view", "native", *w.q],
        2,
        ("keys_native", "holds keys_480", "--view 480"),
        lambda w: ["decode", w.store, "--view", "480", *w.q],
    ),
    Case(
        "checkpoint-gzipped",
        lambda w: ["extract", _compressed(w, "gzip"), "--images", w.small, "--views", "224", "--store", w.fresh(), *w.q],
        2,
        ("tiny-gzip.pth", "gzip-compressed", "decompress it first"),
        lambda w: extract(w),
    ),
    Case(
        "checkpoint-bzip2",
        lambda w: ["extract", _compressed(w, "bzip2"), "--images", w.small, "--views", "224", "--store", w.fresh(), *w.q],
        2,
        ("bzip2-compressed", "decompress"),
        lambda w: extract(w),
    ),
    Case(
        "checkpoint-lightning-prefix",
        lambda w: ["extract", _lightning(w), "--images", w.small, "--views", "224", "--store", w.fresh(), *w.q],
        2,
        ("lightning.ckpt", "prefix 'model.'", "removeprefix"),
        lambda w: extract(w),
    ),
    Case(
        "store-of-a-folder-that-changed",
        lambda w: ["extract", w.ckpt, "--images", w.root / "grown", "--views", "224", "--store", _grown_folder(w), *w.q],
        2,
        ("1 added: new.png", "1 removed: b.png"),
        lambda w: ["extract", w.ckpt, "--images", w.root / "grown", "--views", "224", "--store", w.fresh(), *w.q],
    ),
    Case(
        "read-only-filesystem-creating-a-store",
        lambda w: extract(w, store=w.root / "stores" / "rofs" / "teacher.zarr"),
        2,
        ("rofs/teacher.zarr", "writable filesystem"),
        lambda w: extract(w, store=w.root / "stores" / "rofs" / "teacher.zarr"),
        setup=_store_os_fault(errno.EROFS, "Read-only file system"),
    ),
    Case(
        "permission-denied-creating-a-store",
        lambda w: extract(w, store=w.root / "stores" / "denied" / "teacher.zarr"),
        2,
        ("denied/teacher.zarr", "make it writable"),
        lambda w: extract(w, store=w.root / "stores" / "denied" / "teacher.zarr"),
        setup=_store_os_fault(errno.EACCES, "Permission denied"),
    ),
    Case(
        "read-only-filesystem-saving-results",
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        2,
        ("results/entropy", "writable filesystem"),
        lambda w: ["entropy", w.store, "--boot", "100", "-q"],
        setup=_os_fault("probe_toolkit.store.plain.write", errno.EROFS, "Read-only file system"),
    ),
    Case(
        "permission-denied-saving-results",
        lambda w: ["attention-masks", w.store, "-q"],
        2,
        ("results/attention_masks", "make it writable"),
        lambda w: ["attention-masks", w.store, "-q"],
        setup=_os_fault("xarray.Dataset.to_zarr", errno.EACCES, "Permission denied"),
    ),
    Case(
        "read-only-filesystem-writing-the-report",
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "ro", "--cache", w.cache],
        2,
        ("ro", "writable filesystem"),
        lambda w: ["report", _store_224(w), "--out", w.root / "out" / "r", "--cache", w.cache],
        setup=_os_fault("probe_toolkit.report.markdown.render", errno.EROFS, "Read-only file system"),
    ),
    # --- more careless inputs, each refused in one line before any work ---
    Case("extract-limit-0", lambda w: extract(w, "--limit", "0"), 2, ("--limit",), lambda w: extract(w, "--limit", "1")),
    Case("decode-view-unknown", lambda w: ["decode", w.store, "--view", "nativ", *w.q], 2, ("nativ",), lambda w: ["decode", w.store, "--view", "480", *w.q]),
    Case("decode-workers-0", lambda w: ["decode", w.store, "--workers", "0", *w.q], 2, ("--workers",), lambda w: ["decode", w.store, "--workers", "1", *w.q]),
    Case(
        "attention-masks-workers-0",
        lambda w: ["attention-masks", w.store, "--workers", "0", "-q"],
        2,
        ("--workers",),
        lambda w: ["attention-masks", w.store, "--workers", "1", "-q"],
    ),
    Case(
        "knn-workers-and-dask",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1", "--workers", "2", "--dask-address", "tcp://127.0.0.1:1", *w.q],
        2,
        ("--workers and --dask-address",),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1", *w.q],
    ),
    Case(
        "knn-k-0",
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "0", *w.q],
        2,
        ("--k",),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1", *w.q],
    ),
    Case(
        "knn-train-panel-unknown",
        lambda w: ["knn", _knn_store(w), "--train", "nope", "--val", "kva", *w.q],
        2,
        ("nope",),
        lambda w: ["knn", _knn_store(w), "--train", "ktr", "--val", "kva", "--k", "1", *w.q],
    ),
    Case(
        "linear-train-panel-unknown",
        lambda w: ["linear", w.store, "--train", "nope", "--val", "va", "--level", "image", *w.q],
        2,
        ("nope",),
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--level", "image", *w.q],
    ),
    Case(
        "linear-val-panel-unknown",
        lambda w: ["linear", w.store, "--train", "tr", "--val", "nope", "--level", "image", *w.q],
        2,
        ("nope",),
        lambda w: ["linear", w.store, "--train", "tr", "--val", "va", "--level", "image", *w.q],
    ),
    Case("info-path-missing", lambda w: ["info", w.root / "nowhere.zarr"], 2, ("nowhere.zarr",), lambda w: ["info", w.store]),
    Case("results-not-a-store", lambda w: ["results", w.root], 2, ("is not a probe store (no zarr.json)", "`probe extract`"), lambda w: ["results", w.store]),
    Case(
        "score-masks-missing",
        lambda w: ["score", w.root / "none.json", "--panel", "va", "--cache", w.cache],
        2,
        ("none.json",),
        lambda w: ["score", w.masks, "--panel", "va", "--cache", w.cache],
    ),
    Case(
        "panel-voc-folder-missing",
        lambda w: ["panel", "add", "v2", "--voc", w.root / "noVOC", "--role", "val", "--cache", w.cache],
        2,
        ("noVOC",),
        lambda w: ["panel", "add", "v2", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "panel-two-kinds-at-once",
        lambda w: ["panel", "add", "v3", "--voc", w.root, "--masks", w.images, "--images", w.images, "--role", "val", "--cache", w.cache],
        2,
        ("different kinds",),
        lambda w: ["panel", "add", "v3", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "panel-classes-with-annotations",
        lambda w: ["panel", "add", "v4", "--classes-from-folders", w.images, "--annotations", w.root / "val.json", "--role", "val", "--cache", w.cache],
        2,
        ("--classes-from-folders",),
        lambda w: ["panel", "add", "v4", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--cache", w.cache],
    ),
    Case(
        "make-checkpoint-arch-unknown",
        lambda w: ["make-checkpoint", w.root / "out" / "arch.pth", "--arch", "vit-z99"],
        2,
        ("vit-z99",),
        lambda w: ["make-checkpoint", w.root / "out" / "arch.pth"],
    ),
    Case(
        "convert-not-a-checkpoint",
        lambda w: ["convert", write(w.root / "bad" / "words.pth", "hello"), w.root / "out" / "w.pth"],
        2,
        ("words.pth",),
        lambda w: ["convert", w.ckpt, w.root / "out" / "w.pth"],
    ),
]


def _store_copy(w, stem: str, damage: Callable[[Path], None]) -> Path:
    """A copy of the world's store (results aside) under ``stores/``, damaged by ``damage``."""
    copy = w.root / "stores" / stem / "teacher.zarr"
    if copy.exists():
        shutil.rmtree(copy.parent)
    shutil.copytree(w.store, copy, ignore=shutil.ignore_patterns("results"))
    damage(copy)
    return copy


def _wrong_dimension_names(store: Path) -> None:
    meta_file = store / "tokens_224" / "zarr.json"
    meta = json.loads(meta_file.read_text())
    meta["dimension_names"] = None  # zarr allows it; probe's readers name each axis
    meta_file.write_text(json.dumps(meta))


def _elsewhere(w, mp=None) -> None:
    """A store outside the cache, and panels of its images copied to other folders under other
    names (``elsewhere``, train; ``elsewhere-val``, val): the store holds none of their files."""
    _store_copy(w, "outside", lambda s: None)
    for name, role, names in (("elsewhere", "train", ["a.png", "b.png"]), ("elsewhere-val", "val", ["c.png", "d.png"])):
        folder = w.root / name
        if not folder.exists():
            folder.mkdir()
            data = coco(names)
            for image in data["images"]:
                shutil.copy(w.images / image["file_name"], folder / f"x{image['file_name']}")
                image["file_name"] = f"x{image['file_name']}"
            write(w.root / f"{name}.json", json.dumps(data))
            assert probe("panel", "add", name, "--annotations", w.root / f"{name}.json", "--images", folder, "--role", role, "--cache", w.cache).code == 0


def _ade_with_a_narrow_mask(w, mp=None) -> None:
    """An ADE20K folder whose one training mask is narrower than its image (panels ``adenarrow-t``
    and ``adenarrow-v``), and a store of its validation image."""
    from PIL import Image
    from segmentation_folders import box_scene, write_ade

    root = w.root / "ade-narrow"
    if root.exists():
        return
    write_ade(root, {"training": ["ADE_train_00000001"], "validation": ["ADE_val_00000001"]}, lambda split, n: box_scene(n, (40, 36), 151, True, box=14, room=16))
    mask = root / "annotations" / "training" / "ADE_train_00000001.png"
    Image.fromarray(np.asarray(Image.open(mask))[:, :30], mode="L").save(mask)
    for name, role in (("adenarrow-t", "train"), ("adenarrow-v", "val")):
        assert probe("panel", "add", name, "--ade20k", root, "--role", role, "--cache", w.cache).code == 0
    made = probe(
        "extract", w.ckpt, "--images", root / "images" / "validation", "--views", "96", "--chunk", "1", "--store", w.root / "stores" / "ade" / "teacher.zarr", *w.q
    )
    assert made.code == 0, made.err


def _added(name: str, data: Callable[[], dict] | None = None) -> Args:
    """``probe panel add NAME`` of ``data`` (a COCO dict, written to bad/NAME.json), or of the sound val.json."""

    def args(w) -> list:
        source = write(w.root / "bad" / f"{name}.json", json.dumps(data())) if data else w.root / "val.json"
        return ["panel", "add", name, "--annotations", source, "--images", w.images, "--role", "val", "--cache", w.cache]

    return args


# the careless trial of issue 46, round four: one case per finding
CASES += [
    Case(  # --views 224 was dropped without a word: the store held decode's keys_480 alone
        "extract-for-with-views-of-another-family",
        lambda w: ["extract", w.ckpt, "--images", w.small, "--for", "decode", "--views", "224", "--store", w.fresh(), *w.q],
        2,
        ("--views 224 beside --for decode", "keys_480"),
        lambda w: ["extract", w.ckpt, "--images", w.small, "--for", "decode", "--store", w.fresh(), *w.q],
    ),
    Case(  # overcluster and hummingbird stretched such a mask onto the image's view and scored it; segment checked its train panel only
        "label-map-of-another-size-than-its-image",
        lambda w: ["segment", w.ckpt, "--train", "adenarrow-t", "--val", "adenarrow-v", "--store", w.root / "stores" / "ade" / "teacher.zarr", "--device", "cpu", *w.q],
        2,
        ("ADE_train_00000001.png", "is 30x36 px, its image", "40x36"),
        None,
        setup=_ade_with_a_narrow_mask,
    ),
    Case(
        "panel-add-line-keeps-its-brackets",
        _added("brackets", lambda: _with_first_annotation(bbox=[1, 2, 3])),
        2,
        ("brackets.json", "[1, 2, 3] is not four finite numbers [x, y, width, height]"),
        _added("brackets"),
    ),
    Case(
        "panel-add-line-keeps-its-colons",
        _added(
            "colons", lambda: coco(["c.png", "d.png"], images=[*coco(["c.png", "d.png"])["images"], {"id": 9, "file_name": "gone:cat:.png", "width": 8, "height": 8}])
        ),
        2,
        ("'gone:cat:.png'",),
        _added("colons"),
    ),
    Case(  # the printed extract wrote into the cache, where the rerun never looks (a looping fix)
        "linear-panel-elsewhere-extracts-beside-the-store",
        lambda w: ["linear", w.root / "stores" / "outside" / "teacher.zarr", "--train", "elsewhere", "--val", "va", "--level", "image", *w.q],
        2,
        ("outside", "--panel elsewhere", "--store", "teacher-panel-elsewhere.zarr"),
        lambda w: ["linear", w.root / "stores" / "outside" / "teacher.zarr", "--train", "elsewhere", "--val", "va", "--level", "image", *w.q],
        setup=_elsewhere,
        printed_fix=True,
    ),
    Case(  # the line printed `probe extract CKPT --images DIR, and pass that store`: no command that parses
        "decode-panel-elsewhere-extracts-a-store-to-pass",
        lambda w: ["decode", w.root / "stores" / "outside" / "teacher.zarr", "--panel", "elsewhere-val", *w.q],
        2,
        ("outside", "holds none", "--panel elsewhere-val", "teacher-panel-elsewhere-val.zarr"),
        lambda w: ["decode", w.root / "stores" / "outside" / "teacher-panel-elsewhere-val.zarr", "--panel", "elsewhere-val", *w.q],
        setup=_elsewhere,
        printed_fix=True,
    ),
    Case(
        "store-flag-array-deleted",
        lambda w: ["decode", w.root / "stores" / "flagless" / "teacher.zarr", *w.q],
        1,
        ("flagless", "array done is gone", "new store"),
        lambda w: ["extract", w.ckpt, "--images", w.images, "--views", "224,480", "--chunk", "2", "--store", w.fresh(), *w.q],
        setup=lambda w, mp: _store_copy(w, "flagless", lambda s: shutil.rmtree(s / "done")),
    ),
    Case(
        "store-data-array-deleted",
        lambda w: ["decode", w.root / "stores" / "keyless" / "teacher.zarr", *w.q],
        1,
        ("keyless", "array keys_480 is gone", "into this store"),
        lambda w: ["decode", w.root / "stores" / "keyless" / "teacher.zarr", *w.q],
        setup=lambda w, mp: _store_copy(w, "keyless", lambda s: shutil.rmtree(s / "keys_480")),
        printed_fix=True,
    ),
    Case(
        "store-array-dimension-names-damaged",
        lambda w: ["neighbours", w.root / "stores" / "dims" / "teacher.zarr", "--boot", "100", "-q"],
        2,
        ("dims", "tokens_224 names 0 dimensions for its 3 axes"),
        lambda w: ["neighbours", w.store, "--boot", "100", "-q"],
        setup=lambda w, mp: _store_copy(w, "dims", _wrong_dimension_names),
    ),
    Case(
        "panel-add-names-absent-images",
        _added("absent", lambda: coco(["c.png", "d.png"], images=[*coco(["c.png", "d.png"])["images"], {"id": 9, "file_name": "gone.png", "width": 8, "height": 8}])),
        2,
        ("absent.json", "gone.png", "--images DIR"),
        _added("absent"),
    ),
    Case(
        "panel-add-empty-segmentation",
        _added("emptyseg", lambda: _with_first_annotation(segmentation=[])),
        2,
        ("emptyseg.json", "segmentation is an empty list"),
        _added("emptyseg"),
    ),
    Case(
        "panel-add-no-object",
        _added("noobject", lambda: coco(["c.png", "d.png"], annotations=[])),
        2,
        ("noobject.json", "holds no object"),
        _added("noobject"),
    ),
]


def _with_first_annotation(**changes) -> dict:
    data = coco(["c.png", "d.png"])
    data["annotations"][0].update(changes)
    return data


# ----------------------------------------------------------------------------------------------
# the catalogue test


def refused(result: Result, code: int, needles: tuple[str, ...], args: list | None = None) -> None:
    """The catalogue's promise for a refused run, and every command its line prints as a fix read
    back by the CLI's parser (``fix_commands``: its flags exist, its values parse)."""
    assert result.code == code, f"exit {result.code}, wanted {code}\nstderr: {result.err}\nstdout: {result.out}"
    assert "Traceback" not in result.err, result.err
    assert len(result.lines) == 1, f"wanted one line on stderr, got {len(result.lines)}:\n{result.err}"
    for needle in needles:
        assert needle in result.lines[0], f"{needle!r} not in {result.lines[0]!r}"
    for command in fix_commands.printed(result.lines[0]):
        problem = fix_commands.parse_error(command)
        assert problem is None, f"the printed fix `probe {shlex.join(command)}` does not parse: {problem}"
    if args is not None:  # a flag the line names beside its commands is one of the failed command's own
        foreign = fix_commands.foreign_flags(result.lines[0], args)
        assert not foreign, f"{foreign} named, which probe {args[0]} lacks: {result.lines[0]!r}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=False, reason=c.xfail)] if c.xfail else []) for c in CASES])
def test_case(case: Case, w, monkeypatch):
    if case.id == "device-cuda-without-gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    monkeypatch.setattr(cluster_side, "CONNECT_SECONDS", 2.0)  # bounded waits, kept short here
    if case.setup:
        case.setup(w, monkeypatch)
    roots = case.roots(w)
    args = case.bad(w)  # (files a case names are made here, before the snapshot)
    before = tree(*roots)
    ledger_file = w.cache / "ledger.jsonl"
    ledger_before = ledger_file.read_bytes() if ledger_file.is_file() else b""
    result = probe(*args)
    monkeypatch.undo()
    if getattr(w, "restore_store", None):
        w.restore_store()
        w.restore_store = None
    refused(result, case.code, case.needles, [str(a) for a in args])
    after = tree(*roots)
    new = {p for p in set(after) - set(before) if after[p] >= 0 and not any(litter.is_litter(part) for part in Path(p).parts)}
    if case.resumable:
        new = {p for p in new if ".zarr" not in p}
    changed = {p for p in set(after) & set(before) if after[p] != before[p] and not p.endswith(("ledger.jsonl", "ledger.head"))}
    assert not new, f"left behind: {sorted(new)[:5]}"
    if not case.id.startswith("ledger"):  # refused before any label was read: not a line more in the ledger
        assert (ledger_file.read_bytes() if ledger_file.is_file() else b"") == ledger_before, "the refused run wrote to the ledger"
    assert not changed or case.id.startswith("ledger"), f"changed: {sorted(changed)[:5]}"
    if case.printed_fix:  # pasted as printed, the fix works (issue 46, class 5)
        commands = [c for c in fix_commands.printed(result.lines[0]) if fix_commands.complete(c)]
        assert commands, f"no complete command in {result.lines[0]!r}"
        for command in commands:
            pasted = probe(*command)
            assert pasted.code == 0, f"the printed fix `probe {shlex.join(command)}` failed ({pasted.code}): {pasted.err}"
    if case.after:
        case.after(w)
    if case.fix is not None:
        fix = tuple(map(str, case.fix(w)))
        if fix[0] == "report" and fix in _reports_done:
            return  # this very report was rendered by an earlier case, and nothing it reads has changed since
        rerun = probe(*fix)
        assert rerun.code == 0, f"the corrected rerun failed ({rerun.code}):\n{rerun.err}"
        assert "Traceback" not in rerun.err
        assert not litter_in(*roots), litter_in(*roots)
        if fix[0] == "report":
            _reports_done.add(fix)


_reports_done: set[tuple[str, ...]] = set()


def test_the_catalogue_is_long_enough():
    assert len(CASES) >= 150 and len({c.id for c in CASES}) == len(CASES)


def test_a_lost_scheduler_prints_probes_line_and_no_client_log(w, monkeypatch):
    """distributed's logging config gives its loggers levels of their own: silencing the parent
    alone let a lost scheduler print two tracebacks (36 lines) before probe's one line."""
    import logging

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep(level=logging.NOTSET)
    loggers = [logging.getLogger(n) for n in ("distributed", "distributed.client", "distributed.core", "distributed.comm", "distributed.utils")]
    for logger in loggers:
        logger.addHandler(keep)
    try:
        _scheduler_dies(w, monkeypatch)
        result = probe("neighbours", w.store, "--boot", "100", "--dask-address", w.doomed, "-q")
    finally:
        for logger in loggers:
            logger.removeHandler(keep)
    refused(result, 2, ("mid-run",))
    assert all(logging.getLogger(n).getEffectiveLevel() > logging.CRITICAL for n in ("distributed", "distributed.client", "distributed.worker"))
    assert not [r for r in seen if r.levelno >= logging.WARNING], [r.getMessage() for r in seen][:3]


# ----------------------------------------------------------------------------------------------
# what the catalogue's cases cannot show one by one


def test_killed_runs_litter_is_swept_and_never_read(w):
    """``.NAME.tmp-PID`` / ``.NAME.old-PID`` of a dead process: not listed, not reported, gone after the next run."""
    dead = 2**22 + 12345  # above Linux's default pid_max: no such process
    results = w.store / "results"
    for name in (f".entropy.tmp-{dead}", f".entropy.old-{dead}", f".ghost.tmp-{dead}"):
        (results / name).mkdir(parents=True, exist_ok=True)
        (results / name / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    info = probe("info", w.store, env={"COLUMNS": "200"})
    assert info.code == 0 and ".entropy.tmp" not in info.out and "ghost" not in info.out
    assert ".entropy" not in records.results(w.store)
    assert probe("entropy", w.store, "--boot", "100", "-q").code == 0
    assert not [p.name for p in results.iterdir() if litter.is_litter(p.name)]
    out = w.root / "out" / "swept"
    (out / f".report.tmp-{dead}" / "figures").mkdir(parents=True)
    (out / f".figures.old-{dead}").mkdir()
    assert probe("report", _store_224(w), "--out", out, "--cache", w.cache).code == 0
    assert sorted(p.name for p in out.iterdir()) == [".probe-output.json", "figures", "report.html", "report.md", "tables"]


def test_partial_results_are_marked_stale_in_the_report(w):
    """entropy on 1 of 2 images (--partial), then the store is finished: the report says so."""
    path = w.root / "stores" / "stale" / "teacher.zarr"
    args = ["extract", w.ckpt, "--images", w.small, "--views", "224", "--chunk", "1", "--store", path, *w.q]
    assert probe(*args, "--limit", "1").code == 0
    assert probe("entropy", path, "--boot", "100", "--partial", "-q").code == 0
    record = records.load(path, "entropy").attrs["computed_on"]
    assert record["images"] == 1 and record["store"]["done"] == 1 and record["store"]["total"] == 2
    assert probe(*args).code == 0  # finish the store
    other = _store_224(w)
    assert probe("entropy", other, "--boot", "100", "-q").code == 0
    out = w.root / "out" / "stale-report"
    assert probe("report", path, other, "--out", out, "--cache", w.cache).code == 0
    text = (out / "report.md").read_text()
    assert "STALE: computed on 1 images; the store now has 2 of 2 done" in text
    assert "entropy: the stores were measured on different image sets" in text and "1 images in common" in text


def test_stores_open_with_plain_open_zarr_without_warnings(w):
    import warnings

    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(w.store)
    assert "tokens_224" in ds and ds.sizes["image"] == 4


def test_output_fits_80_columns(w):
    """Tables at 80 columns: no line wider, and the sweep's score headers stay distinct."""
    runs = [
        probe("entropy", w.store, "--boot", "100", "-q", env={"COLUMNS": "80"}),
        probe("neighbours", w.store, "--boot", "100", "-q", env={"COLUMNS": "80"}),
        probe("decode-sweep", w.store, "--panel", "va", "--grid", _grid(w), "--settings-out", w.root / "out" / "b80.json", *w.q, env={"COLUMNS": "80"}),
    ]
    for run in runs:
        assert run.code == 0, run.err
        assert max(len(line) for line in run.out.splitlines()) <= 80, run.out
    assert "tokencut" in runs[2].out and "…" not in runs[2].out, runs[2].out  # nothing cut short
    header = "\n".join(runs[2].out.splitlines()[1:4])
    assert header.count("AP50") == 2 and "segm" in header and "bbox" in header and "CorLoc" in header, runs[2].out


def test_a_rank_stops_when_its_launcher_dies(tmp_path):
    """A process standing in for torchrun starts a rank (new session, as torchrun does) and is
    SIGKILLed; the rank, watching its parent, exits within seconds instead of training on."""
    import signal
    import subprocess
    import time

    root = Path(__file__).resolve().parents[1]
    pid_file = tmp_path / "rank.pid"
    rank = (
        "import os, time; from training.distributed import stop_with_launcher; stop_with_launcher(0, interval=0.1); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    launcher = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True); time.sleep(60)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    parent = subprocess.Popen([sys.executable, "-c", launcher], env=env)
    try:
        for _ in range(1200):
            if pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.05)
        child = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(100):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the rank outlived its launcher by 5 s")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_cluster_tasks_prove_they_read_the_clients_store(w):
    """On a real local dask cluster: another store at the path, or unfinished images there, fail
    the run naming the worker; the proven run equals the local one."""
    import zarr

    from probe_toolkit.analyses.neighbours import neighbours
    from probe_toolkit.analyses.stats import Bootstrap
    from probe_toolkit.infra.errors import IntegrityError
    from probe_toolkit.store.cache import open_store, require

    _clusters(w)
    source = w.root / "stores" / "proof" / "teacher.zarr"
    shutil.copytree(_store_224(w), source)
    other = w.root / "stores" / "proof-other" / "teacher.zarr"
    assert probe("extract", w.ckpt, "--images", w.small, "--views", "224", "--dtype", "float32", "--store", other, *w.q).code == 0
    client = cluster_side.connect(w.cluster)
    try:
        tokens = require(open_store(source), "tokens_224")
        local = neighbours(tokens, 14, boot=Bootstrap(20))
        assert np.array_equal(neighbours(tokens, 14, boot=Bootstrap(20), run_blocks=per_image(Where(client=client))).top_in_window.values, local.top_in_window.values)
        source.rename(source.with_name("away.zarr"))
        shutil.copytree(other, source)  # a private mount holding another store at the same path
        with pytest.raises(IntegrityError, match=r"dask worker .* sees another store"):
            neighbours(tokens, 14, boot=Bootstrap(20), run_blocks=per_image(Where(client=client)))
        shutil.rmtree(source)
        source.with_name("away.zarr").rename(source)
        behind = zarr.open_group(str(source), mode="r+", use_consolidated=False)  # a copy that is behind: b.png not written yet
        behind["done"][1] = False
        behind["done_224"][1] = False  # the flag of the view read, which a worker judges by (as open_store does)
        with pytest.raises(IntegrityError, match=r"dask worker .* as unfinished \(e\.g\. 'b\.png'\)"):
            neighbours(tokens, 14, boot=Bootstrap(20), run_blocks=per_image(Where(client=client)))
    finally:
        client.close()


def test_out_of_image_geometry_is_clipped_counted_and_ledgered(w):
    from probe_toolkit.labels import ledger

    data = coco(["c.png", "d.png"])
    data["annotations"][0]["bbox"] = [40, 8, 200, 64]  # reaches 128 px past c.png's right edge (112 wide)
    data["annotations"][0]["segmentation"] = [[40, 8, 240, 8, 240, 72, 40, 72]]
    panel_file("clip", data)(w, None)
    run = probe("score", w.masks, "--panel", "clip", "--cache", w.cache)
    assert run.code == 0, run.err
    assert "1 annotations reached outside their image and were clipped" in run.err
    assert ledger.entries(w.cache)[-1].fields["clipped"] == 1


def test_report_twice_into_its_own_folder_keeps_the_users_files(w):
    """probe report into its own folder again: the user's figure in figures/, table in tables/
    and notes beside report.md stay byte for byte; the manifest lists only probe's files."""
    from probe_toolkit.infra import owned

    out = w.root / "out" / "twice"
    args = ["report", _store_224(w), "--out", out, "--cache", w.cache]
    assert probe(*args).code == 0
    mine = {out / "figures" / "fig1-my-result.jpg": b"my figure", out / "tables" / "t1.tex": b"my table", out / "notes.md": b"mine"}
    for path, data in mine.items():
        write(path, data)
    (out / "report.md").write_text("edited by hand")  # probe's own file: the rerun replaces it
    again = probe(*args)
    assert again.code == 0, again.err
    assert all(path.read_bytes() == data for path, data in mine.items())
    assert (out / "report.md").read_text() != "edited by hand"
    listed = json.loads((out / owned.MANIFEST).read_text())["files"]["report"]
    assert "report.md" in listed and "report.html" in listed and not {"figures/fig1-my-result.jpg", "tables/t1.tex", "notes.md"} & set(listed)
    assert all((out / name).is_file() for name in listed)


def test_knn_narrows_dinos_default_ks_to_the_train_panel_with_a_note(w):
    """Without --k, DINO's 10,20,100,200 cannot apply to 6 train images: narrowed, said on stderr, recorded."""
    store = _knn_store(w)
    run = probe("knn", store, "--train", "ktr", "--val", "kva", *w.q)
    assert run.code == 0, run.err
    assert run.lines == ["note: --k 10,20,100,200 (DINO's default) narrowed to --k 6: panel 'ktr' has 6 train images"]
    assert list(records.load(store, "knn").k.values) == [6]
