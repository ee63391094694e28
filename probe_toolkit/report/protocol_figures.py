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

import numpy as np
from matplotlib.figure import Figure as MplFigure
from matplotlib.patches import Patch
from PIL import Image

from . import figures
from .content import Figure, Note
from .sources import followed_picture, shown_path

QUERIES = 3
STRIP_FRAMES = 4  # predicted frames shown after the first
FRAMES = "JPEGImages/480p"  # DAVIS's frame folder, as davis_sequences reads it


def fit(text: str, chars: int) -> str:
    """``text`` in at most ``chars`` characters: whole when it fits, else its start and end around
    an ellipsis (file names differ at both ends: a prefix and a number)."""
    text = str(text)
    if len(text) <= chars:
        return text
    if chars <= 3:
        return text[:chars]
    head = max(1, (chars - 1) // 3)  # the end (number and extension) tells files apart more often
    return text[:head] + "…" + text[len(text) - (chars - 1 - head) :]


def name_lines(name: str, chars: int) -> str:
    """A file name on at most two lines of ``chars`` characters, its middle cut when longer."""
    if len(name) <= chars:
        return name
    name = fit(name, 2 * chars)
    return name[:chars] + "\n" + name[chars:]


TILE_IN = 1.3  # a tile's side, inches
CHAR_EM = 0.62  # a DejaVu Sans character's mean advance, in em (digits 0.64, lower case ~0.6)


def knn_grid(queries: list[tuple[str, np.ndarray | None, str]], neighbours: list[list[tuple[str, np.ndarray | None, float]]], title: str = "") -> figures.Drawing:
    """Rows: a query (id, 224 view, its class) then its neighbours (id, 224 view, cosine), best first.

    Titles are short lines (the query's class, or ``#rank · cosine``; then the file name on up to two) cut to
    what one tile holds at the font size the figure is printed with (``figures.legible`` enlarges
    text to 6 pt at one column), so no title runs into its neighbour however long the names; the
    full ids are in the caption. A tile whose picture is missing says so instead of staying blank."""
    columns = 1 + max(len(n) for n in neighbours)
    width = TILE_IN * columns + 0.2
    size = max(7.0, figures.MIN_PT * width / figures.COLUMN_IN)  # the size legible() leaves the titles at
    chars = max(4, int(0.92 * TILE_IN * 72 / (CHAR_EM * size)))
    fig = MplFigure(figsize=(width, (TILE_IN + 3.8 * size / 72 + 0.15) * len(queries) + 0.2), layout="constrained")
    axes = fig.subplots(len(queries), columns, squeeze=False)
    for r, ((image_id, rgb, cls), found) in enumerate(zip(queries, neighbours)):
        cells = [(rgb, fit(cls, chars), image_id, figures.PALETTE[0])]  # the query: its class, framed
        cells += [(n_rgb, fit(f"#{rank} · {sim:.2f}", chars), n_id, None) for rank, (n_id, n_rgb, sim) in enumerate(found, 1)]
        for ax, (picture, head, image_id, frame) in zip(figures.tile_row(axes[r], len(cells)), cells):
            if picture is not None:
                ax.imshow(picture)
            else:
                ax.text(0.5, 0.5, "no picture:\nfile and\ntokens gone", ha="center", va="center", fontsize=size, transform=ax.transAxes)
            ax.set_title(f"{head}\n{name_lines(image_id.rsplit('/', 1)[-1], chars)}", fontsize=size)
            if frame is not None:  # the query is framed in the first store colour, thick
                for spine in ax.spines.values():
                    spine.set_edgecolor(frame)
                    spine.set_linewidth(3)
    if title:
        fig.suptitle(figures.wrap(title, 60), fontsize=size + 1)
    return figures.png(fig)


def _holders(ctx, store, ds) -> list:
    """Where the pictures of a k-NN result can be found: the store, the stores k-NN read each panel
    from (recorded as ``stores``; older records: the per-panel stores beside it), the report's stores."""
    from ..store import cache
    from .sources import StoreView, default_label

    paths = [Path(str(p)) for p in (ds.attrs.get("stores") or {}).values()]
    base = store.path.name.removesuffix(".zarr").split("-panel-")[0]
    for role in ("train", "val"):
        name = ((ds.attrs.get("panels") or {}).get(role) or {}).get("name")
        if name:
            paths.append(store.path.parent / f"{base}-panel-{name}.zarr")
    out, seen = [store], {store.path.resolve()}
    for path in paths:
        if path.resolve() in seen or not (path / "zarr.json").is_file():
            continue
        seen.add(path.resolve())
        opened = cache.open_store(path)
        manifest = cache.manifest(opened)
        out.append(StoreView(path, default_label(path, manifest), opened, manifest))
    return out + [s for s in ctx.stores if s.path.resolve() not in seen]


def knn_figure(ctx, store, ds) -> tuple[Figure, list[str], list[str]]:
    """The grid of ``results/knn``'s first queries; the ids drawn from their tokens (file gone) and
    those with no picture at all."""
    order = _holders(ctx, store, ds)
    train_ids = [str(v) for v in ds.train_image.values]
    classes = [str(v) for v in ds["class"].values]
    chosen = [str(v) for v in ds.image.values[:QUERIES]]
    drawn: dict[str, np.ndarray | None] = {}
    from_tokens: list[str] = []
    nothing: list[str] = []

    def picture(image_id: str) -> np.ndarray | None:
        if image_id not in drawn:
            found = followed_picture(order, image_id)
            drawn[image_id] = found.rgb
            if found.rgb is None:
                nothing.append(image_id)
            elif not Path(found.source or "").is_file():
                from_tokens.append(image_id)
        return drawn[image_id]

    queries, rows, parts = [], [], []
    for q, image_id in enumerate(chosen):
        queries.append((image_id, picture(image_id), classes[int(ds.label.values[q])]))
        ranked = [(train_ids[int(t)], float(s)) for t, s in zip(ds.neighbour.values[q], ds.similarity.values[q])]
        rows.append([(n_id, picture(n_id), s) for n_id, s in ranked])
        parts.append(f"{image_id} ({classes[int(ds.label.values[q])]}) → " + ", ".join(f"{n_id} ({s:.3f})" for n_id, s in ranked))
    png = knn_grid(queries, rows, f"{store.label}: k-NN neighbours")
    caption = (
        f"{store.label}: the first {len(chosen)} val queries of results/knn (framed, with their class) and their "
        f"{ds.sizes['rank']} most similar train images by cosine of the k-NN feature, best first, each as its 224 view "
        "(titles shortened to fit a tile; the full ids follow): " + "; ".join(parts) + "."
    )
    return ctx.figure("knn-retrieval", png, caption), list(dict.fromkeys(from_tokens)), list(dict.fromkeys(nothing))


def object_colours(rgb: np.ndarray, labels: np.ndarray) -> dict[int, tuple[float, float, float]]:
    """Each object's colour (label n > 0): of Tol's vibrant palette, the one that stands out from the picture under
    the object in the first frame, kept for every frame and the legend."""
    from .figures_maps import contrasting

    objects = [int(v) for v in np.unique(labels) if v > 0]
    return dict(zip(objects, contrasting(rgb, [labels == n for n in objects])))


def _overlay(ax, labels: np.ndarray, colours: dict[int, tuple[float, float, float]]) -> None:
    """Each object (label n > 0) filled in its colour and outlined."""
    for n in [int(v) for v in np.unique(labels) if v > 0]:
        colour = colours.get(n, (0.5, 0.5, 0.5))
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
    colours = object_colours(frames[0][1], frames[0][2]) if frames else {}
    for c, (stem, rgb, labels) in enumerate(frames):
        ax = axes[c]
        ax.imshow(rgb)
        _overlay(ax, labels, colours)
        objects |= {int(v) for v in np.unique(labels) if v > 0}
        ax.set_title(f"{stem}\n{'ground truth' if c == 0 else 'predicted'}", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [Patch(color=colours.get(n, (0.5, 0.5, 0.5)), label=f"object {n}") for n in sorted(objects)]
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
        gone = shown_path(missing[0]) if missing else f"{shown_path(out)}/*.png"
        return Note(f"{label}: no propagation strip, {gone} is gone: rerun `probe propagate` (or restore the DAVIS folder).", "missing")
    loaded = []
    for stem, jpg, png in frames:
        with Image.open(jpg) as frame, Image.open(png) as mask:
            loaded.append((stem, np.asarray(frame.convert("RGB")), np.asarray(mask)))
    drawing = propagation_strip(loaded, f"{figures.wrap(label, 40)}: {sequence}")
    caption = (
        f"{label}: sequence {sequence}, frames {', '.join(s for s, _, _ in frames)} of {len(predicted)}: the first frame with its "
        f"ground-truth annotation (the propagation's input), then the masks `probe propagate` predicted ({shown_path(out)}), one colour per object."
    )
    return ctx.figure("davis-strip", drawing, caption)
