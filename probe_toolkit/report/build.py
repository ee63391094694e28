"""Write a report into a folder: ``report.md``, ``report.html`` and ``figures/*.png``.

The folder may hold other things (``probe demo`` keeps its cache beside its report), so the
report owns exactly those three entries and never touches anything else. Everything is first
written into a hidden temporary folder inside the target, then renamed into place (the figures
folder, then the Markdown, then the HTML, each an atomic rename on one filesystem); a failure
before that leaves the previous report as it was and no temporary files behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..commands.summaries import store_label
from ..infra import litter, provenance
from ..infra.errors import ProbeError
from . import html, markdown
from .content import Report
from .sections import gather

DEFAULT_ROOT = Path("reports")
OWNED = ("report.md", "report.html", markdown.FIGURES)


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


def _swap_in(tmp: Path, target: Path) -> None:
    """Move the finished files from ``tmp`` into ``target``; an old figures folder goes whole."""
    figures, old = target / markdown.FIGURES, target / f".{markdown.FIGURES}.old-{os.getpid()}"
    if figures.exists():
        figures.rename(old)
    (tmp / markdown.FIGURES).rename(figures)
    for name in ("report.md", "report.html"):
        os.replace(tmp / name, target / name)
    if old.exists():
        shutil.rmtree(old)


def write_report(
    stores: list[Path], out: Path | None = None, *, follow: str | None = None, patch: int = 34, cache_dir: str | Path | None = None
) -> Written:
    """Gather the stores' results and write the report into ``out`` (default reports/<name>)."""
    report = gather([Path(s) for s in stores], follow=follow, patch=patch, cache_dir=cache_dir)
    target = Path(out) if out is not None else DEFAULT_ROOT / default_name(stores)
    target.mkdir(parents=True, exist_ok=True)
    litter.sweep(target)  # a killed report's .report.tmp-PID and .figures.old-PID
    tmp = target / f".report.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        (tmp / markdown.FIGURES).mkdir(parents=True)
        figures = []
        for section in report.sections:
            for f in section.figures():
                (tmp / markdown.FIGURES / f.name).write_bytes(f.png)
                figures.append(target / markdown.FIGURES / f.name)
        generated = provenance.now()
        (tmp / "report.md").write_text(markdown.render(report, generated), encoding="utf-8")
        (tmp / "report.html").write_text(html.render(report, generated), encoding="utf-8")
        _swap_in(tmp, target)
    except OSError as error:  # a full disk: the previous report stays as it was
        raise ProbeError(target, f"could not be written ({error.strerror or error})", "free disk space and rerun `probe report`") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return Written(target, target / "report.md", target / "report.html", figures, report)


def render_report(
    stores: list[Path], out: Path | None = None, *, follow: str | None = None, patch: int = 34,
    cache_dir: str | Path | None = None, quiet: bool = True,
) -> Path:
    """``write_report`` for callers that want only the page (``probe demo``): the HTML's path.

    ``quiet`` is accepted for symmetry with the other pipelines; a report prints nothing.
    """
    return write_report(stores, out, follow=follow, patch=patch, cache_dir=cache_dir).html
