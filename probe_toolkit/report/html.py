"""The report as one self-contained HTML page: figures embedded as base64 PNG, the explorer's data
as JSON in the page, its script and style inline, and a Content-Security-Policy that forbids
every network request, so the page works offline and cannot leak what it shows.
"""

from __future__ import annotations

import base64
import html
import re
from importlib import resources

from ..infra.atomic import json_text
from .content import Explorer, Figure, Note, Report, Section, Table

# nothing may be fetched: images only from data: URIs, script and style only inline
POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def inline(text: str) -> str:
    """Escape text, then turn `code` spans into <code> (the only markup notes use)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def table(t: Table) -> str:
    head = "".join(f"<th>{inline(h)}</th>" for h in t.header)
    rows = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    caption = f"<caption>{inline(t.caption)}</caption>" if t.caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def figure(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (
        f'<figure data-figure="{html.escape(f.name)}"><img alt="{html.escape(f.caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{inline(f.caption)}</figcaption></figure>"
    )


def note(n: Note) -> str:
    return f'<p class="note {n.kind}">{inline(n.text)}</p>'


def explorer(e: Explorer) -> str:
    # "</" cannot end the script element early once escaped; the JSON stays valid
    payload = json_text(e.data, separators=(",", ":")).replace("</", "<\\/")
    return (
        f'<div id="probe-explorer" class="explorer" data-patch="{int(e.data["patch"])}"></div><script type="application/json" id="probe-explorer-data">{payload}</script>'
    )


RENDER = {Table: table, Figure: figure, Note: note, Explorer: explorer}


def section(s: Section) -> str:
    body = "".join(RENDER[type(b)](b) for b in s.blocks)
    present = "true" if s.present else "false"
    return f'<section id="{s.key}" data-section="{s.key}" data-present="{present}"><h2>{inline(s.title)}</h2>{body}</section>'


def render(report: Report, generated: str) -> str:
    contents = "".join(f'<li class="{"present" if s.present else "absent"}"><a href="#{s.key}">{inline(s.title)}</a></li>' for s in report.sections)
    follow = f"followed image <code>{html.escape(report.follow)}</code>, patch {report.patch}" if report.follow else "no followed image"
    has_explorer = any(isinstance(b, Explorer) for s in report.sections for b in s.blocks)
    script = f"<script>{asset('explorer.js')}</script>" if has_explorer else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{POLICY}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(report.title)}</title>
<style>{asset("report.css")}</style>
</head>
<body data-patch="{report.patch}">
<h1>{html.escape(report.title)}</h1>
<p class="meta">{len(report.stores)} store{"s" if len(report.stores) != 1 else ""}: {", ".join(html.escape(s) for s in report.stores)}; {follow};
generated {html.escape(generated)} by {html.escape(report.version or "probe")}.</p>
<nav><ol>{contents}</ol></nav>
{"".join(section(s) for s in report.sections)}
{script}
</body>
</html>
"""
