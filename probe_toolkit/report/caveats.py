"""A caveat beside every section whose numbers or pictures come from random weights or synthetic
images (``infra.origin``'s markers): a reader who skims to one figure, say a DAVIS J&F of a
random network on drawn shapes, learns there that it checks the pipeline and measures no method.

A section gets the caveat of each store it shows (its tables, figures and notes name the store's
label), and the DAVIS section the caveat of the video folder its result read.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..infra import origin
from . import figures
from .content import Explorer, Figure, Note, Section, Table

MAX_FOLDERS = 64  # image folders looked at per store (ids share few parent folders)
UNCAVEATED = {"training"}  # a training run's own log: the store's weights and images are not what it shows


def store_caveats(store) -> list[str]:
    """What of ``store`` probe made up, in phrases without its name: its checkpoint's random
    weights; how many of its images lie in folders probe drew."""
    found = []
    checkpoint = store.manifest.get("checkpoint") or {}
    weights = origin.random_weights(checkpoint.get("path"), checkpoint.get("sha256"))
    if weights:
        found.append(weights)
    source = store.manifest.get("image_source")
    if source:
        folders: dict[str, int] = {}
        for image_id in store.image_ids:
            folder = str(Path(image_id).parent)
            folders[folder] = folders.get(folder, 0) + 1
        checked = dict(list(folders.items())[:MAX_FOLDERS])
        marks = {f: origin.synthetic(Path(source) / f, stop=source) for f in checked}
        drawn = [f for f, what in marks.items() if what]
        if drawn:
            count = sum(checked[f] for f in drawn)
            kinds = " and ".join(dict.fromkeys(re.sub(r" \(seed \d+\)", "", str(marks[f])) for f in drawn))
            found.append(f"{count} of its {len(store.image_ids)} images are {kinds}")
    return found


def _text(section: Section) -> str:
    parts = []
    for block in section.blocks:
        if isinstance(block, Table):
            parts += [block.caption, *block.header, *(c for row in block.rows for c in row)]
        elif isinstance(block, Figure):
            parts.append(block.caption)
        elif isinstance(block, Note) and block.kind != "missing":
            parts.append(block.text)
        elif isinstance(block, Explorer):
            parts += [str(s.get("label", "")) for s in block.data.get("stores", [])]
    return "\n".join(parts)


def _kinds(phrases: list[str]) -> list[str]:
    """The short names of what the phrases say probe made up: random weights, synthetic data."""
    text = " ".join(phrases)
    return [k for k, cue in (("random weights", "random weights"), ("synthetic data", "synthetic")) if cue in text]


def stamp(figure: Figure, kinds: list[str]) -> Figure:
    """The figure with a line over it saying what it shows is made up, drawn into the image, so
    a PNG or PDF copied into a paper carries the caveat with it; its caption opens with it too."""
    line = f"Not a measurement of a method: {' and '.join(kinds)} made by probe"
    png = figure.image
    if hasattr(png, "figure"):  # a figures.Drawing: drawn with the line over everything it holds (legends included)
        fig = png.figure
        fig.set_dpi(figures.DPI)  # laid out and measured as it is saved: legends placed in pixels stay put
        figures.legible(fig)  # the sizes it will be saved with, laid out once more
        try:
            fig.set_layout_engine("none")  # keep that layout: a layout engine would move legends onto the line
        except RuntimeError:
            pass
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        # above everything: a legend placed "outside lower" is anchored to the figure's edge, which a tight save moves
        fig.text(0.5, (box.y1 + 0.06) / fig.get_figheight(), line, ha="center", va="bottom", fontsize=8, color="#D55E00", fontweight="bold")
        png = figures.png(fig)
    return Figure(figure.name, png, f"{line}. {figure.caption}")


def add_caveats(sections: list[Section], stores) -> None:
    """Put one caveat note first in each present section that shows a store probe made up, and
    stamp each of its figures that shows one (named in its caption, or every store when it names none)."""
    per_store = {s.label: store_caveats(s) for s in stores}
    for section in sections:
        if not section.present or section.key in UNCAVEATED:
            continue
        text = _text(section)
        shown = {label: found for label, found in per_store.items() if found and label in text}
        lines = [f"{label} — {', '.join(found)}" for label, found in shown.items()]
        video = []
        if section.key == "davis":
            for store in stores:
                ds = store.result("davis")
                what = origin.synthetic(ds.attrs.get("davis")) if ds is not None else None
                if what:
                    video.append(f"the video of {store.label}'s J&F — {what}")
        if not lines and not video:
            continue
        section.blocks.insert(
            0, Note(f"Not a measurement of a method: {'; '.join(dict.fromkeys(lines + video))}. These numbers and pictures check the pipeline only.", "caveat")
        )
        for i, block in enumerate(section.blocks):
            if not isinstance(block, Figure):
                continue
            named = [label for label in per_store if label in block.caption]
            phrases = [p for label in (named or list(per_store)) for p in shown.get(label, [])] + video
            kinds = _kinds(phrases)
            if kinds:
                section.blocks[i] = stamp(block, kinds)
