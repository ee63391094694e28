"""Object discovery commands: decode (and its streaming mode), score, decode-sweep.

Their options, help and tables are declared in their registry entries (``protocols/discovery.py``);
their bodies are written here because they do more than one ``run``: decode streams a checkpoint
through ``decode-stream`` when given ``--images`` (``--size`` is kept as the old spelling of
``--view``), and the sweep's table prints only its ``--top`` rows.
"""

from __future__ import annotations

from typing import Any

from ..infra.errors import ProbeError
from .app import console, err_console, flag, run, show
from .protocols import declared, shown

STREAMED = ("images", "batch_size", "chunk")  # decode's options that only streaming takes
SCORING = ("refine", "out", "panel", "allow_partial", "unseal")  # decode's options that streaming refuses


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)


@declared("decode")
def decode(store: Any, given: dict[str, Any]) -> None:
    """Label-free object masks by a normalized cut on the keys; scored only if --panel is given."""
    from ..protocols.discovery import DecodeSettings  # here, not at import: the registry registers protocols in MODULES' order
    from ..results import tables

    size, quiet = given.pop("size"), given.pop("quiet")
    if size is not None:  # the old spelling of --view N; --view's default is a value, so two different views are refused, not ranked
        if given["view"] not in (None, str(size), DecodeSettings().view):
            raise ProbeError("--size", f"{size} and --view {given['view']} name two views", f"give one: --view {given['view']}")
        given["view"] = str(size)
    streamed = {name: given.pop(name) for name in STREAMED}
    if streamed["images"] is None and (named := [flag(n) for n in STREAMED if streamed[n] is not None]):  # a store's decode would ignore them
        raise ProbeError(None, f"{', '.join(named)} {'applies' if len(named) == 1 else 'apply'} with --images (streaming) alone", f"drop {' '.join(named)}")
    if streamed["images"] is not None:
        if given["panel"] is not None:
            raise ProbeError(None, "--images streams without --panel", "score the masks JSON with `probe score`")
        if given["refine"] is not None:
            raise ProbeError(None, "--refine applies to a store's masks scored on a saliency panel, not to --images", "drop --refine")
        for scoring in SCORING:  # given to a stream, each would be ignored: refused, never dropped in silence
            if given.pop(scoring) not in (None, False):
                where = "the masks go to the stream's store (results/decoder-masks.json), as the run prints"
                where = where if scoring == "out" else "it applies to a store's masks scored on a panel"
                raise ProbeError(None, f"{flag(scoring)} does not apply to --images: {where}", f"drop {flag(scoring)}")
        with shown("images", "stream", quiet) as progress:
            report = run("decode-stream", None, checkpoint=store, progress=progress, **streamed, **given).report
        tail = f"masks → {report.masks_file}" if report.masks_file else "other shards still running; the last to finish writes the masks"
        console.print(f"{report.store}: {report.done}/{report.n_images} images decoded ({report.written} now, in {report.seconds:.1f} s); {tail}")
        return
    with shown("images", "decode", quiet) as progress:
        report = run("decode", store, progress=progress, **given).report
    _warn(report.extra.get("warnings", []) if report.masks_file is not None else [])
    show(tables.decode(report))


@declared("score")
def score(masks_file: Any, given: dict[str, Any]) -> None:
    """Score masks on a panel: COCO AP (segm, bbox; class-agnostic), CorLoc, mean best IoU."""
    from ..results import tables

    report = run("score", masks_file, **given).report
    _warn(report.warnings)
    show(tables.score(report))


@declared("decode-sweep")
def decode_sweep(store: Any, given: dict[str, Any]) -> None:
    """Decode a grid of settings, read the panel's labels once, and keep the best setting."""
    from ..results import tables

    top, quiet = given.pop("top"), given.pop("quiet")
    if top < 1:
        raise ProbeError(None, f"--top {top} must be at least 1", "use e.g. --top 20")
    with shown("images", "sweep", quiet) as progress:
        report = run("decode-sweep", store, progress=progress, **given).report
    show(tables.sweep(report, top))
