"""Every table of a report also as CSV and as a LaTeX tabular, to paste into a paper.

Files are named by section and position (``04-entropy-1.csv``, ``04-entropy-1.tex``), the
numbers exactly as the report prints them. The LaTeX holds only a ``tabular`` (booktabs rules,
the caption as a comment above it), so it drops into any ``table`` environment; text is escaped
for LaTeX, and the few non-ASCII symbols the report uses are written as math.
"""

from __future__ import annotations

import csv
import io
import re

from .content import Report, Table

FOLDER = "tables"

_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
            "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_SYMBOLS = {"τ": r"$\tau$", "ε": r"$\varepsilon$", "λ": r"$\lambda$", "θ": r"$\theta$", "≤": r"$\leq$", "≥": r"$\geq$", "×": r"$\times$",
            "→": r"$\rightarrow$", "–": "--", "—": "---", "★": r"$\star$", "≈": r"$\approx$", "·": r"$\cdot$", "−": "$-$", "…": r"\dots{}",
            "²": r"\textsuperscript{2}", "½": r"$\frac{1}{2}$", "∞": r"$\infty$", "±": r"$\pm$", "√": r"$\surd$"}


def latex_text(text: str) -> str:
    """Text safe inside a LaTeX tabular cell (e^H becomes $e^H$; `code` becomes \\texttt)."""
    text = str(text).replace("e^H", "\x00")
    out = "".join(_SPECIAL.get(ch, _SYMBOLS.get(ch, ch)) for ch in text)
    out = out.replace("\x00", r"$e^H$")
    return re.sub(r"`([^`]*)`", r"\\texttt{\1}", out)


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.header)
    writer.writerows(table.rows)
    return out.getvalue()


def latex(table: Table) -> str:
    columns = "l" + "r" * (len(table.header) - 1)
    lines = [f"% {line}" for line in table.caption.splitlines()] if table.caption else []
    lines += [rf"\begin{{tabular}}{{{columns}}}", r"\toprule",
              " & ".join(latex_text(h) for h in table.header) + r" \\", r"\midrule"]
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
