"""The protocols' two pictures, each from saved results only (nothing is recomputed):

- ``knn_grid``: a few val queries of ``results/knn`` (the first in the saved order), each beside
  its nearest train images (``neighbour``, ``similarity``: the top ranks ``probe knn`` keeps), as
  the retrieval grids of the DINO paper show them; every picture is the store's 224 view of the
  image file, as k-NN saw it (``sources.followed_picture``, the tokens' PCA when a file is gone).
- ``propagation_strip``: a few frames of one sequence with the masks ``probe propagate`` wrote
  (the indexed PNGs in ``results/davis``'s ``out`` folder), beside the first frame with its
  ground truth: the first PNG of the sequence is that annotation, written by the command after
  its ledgered read, so the report opens no annotation file of its own.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure as MplFigure
from matplotlib.patches import Patch
from PIL import Image

from . import figures
from .content import Figure, Note
from .sources import followed_picture

QUERIES = 3
STRIP_FRAMES = 4  # predicted frames shown after the first
FRAMES = "JPEGImages/480p"  # DAVIS's frame folder, as davis_sequences reads it


def _short(image_id: str) -> str:
    return figures.wrap(image_id.rsplit("/", 1)[-1], 12)


def knn_grid(queries: list[tuple[str, np.ndarray | None, str]], neighbours: list[list[tuple[str, np.ndarray | None, float]]]) -> figures.Drawing:
    """Rows: a query (id, 224 view, its class) then its neighbours (id, 224 view, cosine), best first."""
    columns = 1 + max(len(n) for n in neighbours)
    fig = MplFigure(figsize=(1.25 * columns + 0.2, 1.55 * len(queries) + 0.3), layout="constrained")
    axes = fig.subplots(len(queries), columns, squeeze=False)
    for r, ((image_id, rgb, cls), found) in enumerate(zip(queries, neighbours)):
        cells = [(rgb, f"query\n{_short(image_id)}\n{cls}", figures.PALETTE[0])]
        cells += [(n_rgb, f"#{rank} · {sim:.2f}\n{_short(n_id)}", None) for rank, (n_id, n_rgb, sim) in enumerate(found, 1)]
        for c in range(columns):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(cells):
                ax.set_visible(False)
                continue
            picture, title, frame = cells[c]
            if picture is not None:
                ax.imshow(picture)
            ax.set_title(title, fontsize=7)
            if frame is not None:  # the query is framed in the first store colour, thick
                for spine in ax.spines.values():
                    spine.set_edgecolor(frame)
                    spine.set_linewidth(3)
    return figures.png(fig)


def knn_figure(ctx, store, ds) -> tuple[Figure, list[str]]:
    """The grid of ``results/knn``'s first queries, and the ids whose files were gone (drawn from tokens)."""
    order = [store] + [s for s in ctx.stores if s is not store]
    train_ids = [str(v) for v in ds.train_image.values]
    classes = [str(v) for v in ds["class"].values]
    chosen = [str(v) for v in ds.image.values[:QUERIES]]
    drawn: dict[str, np.ndarray | None] = {}
    gone: list[str] = []

    def picture(image_id: str) -> np.ndarray | None:
        if image_id not in drawn:
            found = followed_picture(order, image_id)
            drawn[image_id] = found.rgb
            if not Path(found.source or "").is_file():
                gone.append(image_id)
        return drawn[image_id]

    queries, rows, parts = [], [], []
    for q, image_id in enumerate(chosen):
        queries.append((image_id, picture(image_id), classes[int(ds.label.values[q])]))
        ranked = [(train_ids[int(t)], float(s)) for t, s in zip(ds.neighbour.values[q], ds.similarity.values[q])]
        rows.append([(n_id, picture(n_id), s) for n_id, s in ranked])
        parts.append(f"{image_id} ({classes[int(ds.label.values[q])]}) → " + ", ".join(f"{n_id} ({s:.3f})" for n_id, s in ranked))
    png = knn_grid(queries, rows)
    caption = (f"{store.label}: the first {len(chosen)} val queries of results/knn (framed, with their class) and their "
               f"{ds.sizes['rank']} most similar train images by cosine of the k-NN feature, best first, each as its 224 view: "
               + "; ".join(parts) + ".")
    return ctx.figure("knn-retrieval", png, caption), list(dict.fromkeys(gone))


def _overlay(ax, labels: np.ndarray) -> None:
    """Each object (label n > 0) filled in Tol's vibrant colour n and outlined."""
    for n in [int(v) for v in np.unique(labels) if v > 0]:
        colour = matplotlib.colors.to_rgb(figures.MASK_PALETTE[(n - 1) % len(figures.MASK_PALETTE)])
        mask = labels == n
        fill = np.zeros((*labels.shape, 4))
        fill[mask] = (*colour, 0.5)
        ax.imshow(fill)
        ax.contour(mask.astype(float), levels=[0.5], colors=[colour], linewidths=1.2)


def propagation_strip(frames: list[tuple[str, np.ndarray, np.ndarray]], title: str) -> figures.Drawing:
    """Frames (stem, RGB, labels): the first with its ground truth, then the predicted ones."""
    fig = MplFigure(figsize=(1.6 * len(frames) + 0.2, 1.75), layout="constrained")
    axes = fig.subplots(1, len(frames), squeeze=False)[0]
    objects = set()
    for c, (stem, rgb, labels) in enumerate(frames):
        ax = axes[c]
        ax.imshow(rgb)
        _overlay(ax, labels)
        objects |= {int(v) for v in np.unique(labels) if v > 0}
        ax.set_title(f"{stem}\n{'ground truth' if c == 0 else 'predicted'}", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [Patch(color=figures.MASK_PALETTE[(n - 1) % len(figures.MASK_PALETTE)], label=f"object {n}") for n in sorted(objects)]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=8)
    return figures.png(fig)


def strip_frames(predicted: list[Path], count: int = STRIP_FRAMES) -> list[Path]:
    """The first frame, then ``count`` of the others evenly spaced to the last."""
    rest = predicted[1:]
    if len(rest) <= count:
        return predicted
    picks = np.linspace(0, len(rest) - 1, count).round().astype(int)
    return [predicted[0], *[rest[i] for i in dict.fromkeys(picks.tolist())]]


def propagation_figure(ctx, label: str, ds) -> Figure | Note:
    """The strip of the first sequence of ``results/davis``, or a line saying what is gone."""
    sequence = str((ds.attrs.get("sequences") or ["?"])[0])
    out, davis = Path(str(ds.attrs.get("out", ""))) / sequence, Path(str(ds.attrs.get("davis", ""))) / FRAMES / sequence
    predicted = sorted(out.glob("*.png")) if out.is_dir() else []
    shown = strip_frames(predicted)
    frames = [(p.stem, davis / f"{p.stem}.jpg", p) for p in shown]
    missing = [str(jpg) for _, jpg, _ in frames if not jpg.is_file()]
    if not predicted or missing:
        gone = missing[0] if missing else f"{out}/*.png"
        return Note(f"{label}: no propagation strip, {gone} is gone: rerun `probe propagate` (or restore the DAVIS folder).", "missing")
    loaded = []
    for stem, jpg, png in frames:
        with Image.open(jpg) as frame, Image.open(png) as mask:
            loaded.append((stem, np.asarray(frame.convert("RGB")), np.asarray(mask)))
    drawing = propagation_strip(loaded, f"{figures.wrap(label, 40)}: {sequence}")
    caption = (f"{label}: sequence {sequence}, frames {', '.join(s for s, _, _ in frames)} of {len(predicted)}: the first frame with its "
               f"ground-truth annotation (the propagation's input), then the masks `probe propagate` predicted ({out}), one colour per object.")
    return ctx.figure("davis-strip", drawing, caption)
