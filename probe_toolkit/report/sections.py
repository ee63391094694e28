"""Gather what exists into sections: each present only when its results (or arrays) exist, and
saying in one line, when they do not, which command would produce them.

Every section shows the stores side by side (one column or panel per store). A published number
sits beside a score only when protocol and data match; the rest are in their own table
(``published``, ``references``).

The sections themselves live by subject: ``sections_attention``, ``sections_neighbours``,
``sections_decoder`` (with ``pictures``, ``discovery``, ``protocols`` and ``freshness``); this
module holds the manifests, the followed image and explorer, the linear probes and training
curves, and ``gather``, which builds them all in order (``builders()``): the stores' own sections,
then each protocol's, in the registry's order, as its entry names them (``Protocol.sections``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..infra.errors import ProbeError
from ..protocols import registry
from . import figures_maps, figures_training, followed
from .caveats import add_caveats, store_caveats
from .content import Explorer, Note, Report, Section, Table
from .context import Context
from .differing import shown
from .discovery import discovery
from .explorer import explorer_data, store_data
from .freshness import freshness
from .patches import follow_patches
from .published import reference_values
from .sections_blocks import blocks
from .sections_kit import HOW, _grid_of, _lacking, _other_grids
from .sources import Picture, choose_follow, followed_picture, open_stores, read_ledgers, shown_path, training_run

# ----------------------------------------------------------------------------------------------
# manifests


def manifests(ctx: Context) -> Section:
    section = Section("manifests", "Stores and their manifests")
    rows: dict[str, list[str]] = {}

    def put(field_name: str, values: list[str]) -> None:
        rows[field_name] = values

    m = [s.manifest for s in ctx.stores]
    ck = [x.get("checkpoint") or {} for x in m]
    arch = [x.get("arch") or {} for x in m]
    put("store", [shown_path(s.path) for s in ctx.stores])
    put("checkpoint", [Path(str(c.get("path", "?"))).name for c in ck])
    put("checkpoint sha256", [str(c.get("sha256", "?"))[:16] for c in ck])
    put("checkpoint source", [_source(c.get("source") or {}) for c in ck])
    put("format", [f"{c.get('format', '?')}{' (converted)' if c.get('converted') else ''}" for c in ck])
    put("network", [str(x.get("network", "?")) for x in m])
    put("architecture", [f"width {a.get('width')}, depth {a.get('depth')}, heads {a.get('heads')}, patch {a.get('patch')}" for a in arch])
    put("class token / final norm", [f"{'yes' if a.get('class_token') else 'no'} / {'yes' if a.get('final_norm') else 'no'}" for a in arch])
    put("views (px)", [", ".join(str(v) for v in x.get("views", [])) for x in m])
    put("interpolation", [str(x.get("interpolation", "?")) for x in m])
    put("attention", [str(x.get("attention", "?")) for x in m])
    put("dtype", [str(x.get("dtype", "?")) for x in m])
    put("images finished", [f"{len(s.image_ids)} of {s.manifest.get('n_images', '?')}" for s in ctx.stores])
    put("image source", [shown_path(x.get("image_source")) for x in m])
    put("toolkit", [f"{x.get('toolkit_version', '?')} ({str(x.get('git_revision', '?'))[:12]})" for x in m])
    put("extracted", [str(x.get("date", "?")) for x in m])
    put("results", [", ".join(s.results) or "none yet" for s in ctx.stores])
    put("made up by probe", ["; ".join(store_caveats(s)) or "nothing marked" for s in ctx.stores])
    section.blocks.append(Table(["", *ctx.labels], [[k, *v] for k, v in rows.items()], "What each store was extracted from and with."))
    return section


# ----------------------------------------------------------------------------------------------
# the followed image and the explorer


def followed_image(ctx: Context) -> Section:
    section = Section("followed", "The followed image and its patch grid")
    if ctx.follow is None or ctx.picture is None or ctx.picture.rgb is None:
        section.missing(ctx.picture.note if ctx.picture and ctx.picture.note else "No finished image to follow in these stores.")
        return section
    grid = _grid_of(ctx)
    r, c = divmod(ctx.patch, grid)
    section.blocks.append(
        Note(
            f"Image `{ctx.follow}`, its 224-pixel view (short side to 224 px with PIL bicubic, centre crop), cut into {grid} × {grid} "
            f"patches numbered row by row from 0 at the top left: patch = {grid}·row + column. The followed patch {ctx.patch} sits in "
            f"row {r}, column {c} (outlined)."
        )
    )
    mapped = _other_grids(ctx)
    if mapped:
        section.blocks.append(
            Note("Stores on other grids follow the patch under its centre (a centre on a border goes to the upper / left patch): " + "; ".join(mapped) + ".")
        )
    if ctx.picture.note:
        section.blocks.append(Note(ctx.picture.note))
    png = figures_maps.followed_image(ctx.picture.rgb, grid, ctx.patch, f"{ctx.follow}: {grid}×{grid} patches, followed patch {ctx.patch}")
    section.blocks.append(ctx.figure("followed-image", png, f"The 224-pixel view of {ctx.follow} with every patch's number; patch {ctx.patch} outlined."))
    return section


def explorer(ctx: Context) -> Section:
    section = Section("explorer", "Patch explorer")
    usable = [s for s in ctx.stores if ctx.attention.get(s.label) is not None or ctx.neighbours.get(s.label) is not None]
    if ctx.follow is None or not usable:
        section.missing(f"Nothing to explore: the explorer needs the followed image's 224 attention or tokens; {HOW['attention']}.")
        return section
    data = []
    for store in ctx.stores:
        att, near, where = ctx.attention.get(store.label), ctx.neighbours.get(store.label), ctx.followed.get(store.label)
        note = "" if store in usable else f"no 224 attention or tokens of {ctx.follow}"
        if store in usable and where is not None and where.patch is None:
            att, near, note = None, None, where.line
        data.append(store_data(store, att, near, note, where if store in usable else None))
    reference = next(iter(ctx.followed.values()))
    picture = ctx.picture or Picture(None, "", "")
    grids = dict.fromkeys(f"{f.rows} × {f.cols}" for f in ctx.followed.values())
    section.blocks.append(
        Note(
            "Click a patch of the image (or open the page at `#patch=N`): every store shows that patch's row of the last block's "
            "attention, the mean over heads large and each head small, scaled to its largest weight, the five largest weights "
            "outlined in blue; and the cosine of its token to every patch, with its 3×3 window (SelfPatch's wrap-around, dashed), "
            "the window's top k (thick) and the crop's 8 most similar (dots). Networks with a class token can show the class "
            "token's row instead, DINOv2's register tokens each register's row (Darcet et al. 2024, Fig. 9). "
            "Weights and cosines are stored with 8 bits."
            + (
                f" Each store is drawn on its own grid ({', '.join(grids)}); the picture's grid is the first store's, and the others follow "
                "the patch under the chosen patch's centre (a centre on a border goes to the upper / left patch)."
                if len(grids) > 1
                else ""
            )
        )
    )
    section.blocks.append(Explorer(explorer_data(data, reference, ctx.follow, picture)))
    return section


# ----------------------------------------------------------------------------------------------
# training curves and the reference table


def training(ctx: Context) -> Section:
    section = Section("training", "Training curves")
    runs = {s.label: run for s in ctx.stores if (run := training_run(s)) is not None}
    if not runs:
        section.missing(f"No training log beside any checkpoint: {HOW['training']}.")
        return section
    rows = []
    for label, run in runs.items():
        last = run.log[-1] if run.log else {}
        meta = run.manifest
        init = meta.get("init") or {}
        start = init.get("sha256", "")[:12] if isinstance(init, dict) and init.get("sha256") else ("random" if isinstance(init, dict) and "random" in init else "?")
        rows.append(
            [
                label,
                shown_path(run.folder),
                str(meta.get("run", "?")),
                str(meta.get("rule", "?")),
                start,
                str(len(run.log)),
                str(last.get("epoch", "?")),
                f"{last.get('loss', float('nan')):.4f}" if "loss" in last else "–",
                str(meta.get("status", "?")),
            ]
        )
    section.blocks.append(
        Table(
            ["store", "run folder", "run", "rule", "started from", "steps logged", "last epoch", "last loss", "status"],
            rows,
            "Runs of training/ that wrote the stores' checkpoints.",
        )
    )
    png = figures_training.training_curves({label: run.log for label, run in runs.items()})
    section.blocks.append(ctx.figure("training-curves", png, "Logged quantities against the optimiser step (training/'s log.jsonl). " + why_total(runs)))
    _lacking(section, [s for s in ctx.stores if s.label not in runs], "training log beside the checkpoint", HOW["training"])
    return section


def why_total(runs: dict) -> str:
    """Why the total loss lies below the patch loss: L = L_global + λ·L_patch (or λ·L_con), with
    SelfPatch's λ = 0.1 by default (training/config.py), so the patch term enters at a tenth."""
    weights = {label: (run.config.get("rule") or {}).get("weight") for label, run in runs.items()}
    known = {label: w for label, w in weights.items() if isinstance(w, (int, float))}
    said = ", ".join(f"{label}: λ = {w:g}" for label, w in known.items()) if known else "λ as each run's config sets it, 0.1 by default as in SelfPatch"
    return (
        "The total loss is L = L_global + λ·L_patch (λ·L_con for the contrastive rule): the patch term enters weighted by λ "
        f"({said}), so with λ < 1 the total can lie below the patch loss."
    )


FIRST: tuple[Callable[[Context], Section], ...] = (manifests, freshness, explorer, followed_image)  # the stores themselves
LAST: tuple[Callable[[Context], Section], ...] = (
    blocks,  # report/sections_blocks.py: each protocol's number against the block it read
    training,
    reference_values,
    discovery,  # report/discovery.py: the field's benchmarks beside the published numbers
)


def _owners() -> list:
    """The protocol each protocol section belongs to, in ``builders()``' order."""
    return [p for p in registry.protocols() for _ in p.sections]


def differences_note(protocol) -> Note:
    """How a protocol departs from its published reference, beside its numbers (its records carry the same list)."""
    items = "; ".join(f"({i}) {d.what} — {d.why}; effect: {d.effect}" for i, d in enumerate(protocol.differences, 1))
    return Note(f"{protocol.name}: what differs from the published reference, why, and its effect on the number: {items}.")


def builders() -> list[Callable[[Context], Section]]:
    """Every section in report order: the stores', each protocol's (``Protocol.sections``), then the last."""
    return [*FIRST, *(registry.resolve(s) for p in registry.protocols() for s in p.sections), *LAST]


def gather(
    stores: list[Path], follow: str | None = None, patch: int = 34, cache_dir: str | Path | None = None, run: str | None = None, labels: dict[Path, str] | None = None
) -> Report:
    """Open the stores, read their results (the latest records, or run ``run``'s) and the followed
    image, and build every section; ``labels`` titles stores (``--label NAME=STORE``)."""
    if not stores:
        raise ProbeError("probe report", "no store given", "pass one or more stores written by `probe extract`")
    views = open_stores(stores, run, labels)
    image_id = choose_follow(views, follow)
    ctx = Context(views, image_id, int(patch), None, read_ledgers(views, cache_dir), cache_dir=cache_dir)
    if image_id is not None:
        ctx.picture = followed_picture(views, image_id)
        for store in views:
            ctx.attention[store.label] = followed.attention(store, image_id)
            ctx.neighbours[store.label] = followed.neighbours(store, image_id, followed.store_k(store))
        ctx.followed = follow_patches([s for s in views if ctx.attention[s.label] is not None or ctx.neighbours[s.label] is not None], ctx.patch)
    title = "probe report: " + " vs ".join(ctx.labels)
    sections = [shown(build, ctx) for build in builders()]  # each caption with the settings that moved its numbers
    noted = set()
    for section, protocol in zip(sections, [None] * len(FIRST) + _owners()):  # the first section with numbers of each protocol
        if protocol is not None and protocol.name not in noted and section.present:
            noted.add(protocol.name)
            section.blocks.append(differences_note(protocol))
    add_caveats(sections, views)
    return Report(title, ctx.labels, image_id, ctx.patch, sections, version=toolkit_version())


def _source(source: dict) -> str:
    """Where a named checkpoint came from: the Hub repository at its commit, or a folder, and the licence its card states."""
    if not source:
        return "a file"
    where = f"{source['repository']} @ {str(source.get('revision', '?'))[:12]}" if source.get("repository") else f"folder {Path(source.get('folder', '?')).name}"
    licence = source.get("licence") or "not stated in the files at hand"
    return f"{where} ({source.get('file', '?')}); licence: {licence}"


def toolkit_version() -> str:
    """``probe 0.4.0 (git 1a2b3c4d5e6f)``: the code that wrote a report, as records name theirs."""
    from .._version import __version__
    from ..infra.provenance import git_revision

    return f"probe {__version__} (git {git_revision()[:12]})"
