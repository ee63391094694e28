"""Write a report folder atomically: ``report.md``, ``report.html`` and ``figures/*.png``.

Everything is written into a hidden temporary folder beside the target and renamed into place
at the end, so a reader (or a crash) never sees half a report; an older report of the same
name is replaced whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import provenance
from ..summaries import store_label
from . import html, markdown
from .content import Report
from .sections import gather

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


def write_report(
    stores: list[Path], out: Path | None = None, *, follow: str | None = None, patch: int = 34, cache_dir: str | Path | None = None
) -> Written:
    report = gather([Path(s) for s in stores], follow=follow, patch=patch, cache_dir=cache_dir)
    target = Path(out) if out is not None else DEFAULT_ROOT / default_name(stores)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        (tmp / markdown.FIGURES).mkdir(parents=True)
        figures = []
        for section in report.sections:
            for f in section.figures():
                path = tmp / markdown.FIGURES / f.name
                path.write_bytes(f.png)
                figures.append(target / markdown.FIGURES / f.name)
        generated = provenance.now()
        (tmp / "report.md").write_text(markdown.render(report, generated), encoding="utf-8")
        (tmp / "report.html").write_text(html.render(report, generated), encoding="utf-8")
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old)
        else:
            tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return Written(target, target / "report.md", target / "report.html", figures, report)
