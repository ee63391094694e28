"""The report sections of the dense protocols: Hummingbird in-context retrieval, and linear
segmentation (``results/linear-segmentation``: the mIoU with the schedule that produced it, each
class's IoU, the loss curve, and the first val images with their ground truth and prediction as
``probe segment`` saved them after its ledgered read).

It reads ``results/hummingbird`` only: the mIoU per memory size (identity and the reference's
Hungarian-matched), each class's IoU, and the first val images' ground truth and transferred
labels, which ``probe hummingbird`` saved after its ledgered read (the report opens no label
file). The picture beside them is the image file squashed to the view, as the query view saw it.
The published numbers of open-hummingbird-eval sit in rows of their own, marked as other weights.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure as MplFigure

from ..labels.catalogue import data_set
from ..results import differ
from ..store import hbird_views, images
from . import figures
from .content import Figure, Note, Section, Table
from .sections_kit import lacking, results_section
from .sources import image_file

HOW = "run `probe hummingbird STORE --train PANEL --val PANEL` (needs `probe extract --views hbird512,hbird512_aug0,hbird512_aug1`)"
SHOWN = 3  # val images in the figure


def _pct(value) -> str:
    v = float(value)
    return f"{100 * v:.2f}" if np.isfinite(v) else "–"


def _colours(labels: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8: VOC's class colours (its devkit's bit-interleaved palette), 255 white."""
    out = np.zeros((*labels.shape, 3), np.uint8)
    for c in np.unique(labels):
        c = int(c)
        if c == 255:
            rgb = (255, 255, 255)
        else:
            r = g = b = 0
            v = c
            for bit in range(8):
                r |= ((v >> 0) & 1) << (7 - bit)
                g |= ((v >> 1) & 1) << (7 - bit)
                b |= ((v >> 2) & 1) << (7 - bit)
                v >>= 3
            rgb = (r, g, b)
        out[labels == c] = rgb
    return out


def class_legend(fig, maps: list[np.ndarray], names: list[str]) -> None:
    """Below the figure: the colour of every class the maps show, by name (ignored pixels are no class)."""
    import matplotlib.patches

    shown = sorted({int(v) for m in maps for v in np.unique(m) if int(v) != 255 and 0 <= int(v) < len(names)})
    if not shown:
        return
    colours = _colours(np.array(shown, dtype=np.int64)[None, :])[0] / 255.0
    handles = [matplotlib.patches.Patch(facecolor=c, edgecolor="0.3", label=names[v]) for v, c in zip(shown, colours)]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(6, len(handles)), fontsize=7, frameon=False)


def retrieval_maps(
    rows: list[tuple[str, np.ndarray | None, np.ndarray, list[tuple[str, np.ndarray]]]], store: str = "", classes: list[str] | None = None
) -> figures.Drawing:
    """Rows: a val image (id, its view or None), its ground truth, then its transferred labels at each memory size;
    the store's name above, the classes' colours below."""
    columns = 2 + max(len(r[3]) for r in rows)
    fig = MplFigure(figsize=(1.6 * columns + 0.2, 1.75 * len(rows) + 0.9), layout="constrained")
    axes = fig.subplots(len(rows), columns, squeeze=False)
    for r, (image_id, picture, truth, predicted) in enumerate(rows):
        cells = [(picture, figures.wrap(image_id.rsplit("/", 1)[-1], 14)), (_colours(truth), "ground truth")]
        cells += [(_colours(p), f"memory {name}") for name, p in predicted]
        for ax, (shown, title) in zip(figures.tile_row(axes[r], len(cells)), cells):
            if shown is not None:
                ax.imshow(shown)
            ax.set_title(title, fontsize=7)
    if store:
        fig.suptitle(figures.wrap(store, 60), fontsize=9)
    if classes:
        class_legend(fig, [m for r in rows for m in (r[2], *(p for _, p in r[3]))], classes)
    return figures.png(fig)


def hummingbird(ctx) -> Section:
    from ..analyses.hummingbird_published import INPUT_SIZE, PUBLISHED, PUBLISHED_MEMORY_SIZES, PUBLISHED_SOURCE, comparable

    section, found = results_section(ctx, "hummingbird", "Hummingbird dense retrieval (open-hummingbird-eval)", "hummingbird", "Hummingbird results", HOW)
    for label, (store, ds) in found.items():
        memory = [str(m) for m in ds.memory.values]
        headline = ds.attrs.get("matching", "identity")
        rows = [
            [f"{label}: mIoU{' (headline)' if headline == 'identity' else ''}", *(_pct(v) for v in ds.miou.values)],
            [f"{label}: mIoU, Hungarian-matched{' (headline)' if headline == 'hungarian' else ''}", *(_pct(v) for v in ds.miou_hungarian.values)],
            ["memory rows", *(str(int(v)) for v in ds.bank_rows.values)],
        ]
        voc = ds.attrs.get("panel_kind", "voc-segmentation") == "voc-segmentation"
        published, size = [str(m) for m in PUBLISHED_MEMORY_SIZES], int(ds.attrs.get("size", INPUT_SIZE))  # records before --size: 512
        beside = comparable(memory, size) if voc else ()  # a published row only at this run's input size and a published memory size
        for name, values in beside:
            by_size = dict(zip(published, values))
            rows.append([f"published, other weights: {name}", *(f"{by_size[m]:.1f}" if m in by_size else "–" for m in memory)])
        counts, pan, led = ds.attrs.get("counts", {}), ds.attrs.get("panels", {}), ds.attrs.get("ledger", {})
        section.blocks.append(
            Table(
                ["", *(f"memory {m}" for m in memory)],
                rows,
                f"{label}: {data_set(ds.attrs.get('panel_kind', 'voc-segmentation'))} mIoU (%) over "
                f"{len(ds['class'])} classes, {pan.get('train', {}).get('name', '?')} "
                f"({counts.get('train', '?')} images × {len(ds.attrs.get('views', {}).get('memory', []))} augmented views) → "
                f"{pan.get('val', {}).get('name', '?')} ({counts.get('val', '?')} images), input size {size} px"
                + (
                    f"; published rows: {PUBLISHED_SOURCE}, measured on released weights, not this store's network."
                    if beside
                    else ""
                    if voc
                    else "; no published numbers for this data set."
                ),
            )
        )
        apart = [(name, values) for name, values in PUBLISHED if (name, values) not in beside]
        if voc and apart:  # the published numbers at their own input and memory sizes: no column of this run is comparable with them
            section.blocks.append(
                Table(
                    ["published, other weights", *(f"memory {int(m):,}" for m in PUBLISHED_MEMORY_SIZES)],
                    [[name, *(f"{v:.1f}" for v in values)] for name, values in apart],
                    f"{label}: the published VOC mIoU (%) at the published memory sizes, each at its input size ({PUBLISHED_SOURCE}); "
                    f"this run (memory {', '.join(f'{int(m):,}' if m.isdigit() else m for m in memory)}, input size {size} px) "
                    "does not share these settings, so no number above is comparable with them.",
                )
            )
        per_class = [[str(c), *(_pct(ds.iou.values[m, i]) for m in range(len(memory)))] for i, c in enumerate(ds["class"].values)]
        section.blocks.append(Table(["class", *(f"IoU, memory {m}" for m in memory)], per_class, f"{label}: each class's IoU (%), no matching."))
        section.blocks.append(
            Note(
                f"{label}: features — {ds.attrs.get('feature', '?')}; views — queries {ds.attrs.get('views', {}).get('query')}, "
                f"memory {', '.join(ds.attrs.get('views', {}).get('memory', []))}. Labels: train {ctx.book.describe(led.get('train'))}; "
                f"val {ctx.book.describe(led.get('val'))}."
            )
        )
        if ds.sizes.get("shown", 0):
            section.blocks.append(_figure(ctx, store, ds, label))
    return lacking(section, ctx, found, "Hummingbird results", HOW)


def _figure(ctx, store, ds, label: str) -> Figure:
    side, size = int(ds.attrs.get("pixels_side", hbird_views.SIDE)), int(ds.attrs.get("size", hbird_views.SIDE))
    query = ds.attrs.get("views", {}).get("query", hbird_views.VAL)
    rows = []
    for j, image_id in enumerate(str(v) for v in ds.shown.values[:SHOWN]):
        path = image_file(store, image_id)  # the store's own image, else the val panel's file (a sibling store's image)
        folder = (ds.attrs.get("panels", {}).get("val", {}) or {}).get("images")
        if path is None and folder and (Path(folder) / image_id).is_file():
            path = Path(folder) / image_id
        picture = None
        if path is not None:
            picture = np.asarray(hbird_views.squashed(images.load_image(path), size).crop((0, 0, side, side)))
        predicted = [(str(m), ds.prediction.values[i, j]) for i, m in enumerate(ds.memory.values)]
        rows.append((image_id, picture, ds.truth.values[j], predicted))
    colours = (
        "VOC's colours, boundary white"
        if ds.attrs.get("panel_kind", "voc-segmentation") == "voc-segmentation"
        else "ADE20K's classes in VOC's devkit palette, 'other' black"
    )
    k = int(differ.settings(ds)["k"])
    caption = (
        f"{label}: the first {len(rows)} val images of results/hummingbird, each as its {query} view, its ground truth "
        f"({colours}) and the labels transferred from the memory's {k} nearest patches at each memory size."
    )
    return ctx.figure("hummingbird-retrieval", retrieval_maps(rows, label, [str(c) for c in ds["class"].values]), caption)


SEGMENT_HOW = "run `probe segment CHECKPOINT --train PANEL --val PANEL` (ADE20K or VOC segmentation panels)"


def _overlay(picture: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Half the picture, half the class colours; ignored pixels show the picture alone."""
    h, w = labels.shape
    base = picture[:h, :w].astype(np.float32)
    out = 0.5 * base + 0.5 * _colours(labels).astype(np.float32)
    out[labels == 255] = base[labels == 255]
    return out.astype(np.uint8)


def segmentation_maps(
    rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], losses: np.ndarray, store: str = "", classes: list[str] | None = None
) -> figures.Drawing:
    """Rows: a val image, its ground truth and the trained head's prediction over it; the last
    row's extra panel is the training loss per iteration; the store's name above, the classes' colours below."""
    fig = MplFigure(figsize=(7.2, 2.0 * max(len(rows), 1) + 2.2), layout="constrained")
    grid = fig.add_gridspec(len(rows) + 1, 3, height_ratios=[*([1.0] * len(rows)), 0.8])
    for r, (image_id, picture, truth, predicted) in enumerate(rows):
        for c, (shown, title) in enumerate(
            ((picture, figures.wrap(image_id.rsplit("/", 1)[-1], 18)), (_overlay(picture, truth), "ground truth"), (_overlay(picture, predicted), "prediction"))
        ):
            ax = fig.add_subplot(grid[r, c])
            ax.imshow(shown)
            ax.set_title(title, fontsize=7)
            ax.set_axis_off()
    ax = fig.add_subplot(grid[len(rows), :])
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8)
    ax.set_xlabel("iteration", fontsize=7)
    ax.set_ylabel("loss", fontsize=7)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # iterations are whole
    ax.tick_params(labelsize=6)
    if store:
        fig.suptitle(figures.wrap(store, 60), fontsize=9)
    if classes:
        class_legend(fig, [m for r in rows for m in (r[2], r[3])], classes)
    return figures.png(fig)


def segmentation(ctx) -> Section:
    from ..analyses.segment_published import PUBLISHED

    section, found = results_section(
        ctx, "linear-segmentation", "Linear segmentation (DINOv3 / DINOv2 linear head)", "linear-segmentation", "linear segmentation results", SEGMENT_HOW
    )
    for label, (_store, ds) in found.items():
        schedule, settings = ds.attrs.get("schedule", {}), ds.attrs.get("settings", {})
        kind = ds.attrs.get("panel_kind", "ade20k")
        rows = [[f"{label} ({schedule.get('label', '?')})", _pct(ds.miou.values), _pct(ds.accuracy.values)]]
        rows += [[f"published, other weights: {name}", f"{value:.1f}", "–"] for name, published_kind, value in PUBLISHED if published_kind == kind]
        counts, pan, led = ds.attrs.get("counts", {}), ds.attrs.get("panels", {}), ds.attrs.get("ledger", {})
        section.blocks.append(
            Table(
                ["", "mIoU (%)", "pixel accuracy (%)"],
                rows,
                f"{label}: preset {settings.get('preset', '?')}, {pan.get('train', {}).get('name', '?')} ({counts.get('train', '?')} images, "
                f"{schedule.get('iterations', '?')} iterations of {schedule.get('batch', '?')} crops of {settings.get('crop', '?')} px) → "
                f"{pan.get('val', {}).get('name', '?')} ({counts.get('val', '?')} images, windows {settings.get('crop', '?')} / "
                f"{settings.get('stride', '?')}); mean over the classes labelled or predicted."
                + (
                    ""
                    if not schedule.get("unpublished_settings")
                    else " Settings other than the published: " + ", ".join(f"{k} {v}" for k, v in schedule["unpublished_settings"].items()) + "."
                )
                + " Published rows: released weights on the full data set with the published settings, not this network.",
            )
        )
        per_class = [[str(c), _pct(v)] for c, v in zip(ds["class"].values, ds.iou.values) if np.isfinite(v)]
        section.blocks.append(Table(["class", "IoU (%)"], per_class, f"{label}: each class labelled or predicted in the val panel."))
        section.blocks.append(
            Note(
                f"{label}: features — {ds.attrs.get('feature', '?')}; head — BatchNorm + 1×1 convolution, dropout "
                f"{settings.get('dropout', '?')}, AdamW lr {settings.get('lr', '?')} weight decay {settings.get('weight_decay', '?')}, "
                f"{schedule.get('decay', '?')} schedule, warm-up {schedule.get('warmup', '?')}; labels: train "
                f"{ctx.book.describe(led.get('train'))}; val {ctx.book.describe(led.get('val'))}."
            )
        )
        if ds.sizes.get("shown", 0):
            section.blocks.append(_segmentation_figure(ctx, ds, label))
    return lacking(section, ctx, found, "linear segmentation results", SEGMENT_HOW)


def _segmentation_figure(ctx, ds, label: str) -> Figure:
    sizes = ds.attrs.get("sizes") or [list(ds.truth.shape[1:])] * ds.sizes["shown"]
    rows = []
    for j, image_id in enumerate(str(v) for v in ds.shown.values[:SHOWN]):
        h, w = sizes[j]
        rows.append((image_id, ds.image.values[j, :h, :w], ds.truth.values[j, :h, :w], ds.prediction.values[j, :h, :w]))
    caption = (
        f"{label}: the first {len(rows)} val images of results/linear-segmentation, their ground truth and the trained head's "
        f"prediction over them (class colours, ignored pixels unpainted), and the training loss per iteration."
    )
    return ctx.figure("linear-segmentation", segmentation_maps(rows, ds.loss.values, label, [str(c) for c in ds["class"].values]), caption)
