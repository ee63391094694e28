"""Object discovery commands: decode (and its streaming mode), score, decode-sweep.

Their options, help and tables are declared in their registry entries (``protocols/discovery.py``);
their bodies are written here because they do more than one ``run``: decode streams a checkpoint
through ``decode-stream`` when given ``--images``, and each writes its own JSON summary.
"""

from __future__ import annotations

from typing import Any

from ..infra.errors import ProbeError
from .app import console, err_console, run, show, ticker
from .protocols import declared


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)


@declared("decode")
def decode(store: Any, given: dict[str, Any]) -> None:
    """Label-free object masks by a normalized cut on the keys; scored only if --panel is given."""
    from ..infra.owned import check_output_file, write_summary
    from ..infra.progress import bar
    from ..results import tables

    size, images, batch_size, chunk, quiet, json_path = (given.pop(k) for k in ("size", "images", "batch_size", "chunk", "quiet", "json_path"))
    check_output_file(json_path, "--json", [store])  # before any work: never over the store read, nor a user's file
    given["view"] = str(given["view"] or size)
    if images is not None:
        if given["panel"] is not None:
            raise ProbeError(None, "--images streams without --panel", "score the masks JSON with `probe score`")
        if given["refine"] is not None:
            raise ProbeError(None, "--refine applies to a store's masks scored on a saliency panel, not to --images", "drop --refine")
        for scoring in ("refine", "out", "panel", "allow_partial", "unseal"):
            given.pop(scoring)
        with bar("images", quiet) as progress:
            def start(total: int):
                task = progress.add_task("stream", total=total)
                return lambda n: progress.advance(task, n)

            report = run("decode-stream", None, checkpoint=store, images=images, batch_size=batch_size, chunk=chunk, on_start=start, **given).report
        tail = f"masks → {report.masks_file}" if report.masks_file else "other shards still running; the last to finish writes the masks"
        console.print(f"{report.store}: {report.done}/{report.n_images} images decoded ({report.written} now, in {report.seconds:.1f} s); {tail}")
        if json_path:
            write_summary(json_path, {"store": str(report.store), "images": report.n_images, "done": report.done, "written": report.written,
                                   "masks_file": str(report.masks_file) if report.masks_file else None, "settings": report.chosen.as_dict()})
        return
    with bar("images", quiet) as progress:
        report = run("decode", store, on_start=ticker(progress, "decode"), **given).report
    _warn(report.extra.get("warnings", []) if report.masks_file is not None else [])
    show(tables.decode(report, given))
    if json_path and report.masks_file is not None:
        write_summary(json_path, report.summary())


@declared("score")
def score(masks_file: Any, given: dict[str, Any]) -> None:
    """Score masks on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU."""
    from ..infra.owned import check_output_file, write_summary
    from ..results import tables

    json_path = given.pop("json_path")
    check_output_file(json_path, "--json", [masks_file])
    report = run("score", masks_file, **given).report
    _warn(report.warnings)
    show(tables.score(report, given))
    if json_path:
        write_summary(json_path, {"scores": report.scores.table(), "counts": report.scores.counts, "ledger_entry": report.ledger_entry})


@declared("decode-sweep")
def decode_sweep(store: Any, given: dict[str, Any]) -> None:
    """Decode a grid of settings, read the panel's labels once, and keep the best setting."""
    from ..infra.owned import check_output_file, write_summary
    from ..infra.progress import bar
    from ..results import tables

    top, quiet, json_path = (given.pop(k) for k in ("top", "quiet", "json_path"))
    check_output_file(json_path, "--json", [store])
    if top < 1:
        raise ProbeError(None, f"--top {top} must be at least 1", "use e.g. --top 20")
    given["view"] = str(given["view"] or 480)
    with bar("images", quiet) as progress:
        report = run("decode-sweep", store, on_start=ticker(progress, "sweep"), **given).report
    show(tables.sweep(report, {**given, "top": top}))
    if json_path and not report.waiting:
        write_summary(json_path, {"metric": given["metric"], "ledger_entry": report.ledger_entry, "table": report.table})
