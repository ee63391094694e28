"""``probe decode CKPT --images DIR``: decode a set too large to cache, keys never written.

Keys at 480 px for MaskCut's ViT-B/8 are 3,600 × 768 values per image (7 TB in float16 for
ImageNet). Streaming reads each chunk of images through ``probe extract``'s own readout
(``store.extract``: the same loading, views, forward pass and the same cast to the store's
dtype), decodes the keys in memory through the runner, and writes only the decoder's arrays.
The next chunk's images are decoded (on extraction's decoding threads) while one runs.

The output is a masks store (``<cache>/<stem>-<sha8>/<network>-masks-<size>.zarr``), written
with the feature store's writer: chunks along ``image``, each chunk's ``done`` flags last, so a
killed run resumes by chunk and shards (``--shard i/n`` or torchrun's RANK/WORLD_SIZE) fill
disjoint ranges. Its manifest is the extraction manifest plus the decoder settings, which a
rerun must match. When every image is done, the run that finishes it saves
``results/decoder`` and ``results/decoder-masks.json`` in the masks store, as ``probe decode
STORE`` saves them in a feature store: the same arrays, bit for bit.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

from ..analyses.decoder import Decoded, collate
from ..analyses.decoder_blocks import ARRAYS, as_decoded, decode_block
from ..analyses.decoder_settings import Settings
from ..infra import provenance
from ..infra.atomic import write_json
from ..infra.memory import reusing_blocks
from ..infra.runner import map_blocks, process_pool
from ..infra.settings import SettingError
from ..labels.masks import coco_results, decoder_dataset
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.discovery import DecodeSettings
from ..results import records
from ..results.stream_report import StreamReport
from ..store import cache, extract_forward, extract_load, extract_plan, images
from ..store.backbone import Backbone
from ..store.checkpoints import load_checkpoint
from ..store.create import create_store
from ..store.views import keys_array

DTYPE = "float64"  # every decoder array round-trips exactly (bools, ints and float64 values)
KEYS_DTYPE = "float16"  # the keys as the forward pass rounds them, as a store's would be (they are never written)


VIEW = "decoded"  # the masks store's one "view": its arrays are ``<name>_decoded``, with their own flags


def _plan(slots: int, patches: int) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    per_mask = ("score", "lambda2", "lambda3", "gap", "ncut")
    plan = {"masks": (("mask", "patch"), (slots, patches)), **{name: (("patch",), (patches,)) for name in ("fiedler", "degree", "expansion")}}
    plan.update({name: (("mask",), (slots,)) for name in per_mask})
    plan.update({name: ((), ()) for name in ARRAYS if name not in plan})
    return {f"{name}_{VIEW}": spec for name, spec in plan.items()}


def masks_store_path(root: Path, stem: str, sha256: str, network: str, size: int | str) -> Path:
    return cache.store_path(root, stem, sha256, f"{network}-masks-{size}")


def run(inputs: Inputs, settings: DecodeSettings, context: RunContext) -> StreamReport:
    """Stream the image folder through the checkpoint and the decoder; see the module docstring.

    ``inputs.stop_after``: process at most this many chunks now (the rest resumes on the next
    run). On a dask cluster the forward pass runs here (a GPU's process), each chunk's keys are
    shipped to the cluster's workers in blocks and decoded there (one BLAS thread each, the same bits).
    """
    from .decode import resolve_settings

    chosen, settings_source = resolve_settings(preset=settings.preset, overrides=settings.overrides(), settings_file=settings.settings_file, cache_dir=context.cache_dir)
    report = stream(inputs, chosen, settings_source, settings.view, settings.keys, context)
    report.chosen = chosen
    if report.done < report.n_images:  # images still to do (this run's share, or a stop): nothing saved yet
        return context.finish(report)
    report.decoded, report.masks_file, saving = finish(report.store, chosen, settings_source)
    return context.finish(report, saving)


def stream(inputs: Inputs, settings: Settings, settings_source: str, view: str, keys: str, context: RunContext) -> StreamReport:
    """The images not yet done, through the network and the decoder, into the masks store."""
    checkpoint_path, image_dir, network, chunk, batch_size = inputs.checkpoint, inputs.images, inputs.network, inputs.chunk, inputs.batch_size
    backend, device, _ = context.decoder()
    size = int(view) if view == "480" else view
    interpolation = "dino"
    from .decode_views import check_view

    view = check_view(size)
    checkpoint = load_checkpoint(checkpoint_path, network=network)
    if checkpoint.arch.family == "dinov3":  # RoPE: no position table, every grid native
        interpolation = "auto"
    try:
        key_name = keys_array(checkpoint.arch.as_dict(), view, keys)
    except ValueError as error:
        from .decode_keys import refused_keys

        raise refused_keys(checkpoint_path, keys, str(error)) from None
    extraction = extract_plan.Settings(views=(view,), attention="none", dtype=KEYS_DTYPE, chunk=chunk, interpolation=interpolation)
    refs = images.list_images(image_dir)
    store = inputs.store
    path = Path(store) if store else masks_store_path(cache.cache_root(context.cache_dir), checkpoint.stem, checkpoint.sha256, network, view)
    meta = extract_plan.build_manifest(checkpoint, extraction, refs, str(image_dir))
    meta.update(
        kind="probe-masks", dtype=DTYPE, decoder=settings.as_dict(), backend=backend, keys_dtype=KEYS_DTYPE, views=[VIEW], keys_view=view, keys_kind=keys, per_view={}
    )
    own = view in images.OWN_SIZE
    if own:  # each image's grid from its header, as extraction reads it; masks padded to the most patches
        rows, cols = extract_plan.native_grids(refs, checkpoint.arch.patch, "fail", (view,))[view]
        patches, grid = int((rows * cols).max(initial=0)), {VIEW: (rows, cols)}
    else:
        patches, grid = (int(size) // checkpoint.arch.patch) ** 2, None
    writer = create_store(path, meta, [r.id for r in refs], _plan(settings.masks, patches), grid)
    if any(writer.manifest.get(key) != meta[key] for key in ("decoder", "backend", "keys_dtype", "keys_kind")) and not writer.done().any():
        shutil.rmtree(path)  # nothing of the other settings was finished: a failed run never blocks the corrected one
        writer = create_store(path, meta, [r.id for r in refs], _plan(settings.masks, patches), grid)
    for key in ("decoder", "backend", "keys_dtype", "keys_kind"):
        if writer.manifest.get(key, "plain" if key == "keys_kind" else None) != meta[key]:
            raise SettingError(
                "store",
                f"holds masks decoded with another {key} ({writer.manifest.get(key)})",
                "pass the same decoder options, or another store or cache_dir",
                path,
                others=("cache_dir",),
            )
    todo = writer.todo(context.shard() or (0, 1))
    if inputs.stop_after is not None:
        todo = todo[: inputs.stop_after]
    tick = context.task("stream", sum(b - a for a, b, _ in todo))
    forward_device = extract_forward.resolve_device("auto")
    backbone = Backbone.from_checkpoint(checkpoint, interpolation).to(forward_device)
    if settings.color_lambda:  # DSM's colour term: each block reads its images' files, as from a store's image_source
        from ..store.own_size import EDGE, PAD
        from .decode_colour import colour_block

        fn = partial(colour_block, settings=settings, source=str(Path(image_dir).resolve()), patch=checkpoint.arch.patch, padded=EDGE.get(view) == PAD)
    else:
        fn = partial(decode_block, settings=settings, backend=backend, device=device)
    names = np.array([r.id for r in refs], dtype=object)
    key_plan = {key_name: ((f"patch_{view}", "channel"), (patches, checkpoint.arch.width))}
    t0 = time.perf_counter()
    written = 0
    with (
        context.placed() as where,
        process_pool(where.workers) as pool,
        reusing_blocks(),
        ThreadPoolExecutor(extract_load.decoder_threads(None, "auto"), thread_name_prefix="probe-decode") as decoding,
        ThreadPoolExecutor(1) as loader,
    ):

        def load(run: tuple[int, int, tuple[str, ...]]) -> extract_load.Loaded:  # the next chunk's images, decoded while this one runs
            a, b = run[0], run[1]
            return extract_load.load_run(refs[a:b], [view], extraction, checkpoint.arch.patch, {view: (rows[a:b], cols[a:b])} if own else None, "fail", decoding)

        upcoming = loader.submit(load, todo[0]) if todo else None
        for index, (start, stop, _) in enumerate(todo):
            loaded = upcoming.result()
            upcoming = loader.submit(load, todo[index + 1]) if index + 1 < len(todo) else None
            keys = extract_forward.view_data(backbone, loaded, view, key_plan, stop - start, extraction, batch_size, forward_device, lambda n: None)[key_name]
            step = max(1, -(-len(keys) // (2 * where.workers)))
            ranges = [(a, min(a + step, len(keys))) for a in range(0, len(keys), step)]

            def block(a: int, b: int, start: int = start, keys: np.ndarray = keys) -> dict[str, np.ndarray]:
                out = {"keys": keys[a:b]}
                if own:
                    out.update(rows=rows[start + a : start + b], cols=cols[start + a : start + b])
                if settings.color_lambda:
                    out["names"] = names[start + a : start + b]
                return out

            arrays = map_blocks(fn, block, ranges, workers=where.workers, pool=pool, progress=tick, client=where.client)
            writer.write(start, {f"{k}_{VIEW}": v.astype(DTYPE) for k, v in arrays.items()}, loaded.original, loaded.failed[view])
            written += stop - start
    seconds = time.perf_counter() - t0
    done = writer.done()
    return StreamReport(store=path, n_images=len(refs), written=written, done=int(done.sum()), seconds=seconds, masks_file=None, decoded=None)


def load_decoded(path: Path, settings: Settings) -> tuple[Decoded, list[str], np.ndarray, np.ndarray]:
    """The masks store's arrays as ``Decoded`` (the dtypes ``collate`` gives; an own-size view's
    grids, patch size and view beside them), ids and sizes."""
    ds = cache.open_store(path, done_only=False)
    empty = collate([], settings, 1)
    arrays = {name: cache.checked(ds, f"{name}_{VIEW}").values.astype(getattr(empty, name).dtype) for name in ARRAYS}
    decoded = as_decoded(arrays, settings)
    meta = cache.manifest(path)
    if meta["keys_view"] in images.OWN_SIZE:
        decoded.grids = np.stack([ds[f"grid_rows_{VIEW}"].values, ds[f"grid_cols_{VIEW}"].values], axis=1).astype(np.int64)
        decoded.patch, decoded.view = int(meta["arch"]["patch"]), meta["keys_view"]
    return (decoded, [str(v) for v in ds["image"].values], ds["image_height"].values.astype(np.int64), ds["image_width"].values.astype(np.int64))


def finish(path: Path, settings: Settings, settings_source: str) -> tuple[Decoded, Path, Saving]:
    """Every image is done: the masks JSON written beside the masks; (the masks, that file, ``results/decoder`` to save)."""
    decoded, ids, heights, widths = load_decoded(path, settings)
    meta = cache.manifest(path)
    view = meta["keys_view"]
    masks_file = records.results_path(path, "decoder-masks.json")
    write_json(masks_file, coco_results(decoded, ids, heights, widths, None))
    return (
        decoded,
        masks_file,
        Saving(
            path,
            "decoder",
            decoder_dataset(decoded, ids),
            {
                "manifest": meta,
                "settings": settings.as_dict(),
                "settings_source": settings_source,
                "size": int(view) if view.isdigit() else view,
                "view": view,
                "provenance": provenance.stamp(),
                "backend": meta.get("backend"),
                "streamed": True,
            },
        ),
    )
