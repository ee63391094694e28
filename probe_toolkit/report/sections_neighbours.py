"""The neighbour sections: the followed patch's cosine map and the premise statistics of
``probe neighbours`` (top-k in the window, shares, at each grid the stores hold)."""

from __future__ import annotations

import re

from ..results.summaries import NEIGHBOUR_LABELS, statistic_rows
from . import figures_maps, followed
from .content import Note, Section, Table
from .context import Context
from .sections_kit import HOW, _lacking, _other_grids
from .sources import StoreView

# ----------------------------------------------------------------------------------------------
# neighbours: the followed patch's cosine map, and the premise statistics


def neighbour_map(ctx: Context) -> Section:
    section = Section("neighbour-map", f"Patch {ctx.patch}'s neighbours: cosine to every patch")
    have = [(s, ctx.neighbours[s.label]) for s in ctx.stores if ctx.neighbours.get(s.label) is not None]
    if ctx.follow is None or not have:
        section.missing(f"No 224 tokens of the followed image: {HOW['tokens']}.")
        return section
    rows, by_grid = [], {}
    for store, n in have:  # one figure per grid: stores on another grid follow the patch under the centre (patches.py)
        if ctx.patch_of(store) is not None:
            by_grid.setdefault(n.grid, []).append((store, n))
    for grid, group in by_grid.items():
        anchor = ctx.patch_of(group[0][0])
        window = group[0][1].window[anchor]
        in_window = set(window.tolist())
        maps = []
        for store, n in group:
            topk, crop = n.topk[anchor], n.top_crop[anchor]
            maps.append((store.label, n.cosine[anchor], topk, crop))
            inside = [int(p) for p in crop if p in in_window]
            rows.append(
                [
                    store.label,
                    ", ".join(str(int(p)) for p in window),
                    ", ".join(f"{int(p)}: {n.cosine[anchor, p]:.3f}" for p in topk),
                    ", ".join(f"{int(p)}{'*' if int(p) in inside else ''}: {n.cosine[anchor, p]:.3f}" for p in crop),
                    f"{len(inside)} of {len(crop)}",
                    f"{anchor} of {grid} × {grid}",
                ]
            )
        png = figures_maps.cosine_maps(maps, grid, anchor, window)
        where = "" if len(by_grid) == 1 else f" ({grid} × {grid} grid)"
        section.blocks.append(
            ctx.figure(
                "neighbour-map",
                png,
                f"Cosine of patch {anchor}'s token to every patch of {ctx.follow}{where}; dashed: its 3×3 "
                "window (SelfPatch wraps around the border); thick: the window's top k; dots: the crop's 8 most similar.",
            )
        )
    k = ", ".join(f"{s.label}: k = {n.k}" + ("" if followed.k_record(s) is not None else " (SelfPatch's; no neighbours record)") for s, n in have)
    section.blocks.append(
        Table(
            ["store", "window (wrap)", "window's top k (cosine)", "crop's top 8 (* in the window)", "top 8 in the window", "anchor (its grid)"],
            rows,
            f"Anchor {ctx.patch} of {ctx.follow}, on each store's own grid ({k}).",
        )
    )
    _lacking(section, [s for s in ctx.stores if ctx.neighbours.get(s.label) is None], f"224 tokens of {ctx.follow}", HOW["tokens"])
    for line in _other_grids(ctx):
        section.blocks.append(Note(line + "."))
    return section


PREMISE_RESULTS = ("neighbours_g14", "neighbours_g14_nowrap", "neighbours_g6", "neighbours_g6_nowrap")


def premise_results(ctx: Context) -> list[str]:
    """ViT-S/16's names first, then every other grid's (ViT-S/8: g28, g12; DINOv2 /14: g16, g6), larger grids first."""
    held = {name for s in ctx.stores for name in s.results if re.fullmatch(r"neighbours_g\d+(_nowrap)?", name)}
    others = sorted(held - set(PREMISE_RESULTS), key=lambda n: (-int(re.search(r"\d+", n).group()), n))
    return [*PREMISE_RESULTS, *others]


def _other_grid(store: StoreView, name: str, array: str | None) -> bool:
    """Whether ``store`` holds the same view's premise statistics at another grid (another patch size)."""
    wrap = name.endswith("_nowrap")
    return any(
        other != name and other.endswith("_nowrap") == wrap and found.attrs.get("array") == array
        for other, found in store.results.items()
        if re.fullmatch(r"neighbours_g\d+(_nowrap)?", other)
    )


def premise(ctx: Context) -> Section:
    section = Section("premise", "Premise statistics: do the most similar patches lie in the window?")
    any_found = False
    for name in premise_results(ctx):
        found = {s.label: s.result(name) for s in ctx.stores if s.result(name) is not None}
        if not found:
            continue
        any_found = True
        first = next(iter(found.values()))
        level = int(round(100 * float(first.attrs.get("level", 0.95))))
        rows = statistic_rows(found, NEIGHBOUR_LABELS)
        rows.append(["wrapped candidate links", *[f"{int(ds.wrapped_links)} of {int(ds.links)}" for ds in found.values()]])
        rows.append(["images", *[str(ds.attrs.get("n_images")) for ds in found.values()]])
        wrap = "SelfPatch's wrap-around" if first.attrs.get("wrap") else "no wrap"
        section.blocks.append(
            Table(
                ["statistic", *found],
                rows,
                f"{name}: grid {first.attrs.get('grid')}, {wrap}, {first.attrs.get('distance', '')}; mean over images [{level} % bootstrap interval].",
            )
        )
        if first.attrs.get("array") == "tokens_224" and not name.endswith("_nowrap"):
            png = figures_maps.share_maps(
                {label: ds.anchor_top_in_window.values for label, ds in found.items()},
                int(first.attrs.get("grid", 14)),
                f"Share of each anchor's top {first.attrs.get('top', 8)} inside its window, mean over images",
                "share of the top 8 inside the window",
            )
            section.blocks.append(
                ctx.figure(
                    "premise-anchors" + ("" if name == "neighbours_g14" else f"-g{first.attrs.get('grid')}"),
                    png,
                    "Per anchor position: how often its most similar patches lie in its 3×3 window.",
                )
            )
        lacking = [s for s in ctx.stores if s.label not in found and not _other_grid(s, name, first.attrs.get("array"))]
        _lacking(section, lacking, f"premise statistics ({name})", HOW.get(name.removesuffix("_nowrap"), HOW["neighbours_g14"]))
    if not any_found:
        section.missing(f"No premise statistics yet: {HOW['neighbours_g14']} (and, for the 96 view, {HOW['neighbours_g6'].removeprefix('run ')}).")
    return section
