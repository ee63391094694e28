"""``probe position STORE...``: a linear probe of each patch token's normalised (row, col), trained
on some of a store's images and scored on the others, saved as ``results/position`` in each store.

Reads no panel and no label: the targets are the tokens' own grid positions. The images are
split once by a seeded draw (``analyses.position.split``); the training images are read a
batch of 32 at a time in store order, as RADIO's loader feeds them (held in memory when they fit
in ``MEMORY``). Result ``results/position``:

    loss, l1, l1_row, l1_col, chance    ()       held-out SmoothL1 (RADIO's figure), L1 error, per coordinate, chance level
    train_loss                          (epoch)  mean training loss of each epoch
    weight (coordinate, channel), bias (coordinate)   the fitted map ((row, col) = (y, x))
    attrs: view, block, grid, images {train, held_out}, settings, and the provenance (command, versions, computed_on: the images read)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analyses import position
from ..analyses.grid import grid_side
from ..infra.errors import ProbeError
from ..protocols.context import Inputs, RunContext, Saving
from ..results.position_report import RESULT, PositionReport, StorePosition
from ..store import cache, views
from . import token_rows
from .runs import result_provenance

MEMORY = 2 << 30  # training tokens held in memory up to this many bytes; beyond, read again each epoch


def _reader(array, indices: np.ndarray, batch: int):
    """A function of the epoch giving the training batches (images in store order), from memory when they fit."""
    width = int(array.shape[-1])
    held = None
    if len(indices) * int(array.shape[1]) * width * 4 <= MEMORY:
        held = np.asarray(array.isel(image=indices).values, np.float32)

    def batches(epoch: int):
        for a in range(0, len(indices), batch):
            yield held[a : a + batch] if held is not None else np.asarray(array.isel(image=indices[a : a + batch]).values, np.float32)

    return batches


def run(inputs: Inputs, settings, context: RunContext) -> PositionReport:
    """The position probe of each store's patch tokens at ``settings.view`` and the context's block; one record per store."""
    view = views.canonical(settings.view)
    opened = {}
    for store in dict.fromkeys(Path(s) for s in inputs.stores):  # every store checked before any is fitted
        ds = cache.open_store(store, allow_partial=settings.partial, arrays=[token_rows.array_name("patch", view)], plain=True)
        array = token_rows.read(ds, "patch", view, context.block)
        n = int(array.shape[0])
        held_out = round(settings.held_out * n)
        if held_out < 1 or held_out >= n:
            raise ProbeError(
                store,
                f"has {n} images: a held-out share of {settings.held_out:g} leaves {held_out} held out and {n - held_out} to train on",
                "extract more images, or change held_out so that both sides have at least one image",
            )
        opened[store] = (ds, array)
    report, saving = PositionReport(view), []
    for store, (ds, array) in opened.items():
        advance = context.task(str(store), 1)
        side = grid_side(int(array.shape[1]), array.name)
        ids = [str(i) for i in ds["image"].values]
        train, held = position.split(ids, settings.held_out, settings.seed)
        values = np.asarray(array.isel(image=held).values, np.float32)
        token_rows.check_finite(store, array.name, values)
        fit = position.train_probe(
            _reader(array, train, settings.batch),
            [values[a : a + settings.batch] for a in range(0, len(values), settings.batch)],
            int(array.shape[-1]),
            side,
            side,
            epochs=settings.epochs,
            lr=settings.lr,
            seed=settings.seed,
        )
        advance(1)
        images = {"train": len(train), "held_out": len(held)}
        block = token_rows.block_of(array, ds)
        data = xr_result(fit)
        attrs = {
            "view": view,
            "block": int(block),
            "grid": int(side),
            "images": images,
            "settings": settings.as_dict(),
            "targets": "linspace(-1, 1) along each side of the grid (RADIO position_predictor.py generate_position_tensor)",
            "source": "NVlabs/RADIO examples/position_predictor.py",
            **result_provenance(ds, context.command),
        }  # computed_on at the top: the report checks the record against the store now
        report.stores.append(StorePosition(store, int(block), fit, int(side), images))
        saving.append(Saving(store, RESULT, data, attrs))
    return context.finish(report, *saving)


def xr_result(fit: position.PositionResult):
    import xarray as xr

    return xr.Dataset(
        {
            "loss": ((), fit.loss),
            "l1": ((), fit.l1),
            "l1_row": ((), fit.l1_row),
            "l1_col": ((), fit.l1_col),
            "chance": ((), fit.chance),
            "train_loss": ("epoch", np.asarray(fit.train_loss)),
            "weight": (("coordinate", "channel"), fit.weight),
            "bias": ("coordinate", fit.bias),
        },
        coords={"epoch": np.arange(len(fit.train_loss)), "coordinate": ["row", "col"]},
    )
