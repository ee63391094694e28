"""The report as Markdown: the same sections as the HTML, figures linked as PNG files beside it.

The interactive explorer exists only in the HTML; here its section points there.
"""

from __future__ import annotations

from .content import Explorer, Figure, Note, Report, Section, Table

FIGURES = "figures"  # folder of the PNGs, relative to report.md


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(t: Table) -> str:
    lines = [f"*{cell(t.caption)}*", ""] if t.caption else []
    lines.append("| " + " | ".join(cell(h) for h in t.header) + " |")
    lines.append("|" + "|".join("---" for _ in t.header) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def figure(f: Figure) -> str:
    return f"![{cell(f.caption)}]({FIGURES}/{f.name})\n\n*{f.caption}*"


def note(n: Note) -> str:
    if n.kind == "missing":
        return f"> **Not available:** {n.text}"
    if n.kind == "caveat":
        return f"> **Caveat:** {n.text}"
    if n.kind == "reference":
        return f"> **Reference:** {n.text}"
    return n.text


def explorer(e: Explorer) -> str:
    return f"The interactive explorer (click a patch of `{e.data['image']}`) is in `report.html`; open it offline at `report.html#patch={e.data['patch']}`."


RENDER = {Table: table, Figure: figure, Note: note, Explorer: explorer}


def section(s: Section) -> str:
    return "\n\n".join([f"## {s.title}", *(RENDER[type(b)](b) for b in s.blocks)])


def render(report: Report, generated: str) -> str:
    follow = f"followed image `{report.follow}`, patch {report.patch}" if report.follow else "no followed image"
    contents = "\n".join(f"{i}. {s.title}{'' if s.present else ' (not available)'}" for i, s in enumerate(report.sections, 1))
    head = f"# {report.title}\n\n{len(report.stores)} store(s): {', '.join(report.stores)}; {follow}; generated {generated} by {report.version or 'probe'}.\n\n{contents}"
    return "\n\n".join([head, *(section(s) for s in report.sections)]) + "\n"
