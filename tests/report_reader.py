"""Read a report as its reader would: no path of the machine, no element of a figure outside its axes,
captions that say what the records say. Shared by the demo's test and the report's tests."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Polygon, Rectangle


def absolute_paths(text: str, roots: list[str | Path]) -> list[str]:
    """Every place ``text`` names a path under one of ``roots`` (the machine's folders: the test's tmp, the
    working folder, the home) or any absolute POSIX path of three parts or more."""
    found = [m.group(0) for root in roots for m in re.finditer(re.escape(str(Path(root).resolve())) + r"[^\s|`)\"']*", text)]
    found += re.findall(r"(?<![\w.~/:…])/(?:tmp|home|root|work|usr|var|opt)/[^\s|`)\"']+", text)
    return sorted(set(found))


def _data_extent(artist, ax) -> np.ndarray | None:
    """An artist's points in the axes' data coordinates, when it is drawn in them (None otherwise)."""
    if artist.get_transform() != ax.transData and not (isinstance(artist, (Polygon, Rectangle)) and artist.get_transform().contains_branch(ax.transData)):
        return None
    if isinstance(artist, Line2D):
        points = np.asarray(artist.get_xydata(), dtype=float)
    elif isinstance(artist, (Polygon, Rectangle)):
        points = artist.get_patch_transform().transform(artist.get_path().vertices)
    else:
        return None
    return points[np.isfinite(points).all(axis=1)] if points.size else None


def outside_axes(fig) -> list[str]:
    """Data artists (lines, histogram outlines and bars) that reach past their axes' view limits, so that clipping
    hides part of them (texts need no check: the figure is saved with its tight bounding box)."""
    fig.canvas.draw()
    problems = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        tx, ty = 1e-6 * max(x1 - x0, 1e-12), 1e-6 * max(y1 - y0, 1e-12)
        for artist in [*ax.lines, *ax.patches]:
            if not artist.get_visible():
                continue
            points = _data_extent(artist, ax)
            if points is None or not len(points):
                continue
            if (points[:, 0] < x0 - tx).any() or (points[:, 0] > x1 + tx).any() or (points[:, 1] < y0 - ty).any() or (points[:, 1] > y1 + ty).any():
                problems.append(
                    f"{type(artist).__name__} in '{ax.get_title()}' reaches past its axes "
                    f"(x {points[:, 0].min():.4g}..{points[:, 0].max():.4g} of {x0:.4g}..{x1:.4g}, "
                    f"y {points[:, 1].min():.4g}..{points[:, 1].max():.4g} of {y0:.4g}..{y1:.4g})"
                )
    return problems


def figures_of(report) -> list[tuple[str, object]]:
    """(name, matplotlib figure) of every figure a gathered report holds (``figures.png`` keeps the figure)."""
    return [(f.name, f.png.figure) for s in report.sections for f in s.figures() if getattr(f.png, "figure", None) is not None]


# ----------------------------------------------------------------------------------------------
# captions against the records their section read (``Section.sources``)

CAVEAT = re.compile(r"^Not a measurement of a method: [^.]*\. ")
DIFFERING = re.compile(r"Settings other than the defaults: (.*?)\.?$")
IMAGE_KEYS = ("image", "count", "held", "train", "val", "frames", "examples")


def _flat(value, path: str = "") -> list[tuple[str, object]]:
    """(dotted path, scalar) of everything a record's attributes hold (lists as their items, under the same path)."""
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _flat(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flat(v, path)]
    if isinstance(value, np.ndarray):
        return _flat(value.tolist(), path)
    return [(path, value)]


def facts(ds) -> list[tuple[str, object]]:
    """A record's attributes (its record.json meta included) and its coordinates' values, flattened."""
    found = _flat({k: v for k, v in ds.attrs.items() if k != "manifest"})  # the store's manifest: what it holds, not what the run read
    for name, coord in ds.coords.items():
        if coord.ndim <= 1 and coord.size <= 1000:
            found += _flat(coord.values.tolist(), f"coord.{name}")
    return found


def _ints(found, *ends: str, within: tuple[str, ...] = ()) -> set[int]:
    out = set()
    for path, value in found:
        last = path.rsplit(".", 1)[-1].lower()
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not float(value).is_integer():
            continue
        if last in ends or any(w in path.lower() for w in within):
            out.add(int(value))
    return out


def _spelled(value) -> list[str]:
    """The ways a caption may write a record's value (``0.07``, ``1,3,5``, ``480``)."""
    if isinstance(value, (list, tuple)):
        return [",".join(_spelled(v)[0] for v in value), ", ".join(_spelled(v)[0] for v in value)]
    if isinstance(value, float):
        return [f"{value:g}", repr(value), str(value)]
    return [str(value)]


def _as_declared(protocol, key: str, value) -> list[str]:
    """The value as its setting's declaration spells it (Hummingbird's memory ``1000,full``), when it declares one."""
    import dataclasses

    from probe_toolkit.infra.settings import declared
    from probe_toolkit.protocols import registry

    try:
        fields = {f.name: declared(f) for f in dataclasses.fields(registry.get(str(protocol)).settings)}
    except Exception:  # noqa: BLE001 - a record of no registered protocol: no declared spelling
        return []
    said = fields.get(key)
    if said is None or said.spell is None:
        return []
    return [said.spell(tuple(value) if isinstance(value, list) else value)]


def _views(found) -> set[str]:
    from probe_toolkit.store import views

    out = set()
    for path, value in found:
        if "manifest" in path:
            continue
        if isinstance(value, (str, int)) and not isinstance(value, bool) and ("view" in path.lower() or path.rsplit(".", 1)[-1] == "size"):
            try:
                out.add(views.canonical(str(value)))
            except Exception:  # noqa: BLE001  a view's description, not its name
                continue
    return out


def _view_claims(text: str) -> list[str]:
    from probe_toolkit.store import views

    claimed = re.findall(r"(?:\bthe |\bat |\bin |\bits )?([\w@.]+)(?:'s)? view\b", text) + re.findall(r"\bview ([\w@.]+)", text)
    out = []
    for token in claimed:
        token = token.rstrip(".")
        try:
            out.append(views.canonical(token))
        except Exception:  # noqa: BLE001  a word before "view" that names none ("its own", "this")
            continue
    return out


def _differing_items(text: str, labels: list[str]) -> list[tuple[str, str, dict[str, str]]]:
    """(store label, protocol, {setting: value as written}) of each item of a "Settings other than the defaults" sentence."""
    found = DIFFERING.search(text)
    if not found:
        return []
    items = []
    for item in found.group(1).split("; "):
        label = next((lab for lab in sorted(labels, key=len, reverse=True) if item.startswith(f"{lab}: ")), None)
        if label is None:
            items.append(("?", item, {}))
            continue
        protocol, _, spelled = item[len(label) + 2 :].partition(" ")
        settings = dict(re.findall(r"(\w+)=(.*?)(?=, \w+=|$)", spelled))
        items.append((label, protocol, settings))
    return items


def caption_claims(report) -> list[str]:
    """Every claim of a table's or figure's caption that the records its section read (``Section.sources``) do not
    bear out, one line each: image counts (``demo-val (4 images``: the panel's count in the record), ``k = N``, the
    view, ``block B``, ``panel NAME``, each setting a caption names (``crop 32``, ``iterations 4``) and every item of
    "Settings other than the defaults" (the setting's value in that store's record of that protocol, and unlike its
    default). A caption that opens with a store's label is read against that store's records only."""
    from probe_toolkit.report.content import Figure, Table

    problems = []
    for section in report.sections:
        if not section.sources:
            continue
        by_label: dict[str, list] = {}
        for label, _, ds in section.sources:
            by_label.setdefault(label, []).append(ds)
        everything = [ds for _, _, ds in section.sources]
        for block in section.blocks:
            if not isinstance(block, (Table, Figure)):
                continue
            caption = CAVEAT.sub("", block.caption)
            head = caption.split(" Settings other than the defaults:")[0]
            label = next((lab for lab in sorted(by_label, key=len, reverse=True) if head.startswith(f"{lab}: ")), None)
            scope = by_label[label] if label else everything
            found = [f for ds in scope for f in facts(ds)]
            where = f"{section.key}: {block.caption[:90]}…"

            def bad(what: str) -> None:
                problems.append(f"{where} claims {what}")  # noqa: B023  called at once

            counts = _ints(found, within=IMAGE_KEYS)
            for name, n in re.findall(r"([\w.@/-]+) \((\d[\d,]*) images", head):
                n = int(n.replace(",", ""))
                paired = _panel_counts(scope).get(name)
                if paired is not None and n not in paired:
                    bad(f"{name} has {n} images; its records say {sorted(paired)}")
            for n in re.findall(r"(\d[\d,]*) images", head):
                if int(n.replace(",", "")) not in counts:
                    bad(f"{n} images; the records count {sorted(counts)}")
            for k in re.findall(r"\bk = (\d+)", head):
                if int(k) not in _ints(found, "k", "ks"):
                    bad(f"k = {k}; the records' k: {sorted(_ints(found, 'k', 'ks'))}")
            for b in re.findall(r"\bblock (\d+)\b", head):
                if int(b) not in _ints(found, "block"):
                    bad(f"block {b}; the records' blocks: {sorted(_ints(found, 'block'))}")
            held_views = _views(found)
            for view in _view_claims(head):
                if held_views and view not in held_views:
                    bad(f"the {view} view; the records' views: {sorted(held_views)}")
            names = {str(v) for p, v in found if "panel" in p.lower() and isinstance(v, str)}
            for name in re.findall(r"\b[Pp]anel ([\w.-]*\w)", head):
                if names and name not in names:
                    bad(f"panel {name}; the records' panels: {sorted(names)}")
            settings = {}
            for ds in scope:
                settings.update({k: v for k, v in ((ds.attrs.get("record") or {}).get("settings") or {}).items() if v is not None})
                settings.update({k: v for k, v in (ds.attrs.get("settings") or {}).items() if v is not None and k not in settings})
            for key, value in settings.items():
                for said in re.findall(rf"\b{re.escape(key)}(?: |=| = )(-?\d[\d.,e-]*\d|\d)\b", head):
                    items = value if isinstance(value, (list, tuple)) else [value]  # a caption may name one of a list's values (memory 1,000 of 1000,full)
                    if said not in _spelled(value) and not any(said in _spelled(v) or _same_number(said, v) for v in items):
                        bad(f"{key} {said}; the records: {value!r}")
            for store, protocol, named in _differing_items(caption, list(by_label)):
                records = [ds for ds in by_label.get(store, []) if (ds.attrs.get("record") or {}).get("protocol") == protocol]
                if not records:
                    bad(f"settings of {store}'s {protocol} record, which the section did not read")
                    continue
                if not any(_differs_as_said(ds, named) for ds in records):
                    bad(f"{store}: {protocol} {named}; its records' settings: {[(ds.attrs.get('record') or {}).get('settings') for ds in records]}")
    return problems


def _same_number(said: str, value) -> bool:
    try:
        return float(said.replace(",", "")) == float(value)
    except (TypeError, ValueError):
        return False


def _differs_as_said(ds, named: dict[str, str]) -> bool:
    """Every named setting has that value in the record and another one by default."""
    record = ds.attrs.get("record") or {}
    settings, defaults = record.get("settings") or {}, record.get("defaults") or {}
    for key, said in named.items():
        if key == "block":
            if str((record.get("selection") or {}).get("block")) != said:
                return False
            continue
        if key not in settings or (
            said not in _spelled(settings[key]) + _as_declared(record.get("protocol"), key, settings[key]) and not _same_number(said, settings[key])
        ):
            return False
        if key in defaults and defaults[key] == settings[key]:
            return False
    return True


def _panel_counts(scope) -> dict[str, set[int]]:
    """Panel name → the image counts its records give it (``panels[role].name`` with ``counts[role]``, or ``panel`` with
    ``counts`` of its images, those held and those scored)."""
    out: dict[str, set[int]] = {}
    for ds in scope:
        panels, counts = ds.attrs.get("panels") or {}, ds.attrs.get("counts") or {}
        for role, panel in panels.items() if isinstance(panels, dict) else ():
            if isinstance(panel, dict) and isinstance(counts.get(role), int):
                out.setdefault(str(panel.get("name")), set()).add(counts[role])
        panel = ds.attrs.get("panel")
        name = panel.get("name") if isinstance(panel, dict) else panel
        held = {int(counts[k]) for k in ("images", "in_panel", "scored", "held") if isinstance(counts.get(k), int)}
        if name and held:  # the panel's images, those the store held of them, those scored
            out.setdefault(str(name), set()).update(held)
    return out
