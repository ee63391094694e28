"""Every table of a report also as CSV and as a LaTeX tabular, to paste into a paper.

Files are named by section and position (``04-entropy-1.csv``, ``04-entropy-1.tex``), the
numbers as the report prints them. The CSV is for a spreadsheet or pandas: a cell holds one
number, its unit in the header (``mIoU (%)``; a row's unit in its first cell when the rows are
statistics of different units), an interval ``m [lo, hi]`` is split into three columns
(``X``, ``X low``, ``X high``) and a missing value (``–``) is empty. The LaTeX holds only a
``tabular`` (booktabs rules, the caption as a comment above it), so it drops into any ``table``
environment; it is plain ASCII: text is escaped, symbols are written as math (``β`` as
``$\\beta$``), so it compiles with pdflatex as it is.
"""

from __future__ import annotations

import csv
import io
import re
import unicodedata

from .content import Report, Table

FOLDER = "tables"
SETTINGS_COLUMN = "settings other than the defaults"

_SPECIAL = {
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
}
_SYMBOLS = {
    "τ": r"$\tau$",
    "ε": r"$\varepsilon$",
    "λ": r"$\lambda$",
    "θ": r"$\theta$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "×": r"$\times$",
    "→": r"$\rightarrow$",
    "–": "--",
    "—": "---",
    "★": r"$\star$",
    "≈": r"$\approx$",
    "·": r"$\cdot$",
    "−": "$-$",
    "…": r"\dots{}",
    "²": r"\textsuperscript{2}",
    "½": r"$\frac{1}{2}$",
    "∞": r"$\infty$",
    "±": r"$\pm$",
    "√": r"$\surd$",
}


# Greek capitals that LaTeX writes as Latin letters (it has no \\Alpha)
_LATIN_CAPITALS = {
    "ALPHA": "A",
    "BETA": "B",
    "EPSILON": "E",
    "ZETA": "Z",
    "ETA": "H",
    "IOTA": "I",
    "KAPPA": "K",
    "MU": "M",
    "NU": "N",
    "OMICRON": "O",
    "RHO": "P",
    "TAU": "T",
    "CHI": "X",
}


def _latex_char(ch: str) -> str:
    if ch in _SPECIAL:
        return _SPECIAL[ch]
    if ch in _SYMBOLS:
        return _SYMBOLS[ch]
    if ord(ch) < 128:
        return ch
    name = unicodedata.name(ch, "")
    if name.startswith("GREEK SMALL LETTER ") and " WITH " not in name:
        letter = name.rsplit(" ", 1)[1].lower().replace("lamda", "lambda")
        return "o" if letter == "omicron" else rf"$\{letter}$"
    if name.startswith("GREEK CAPITAL LETTER ") and " WITH " not in name:
        letter = name.rsplit(" ", 1)[1].replace("LAMDA", "LAMBDA")
        return _LATIN_CAPITALS.get(letter) or rf"$\{letter.capitalize()}$"
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
    return "".join(_SPECIAL.get(c, c) for c in plain) if plain else "?"


def latex_text(text: str) -> str:
    """Text safe inside a LaTeX tabular cell, in plain ASCII (e^H becomes $e^H$; `code` becomes \\texttt)."""
    text = str(text).replace("e^H", "\x00")
    out = "".join(_latex_char(ch) for ch in text)
    out = out.replace("\x00", r"$e^H$")
    return re.sub(r"`([^`]*)`", r"\\texttt{\1}", out)


_NUMBER = r"[-−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
_CELL = re.compile(rf"^\s*(?P<v>{_NUMBER})\s*(?P<pct>%)?(?:\s*\[(?P<lo>{_NUMBER}),\s*(?P<hi>{_NUMBER})\])?\s*$")
_MISSING = {"", "–", "-", "?"}


def _number(text: str) -> str:
    return text.replace("−", "-")


def _parse(cell: str):
    """(value, percent, low, high) of a numeric cell, None for a missing one, False for text."""
    if str(cell).strip() in _MISSING:
        return None
    found = _CELL.match(str(cell))
    if not found:
        return False
    return _number(found["v"]), bool(found["pct"]), found["lo"] and _number(found["lo"]), found["hi"] and _number(found["hi"])


def _unit(label: str) -> str:
    return label if "%" in label else f"{label} (%)".strip()


def numeric(table: Table) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows for a CSV: one number per cell, units and intervals moved out
    of the cells (see the module's docstring); cells holding text stay as they are."""
    header = [str(h) for h in table.header]
    rows = [[str(c) for c in row] + [""] * (len(header) - len(row)) for row in table.rows]
    parsed = [[_parse(c) for c in row] for row in rows]
    first_is_label = not any(p[0] for p in parsed)
    labels = [row[0] for row in rows]
    keep_text = set()  # (row, column) of a percentage with nowhere to put its unit
    for j in range(len(header)):
        cells = [p[j] for p in parsed if p[j]]
        if cells and all(c[1] for c in cells):
            header[j] = _unit(header[j])
        elif any(c[1] for c in cells):
            for i, p in enumerate(parsed):
                if p[j] and p[j][1]:
                    if first_is_label and j > 0:
                        labels[i] = _unit(labels[i])
                    else:
                        keep_text.add((i, j))
    out_header: list[str] = []
    out_rows: list[list[str]] = [[] for _ in rows]
    for j, name in enumerate(header):
        spread = any(p[j] and p[j][2] is not None for p in parsed)
        out_header += [name, *([f"{name} low", f"{name} high"] if spread else [])]
        for i, p in enumerate(parsed):
            cell = p[j]
            if j == 0 and first_is_label:
                out_rows[i] += [labels[i], *(["", ""] if spread else [])]
            elif cell is False or (i, j) in keep_text:
                out_rows[i] += [rows[i][j], *(["", ""] if spread else [])]
            elif cell is None:
                out_rows[i] += ["", *(["", ""] if spread else [])]
            else:
                out_rows[i] += [cell[0], *([cell[2] or "", cell[3] or ""] if spread else [])]
    return out_header, out_rows


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header, rows = numeric(table)
    if table.settings:  # every row says the settings that moved its numbers (``report/differing.py``)
        header, rows = [*header, SETTINGS_COLUMN], [[*row, table.settings] for row in rows]
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def latex(table: Table) -> str:
    columns = "l" + "r" * (len(table.header) - 1)
    lines = [f"% {latex_text(line)}" for line in table.caption.splitlines()] if table.caption else []
    lines += [rf"\begin{{tabular}}{{{columns}}}", r"\toprule", " & ".join(latex_text(h) for h in table.header) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_text(c) for c in row) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def named_tables(report: Report) -> list[tuple[str, Table]]:
    """(file stem, table) for every table, numbered by section and by position in the section."""
    out = []
    for n, section in enumerate(report.sections, 1):
        tables = [b for b in section.blocks if isinstance(b, Table)]
        for k, table in enumerate(tables, 1):
            out.append((f"{n:02d}-{section.key}-{k}", table))
    return out
