"""``probe hummingbird STORE --train PANEL --val PANEL``: dense in-context retrieval on frozen patch tokens.

Order, which the ledger shows: every refusal that needs no label comes first (the panels' kinds
and roles, the store's views for both panels' images, each memory size against the memory views
and the grid); then the train panel's label maps are read (purpose ``hummingbird: memory``), the
memories are built and every val patch's soft label is transferred from them; only then are the
val panel's label maps read (``hummingbird: score``), and the predictions scored.

Views (``store.hbird_views``): the val images' ``hbird512`` tokens are the queries; the train
images' ``hbird512_aug0`` (and ``hbird512_aug1``: two augmentation epochs, as published) tokens
are the memory, each patch labelled by the share of its pixels of each class in the same crop of
the train label map. Features are the stored last-block patch tokens through the network's final
norm (recorded by extraction), as the reference's extractors return them. Results
``results/hummingbird``:

    miou, miou_hungarian          (memory)                   mean over the 21 classes
    iou, iou_hungarian            (memory, class)
    confusion                     (memory, class, predicted) pixels
    bank_rows, per_view           (memory)                   rows held; patches per memory view (0: all)
    truth                         (shown, y, x)              uint8 ground truth of the first val images, at the view's size
    prediction                    (memory, shown, y, x)      uint8 their transferred labels
    coords: memory ("102400", ..., "full"), class (names), shown (the val images' file names in the panel's folder)
    attrs: settings, ledger {train, val}, panels, counts, feature, views, provenance
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analyses import hummingbird as hb
from ..infra.errors import ProbeError
from ..infra.memory import keep_memory_flat, reusing_blocks
from ..infra.runner import Where, map_images, process_pool
from ..infra.settings import SettingError
from ..infra.shared import spooled
from ..labels import ade_segmentation, voc_segmentation
from ..labels.panels import Panel
from ..protocols.context import Inputs, RunContext, Saving
from ..protocols.hummingbird import HummingbirdSettings
from ..results import records
from ..results.hummingbird_report import HummingbirdReport
from ..store import cache, hbird_views, parts, views
from ..store.completion import computed_on
from . import shards
from .hummingbird_memory import MemorySource, built, memory_name, memory_plan
from .panel_stores import locate, panel_ids
from .runs import result_provenance

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    import xarray as xr

QUERY_BLOCK = 2  # val views per worker task (any value gives the same numbers)
DEVICE_QUERY_BLOCK = 16  # val views per task on a GPU: fewer, larger products (the same numbers)
BANK_BLOCK = 16384  # bank rows per product block (any value gives the same numbers)


# the panel kinds hummingbird reads: their reader and the classes it scores (open-hummingbird-eval: VOC's 21 with the
# background; ADE20K's 150 and "other", label 0, as a 151st class, hbird/data/ade20k/ade20k_data.py get_num_classes)
LAYOUTS = {voc_segmentation.KIND: (voc_segmentation, voc_segmentation.CLASSES), ade_segmentation.KIND: (ade_segmentation, ("other", *ade_segmentation.CLASSES))}


def _check_kinds(train: Panel, val: Panel) -> None:
    for panel in (train, val):
        if panel.kind not in LAYOUTS:
            raise ProbeError(
                panel.name,
                f"is a {panel.kind} panel; hummingbird reads label maps of a {' or '.join(LAYOUTS)} panel",
                f"register the VOC2012 folder: probe panel add NAME --voc-segmentation DIR --split {'train' if panel.role == 'train' else 'val'} "
                f"--role {panel.role} (or ADEChallengeData2016 with --ade20k)",
            )
    if train.kind != val.kind:
        raise ProbeError(
            val.name, f"is a {val.kind} panel and {train.name!r} a {train.kind} one; their classes differ", "score on a val panel of the train panel's data set"
        )


def _check_views(ds: xr.Dataset, ids: Sequence[str], views: Sequence[str], panel: Panel) -> None:
    """Every view the protocol reads is held, and finished, for every image of the panel (the fix
    command is made only for a refusal)."""
    from .panel_stores import panel_extract

    store, meta = Path(ds.attrs.get("store")), dict(ds.attrs.get("manifest") or {})

    def extract() -> str:
        return panel_extract(meta, store, panel.name, views)

    for view in views:
        if not cache.holds(ds, f"tokens_{view}"):  # at the run's block
            raise ProbeError(ds.attrs.get("store"), f"has no {view} view for panel {panel.name!r}", f"run `{extract()}`")
        if hbird_views.epoch(view) is not None and cache.view_facts(ds.attrs.get("manifest") or {}, view).get("augmentation") != hbird_views.ORDER:
            raise ProbeError(
                ds.attrs.get("store"),
                f"holds its {view} view in the order probe used before it followed open-hummingbird-eval's "
                "(the 8-bit crop jittered; the reference jitters the whole image, normalises, then crops the float tensor)",
                f"extract the memory views into a new store: `{panel_extract(meta, store, panel.name, views, into='NEW.zarr')}`",
            )
        flag = f"done_{view}"
        if flag in ds:
            done = np.asarray(ds[flag].sel(image=list(ids)).values, bool)
            if not done.all():
                raise ProbeError(
                    ds.attrs.get("store"),
                    f"has not finished its {view} view for {int((~done).sum())} of the {len(ids)} images of panel {panel.name!r}",
                    f"rerun `{extract()}` to finish it",
                )


def _ordered(read, store_ids: Sequence[str], panel: Panel) -> tuple[list[str], np.ndarray]:
    """(file names, indices into ``read.maps``) in the order of ``store_ids`` (each map is its
    image's size: ``label_maps.sized_as_images`` refused any other when they were read). The
    indices found by bisection in the sorted names, not a dict of every name (its objects outlive it, scattered in the heap)."""
    names = [read.image_map[s] for s in store_ids]
    ids = np.array(read.ids, dtype=str)
    by_name = np.argsort(ids, kind="stable")
    return names, by_name[np.searchsorted(ids[by_name], np.array(names, dtype=str))]


@contextmanager
def _search_workers(where: Where, blocks: int, device: str | None) -> Iterator[ProcessPoolExecutor | None]:
    """The search's local workers, forked now (a fork pool forks every worker at its first task):
    a forked worker starts as a copy of this process, which from the train labels' read on holds
    per-image data the workers never use. None where ``map_images`` makes the pool as before: one
    block, a cluster, or a torch search (whose workers are spawned once torch is loaded)."""
    if where.client is not None or device is not None:
        yield None
        return
    keep_memory_flat()  # the workers inherit the command's malloc settings, as map_images sets them
    with process_pool(min(where.workers, blocks), torch_free=True) as pool:  # torch_free: forked
        if pool is not None:
            pool.submit(int).result()
        yield pool


def soft_labels(values: np.ndarray, **search) -> dict[str, np.ndarray]:
    """``analyses.hummingbird.soft_labels_block`` (the task a worker runs) with freed blocks kept in
    the heap (``infra.memory.reusing_blocks``): the search's parts allocate the same arrays again
    and again, which the command's 128 KiB mmap threshold would otherwise map and fault in each time."""
    with reusing_blocks():
        return hb.soft_labels_block(values, **search)


def shard_scores(
    store: Path,
    which: tuple[int, int],
    share: tuple[int, int],
    shown: int,
    confusions: np.ndarray,
    truth_shown: np.ndarray,
    predicted_shown: np.ndarray,
    identity: dict[str, Any],
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray] | None, list[int]]:
    """This shard's confusion counts over its val images [a, b) and the shown images among them, saved
    as ``results/hummingbird-part-i-of-n``; (the summed counts and every shown image, []) once all
    parts with this ``identity`` are in (integer sums: the one-process run's counts), else (None, missing)."""
    a, b = share
    import xarray as xr

    mine = slice(min(a, shown), min(b, shown))  # the shown images in this share
    part = xr.Dataset(
        {
            "confusion": (("memory", "class", "predicted"), confusions),
            "truth": (("shown", "y", "x"), truth_shown[mine]),
            "prediction": (("memory", "shown", "y", "x"), predicted_shown[:, mine]),
        }
    )
    parts, missing = shards.exchange(store, "hummingbird", which, part, identity)
    if missing:
        return None, missing
    return (
        np.sum([q.confusion.values for q in parts], axis=0),
        np.concatenate([q.truth.values for q in parts], axis=0),
        np.concatenate([q.prediction.values for q in parts], axis=1),
    ), []


def run(inputs: Inputs, settings: HummingbirdSettings, context: RunContext) -> HummingbirdReport:
    """Build each memory from the train panel, transfer labels to the val panel's patches, score; save ``results/hummingbird``.

    The val images' blocks run where the context places them (local workers or the dask cluster),
    each against the memory (``infra.shared.Shared``: a file read block by block by every worker).
    Backend torch searches with torch on the placement's device (cpu, or cuda: one process by
    default, the memory moved to the GPU once), with the numpy search's neighbours and cosines
    (``analyses.search_torch``). A shard builds the memories (the train labels are read in each) and
    labels its contiguous share of the val images; the last one to finish sums the parts'
    confusion counts (``shard_scores``) and saves the record. The placement (a GPU asked for and
    absent, --workers beside --dask-address) was checked before the run: before any label read."""
    from ..analyses import search_torch

    device = context.search_device()
    train_panel, val_panel = context.panel("train"), context.panel("val")  # roles, kinds and seals checked before the run
    _check_kinds(train_panel, val_panel)
    layout, classes = LAYOUTS[train_panel.kind]
    store = inputs.store
    query_view, *augmented = views.hbird_views(settings.size)  # hbird@S and its memory views (hbird512, hbird512_aug<e> at 512)
    memory_views = tuple(augmented[: settings.augmentation_epochs])
    patch = int(cache.manifest(cache.open_store(store, plain=True))["arch"]["patch"])
    if settings.size % patch and views.view(query_view).alias is None:  # hbird512 keeps its rule: at /14 its top-left 504 px
        low, high = settings.size // patch * patch, -(-settings.size // patch) * patch
        raise SettingError("size", f"size {settings.size} is not a multiple of the network's {patch}-px patch", f"use size {low} or {high}")
    panels = [(train_panel, panel_ids(train_panel), memory_views), (val_panel, panel_ids(val_panel), (query_view,))]  # VOC's share JPEGImages/
    source = locate(store, panels, "patch", (query_view, *memory_views), plain=True)  # xarray only to save the result
    meta = source.manifest
    train_ds, train_ids = source.panel_stores[train_panel.name]
    val_ds, val_ids = source.panel_stores[val_panel.name]
    _check_views(train_ds, train_ids, memory_views, train_panel)
    _check_views(val_ds, val_ids, (query_view,), val_panel)
    grid = settings.size // patch
    cut = grid * patch  # the pixels the network reads (512 at /16; at the default 512, the top-left 504 at /14)
    n_views = len(train_ids) * len(memory_views)
    plan = memory_plan(settings.memory, n_views, grid, settings.k)  # every size checked before any label is read
    norm = parts.final_norm(meta, store)
    checkpoint = str((meta.get("checkpoint") or {}).get("sha256", "?"))

    values = {"values": cache.require(val_ds, f"tokens_{query_view}").sel(image=list(val_ids))}  # checked, and a cluster's workers read it themselves
    query_block = DEVICE_QUERY_BLOCK if device not in (None, "cpu") else QUERY_BLOCK
    which, (a, b) = shards.share(context.shard(), len(val_ids), QUERY_BLOCK)  # every val image when not sharded
    folder = records.results_path(train_ds.attrs.get("store") or store, "")
    bank_rows, n_classes = [rows for _, rows in plan], len(classes)
    with ExitStack() as files, context.placed() as where:
        pool = files.enter_context(_search_workers(where, -(-(b - a) // query_block), device))  # before the label reads: forked small
        train_read = context.read("train", layout.read_label_maps, purpose="hummingbird: memory", checkpoint=checkpoint, images=train_ids)
        names, order = _ordered(train_read, train_ids, train_panel)
        memory_source = MemorySource(train_ds, list(train_ids), train_read.maps, order, names, tuple(memory_views), grid, cut, norm, len(classes))
        progress = context.task("hummingbird", (b - a) * len(settings.memory))
        soft = []  # per memory size: every val patch's soft labels, spooled to a file as the blocks come
        for size in settings.memory:
            spool = files.enter_context(spooled((b - a, grid * grid, n_classes), np.float32, folder, f"hbird-soft-{memory_name(size)}"))
            with built(memory_source, size, settings.seed, folder) as (bank, labels, _):
                fn = functools.partial(
                    soft_labels,
                    bank=bank,
                    labels=labels,
                    norm=norm,
                    k=settings.k,
                    temperature=settings.temperature,
                    block=context.search_block(query_block * grid * grid, BANK_BLOCK),
                    device=device,
                )
                try:
                    if b > a:
                        map_images(
                            fn,
                            values,
                            where=where,
                            block=query_block,
                            fixed=True,
                            progress=progress,
                            image_range=(a, b),
                            torch_free=device is None,
                            each=lambda _a, _b, part, spool=spool: spool.append(part["soft"]),
                            keep=False,
                            pool=pool,
                        )
                finally:
                    search_torch.forget()
            soft.append(spool.shared())
        if pool is not None:
            pool.shutdown()  # the search is done: no idle worker waits through the scoring
        train_entry = train_read.entry_id
        del train_read, memory_source, names, order  # every memory is built: the train maps' files, digests and names go before the val read

        val_read = context.read("val", layout.read_label_maps, purpose="hummingbird: score", checkpoint=checkpoint, images=val_ids)
        val_names, val_order = _ordered(val_read, val_ids, val_panel)
        shown = min(settings.figure_images, len(val_ids))
        truth_shown = np.zeros((shown, cut, cut), np.uint8)
        predicted_shown = np.zeros((len(soft), shown, cut, cut), np.uint8)
        confusions = np.zeros((len(soft), n_classes, n_classes), np.int64)
        i = a
        with reusing_blocks():  # every image allocates the same arrays: the heap's pages serve again
            for portion in val_read.maps.portions(val_order[a:b]):  # this shard's val images (all of them when not sharded), a portion at a time
                for y in portion:
                    truth = hbird_views.label_view(y, query_view, val_names[i])[:cut, :cut]
                    for m, scores in enumerate(soft):
                        predicted = hb.predict(scores.rows(i - a, i - a + 1)[0], (grid, grid), (cut, cut))
                        confusions[m] += hb.confusion(truth, predicted, n_classes)
                        if i < shown:
                            predicted_shown[m, i] = predicted
                    if i < shown:
                        truth_shown[i] = truth
                    i += 1
    ledger = {"train": train_entry, "val": val_read.entry_id}
    memory = [memory_name(s) for s in settings.memory]
    if context.sharded:
        identity = {
            "settings": json.dumps(settings.as_dict(), sort_keys=True),
            "memory_rows": [int(r) for r in bank_rows],
            "train_sha256": shards.images_sha256(list(train_ids)),
            "images_sha256": shards.images_sha256(list(val_ids)),
            "grid": int(grid),
        }
        whole, missing = shard_scores(store, which, (a, b), shown, confusions, truth_shown, predicted_shown, identity)
        if whole is None:  # a shard that finished before the others
            return context.finish(
                HummingbirdReport(
                    store, source.name, memory, [], bank_rows, [p for p, _ in plan], classes, {}, ledger, settings.matching, train_panel.kind, waiting=missing
                )
            )
        confusions, truth_shown, predicted_shown = whole
    import xarray as xr

    results = [hb.miou(c) for c in confusions]
    counts = {"train": len(train_ids), "memory_views": n_views, "val": len(val_ids), "pixels": int(results[0].pixels) if results else 0}
    ds = xr.Dataset(
        {
            "miou": ("memory", [r.miou for r in results]),
            "miou_hungarian": ("memory", [r.miou_hungarian for r in results]),
            "iou": (("memory", "class"), np.stack([r.iou for r in results])),
            "iou_hungarian": (("memory", "class"), np.stack([r.iou_hungarian for r in results])),
            "confusion": (("memory", "class", "predicted"), confusions),
            "bank_rows": ("memory", np.asarray(bank_rows, np.int64)),
            "per_view": ("memory", np.asarray([p for p, _ in plan], np.int64)),
            "truth": (("shown", "y", "x"), truth_shown),
            "prediction": (("memory", "shown", "y", "x"), predicted_shown),
        },
        coords={"memory": memory, "class": list(classes), "predicted": list(classes), "shown": list(val_names[:shown])},
    )
    attrs = {
        "settings": settings.as_dict(),
        "matching": settings.matching,
        "panel_kind": train_panel.kind,
        "ledger": ledger,
        "counts": counts,
        "grid": grid,
        "pixels_side": cut,
        "panels": {
            "train": {"name": train_panel.name, "role": train_panel.role, "split": train_panel.split},
            "val": {"name": val_panel.name, "role": val_panel.role, "split": val_panel.split, "images": str(val_panel.images)},
        },
        "views": {"query": query_view, "memory": list(memory_views)},
        "size": int(settings.size),
        "feature": "last-block patch tokens through the final norm" if norm is not None else "last-block patch tokens (the network has no final norm)",
        "search": (f"exact: float64 products rounded to float32, running top-{settings.k}, equal cosines by bank row ({'torch on ' + device if device else 'numpy'})"),
        "source": "vpariza/open-hummingbird-eval hbird/hbird_eval.py (HbirdEvaluation)",
        "provenance": result_provenance(val_ds, context.command),
        "computed_on": computed_on(store, list(val_ids), scope="panel", read_from=val_ds.attrs.get("store") or store),  # the val images scored
    }
    if norm is None:
        context.note("note: the network has no final norm; its stored patch tokens are the features")
    return context.finish(
        HummingbirdReport(store, source.name, memory, results, bank_rows, [p for p, _ in plan], classes, counts, ledger, settings.matching, train_panel.kind),
        Saving(store, "hummingbird", ds, attrs),
    )
