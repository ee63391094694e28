"""Figures of patch maps over the image: the followed image and its grid, the tokens' principal
components as RGB, the anchor's cosine maps, the premise's share maps, the decoder's mask
overlays and Fiedler panels. Drawn with ``figures``' grid and colour conventions."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from .figures import COSINE_CMAP, FIEDLER_CMAP, MASK_PALETTE, SHARE_CMAP, TRUTH_COLOUR, _picture, grid_lines, outline, patch_map, png, wrap

# ----------------------------------------------------------------------------------------------
# the followed image


def followed_image(rgb: np.ndarray, grid: int, patch: int, title: str) -> bytes:
    """The 224 view with its G × G grid, every patch's number, and the followed patch outlined."""
    import matplotlib.patheffects as effects

    fig = Figure(figsize=(4.6, 4.8))
    ax = fig.add_subplot()
    _picture(ax, rgb, grid)
    grid_lines(ax, grid, alpha=0.6)
    halo = [effects.withStroke(linewidth=1.5, foreground="black")]
    for p in range(grid * grid):  # numbers of a grid finer than 16 × 16 are too dense to print large
        ax.text(
            p % grid + 0.5,
            p // grid + 0.5,
            str(p),
            ha="center",
            va="center",
            fontsize=8 if grid <= 16 else 3,
            color="white",
            path_effects=halo,
            gid=None if grid <= 16 else "dense",
        )
    outline(ax, [patch], grid, "#F0E442", width=3)
    ticks = list(range(0, grid, 1 if grid <= 16 else 4))
    ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=8)
    ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks], fontsize=8)
    ax.set_xlabel("column c")
    ax.set_ylabel("row r  (patch = G·r + c)")
    ax.set_title(title)
    return png(fig)


def principal_rgb(token_sets: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The first three principal components of every patch token of a set of images, as RGB.

    One PCA over all the images' tokens together (as DINOv2's and dino-vit-features' figures
    do), so a colour means the same direction in every image of the set; each component is
    signed so that its largest projection is positive and scaled to [0, 1] over the set.
    Returns each image's (N, 3) colours and the three components' shares of the variance.
    """
    x = np.concatenate([np.asarray(t, dtype=np.float64) for t in token_sets])
    x = x - x.mean(0)
    _, sv, vt = np.linalg.svd(x, full_matrices=False)
    comps = x @ vt[:3].T
    comps *= np.where(comps[np.abs(comps).argmax(0), range(comps.shape[1])] < 0, -1.0, 1.0)
    if comps.shape[1] < 3:
        comps = np.pad(comps, ((0, 0), (0, 3 - comps.shape[1])))
    low, high = comps.min(0), comps.max(0)
    rgb = (comps - low) / np.where(high > low, high - low, 1.0)
    share = (sv[:3] ** 2) / max(float((sv**2).sum()), 1e-300)
    bounds = np.cumsum([0] + [len(t) for t in token_sets])
    return [rgb[bounds[i] : bounds[i + 1]] for i in range(len(token_sets))], np.pad(share, (0, 3 - share.size))


def tokens_picture(tokens: np.ndarray, grid: int, size: int = 224) -> np.ndarray:
    """A stand-in for a missing image file: the tokens' first three principal components as RGB."""
    (rgb,), _ = principal_rgb([tokens])
    cells = (rgb.reshape(grid, grid, 3) * 255.0 + 0.5).astype(np.uint8)
    return np.asarray(Image.fromarray(cells).resize((size, size), Image.Resampling.NEAREST))


def pca_grids(pictures: list[tuple[str, np.ndarray | None]], per_store: dict[str, tuple[list[np.ndarray | None], np.ndarray]], grid: int) -> bytes:
    """Images (rows): the picture, then each store's PCA colours of its patch tokens (columns).

    ``per_store[label]`` = (per image (N, 3) colours or None, the components' variance shares).
    """
    n_rows, n_cols = len(pictures), 1 + len(per_store)
    fig = Figure(figsize=(1.75 * n_cols + 0.2, 1.75 * n_rows + 0.5), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for r, (image_id, rgb) in enumerate(pictures):
        ax = axes[r, 0]
        if rgb is not None:
            ax.imshow(rgb)
        ax.set_title(image_id.rsplit("/", 1)[-1], fontsize=8)
        for c, (label, (colours, share)) in enumerate(per_store.items(), 1):
            ax = axes[r, c]
            if colours[r] is not None:
                ax.imshow(colours[r].reshape(grid, grid, 3), interpolation="nearest")
            if r == 0:
                ax.set_title(f"{wrap(label)}\nPC 1–3: {100 * share.sum():.0f} % of var.", fontsize=8)
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    return png(fig)


# ----------------------------------------------------------------------------------------------
# neighbours


def cosine_maps(maps: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], grid: int, anchor: int, window: np.ndarray) -> bytes:
    """Cosine of the anchor's token to every patch, one panel per store.

    ``maps``: (label, cosine (N,), top k of the window (k,), top 8 of the crop (8,)). Marks: the
    anchor (white ×), its 3×3 window with SelfPatch's wrap (dashed), the window's top k (thick
    black), and the crop's 8 most similar (black dots: those outside the window are the
    similar patches SelfPatch's window cannot reach).
    """
    n = len(maps)
    fig = Figure(figsize=(2.7 * n + 0.9, 3.4), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, (label, cos, topk, top8) in zip(axes, maps):
        image = patch_map(ax, cos, grid, COSINE_CMAP, -1.0, 1.0, labels=True)
        outline(ax, window, grid, "black", width=1.0, style="--")
        outline(ax, topk, grid, "black", width=2.6)
        for p in top8:
            ax.plot(p % grid + 0.5, p // grid + 0.5, "o", color="black", markersize=3.5)
        ax.plot(anchor % grid + 0.5, anchor // grid + 0.5, "x", color="white", markersize=9, markeredgewidth=2.5)
        inside = len(set(int(p) for p in top8) & set(int(p) for p in window))
        ax.set_title(f"{wrap(label)}\n{inside} of the top {len(top8)} in the window", fontsize=9)
    fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label="cosine to the anchor's token")
    return png(fig)


def share_maps(per_store: dict[str, np.ndarray], grid: int, title: str, label: str) -> bytes:
    """One value in [0, 1] per anchor position, one panel per store (e.g. top 8 inside the window)."""
    n = len(per_store)
    fig = Figure(figsize=(2.6 * n + 0.9, 3.2), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    image = None
    for ax, (name, values) in zip(axes, per_store.items()):
        image = patch_map(ax, values, grid, SHARE_CMAP, 0.0, 1.0, labels=True)
        ax.set_title(wrap(name), fontsize=9)
    fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label=label)
    fig.suptitle(title, fontsize=10)
    return png(fig)


# ----------------------------------------------------------------------------------------------
# decoder masks


def mask_overlays(pictures: list[tuple[str, np.ndarray]], masks: dict[str, list[np.ndarray | None]]) -> bytes:
    """Images (rows) × stores (columns): each decoder mask filled in its own colour over the image.

    ``pictures``: (image id, RGB at display size); ``masks[label][i]``: (masks, H, W) bool at that
    display size, or None when the store has no decoder result for the image.
    """
    n_rows, n_cols = len(pictures), len(masks)
    fig = Figure(figsize=(2.2 * n_cols + 0.2, 2.0 * n_rows + 0.4), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for c, (label, per_image) in enumerate(masks.items()):
        for r, (image_id, rgb) in enumerate(pictures):
            ax = axes[r, c]
            ax.imshow(rgb)
            found = per_image[r]
            if found is None:
                ax.text(0.5, 0.5, "no decoder result", transform=ax.transAxes, ha="center", color="white", bbox=dict(facecolor="black", alpha=0.6))
            else:
                _masks_over(ax, found, rgb)
            ax.set_xticks([])
            ax.set_yticks([])
            n = 0 if found is None else len(found)
            text = f"{image_id.rsplit('/', 1)[-1]}: {n} mask{'s' if n != 1 else ''}"
            ax.set_title(f"{wrap(label)}\n{text}" if r == 0 else text, fontsize=8)
    return png(fig)


# ----------------------------------------------------------------------------------------------
# the decoder's Fiedler vector, and masks against the ground truth


def fiedler_panels(items: list[tuple[str, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray | None]], grid: int, title: str, lost: bool = False) -> bytes:
    """Per image (rows): the Fiedler vector on the patch grid with the seed marked, beside its masks.

    ``items``: (image id, x (N,) oriented so x[seed side] > 0, seed patch, RGB at display size,
    masks (M, H, W) at that size, ground truth (H, W) bool or None). The vector uses a
    sequential map centred nowhere (cividis), the seed is a white ×, the cut at mean(x) is the
    contour; masks are filled in Tol's colours, the ground truth (when a panel was scored) is
    outlined white and dashed. ``lost``: x is LOST's degree per patch (no cut: no contour), the
    seed its patch of least degree.
    """
    fig = Figure(figsize=(4.6, 2.0 * len(items) + 0.6), layout="constrained")
    axes = fig.subplots(len(items), 2, squeeze=False)
    image = None
    for r, (image_id, x, seed, rgb, masks, truth) in enumerate(items):
        ax = axes[r, 0]
        image = patch_map(ax, x, grid, FIEDLER_CMAP)
        if not lost:
            ax.contour(
                np.arange(grid) + 0.5,
                np.arange(grid) + 0.5,
                np.asarray(x, dtype=np.float64).reshape(grid, grid),
                levels=[float(np.mean(x))],
                colors="white",
                linewidths=1.0,
            )
        if seed >= 0:
            ax.plot(seed % grid + 0.5, seed // grid + 0.5, "x", color="white", markersize=9, markeredgewidth=2.5)
            ax.plot(seed % grid + 0.5, seed // grid + 0.5, "x", color="black", markersize=6, markeredgewidth=1.0)
        ax.set_title(f"{image_id.rsplit('/', 1)[-1]}: {'LOST degree' if lost else 'Fiedler vector'}", fontsize=8)
        ax = axes[r, 1]
        ax.imshow(rgb)
        _masks_over(ax, masks, rgb)
        if truth is not None and truth.any():
            ax.contour(truth.astype(float), levels=[0.5], colors="black", linewidths=2.6)
            ax.contour(truth.astype(float), levels=[0.5], colors=TRUTH_COLOUR, linewidths=1.4, linestyles="--")
        ax.set_title(f"{len(masks)} mask{'s' if len(masks) != 1 else ''}" + (", ground truth dashed" if truth is not None else ""), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(image, ax=list(axes[:, 0]), location="bottom", fraction=0.04, pad=0.02, label="patches linked (A > 0)" if lost else "x (seed side > 0)")
    fig.suptitle(title, fontsize=9)
    return png(fig)


def contrasting(rgb: np.ndarray | None, masks, palette: tuple[str, ...] = MASK_PALETTE) -> list[tuple[float, float, float]]:
    """One palette colour per mask, each the one farthest from the picture's mean colour under that mask (and
    not yet taken while others remain), so no mask is painted in its object's own colour (orange on orange)."""
    colours = [matplotlib.colors.to_rgb(c) for c in palette]
    chosen: list[tuple[float, float, float]] = []
    for k, mask in enumerate(masks):
        if rgb is None or not np.asarray(mask).any() or np.asarray(mask).shape != rgb.shape[:2]:
            chosen.append(colours[k % len(colours)])
            continue
        under = rgb[np.asarray(mask, bool)].reshape(-1, rgb.shape[-1])[:, :3].mean(axis=0) / (255.0 if rgb.dtype == np.uint8 else 1.0)
        free = [c for c in colours if c not in chosen] or colours
        chosen.append(max(free, key=lambda c: float(np.sum((np.array(c) - under) ** 2))))
    return chosen


def _masks_over(ax, masks: np.ndarray, rgb: np.ndarray | None = None) -> None:
    for mask, colour in zip(masks, contrasting(rgb, masks)):
        overlay = np.zeros((*mask.shape, 4))
        overlay[mask] = (*colour, 0.5)
        ax.imshow(overlay)
        if mask.any():
            ax.contour(mask.astype(float), levels=[0.5], colors=[colour], linewidths=1.5)
