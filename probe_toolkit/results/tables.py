"""What each protocol prints at the terminal: rich tables and lines built from a run's report.

Pure presentation: a report (the dataclass a command returns) in, a list of rich renderables or
strings out. The CLI prints them; nothing here reads a store or computes a number. A protocol
names its table in its registry entry (``Command.table``); each such table takes the report its run
returned (``commands.<protocol>``'s ``XReport``, typed ``Any`` here: results come before the commands that
write them, and no stage imports a later one) and reads the run's settings, inputs and placement from it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from ..labels.coco_metrics import METRICS

if TYPE_CHECKING:
    from .correspond_report import CorrespondReport
    from .decode_report import DecodeReport
    from .hummingbird_report import HummingbirdReport
    from .knn_report import KnnReport
    from .linear_report import LinearReport
    from .masks_report import MasksReport
    from .navi_report import NaviReport
    from .over_stores_report import OverStoresReport
    from .propagation_report import PropagationReport
    from .score_report import ScoreReport
    from .segment_report import SegmentReport
    from .sweep_report import SweepReport


class Unwrapped(str):
    """A line printed whole (a path or a ledger id must not break); other lines wrap at the terminal."""


def _pct(value: float, unit: str = "") -> str:  # NaN: undefined (segm and mean best IoU on a panel of boxes)
    return f"{100 * value:.2f}{unit}" if math.isfinite(value) else "–"


def scores(title: str, scores: Any) -> list[Any]:
    """Detection scores (COCO AP per kind, CorLoc, mean best IoU) or a saliency panel's scores."""
    if not hasattr(scores, "segm"):  # a saliency panel (labels/saliency.py)
        return [
            f"{title}: maxFβ {100 * scores.max_f:.2f}   IoU {100 * scores.iou:.2f}   accuracy {100 * scores.accuracy:.2f}   "
            f"MAE {scores.mae:.4f}   S-measure {scores.s_measure:.4f}   ({scores.counts['images']} images)"
        ]
    table = Table(title=title)
    for column in ("", *METRICS):
        table.add_column(column, justify="right")
    for kind in ("segm", "bbox"):
        values = getattr(scores, kind)
        table.add_row(kind, *(_pct(values[m]) for m in METRICS))
    objects = scores.counts["objects"]
    boxes = "" if scores.counts.get("objects_with_masks", objects) == objects else f" ({scores.counts.get('objects_with_masks')} with masks)"
    if not scores.counts.get("objects_with_masks", objects) and objects:
        boxes = " as boxes, no masks: no mean best IoU"
    return [
        table,
        f"CorLoc {_pct(scores.corloc, ' %')}   mean best IoU {_pct(scores.mean_best_iou, ' %')}   "
        f"({scores.counts['images']} images, {objects} objects{boxes}, {scores.counts['masks']} masks)",
    ]


def decode_summary(report: DecodeReport, source: str) -> str:
    s = report.settings
    return (
        f"{report.n_images} images → {report.n_masks} masks ({s.preset}: τ {s.tau}, ε {s.eps}, centred {s.center}, rule {s.rule}, "
        f"≤ {s.masks} masks; {source}{'; keys after RoPE' if report.extra.get('keys') == 'rope' else ''}) in {report.seconds:.1f} s; "
        f"{report.degenerate} flagged degenerate; masks → {report.masks_file}"
    )


def decode(report: DecodeReport) -> list[Any]:
    """``probe decode``: what was decoded with which settings, then the panel's scores when one was given."""
    if report.masks_file is None:  # a shard that finished before the others
        return [waiting_line(report.run.placement.shard, report.extra["waiting_for_shards"], "the last one writes the masks")]
    out: list[Any] = [decode_summary(report, report.extra["settings_source"])]
    if report.scores is not None:
        out += scores(f"{report.run.inputs.panel} (ledger entry {report.ledger_entry[:12]})", report.scores)
    return out


def score(report: ScoreReport) -> list[Any]:
    """``probe score``: the panel's scores of a masks file, and where the record went."""
    out = scores(f"{report.run.inputs.panel} (ledger entry {report.ledger_entry[:12]})", report.scores)
    return out + ([f"saved → {report.saved}"] if report.saved else [])


def sweep(report: SweepReport, top: int) -> list[Any]:
    """``probe decode-sweep``: the ``top`` settings by the metric, and the best one with where it was written."""
    if report.waiting:
        return [waiting_line(report.run.placement.shard, report.waiting, "the last one scores every setting")]
    panel, metric = report.run.inputs.panel, report.metric
    rows = sorted(report.table, key=lambda r: -(r[metric] if r[metric] == r[metric] else -1))
    table = Table(
        title=f"{len(report.table)} settings on {panel} (ledger entry {report.ledger_entry[:12]}), by {metric}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )  # ten columns readable at 80
    for column in ("preset", "centred", "τ", "ε", "masks", "segm\nAP", "segm\nAP50", "bbox\nAP50", "CorLoc", "best\nIoU"):
        table.add_column(column, justify="right", no_wrap=True)
    for r in rows[:top]:
        table.add_row(
            r["preset"],
            str(r["center"]),
            f"{r['tau']:g}",
            f"{r['eps']:g}",
            str(r["masks"]),
            *(f"{100 * r[c]:.2f}" for c in ("segm_AP", "segm_AP50", "bbox_AP50", "corloc", "mean_best_iou")),
        )
    b = report.best
    return [table, f"best: {b.preset}, centred {b.center}, τ {b.tau}, ε {b.eps}, {b.masks} masks → {report.settings_file}"]


def waiting_line(shard: str | None, waiting: Any, what: str) -> str:
    """A shard that finished before the others: which are still running, and who saves."""
    return f"shard {shard or 'of torchrun'} done; waiting for shards {waiting} ({what})"


def entropy(report: OverStoresReport) -> list[Any]:
    """``probe entropy``: the stores side by side, then the followed patch's tables."""
    from .summaries import detail_tables, entropy_table

    out = [entropy_table(report.results)]
    if report.followed is not None:
        for store, result in report.results.items():
            out += detail_tables(store, result, report.followed)
    return out


def neighbours(report: OverStoresReport) -> list[Any]:
    from .summaries import neighbours_table

    return [neighbours_table(report.results)]


def linear(report: LinearReport) -> list[Any]:
    """``probe linear``: every store's scores and chosen regularisation, then the ledger reads and label space."""
    train, val, seed = report.run.inputs.train, report.run.inputs.val, report.run.settings.seed
    columns = ("mIoU", "accuracy", "mIoU dense", "weight decay") if report.level == "patch" else ("mAP", "C")
    keys = ("miou", "accuracy", "miou_dense") if report.level == "patch" else ("map",)
    table = Table(title=f"linear probe ({report.level}): {train} → {val}")
    table.add_column("store")
    for column in columns:
        table.add_column(column, justify="right")
    for o in report.outcomes:
        table.add_row(o.name, *(f"{100 * o.scores[k]:.2f}" for k in keys), f"{o.chosen:g}")
    return [
        table,
        f"ledger: train {report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; "
        f"{len(report.label_space.ids)} categories{' + background' if report.level == 'patch' else ''}; seed {seed}; saved as results/linear_{report.level}",
    ]


def knn(report: KnnReport) -> list[Any]:
    """``probe knn``: top-1 and top-5 per k, then the panels, feature, temperature and view that produced them."""
    run = report.run
    if report.waiting:
        return [waiting_line(run.placement.shard, report.waiting, "the last one saves results/knn")]
    train, val, temperature = run.inputs.train, run.inputs.val, report.temperature
    table = Table(title=f"k-NN: {train} → {val}")
    for column in ("k", "top-1", "top-5"):
        table.add_column(column, justify="right")
    for kk, t1, t5 in zip(report.result.ks, report.result.top1, report.result.top5):
        table.add_row(str(kk), f"{100 * t1:.2f}", "–" if t5 != t5 else f"{100 * t5:.2f}")
    lines = [
        table,
        Unwrapped(
            f"{report.counts['train']} train → {report.counts['val']} val images, {report.counts['classes']} classes; feature: {report.feature}; "
            f"T {temperature}; ledger: train {report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; saved as results/knn"
        ),
        Unwrapped(f"view: {report.view_line}"),
    ]
    if report.counts["classes"] <= 5:
        lines.append("top-5 is undefined with 5 classes or fewer (shown as –)")
    return lines


def hummingbird(report: HummingbirdReport) -> list[Any]:
    """mIoU per memory size, identity and Hungarian-matched, on the panels' data set, beside the
    published numbers of released weights (marked as other weights: not this store's network)."""
    if report.waiting:
        return [waiting_line(report.run.placement.shard, report.waiting, "the last one saves results/hummingbird")]
    train, val = report.run.inputs.train, report.run.inputs.val
    from ..analyses.hummingbird_published import PUBLISHED, PUBLISHED_MEMORY_SIZES, PUBLISHED_SOURCE, comparable
    from ..labels.catalogue import data_set

    table = Table(title=f"Hummingbird dense retrieval ({data_set(report.kind)} mIoU): {train} → {val}")
    table.add_column("")
    for memory, rows in zip(report.memory, report.bank_rows):
        table.add_column(f"memory {memory}" + (f" ({rows} rows)" if memory == "full" else ""), justify="right")
    headline = " ◀"
    table.add_row(f"{report.name}: mIoU{headline if report.matching == 'identity' else ''}", *(f"{100 * s.miou:.2f}" for s in report.scores))
    table.add_row(
        f"{report.name}: mIoU, Hungarian-matched{headline if report.matching == 'hungarian' else ''}", *(f"{100 * s.miou_hungarian:.2f}" for s in report.scores)
    )
    published = [str(m) for m in PUBLISHED_MEMORY_SIZES]
    beside = comparable(report.memory, report.run.settings.size) if report.kind == "voc-segmentation" else ()
    for name, values in beside:  # at the run's input size, in the columns of the published memory sizes
        by_size = dict(zip(published, values))
        table.add_row(f"published, other weights: {name}", *(f"{by_size[m]:.1f}" if m in by_size else "–" for m in report.memory))
    apart = [(name, values) for name, values in PUBLISHED if (name, values) not in beside]
    if report.kind != "voc-segmentation":
        table.caption = "no published numbers for this data set (open-hummingbird-eval's README tables VOC only)"
    elif apart:  # another input size or no published memory size: not in the table's columns
        table.caption = (
            "published, other weights: " + "; ".join(f"{name} {' / '.join(f'{v:.1f}' for v in values)}" for name, values in apart) + f" at memory {' / '.join(published)}"
        )
    counts = report.counts
    return [
        table,
        Unwrapped(
            f"{counts['train']} train images × {counts['memory_views'] // max(counts['train'], 1)} augmented views → memory; "
            f"{counts['val']} val images, {counts['pixels']} pixels scored (255 ignored), mean over {len(report.classes)} classes; "
            f"◀ headline; ledger: train {report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; saved as results/hummingbird"
        ),
        *(
            [Unwrapped(f"published: {PUBLISHED_SOURCE}; measured on released weights and the full VOC, not comparable with this store's network")]
            if report.kind == "voc-segmentation"
            else []
        ),
    ]


def attention_masks(report: MasksReport) -> list[Any]:
    """``probe attention-masks``: the masks' rule, the Jaccards on the panel, and where the prefix tokens look."""
    if report.waiting:
        return [waiting_line(report.run.placement.shard, report.waiting, "the last one saves results/attention_masks")]
    panel = report.run.inputs.panel
    lines: list[Any] = [
        Unwrapped(
            f"{report.n_images} images: each head's smallest set of patches holding {100 * report.mass:.0f} % of "
            f"{report.summary()['row_text']}; saved as results/attention_masks"
        )
    ]
    if report.jaccard_mean is not None:
        table = Table(title=f"Jaccard on {panel} (ledger entry {report.ledger[:12]}; {report.scored} images, {report.counts['objects']} objects)")
        table.add_column("")
        for h in range(len(report.jaccard_mean)):
            table.add_column(f"head {h}", justify="right")
        table.add_column("best head", justify="right")
        table.add_column("per object (dino #54)", justify="right")
        table.add_row("Jaccard (%)", *[f"{100 * v:.1f}" for v in report.jaccard_mean], f"{100 * report.best_mean:.1f}", f"{100 * report.per_object_mean:.1f}")
        lines.append(table)
    if report.looks is not None:
        lines.append(looks_table(report.looks))
    return lines


LOOKS_COLUMNS = (
    ("on_class", "on the class token"),
    ("on_storage", "on the storage tokens"),
    ("on_patches", "on the patches"),
    ("mask_share", "its mask (share of the patches)"),
)


def looks_table(looks: dict[str, list]) -> Any:
    """Where the class token and each storage (register) token look, mean over images and heads (%)."""
    table = Table(title="where the prefix tokens look: attention share, mean over images and heads (%)")
    table.add_column("token")
    for _, text in LOOKS_COLUMNS:
        table.add_column(text, justify="right")
    for i, token in enumerate(looks["token"]):
        table.add_row(token, *[f"{100 * looks[key][i]:.1f}" for key, _ in LOOKS_COLUMNS])
    return table


DAVIS_COLUMNS = ("J&F-Mean", "J-Mean", "J-Recall", "J-Decay", "F-Mean", "F-Recall", "F-Decay")


def propagate(report: PropagationReport) -> list[Any]:
    """``probe propagate``: what was written where, then DAVIS's J&F table and where its CSV tables went."""
    subset = report.run.settings.subset
    lines: list[Any] = [f"{len(report.sequences)} sequences, {report.frames} frames in {report.seconds:.1f} s → {report.out}"]
    if report.waiting:
        lines.append(waiting_line(report.run.placement.shard, report.waiting, "the last one scores every sequence"))
    if report.global_scores is None:
        return lines
    table = Table(title=f"DAVIS {subset} (ledger: first frames {report.ledger['first_frames'][:12]}, score {report.ledger['score'][:12]})")
    for column in DAVIS_COLUMNS:
        table.add_column(column, justify="right")
    table.add_row(*[f"{report.global_scores[c]:.3f}" for c in DAVIS_COLUMNS])
    saved = f"; saved as {report.saved}" if report.saved else ""
    return [*lines, table, Unwrapped(f"tables: {report.out}/global_results-{subset}.csv, per-sequence_results-{subset}.csv{saved}")]


def correspond(report: CorrespondReport | NaviReport) -> list[Any]:
    """``probe correspond``: PCK per category and viewpoint bin at the reference's 0.10 (or the first
    threshold asked), then the mean over categories at every threshold."""
    if getattr(report, "dataset", "spair") == "navi":  # a NAVI panel's result (NaviReport)
        from .tables_correspond import navi

        return navi(report)
    if report.waiting:
        return [waiting_line(report.run.placement.shard, report.waiting, "the last one saves results/correspond")]
    thresholds = list(report.thresholds)
    main = thresholds.index(0.1) if 0.1 in thresholds else 0

    def cell(v: float) -> str:
        return f"{v:.1f}" if math.isfinite(v) else "–"

    bins = ("vp 0", "vp 1", "vp 2", "all")
    table = Table(title=f"PCK@{thresholds[main]:g} (% of keypoints) on {report.panel} (ledger entry {report.ledger[:12]})", box=box.SIMPLE_HEAD)
    table.add_column("category")
    for b in bins:
        table.add_column(b, justify="right")
    for c, category in enumerate(report.categories):
        table.add_row(category, *(cell(report.pck[c, b, main]) for b in range(len(bins))))
    table.add_row("mean of categories", *(cell(report.mean[b, main]) for b in range(len(bins))), style="bold")
    means = Table(title="mean over categories at every threshold", box=box.SIMPLE_HEAD)
    means.add_column("threshold", justify="right")
    for b in bins:
        means.add_column(b, justify="right")
    for t, threshold in enumerate(thresholds):
        means.add_row(f"{threshold:g}", *(cell(report.mean[b, t]) for b in range(len(bins))))
    counts = report.counts
    return [
        table,
        means,
        Unwrapped(
            f"{counts['pairs_matched']} of {counts['pairs_in_panel']} pairs matched, {counts['keypoints_scored']} keypoints; "
            f"tokens {report.dtype}; {report.seconds:.1f} s" + (f"; saved as {report.saved}" if report.saved else "")
        ),
    ]


def records(found: list[Any]) -> Table:
    """``probe results``: every record of a store, oldest first; the settings shown are those
    that differ from the protocol's defaults (``results.differ``)."""
    from .differ import differing_text

    table = Table(title=f"{len(found)} records", box=box.SIMPLE_HEAD)
    for column in ("result", "run id (UTC time it began)", "settings"):
        table.add_column(column, overflow="fold", no_wrap=column != "settings")
    for r in found:
        if r.meta.get("settings") is None:
            text = "(written before records)" if r.meta.get("legacy") else "–"
        else:
            text = differing_text(r) or "defaults"
        table.add_row(r.result, r.run_id, text)
    return table


def catalogue(protocols: list[Any], views: list[Any], archs: dict[str, Any], panel_kinds: dict[str, str]) -> list[Table]:
    """``probe list``: protocols, views, architectures and panel kinds, each with its reference."""
    out = []
    table = Table(title="protocols", box=box.SIMPLE_HEAD)
    for column in ("name", "reads", "follows"):
        table.add_column(column, overflow="fold")
    for p in protocols:
        reads = ", ".join(p.reads.views) or p.reads.source
        follows = "\n".join(dict.fromkeys(r.code.split()[0] for r in p.references))
        table.add_row(p.name, reads + (" + labels" if p.reads.labels else ""), follows)
    out.append(table)
    table = Table(title="views (S: any size that is a multiple of the patch)", box=box.SIMPLE_HEAD)
    for column in ("view", "geometry", "stores", "follows"):
        table.add_column(column, overflow="fold")
    for v in views:
        named = getattr(v, "alias_text", "")
        table.add_row(v.name + (f"\n({named})" if named else ""), v.rule, ", ".join(getattr(v, "reads", ())), v.reference)
    out.append(table)
    table = Table(title="architectures", box=box.SIMPLE_HEAD)
    for column in ("name", "shape"):
        table.add_column(column, overflow="fold")
    for name, arch in archs.items():
        prefix = f", {arch.registers} {'storage tokens' if arch.family == 'dinov3' else 'registers'}" if arch.registers else ""
        rope = ", RoPE" if arch.family == "dinov3" else ""
        table.add_row(name, f"/{arch.patch}, width {arch.width}, depth {arch.depth}, {arch.heads} heads{prefix}{rope}")
    out.append(table)
    table = Table(title="panel kinds", box=box.SIMPLE_HEAD)
    for column in ("kind", "layout"):
        table.add_column(column, overflow="fold")
    for kind, text in panel_kinds.items():
        table.add_row(kind, text)
    out.append(table)
    return out


def segmentation(report: SegmentReport) -> list[Any]:
    """The mIoU of the trained head, with the schedule that produced it, beside the published
    numbers of released weights on ADE20K (marked as other weights: not this checkpoint)."""
    train, val = report.run.inputs.train, report.run.inputs.val
    from ..analyses.segment_published import PUBLISHED
    from ..labels.catalogue import data_set

    short = "" if report.full_schedule else " (short schedule)"
    table = Table(title=f"Linear segmentation ({report.preset} preset, {data_set(report.kind)} mIoU): {train} → {val}")
    table.add_column("")
    table.add_column("mIoU", justify="right")
    table.add_column("pixel accuracy", justify="right")
    table.add_row(f"{report.name}{short}", _pct(report.scores.miou), _pct(report.scores.accuracy))
    published = [(name, value) for name, kind, value in PUBLISHED if kind == report.kind]
    for name, value in published:
        table.add_row(f"published, other weights: {name}", f"{value:.1f}", "–")
    if not published:
        table.caption = "no published numbers for this data set here (the model cards table ADE20K)"
    counted_classes = sum(1 for v in report.scores.iou if math.isfinite(v))
    counts = report.counts
    schedule = (
        "the published schedule"
        if report.full_schedule
        else f"short schedule: {counts['iterations']} of 40000 iterations, batch {counts['batch']} of 16, not comparable with the published numbers"
    )
    if report.unpublished:
        schedule += "; settings other than the published: " + ", ".join(f"{k} {v}" for k, v in report.unpublished.items())
    return [
        table,
        Unwrapped(
            f"{schedule}; {counts['train']} train images, {counts['iterations']} iterations of {counts['batch']} crops; {counts['val']} val images, "
            f"{counts['pixels']} labelled pixels; mean over the {counted_classes} of {len(report.classes)} classes labelled or predicted; "
            f"loss {report.losses[0]:.3f} → {report.losses[-1]:.3f}; ledger: train {report.ledger['train'][:12]}, val {report.ledger['val'][:12]}; "
            f"saved as results/linear-segmentation"
        ),
    ]
