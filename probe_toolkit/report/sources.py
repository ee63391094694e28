"""What a report reads: the stores, their saved results, the followed image, the ledger, training logs.

The report never recomputes an analysis: numbers come from ``<store>/results/<name>``. What it
does read from a store's arrays is one image's attention rows and tokens, to draw them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from ..infra.errors import ProbeError
from ..infra.spelling import fix_command
from ..labels import ledger
from ..results import records
from ..results.summaries import store_label
from ..store import cache, images
from .figures_maps import tokens_picture

VIEW = 224


class ReadResults(dict):
    """A store's loaded results that remember which were read (``read``): a section's captions
    then carry the settings of exactly the records it showed (``report/differing.py``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: dict[str, None] = {}

    def __getitem__(self, name: str) -> xr.Dataset:
        found = super().__getitem__(name)
        self.read[name] = None
        return found

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def items(self):  # type: ignore[override]
        self.read.update(dict.fromkeys(self.keys()))
        return super().items()

    def values(self):  # type: ignore[override]
        self.read.update(dict.fromkeys(self.keys()))
        return super().values()


@dataclass
class StoreView:
    """One store as the report sees it: its finished images, manifest and saved results."""

    path: Path
    label: str
    ds: xr.Dataset
    manifest: dict[str, Any]
    results: ReadResults = field(default_factory=ReadResults)

    def __post_init__(self) -> None:
        if not isinstance(self.results, ReadResults):
            self.results = ReadResults(self.results)

    @property
    def class_token(self) -> bool:
        return bool(self.manifest.get("arch", {}).get("class_token", False))

    @property
    def registers(self) -> int:
        return int(self.manifest.get("arch", {}).get("registers", 0))

    @property
    def prefix(self) -> int:
        """Tokens before the patches in the stored attention: the class token, then the registers."""
        return int(self.class_token) + self.registers

    @property
    def image_ids(self) -> list[str]:
        return [str(v) for v in self.ds["image"].values]

    def has(self, array: str, image_id: str | None = None) -> bool:
        return array in self.ds and (image_id is None or image_id in self.image_ids)

    def image_values(self, array: str, image_id: str) -> np.ndarray:
        """One image's slice of a stored array, as float32 (stores hold float16 by default)."""
        return np.asarray(self.array(array).sel(image=image_id).values, dtype=np.float32)

    def array(self, name: str) -> xr.DataArray:
        """A stored array, its chunks checked first (``cache.checked``): a deleted chunk is one line, not a NaN picture."""
        return cache.checked(self.ds, name)

    def result(self, name: str) -> xr.Dataset | None:
        return self.results.get(name)


def default_label(path: Path, manifest: dict[str, Any]) -> str:
    """A store's title when the user names none: the manifest's ``name`` (set at extraction), else
    the checkpoint's file stem and the network, with the panel a per-panel store was cut to
    (``dino_deitsmall16_pretrain (teacher)``, ``… (teacher, panel coco-val)``): no folder hashes."""
    named = manifest.get("name")
    if isinstance(named, str) and named.strip():
        return named.strip()
    checkpoint = (manifest.get("checkpoint") or {}).get("path")
    if not checkpoint:
        return store_label(str(path))
    panel = path.name.removesuffix(".zarr").partition("-panel-")[2]
    extra = f", panel {panel}" if panel else ""
    return f"{Path(str(checkpoint)).stem} ({manifest.get('network', '?')}{extra})"


def parse_labels(items: Sequence[str] | None, stores: Sequence[Path]) -> dict[Path, str]:
    """``--label NAME=STORE`` (repeatable) → {store: NAME}; each STORE one of the stores given."""
    given = {Path(s).resolve(): Path(s) for s in stores}
    out: dict[Path, str] = {}
    for item in items or []:
        name, sep, store = str(item).partition("=")
        if not sep or not name.strip() or not store.strip():
            raise ProbeError("--label", f"{item!r} is not NAME=STORE", "write e.g. --label 'DINO ViT-S/16'=cache/dino-1a2b/teacher.zarr")
        found = given.get(Path(store.strip()).resolve())
        if found is None:
            raise ProbeError("--label", f"{store.strip()} is not one of the stores reported on", "name a store also given as an argument")
        if found in out:
            raise ProbeError("--label", f"{store.strip()} is named twice ({out[found]!r}, {name.strip()!r})", "give each store one --label")
        out[found] = name.strip()
    names = list(out.values())
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ProbeError("--label", f"{', '.join(twice)} names two stores", "give each store its own name")
    return out


def open_stores(paths: list[Path], run: str | None = None, labels: dict[Path, str] | None = None) -> list[StoreView]:
    """Each store once, in the order given, with the latest record of every result loaded (the
    record of run ``run`` where a result has one); titled by ``labels`` (``--label``), else by
    ``default_label``; titles made unique."""
    views: list[StoreView] = []
    labels = labels or {}
    matched = False
    for path in dict.fromkeys(Path(p) for p in paths):
        ds = cache.open_store(path)
        results = {}
        for name in records.results(path):
            if records.is_part(name):
                continue
            chosen = records.find(path, name, run) if run is not None else None
            matched |= chosen is not None
            found = records.load(path, name, run=chosen.run_id if chosen is not None else None)
            if found is not None:
                results[name] = found
        manifest = cache.manifest(ds)
        views.append(StoreView(path, labels.get(path) or default_label(path, manifest), ds, manifest, results))
    if run is not None and not matched:  # every section would show other runs' records under the one asked for
        several = sorted({r.run_id for v in views for name in records.results(v.path) for r in records.runs(v.path, name) if r.run_id.startswith(run)})
        if len(several) > 1:  # a prefix of two runs' ids names neither
            raise ProbeError(
                "--run",
                f"{run!r} begins {len(several)} run ids ({', '.join(several[:3])}{', …' if len(several) > 3 else ''})",
                f"give enough of the run id to name one run (`{fix_command('results', views[0].path)}` lists them)",
            )
        raise ProbeError(
            "--run",
            f"{run!r} is the run id of no record in {', '.join(str(v.path) for v in views)}",
            f"pick one of the run ids `{fix_command('results', views[0].path)}` lists",
        )
    seen: dict[str, int] = {}
    for view in views:
        count = seen.get(view.label, 0)
        seen[view.label] = count + 1
        if count:
            view.label = f"{view.label} ({count + 1})"
    return views


def choose_follow(stores: list[StoreView], follow: str | None) -> str | None:
    """``--follow`` when a store holds it; else the first image (of the first store) held by all."""
    if follow is not None:
        if not any(follow in s.image_ids for s in stores):
            sample = ", ".join(stores[0].image_ids[:3]) if stores else ""
            raise ProbeError("--follow", f"{follow!r} is not a finished image of any store", f"pass an image id such as {sample}")
        return follow
    if not stores or not stores[0].image_ids:
        return None
    common = [i for i in stores[0].image_ids if all(i in s.image_ids for s in stores[1:])]
    return (common or stores[0].image_ids)[0]


@dataclass
class Picture:
    """The followed image's 224 view, and a note when it had to be drawn from tokens."""

    rgb: np.ndarray | None
    source: str
    note: str = ""


def image_file(store: StoreView, image_id: str) -> Path | None:
    """The photograph of a store's image, as it was extracted (a file changed since is one line:
    a picture drawn under the store's masks or maps must be the one they were computed on)."""
    from ..store.sources import check_current, image_folder_or_none

    source = image_folder_or_none(store.path, store.manifest)  # absolute; an older relative one resolved against the store
    if source is None:
        return None
    path = source / image_id
    if not path.is_file():
        return None
    check_current(store.path, [(image_id, path)])
    return path


def original_image(stores: list[StoreView], image_id: str) -> np.ndarray | None:
    """The image at its original size, from the first store whose ``image_source`` still holds it."""
    for store in stores:
        path = image_file(store, image_id)
        if path is not None:
            try:
                return np.asarray(images.load_image(path))
            except ProbeError:
                continue
    return None


def followed_picture(stores: list[StoreView], image_id: str) -> Picture:
    """The 224 view as the extractor made it (same PIL path), or a drawing of the tokens."""
    looked = []
    for store in stores:
        path = image_file(store, image_id)
        if path is None:
            looked.append(shown_path(Path(store.manifest.get("image_source") or "?") / image_id))
            continue
        try:
            return Picture(np.asarray(images.view(images.load_image(path), VIEW)), str(path))
        except ProbeError as error:
            looked.append(f"{path} ({error.line()})")
    for store in stores:
        if store.has("tokens_224", image_id):
            tokens = store.image_values("tokens_224", image_id)
            grid = int(round(np.sqrt(tokens.shape[0])))
            note = (
                f"The image file was not found (looked for {'; '.join(dict.fromkeys(looked))}); the picture is drawn from the tokens "
                f"of {store.label}: their first three principal components as RGB, one colour per patch."
            )
            return Picture(tokens_picture(tokens, grid), f"tokens of {store.label}", note)
    return Picture(None, "", f"No picture of {image_id}: its file was not found and no store holds its 224 tokens.")


# ----------------------------------------------------------------------------------------------
# the ledger: every label read that a result names


@dataclass
class LedgerBook:
    """Ledger entries by id, from every ledger found, and whether each chain holds."""

    entries: dict[str, tuple[Path, ledger.Entry]] = field(default_factory=dict)
    chains: dict[Path, list[str]] = field(default_factory=dict)  # ledger file → problems (empty: intact)

    def describe(self, entry_id: str | None) -> str:
        """``entry 3 (a1b2c3d4e5f6): 2025-… score of panel val (val), 4 images``, or what is known."""
        if not entry_id:
            return "–"
        found = self.entries.get(entry_id)
        if found is None:
            return f"{entry_id[:12]} (not in any ledger found)"
        _, entry = found
        f = entry.fields
        unseal = f", unsealed: {f['unseal']}" if f.get("unseal") else ""
        panel = str(f.get("panel", "?"))
        kind, sep, folder = panel.partition(":")
        panel = f"{kind}:{shown_path(folder)}" if sep and folder.startswith("/") else panel  # DAVIS's panel is named by its folder
        return (
            f"entry {entry.n} ({entry_id[:12]}): {f.get('time', '?')}, {f.get('purpose', '?')} on panel {panel} ({f.get('role', '?')}), "
            f"{f.get('images', '?')} images{unseal}"
        )


def shown_path(path: str | Path | None) -> str:
    """A path as the report shows it: relative to the working folder when under it, else ``…/`` and its last two
    parts; never the machine's absolute path (a report is read, and sent, elsewhere)."""
    if path is None or str(path) in ("", "?"):
        return "?"
    p = Path(str(path))
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.relative_to(Path.cwd()).as_posix() or "."
    except ValueError:
        return "…/" + "/".join(p.parts[-2:])


def read_ledgers(stores: list[StoreView], cache_dir: str | Path | None) -> LedgerBook:
    """Ledgers of the cache root (``--cache``, ``$PROBE_CACHE``, ``./cache``) and of the stores' roots."""
    roots = [cache.cache_root(cache_dir)] + [s.path.parent.parent for s in stores] + [s.path.parent for s in stores]
    book = LedgerBook()
    for root in dict.fromkeys(Path(r).resolve() for r in roots):
        if not (root / ledger.LEDGER).is_file():
            continue
        book.chains[root / ledger.LEDGER] = [str(p) for p in ledger.verify(root)]
        for entry in ledger.entries(root):
            book.entries.setdefault(entry.id, (root, entry))
    return book


# ----------------------------------------------------------------------------------------------
# training runs: a checkpoint written by training/ sits in a run folder with log.jsonl


@dataclass
class TrainingRun:
    folder: Path
    log: list[dict[str, Any]]
    manifest: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config.json (λ: config["rule"]["weight"])


def training_run(store: StoreView) -> TrainingRun | None:
    """The run folder of the store's checkpoint when it holds ``log.jsonl`` (training/'s layout)."""
    checkpoint = (store.manifest.get("checkpoint") or {}).get("path")
    if not checkpoint:
        return None
    folder = Path(checkpoint).parent
    log_path = folder / "log.jsonl"
    if not log_path.is_file():
        return None
    rows = []
    for line in log_path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash; the run's own resume trims it
    meta_path = folder / "manifest.json"
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except ValueError:
        meta = {}
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    return TrainingRun(folder, rows, meta, config if isinstance(config, dict) else {})
