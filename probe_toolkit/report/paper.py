"""``probe table``: one paper table from records alone — checkpoints as rows, protocols (and blocks) as columns.

Each column is one number of one result measured one way: records share a column only when they
were computed on the same images (the ``computed_on`` hash of their image ids) and with the same
settings that move the number (``results.differ``: the settings that differ from the protocol's
defaults, the block and facet read included). Records that differ go to columns of their own, each
headed by what differs, so no cell is compared with a number measured otherwise. A cell carries its
interval where the record has one. Published numbers (other weights, other data) are rows of their
own, marked as such, and fill only the columns measured at their published setting.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..infra.errors import ProbeError
from ..results import differ, records

FORMATS = ("markdown", "csv", "latex")
DEFAULT_PROTOCOLS = ("knn", "decode", "hummingbird")


@dataclass(frozen=True)
class Number:
    """A cell: a fraction (or a count where ``share`` is false) with its interval where the record has one."""

    value: float
    low: float | None = None
    high: float | None = None
    share: bool = True

    def text(self, digits: int = 1) -> str:
        if not np.isfinite(self.value):
            return "–"
        scale = 100.0 if self.share else 1.0
        out = f"{scale * self.value:.{digits}f}"
        if self.low is not None and self.high is not None and np.isfinite([self.low, self.high]).all():
            out += f" [{scale * self.low:.{digits}f}, {scale * self.high:.{digits}f}]"
        return out


# protocol -> (does a result name belong to it, what one record gives: {metric heading: Number})
def _knn(ds) -> dict[str, Number]:
    ks = [int(k) for k in ds.k.values]
    k = 20 if 20 in ks else ks[0]  # DINO's tables report the 20-NN top-1
    return {f"k-NN top-1 (%), k = {k}": Number(float(ds.top1.values[ks.index(k)]))}


def _scores(ds) -> dict[str, Number]:
    return {"CorLoc (%)": Number(float(ds.corloc.values))}


def _hummingbird(ds) -> dict[str, Number]:
    values = ds.miou_hungarian.values if ds.attrs.get("matching") == "hungarian" else ds.miou.values
    sizes = [f"{int(m):,}" if str(m).isdigit() else str(m) for m in ds.memory.values]  # "full": every patch
    return {f"Hummingbird mIoU (%), memory {m}": Number(float(v)) for m, v in zip(sizes, values)}


def _entropy(ds) -> dict[str, Number]:
    names = [str(s) for s in ds.statistic.values]
    i = names.index("patch_effective")
    return {"mean e^H (tokens)": Number(float(ds.summary_mean.values[i]), float(ds.summary_low.values[i]), float(ds.summary_high.values[i]), share=False)}


def _published_hummingbird(heading: str) -> list[tuple[str, Number]]:
    from ..analyses.hummingbird_published import PUBLISHED, PUBLISHED_MEMORY_SIZES

    found = []
    for name, values in PUBLISHED:
        for memory, value in zip(PUBLISHED_MEMORY_SIZES, values):
            if heading == f"Hummingbird mIoU (%), memory {memory:,}":
                found.append((name, Number(value / 100)))
    return found


@dataclass(frozen=True)
class Metric:
    belongs: Callable[[str], bool]
    numbers: Callable[[Any], dict[str, Number]]
    published: Callable[[str], list[tuple[str, Number]]] = lambda heading: []
    source: str = ""


METRICS = {
    "knn": Metric(lambda r: r == "knn", _knn),
    "decode": Metric(lambda r: r.startswith("scores_"), _scores),
    "hummingbird": Metric(
        lambda r: r == "hummingbird", _hummingbird, _published_hummingbird, "vpariza/open-hummingbird-eval README.md (Pascal VOC, 512 px; Hungarian-matched mIoU)"
    ),
    "entropy": Metric(lambda r: r == "entropy", _entropy),
}


@dataclass
class Column:
    protocol: str
    result: str
    heading: str
    measured: str  # what the records of this column share: images and the settings that differ from the defaults
    cells: dict[str, Number] = field(default_factory=dict)  # row label -> number

    @property
    def title(self) -> str:
        return f"{self.heading}; {self.measured}"


@dataclass
class PaperTable:
    rows: list[str]  # checkpoints (one per store), then published rows
    published: set[str]
    columns: list[Column]
    notes: list[str]


def _label(store: Path) -> str:
    """The store's checkpoint: the manifest's Hub repository or file stem, and the network."""
    from ..store import cache

    manifest = cache.manifest(store)
    checkpoint = manifest.get("checkpoint") or {}
    source = checkpoint.get("source") or {}
    name = source.get("repository") or Path(str(checkpoint.get("path", store))).stem
    return f"{name} ({manifest.get('network', store.stem)})"


def _with_last_block(meta: dict[str, Any], store: Path) -> dict[str, Any]:
    """``meta`` whose selection knows the last block of the store the record lies in, so that ``differ`` leaves out the
    default block even where the record's ``inputs.store`` names a folder that is not here (stores copied or moved)."""
    from ..store import cache

    depth = (cache.manifest(store).get("arch") or {}).get("depth")
    if isinstance(meta.get("selection"), dict) and isinstance(depth, int):
        meta["selection"] = {"last_block": depth - 1, **meta["selection"]}
    return meta


def _measured(meta: dict[str, Any], ds) -> str:
    on = ds.attrs.get("computed_on") if isinstance(ds.attrs.get("computed_on"), dict) else {}
    panel = (meta.get("inputs") or {}).get("panel") or ((ds.attrs.get("panels") or {}).get("val") or {}).get("name")
    images = f"{on.get('images', '?')} images {str(on.get('images_sha256', ''))[:8]}".strip() if on else "images unrecorded"
    settings = differ.differing_text(meta) or "defaults"
    return f"{'panel ' + str(panel) + ', ' if panel else ''}{images}; {settings}"


def build(stores: Iterable[str | Path], protocols: Iterable[str] = DEFAULT_PROTOCOLS, labels: dict[str, str] | None = None) -> PaperTable:
    """The table of ``stores``' latest record of each result of ``protocols`` (records alone: nothing is recomputed)."""
    stores = [Path(s) for s in stores]
    protocols = list(protocols)
    unknown = [p for p in protocols if p not in METRICS]
    if unknown:
        raise ProbeError("--protocols", f"{', '.join(unknown)} has no paper column", f"use any of {', '.join(METRICS)}")
    for store in stores:
        if not (store / "zarr.json").is_file():
            raise ProbeError(store, "is not a probe store (no zarr.json)", "pass stores written by `probe extract`")
    names = {str(s): (labels or {}).get(str(s)) or _label(s) for s in stores}
    if len(set(names.values())) < len(names):  # two stores of one checkpoint: tell them apart by their folders
        names = {str(s): f"{names[str(s)]} {s.parent.name}/{s.name}" for s in stores}
    columns: dict[tuple[str, str, str, str], Column] = {}
    notes: list[str] = []
    for protocol in protocols:
        metric = METRICS[protocol]
        for store in stores:
            for result in records.results(store):
                if records.is_part(result) or not metric.belongs(result):
                    continue
                found = records.find(store, result)
                ds = records.load(store, result) if found is not None else None
                if ds is None:
                    continue
                meta = _with_last_block(dict(found.meta), store)
                measured = _measured(meta, ds)
                for heading, number in metric.numbers(ds).items():
                    column = columns.setdefault((protocol, result, heading, measured), Column(protocol, result, heading, measured))
                    column.cells[names[str(store)]] = number
    ordered = sorted(columns.values(), key=lambda c: (protocols.index(c.protocol), c.result, c.heading, -len(c.cells), c.measured))
    split = {}
    for c in ordered:
        split.setdefault((c.protocol, c.result, c.heading), []).append(c)
    for (protocol, result, heading), group in split.items():
        if len(group) > 1:
            notes.append(
                f"{protocol} ({result}), {heading}: records measured {len(group)} ways sit in {len(group)} columns, "
                "one per set of images and settings: " + " | ".join(c.measured for c in group)
            )
    published: dict[str, None] = {}
    filled: set[str] = set()
    for column in ordered:
        for name, number in METRICS[column.protocol].published(column.heading):
            row = f"{name} (published, other weights)"
            column.cells[row] = number
            published[row] = None
            filled.add(column.protocol)
    for protocol in protocols:
        if METRICS[protocol].source and any(c.protocol == protocol for c in ordered):
            notes.append(
                f"published rows ({protocol}): {METRICS[protocol].source}; measured on released weights and the full data set, not on these stores."
                if protocol in filled
                else f"{protocol}: no column was measured at a published setting, so no published row is shown ({METRICS[protocol].source})."
            )
    if not ordered:
        raise ProbeError(None, f"the stores hold no record of {', '.join(protocols)}", "run the protocols first (probe knn / decode --panel / hummingbird)")
    return PaperTable([*dict.fromkeys(names.values()), *published], set(published), ordered, notes)


def _grid(table: PaperTable) -> list[list[str]]:
    return [[row, *(c.cells[row].text() if row in c.cells else "–" for c in table.columns)] for row in table.rows]


def markdown(table: PaperTable) -> str:
    head = ["checkpoint", *(c.title for c in table.columns)]
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in _grid(table)]
    notes = [
        "",
        "Cells: % (or tokens) [95 % bootstrap interval where the record has one]; – where a checkpoint has no record measured that way.",
        *(["", *(f"- {n}" for n in table.notes)] if table.notes else []),  # a list after a blank line: Python-Markdown (mkdocs) renders it as one
    ]
    return "\n".join(lines + notes) + "\n"


def csv_text(table: PaperTable) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["checkpoint", "published", "protocol", "result", "metric", "measured", "value", "low", "high"])
    for column in table.columns:
        for row in table.rows:
            number = column.cells.get(row)
            if number is None:
                continue
            scale = 100.0 if number.share else 1.0
            writer.writerow(
                [
                    row,
                    row in table.published,
                    column.protocol,
                    column.result,
                    column.heading,
                    column.measured,
                    f"{scale * number.value:.4f}",
                    "" if number.low is None else f"{scale * number.low:.4f}",
                    "" if number.high is None else f"{scale * number.high:.4f}",
                ]
            )
    return out.getvalue()


LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "≤": r"$\leq$",
    "τ": r"$\tau$",
    "ε": r"$\varepsilon$",
}


def _tex(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def latex(table: PaperTable) -> str:
    lines = [
        r"\begin{tabular}{l" + "r" * len(table.columns) + "}",
        r"\hline",
        " & ".join(["checkpoint", *(_tex(c.heading) for c in table.columns)]) + r" \\",
        " & ".join(["", *(r"\scriptsize " + _tex(c.measured) for c in table.columns)]) + r" \\",
        r"\hline",
    ]
    for row in _grid(table):
        if row[0] in table.published and not lines[-1].startswith(r"\hline"):
            lines.append(r"\hline")
        label = r"\textit{" + _tex(row[0]) + "}" if row[0] in table.published else _tex(row[0])
        lines.append(" & ".join([label, *(_tex(cell) for cell in row[1:])]) + r" \\")
    lines += [r"\hline", r"\end{tabular}"]
    notes = ["% " + n for n in table.notes]
    return "\n".join(lines + notes) + "\n"


RENDER = {"markdown": markdown, "csv": csv_text, "latex": latex}


def write(path: str | Path, text: str) -> Path:
    """The table file, written atomically (a temporary name, then renamed): never half a table."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def render(table: PaperTable, form: str) -> str:
    if form not in RENDER:
        raise ProbeError("--format", f"{form!r} is not one of {', '.join(FORMATS)}", "use --format markdown, csv or latex")
    return RENDER[form](table)
