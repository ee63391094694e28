"""``probe similarity STORE [--other STORE2]``: linear CKA between the blocks of one store, or between
the blocks of two checkpoints' stores of the same images, saved as ``results/similarity`` in STORE.

Reads no panel and no label. Examples (``examples``): ``image`` (each image one example, its patch
tokens flattened: Kornblith's and Nguyen's convention for a feature map), ``class`` (the class
token of each image) or ``patch`` (every patch token an example). Two stores must hold the same
images (ids and file sha256, in one order) and, for patch tokens, one grid; otherwise one line
before any token is read. Result ``results/similarity``:

    cka            (set, other)   full linear CKA (Kornblith et al. 2019) between every pair of sets
    cka_minibatch  (set, other)   the unbiased minibatch estimator (Nguyen et al. 2021); NaN where not computed
    coords: set = "<store>:<block>" (store a = STORE, b = --other), store (set), block (set)
    attrs: view, examples, examples_count, batch, epochs, batches, seed, stores {a, b}, minibatch_note, and the provenance (command,
           versions, computed_on: the images read)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analyses import similarity
from ..infra.errors import ProbeError
from ..infra.runner import task_threads
from ..infra.settings import SettingError
from ..infra.spelling import fix_command
from ..protocols.context import Inputs, RunContext, Saving
from ..results.similarity_report import RESULT, SimilarityReport
from ..store import cache, views
from . import token_rows
from .runs import result_provenance

MEMORY = 2 << 30  # bytes the full estimator on whole images may hold (one set's tokens, every set's n × n Gram)


def _kind(examples: str) -> str:
    return "class" if examples == "class" else "patch"


def check_pair(a, b, a_path: Path, b_path: Path, kind: str, view: str) -> None:
    """Two stores compared example by example: the same images, in one order, and one grid for patch tokens."""
    ids_a, ids_b = [str(i) for i in a["image"].values], [str(i) for i in b["image"].values]
    if ids_a != ids_b:
        differ = len(set(ids_a) ^ set(ids_b))
        raise ProbeError(
            b_path,
            f"holds other images than {a_path} ({len(ids_b)} against {len(ids_a)}, {differ} not in both)" if differ else f"holds the images of {a_path} in another order",
            "extract both checkpoints from the same image folder",
        )
    if "image_sha256" in a and "image_sha256" in b:
        same = np.all(np.asarray(a["image_sha256"].values) == np.asarray(b["image_sha256"].values), axis=1)
        if not same.all():
            raise ProbeError(
                b_path, f"holds {int((~same).sum())} images whose files differ from {a_path}'s under the same ids", "extract both checkpoints from the same image files"
            )
    if kind == "patch":
        pa, pb = token_rows.read(a, "patch", view).shape[1], token_rows.read(b, "patch", view).shape[1]
        if pa != pb:
            raise ProbeError(
                b_path,
                f"has {pb} patch tokens per image at the {view} view, {a_path} {pa}: patch tokens pair up only on one grid",
                f"compare their class tokens: probe similarity {a_path} --other {b_path} --view {view} --examples class",
            )


def _sets(ds, store_name: str, kind: str, view: str):
    return [(f"{store_name}:{b}", store_name, b, token_rows.read(ds, kind, view, b, ("examples", "patch"))) for b in token_rows.held_blocks(ds, kind, view)]


def full_cka(sets, examples: str) -> np.ndarray:
    arrays = [s[3] for s in sets]
    if examples == "image":
        n, per = int(arrays[0].shape[0]), int(np.prod(arrays[0].shape[1:]))
        need = max(n * per * 4, len(arrays) * n * n * 8)
        if need > MEMORY:
            raise SettingError(
                "estimators",
                f"full CKA on whole images would hold {need / 2**30:.1f} GiB ({n} images, more than {MEMORY / 2**30:.0f} GiB)",
                "use the minibatch estimator alone: estimators=minibatch, or compare every patch token: examples=patch",
                arrays[0].attrs.get("probe_store"),
                others=("examples",),
            )
        grams = similarity.ExampleGrams()
        for array in arrays:
            values = np.asarray(array.values, np.float32)
            token_rows.check_finite(array.attrs.get("probe_store"), array.name, values)
            grams.add(values)
        return grams.cka()
    moments = similarity.FeatureMoments(tuple(int(a.shape[-1]) for a in arrays))
    for a, b, first in token_rows.image_chunks(arrays[0]):
        chunk = [first] + [np.asarray(x.isel(image=slice(a, b)).values, np.float32) for x in arrays[1:]]
        for x in chunk:
            token_rows.check_finite(arrays[0].attrs.get("probe_store"), arrays[0].name, x)
        moments.add([token_rows.rows_of(x) for x in chunk])
    return moments.cka()


def minibatch_cka(sets, batch: int, epochs: int, seed: int) -> tuple[np.ndarray, int]:
    arrays = [s[3] for s in sets]
    n = int(arrays[0].shape[0])
    order = similarity.minibatch_order(n, batch, epochs, seed)
    sums = similarity.Minibatches(len(arrays))
    for rows in order:
        sums.add([np.asarray(x.isel(image=rows).values, np.float32) for x in arrays])
    return sums.cka(), len(order)


def run(inputs: Inputs, settings, context: RunContext) -> SimilarityReport:
    """CKA between every pair of blocks of the store (and of --other's); one record in the store."""
    store, other = Path(inputs.store), inputs.get("other")
    kind = _kind(settings.examples)
    view = views.canonical(settings.view)
    name = token_rows.array_name(kind, view)
    a = cache.open_store(store, allow_partial=settings.partial, arrays=[name], plain=True)
    sets = _sets(a, "a", kind, view)
    b = None
    if other is not None:
        if Path(other).resolve() == store.resolve():
            raise SettingError("other", "is the store itself", "give another checkpoint's store, or leave other out to compare the store's blocks", other)
        b = cache.open_store(other, allow_partial=settings.partial, arrays=[name], plain=True)
        check_pair(a, b, store, Path(other), kind, view)
        sets += _sets(b, "b", kind, view)
    elif len(sets) < 2:
        raise ProbeError(
            store,
            f"holds one block of {name} (block {sets[0][2]}): nothing to compare it with",
            f"compare it with a second checkpoint's store of the same images: probe similarity {store} --other STORE2",
        )
    n = int(sets[0][3].shape[0])
    advance = context.task(str(store), n)
    with task_threads(1):  # one BLAS thread: the same bits on any machine
        full = full_cka(sets, settings.examples) if "full" in settings.estimators else np.full((len(sets),) * 2, np.nan)
    advance(n)
    mb, batches, note = np.full((len(sets),) * 2, np.nan), 0, ""
    if "minibatch" in settings.estimators:
        # the rerun that computes it: whole images for patch tokens, and at most one minibatch of the store's images
        fits = n if n < settings.batch else None
        examples = "image" if settings.examples == "patch" else settings.examples
        paths = [Path(p).absolute() if p is not None else None for p in (store, other)]  # as the record names them (the report shows placeholders)
        rerun = fix_command("similarity", paths[0], other=paths[1], view=settings.view, examples=examples, batch=fits)
        if settings.examples == "patch":
            note = f"the minibatch estimator takes whole images or class tokens as examples: {rerun}"
        elif fits is not None:
            note = f"the store has {n} images, fewer than one minibatch of {settings.batch}: {rerun}"
        else:
            with task_threads(1):
                mb, batches = minibatch_cka(sets, settings.batch, settings.epochs, settings.seed)
    examples = n * (int(sets[0][3].shape[1]) if settings.examples == "patch" else 1)
    report = SimilarityReport(store, Path(other) if other else None, [s[0] for s in sets], full, mb, examples, note)
    return context.finish(report, Saving(store, RESULT, *dataset(report, a, settings, view, batches, context.command, b)))


def _describe(ds, path: Path) -> dict:
    manifest = ds.attrs.get("manifest", {})
    return {
        "path": str(Path(path).absolute()),
        "checkpoint_sha256": (manifest.get("checkpoint") or {}).get("sha256"),
        "network": manifest.get("network"),
        "images": int(ds.sizes.get("image", 0)),
    }


def dataset(report: SimilarityReport, a, settings, view: str, batches: int, command: str, b=None):
    """The record's dataset and attributes."""
    import xarray as xr

    stores = [s.split(":")[0] for s in report.sets]
    blocks = [int(s.split(":")[1]) for s in report.sets]
    data = xr.Dataset(
        {"cka": (("set", "other"), report.cka), "cka_minibatch": (("set", "other"), report.cka_minibatch)},
        coords={"set": report.sets, "other": report.sets, "store": ("set", stores), "block": ("set", np.asarray(blocks, np.int64))},
    )
    described = {"a": _describe(a, report.store)}
    if b is not None:
        described["b"] = _describe(b, report.other)
    attrs = {
        "view": view,
        "examples": settings.examples,
        "examples_count": int(report.examples),
        "batch": int(settings.batch),
        "epochs": int(settings.epochs),
        "batches": int(batches),
        "seed": int(settings.seed),
        "stores": described,
        "minibatch_note": report.minibatch_note,
        "estimators": list(settings.estimators),
        "source": "Kornblith et al. 2019 (linear CKA); Nguyen et al. 2021 and google-research efficient_CKA.py (unbiased minibatch CKA)",
        **result_provenance(a, command),
    }  # computed_on at the top: the report checks the record against the store now
    return data, attrs
