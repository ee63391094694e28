"""Write a report into a folder: ``report.md``, ``report.html``, ``figures/`` (each figure as PNG,
and as PDF and SVG unless ``formats`` says otherwise) and ``tables/`` (each table as CSV and
LaTeX tabular).

The folder is probe's output folder (``infra.owned``): new, empty, or carrying probe's manifest
``.probe-output.json``; a non-empty folder without it is refused before any work. The report
replaces or deletes only the files the manifest lists as the report's: a file the user added
(a figure in ``figures/``, a table in ``tables/``, notes beside ``report.md``) stays, and a file
of the user's where the report would write is refused. Everything is first written into a
hidden temporary folder inside the target, then each file renamed into place (figures and
tables, then the Markdown, then the HTML, each an atomic rename on one filesystem); a failure
before that leaves the previous report as it was and no temporary files behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..infra import litter, owned, provenance
from ..infra.errors import ProbeError, os_fix
from ..results.summaries import store_label
from . import html, markdown, tables
from .content import Report
from .figures import FORMATS
from .sections import gather
from .sources import parse_labels

DEFAULT_ROOT = Path("reports")


@dataclass
class Written:
    folder: Path
    markdown: Path
    html: Path
    figures: list[Path]
    report: Report


def default_name(stores: list[Path]) -> str:
    """A folder name from the stores' labels (checkpoint folder and network), kept short."""
    labels = [store_label(str(s)).removesuffix(".zarr").replace("/", "-") for s in dict.fromkeys(Path(p) for p in stores)]
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", "+".join(labels)).strip("._") or "report"
    if len(name) > 80:
        name = name[:70].rstrip("._+-") + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return name


GROUP = "report"  # the report's files in the folder's manifest


def _swap_in(tmp: Path, output: owned.Output) -> None:
    """Move the finished files from ``tmp`` into the output folder, each by an atomic rename
    (figures and tables first, the pages last); the report's old files that this one no longer
    has go; files the manifest does not list as probe's are never touched."""
    files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    pages = [n for n in ("report.md", "report.html") if n in files]
    for folder in (markdown.FIGURES, tables.FOLDER):  # present even when a report has no table
        (output.folder / folder).mkdir(parents=True, exist_ok=True)
    output.replace(GROUP, tmp, [*(n for n in files if n not in pages), *pages])


def parse_formats(formats: str | Sequence[str] | None) -> tuple[str, ...]:
    """``png,pdf,svg`` → ("png", "pdf", "svg"); PNG is always written (the HTML embeds it)."""
    if formats is None:
        return FORMATS
    items = [f.strip().lower() for f in (formats.split(",") if isinstance(formats, str) else formats) if f.strip()]
    bad = [f for f in items if f not in FORMATS]
    if bad:
        raise ProbeError("--format", f"{', '.join(bad)} is not one of {', '.join(FORMATS)}", "use e.g. --format png,pdf,svg")
    return tuple(dict.fromkeys(["png", *items]))


def write_report(
    stores: list[Path],
    out: Path | None = None,
    *,
    follow: str | None = None,
    patch: int = 34,
    cache_dir: str | Path | None = None,
    formats: str | Sequence[str] | None = None,
    run: str | None = None,
    labels: Sequence[str] | None = None,
) -> Written:
    """Gather the stores' results and write the report into ``out`` (default reports/<name>);
    ``labels``: ``NAME=STORE`` items naming stores in titles, tables and figures."""
    kinds = parse_formats(formats)
    names = parse_labels(labels, [Path(s) for s in stores])
    target = Path(out) if out is not None else DEFAULT_ROOT / default_name(stores)
    output = owned.claim(target, "out")  # the user's own folder is refused before any work
    report = gather([Path(s) for s in stores], follow=follow, patch=patch, cache_dir=cache_dir, run=run, labels=names)
    target.mkdir(parents=True, exist_ok=True)
    litter.sweep(target)  # a killed report's .report.tmp-PID and .figures.old-PID
    tmp = target / f".report.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        (tmp / markdown.FIGURES).mkdir(parents=True)
        (tmp / tables.FOLDER).mkdir()
        figures = []
        for section in report.sections:
            for f in section.figures():
                (tmp / markdown.FIGURES / f.name).write_bytes(f.png)
                figures.append(target / markdown.FIGURES / f.name)
                for kind in kinds[1:]:
                    if hasattr(f.png, "vector"):  # a figure drawn by figures.png; raw PNG bytes have no vector form
                        name = f.name.removesuffix(".png") + f".{kind}"
                        (tmp / markdown.FIGURES / name).write_bytes(f.png.vector(kind))
        for stem, table in tables.named_tables(report):
            (tmp / tables.FOLDER / f"{stem}.csv").write_text(tables.csv_text(table), encoding="utf-8")
            (tmp / tables.FOLDER / f"{stem}.tex").write_text(tables.latex(table), encoding="utf-8")
        generated = provenance.now()
        (tmp / "report.md").write_text(markdown.render(report, generated), encoding="utf-8")
        (tmp / "report.html").write_text(html.render(report, generated), encoding="utf-8")
        _swap_in(tmp, output)
    except OSError as error:  # a full disk: the previous report stays as it was
        raise ProbeError(target, f"could not be written ({error.strerror or error})", os_fix(error, "rerun `probe report`")) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return Written(target, target / "report.md", target / "report.html", figures, report)


def render_report(
    stores: list[Path],
    out: Path | None = None,
    *,
    follow: str | None = None,
    patch: int = 34,
    cache_dir: str | Path | None = None,
    quiet: bool = True,
    formats: str | Sequence[str] | None = None,
    labels: Sequence[str] | None = None,
) -> Path:
    """``write_report`` for callers that want only the page (``probe demo``): the HTML's path.

    ``quiet`` is accepted for symmetry with the other pipelines; a report prints nothing.
    """
    return write_report(stores, out, follow=follow, patch=patch, cache_dir=cache_dir, formats=formats, labels=labels).html
