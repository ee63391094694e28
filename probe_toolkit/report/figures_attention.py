"""Attention figures: a patch's weight maps per head with its five largest keys marked, the same
patch through the blocks, the histograms of e^H and the per-block curves (the report's
attention and entropy sections). Drawn with ``figures``' grid and colour conventions."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure

from .figures import TOP_COLOUR, WEIGHT_CMAP, head_style, outline, patch_map, png, store_colour, wrap


def weight_scale(*rows: np.ndarray) -> float:
    """One upper end for every attention map of a figure (or a section): the largest weight shown."""
    top = max((float(np.max(r)) for r in rows if np.size(r)), default=1.0)
    return top if top > 0 else 1.0


def _weight_map(ax, row: np.ndarray, grid: int, tops: Sequence[int], patch: int | None, title: str, vmax: float, labels: bool = False):
    image = patch_map(ax, row, grid, WEIGHT_CMAP, 0.0, vmax, labels=labels)
    outline(ax, tops, grid, TOP_COLOUR, width=1.6 if not labels else 2.2)
    if patch is not None:
        outline(ax, [patch], grid, "white", width=1.2, style="--")
    ax.set_title(title, fontsize=9 if not labels else 10)
    return image


def _weight_bar(fig, image, axes, n_keys: int, **where) -> None:
    """The colour bar of the weights, in weight units, with the uniform row 1/N marked."""
    bar = fig.colorbar(image, ax=axes, label="attention weight", **where)
    uniform = 1.0 / max(n_keys, 1)
    if uniform <= image.norm.vmax:
        (bar.ax.axvline if bar.orientation == "horizontal" else bar.ax.axhline)(uniform, color="white", linewidth=1.5, linestyle="--")
        bar.ax.text(
            *((uniform, 1.15) if bar.orientation == "horizontal" else (1.6, uniform)),
            f"uniform 1/{n_keys}",
            transform=bar.ax.get_xaxis_transform() if bar.orientation == "horizontal" else bar.ax.get_yaxis_transform(),
            ha="center" if bar.orientation == "horizontal" else "left",
            va="bottom" if bar.orientation == "horizontal" else "center",
            fontsize=8,
        )


def attention_rows(
    rows: np.ndarray,
    tops: np.ndarray,
    effective: np.ndarray,
    grid: int,
    patch: int | None,
    title: str,
    cls_weight: np.ndarray | None = None,
    vmax: float | None = None,
) -> bytes:
    """One row of attention: the mean over heads in a large map, each head in a small map.

    ``rows`` (head, N) are the weights on the N patch keys, ``tops`` (head, 5) the five largest
    keys of each head (patch indices, -1 for the class token), ``effective`` (head,) each row's e^H,
    ``cls_weight`` (head,) the weight the row puts on the class token. Every map shares one scale,
    0 to ``vmax`` (default: the largest weight drawn; pass one value for every store of a
    section), shown on the colour bar with the uniform row 1/N marked: a row spread evenly looks
    evenly dark instead of stretched into structure. The largest weights are outlined in sky
    blue and the followed patch is dashed white.
    """
    heads = rows.shape[0]
    columns = max(1, -(-heads // 2))
    mean = rows.mean(0)
    vmax = weight_scale(rows, mean) if vmax is None else vmax
    fig = Figure(figsize=(3.2 + 1.55 * columns, 4.4), layout="constrained")
    spec = fig.add_gridspec(2, 2 + columns)
    big = fig.add_subplot(spec[:, :2])
    order = np.argsort(-mean, kind="stable")[:5]
    image = _weight_map(big, mean, grid, order, patch, "mean over heads", vmax, labels=True)
    for h in range(heads):
        ax = fig.add_subplot(spec[h // columns, 2 + h % columns])
        extra = f"\n[CLS] {cls_weight[h]:.2f}" if cls_weight is not None else ""
        _weight_map(ax, rows[h], grid, tops[h], patch, f"head {h}: $e^H$ {effective[h]:.1f}{extra}", vmax)
    _weight_bar(fig, image, big, rows.shape[-1] + (1 if cls_weight is not None else 0), orientation="horizontal", fraction=0.05, pad=0.02)
    fig.suptitle(title, fontsize=10)
    return png(fig)


def block_rows(rows: np.ndarray, effective: np.ndarray, blocks: Sequence[int], grid: int, patch: int, title: str, vmax: float | None = None) -> bytes:
    """The followed patch's row in every block (rows) and head (columns), all maps on one scale."""
    n_blocks, heads = rows.shape[:2]
    vmax = weight_scale(rows) if vmax is None else vmax
    fig = Figure(figsize=(1.2 * heads + 1.2, 1.3 * n_blocks + 0.9), layout="constrained")
    axes = fig.subplots(n_blocks, heads, squeeze=False)
    image = None
    for b in range(n_blocks):
        for h in range(heads):
            ax = axes[b, h]
            row = rows[b, h]
            tops = np.argsort(-row, kind="stable")[:5]
            image = _weight_map(ax, row, grid, tops, patch, (f"head {h}\n" if b == 0 else "") + f"$e^H$ {effective[b, h]:.1f}", vmax)
            if h == 0:
                ax.set_ylabel(f"block {blocks[b]}", fontsize=9)
    _weight_bar(fig, image, list(axes.ravel()), rows.shape[-1], orientation="vertical", fraction=0.04, pad=0.02)
    fig.suptitle(title, fontsize=10)
    return png(fig)


HEAD_DASHES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (3, 1, 1, 1, 1, 1)))
HEAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def shared_bins(arrays: Sequence[np.ndarray], count: int = 20, ceiling: float | None = None) -> np.ndarray:
    """Bin edges over the range the data fill (every store alike), padded when the range is flat; never past
    ``ceiling`` (e^H cannot exceed T: no bin is drawn beyond it)."""
    values = np.concatenate([np.ravel(a) for a in arrays if np.size(a)]) if arrays else np.zeros(1)
    values = values[np.isfinite(values)]
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = 0.05 * (high - low) if high > low else max(1e-3 * abs(high), 0.5)
    top = high + pad if ceiling is None or high > ceiling else min(high + pad, ceiling)
    return np.linspace(low - pad, top, count + 1)


def effective_histograms(per_store: dict[str, np.ndarray], keys: dict[str, int]) -> bytes:
    """Per head, the distribution over images of the mean e^H of a patch row, one outline per store.

    ``per_store`` maps a store label to its (image, head) array; ``keys`` to its T (the row
    length, the largest possible e^H). The bins are shared by every store and head and span the
    values actually found, so neither store's outline hides the other's and close stores stay
    apart; each store is a step outline (its own colour and line style) over a light fill. T is
    marked (dotted) when it lies in the range shown.
    """
    heads = max(v.shape[1] for v in per_store.values())
    columns = min(heads, 3)
    rows = -(-heads // columns)
    fig = Figure(figsize=(2.4 * columns + 0.3, 1.9 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    bins = shared_bins(list(per_store.values()), ceiling=max(keys.values()) if keys else None)
    styles = ("-", "--", "-.", ":")
    for h in range(rows * columns):
        ax = axes[h // columns, h % columns]
        if h >= heads:
            ax.set_visible(False)
            continue
        for i, (label, values) in enumerate(per_store.items()):
            if h < values.shape[1]:
                colour = store_colour(i)
                ax.hist(values[:, h], bins=bins, histtype="stepfilled", color=colour, alpha=0.18)
                ax.hist(values[:, h], bins=bins, histtype="step", linewidth=1.8, color=colour, linestyle=styles[i % len(styles)], label=label)
        for t in sorted(set(keys.values())):
            if bins[0] <= t <= bins[-1]:
                ax.axvline(t, color="0.3", linestyle=":", linewidth=1.2)
        ax.set_xlim(bins[0], bins[-1])
        ax.set_title(f"head {h}", fontsize=10)
        if h // columns == rows - 1 or h + columns >= heads:
            ax.set_xlabel("mean $e^H$ (tokens)", fontsize=9)
        if h % columns == 0:
            ax.set_ylabel("images", fontsize=9)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(2, len(names)), fontsize=9, frameon=False)
    fig.suptitle("$e^H$ of a patch row, per image (mean over its rows)", fontsize=10)
    return png(fig)


def per_block(
    per_store: dict[str, np.ndarray],
    blocks: dict[str, Sequence[int]],
    ylabel: str,
    title: str = "",
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ceiling: float | None = None,
    ceiling_label: str = "",
) -> bytes:
    """One quantity per block, one line per head (Tol's colours and line styles), one panel per store.

    The axis is honest: it starts at 0 and, with ``ceiling`` (the largest value the quantity can
    take, e.g. T for e^H), reaches past it, with the ceiling dotted, so a difference reads at its
    true size against the whole range rather than zoomed until 1 % fills the panel. ``intervals``
    (per store: low and high, block × head) are drawn as a band around each head's line."""
    n = len(per_store)
    fig = Figure(figsize=(3.0 * n + 0.4, 3.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False, sharey=True)[0]
    top = max(float(np.nanmax(v)) for v in per_store.values())
    if intervals:
        top = max(top, *(float(np.nanmax(hi)) for _, hi in intervals.values()))
    for ax, (label, values) in zip(axes, per_store.items()):
        for h in range(values.shape[1]):  # each head its own colour, dash and marker, the later drawn thinner: equal lines stay visible
            style = head_style(h)
            style["linestyle"] = HEAD_DASHES[h % len(HEAD_DASHES)]
            ax.plot(
                blocks[label],
                values[:, h],
                marker=HEAD_MARKERS[h % len(HEAD_MARKERS)],
                markersize=5.0 - 0.4 * min(h, 6),
                linewidth=max(2.6 - 0.3 * h, 0.9),
                markerfacecolor="none" if h % 2 else style["color"],
                label=f"head {h}",
                **style,
            )
            if intervals and label in intervals:
                low, high = intervals[label]
                ax.fill_between(blocks[label], low[:, h], high[:, h], color=style["color"], alpha=0.2, linewidth=0)
        if ceiling is not None:
            ax.axhline(ceiling, color="0.35", linestyle=":", linewidth=1.2, label=ceiling_label or None)
        ax.set_xticks(list(blocks[label]))  # blocks are whole numbers
        ax.set_xlabel("block", fontsize=9)
        ax.set_title(wrap(label), fontsize=9)
    axes[0].set_ylim(0, 1.08 * max(top, ceiling or 0.0) or 1.0)
    axes[0].set_ylabel(ylabel, fontsize=9)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 4), fontsize=8, frameon=False)  # below: the panels keep the width
    if title:
        fig.suptitle(title, fontsize=10)
    return png(fig)


def block_spread(
    per_store: dict[str, np.ndarray], blocks: dict[str, Sequence[int]], intervals: dict[str, tuple[np.ndarray, np.ndarray]] | None = None, keys: int | None = None
) -> bytes:
    """Mean e^H of the patch rows per block, one line per head, one panel per store; on 0 … T."""
    return per_block(
        per_store, blocks, "mean $e^H$ of a patch row (tokens)", intervals=intervals, ceiling=keys, ceiling_label=f"T = {keys}, a uniform row" if keys else ""
    )
