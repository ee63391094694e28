"""Panels: labelled image sets, and the one function that opens their annotation files.

A panel is a COCO annotation file, an image folder and a role (``train``, ``val``, ``test``),
registered by name in ``panels.toml`` in the cache root::

    [val1k]
    annotations = "/data/coco/val1k.json"
    images = "/data/coco/val2017"
    role = "val"
    added = "2026-05-09T08:00:00+00:00"

Registering a panel checks its annotation file field by field (``schema``), inside the readers'
guard, handing out nothing (so it writes no ledger entry). ``read_labels`` is the only code in the
toolkit that hands labels out (``coco_classes.read``, each image's class for k-NN, reads through
its ``annotation_bytes`` and ends with its ``log_coco_read``): it reads the bytes once, hashes them,
builds the pycocotools ``COCO`` object in memory, appends a ledger entry (``ledger.py``) and only then returns. A ``test`` panel is sealed:
``read_labels`` refuses it unless given an ``unseal`` reason, which the ledger records.

Image ids. A store's image ids are paths relative to the folder it was extracted from
(``probe extract --panel NAME`` extracts from the panel's image folder). A panel image matches a
store id when its COCO ``file_name`` equals the id, or, failing that, when one is the other with
leading folders added (``val2017/x.jpg`` ↔ ``x.jpg``) and exactly one candidate exists
(``matching.py``).

Beside this module: ``guard.py`` (``forbid_label_reads``, which proves that nothing else opens an
annotation file) and ``davis_folders.py`` (DAVIS sequences and their annotation readers, which
write their ledger entries through ``log_read`` here).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..infra import provenance
from ..infra.errors import ProbeError
from ..store.cache import cache_root
from . import hygiene, ledger, schema
from .guard import inside
from .matching import clean_name, match_images

REGISTRY = "panels.toml"
ROLES = ("train", "val", "test")
KINDS = ("coco", "voc", "coco20k", "saliency", "classes", "voc-segmentation", "ade20k", "spair", "nyu", "navi")  # kinds other than coco: labels/kinds.py
NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class Panel:
    name: str
    annotations: Path  # a COCO file; for a class-folder panel, the folder itself
    images: Path
    role: str
    added: str = ""
    kind: str = "coco"  # see KINDS (classes: one sub-folder per class, the ImageNet layout); ``annotations`` is a VOC devkit folder or a mask folder for voc / saliency
    split: str = ""  # voc: ImageSets/Main/<split>.txt
    no_hard: bool = False  # voc: drop difficult/truncated boxes and images left without one (LOST --no_hard)

    @property
    def sealed(self) -> bool:
        return self.role == "test"


# ----------------------------------------------------------------------------------------------
# the registry (never opens an annotation file)


def _toml_string(value: str) -> str:
    # a JSON string with non-ASCII kept literal is a valid TOML basic string, DEL aside
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _registry_path(cache: str | Path | None) -> Path:
    return cache_root(cache) / REGISTRY


def load_registry(cache: str | Path | None = None) -> dict[str, Panel]:
    path = _registry_path(cache)
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ProbeError(path, f"is not valid TOML ({error})", "fix or delete it, then `probe panel add` again") from None
    panels = {}
    for name, table in data.items():
        fields = [table.get(k) if isinstance(table, dict) else None for k in ("annotations", "images", "role")]
        extra = [table.get(k, d) for k, d in (("added", ""), ("kind", "coco"), ("split", ""))] if isinstance(table, dict) else []
        if not all(isinstance(v, str) and v for v in fields) or not all(isinstance(v, str) for v in extra):
            raise ProbeError(path, f"panel {name!r} lacks annotations, images or role (or holds a value that is not text)", "re-add it with `probe panel add --replace`")
        if fields[2] not in ROLES or extra[1] not in KINDS:
            raise ProbeError(
                path,
                f"panel {name!r} has role {fields[2]!r} and kind {extra[1]!r}; roles are {', '.join(ROLES)}, kinds {', '.join(KINDS)}",
                "re-add it with `probe panel add --replace`",
            )
        panels[name] = Panel(name, Path(fields[0]), Path(fields[1]), fields[2], extra[0], extra[1], extra[2], bool(table.get("no_hard", False)))
    return panels


def _write_registry(path: Path, panels: dict[str, Panel]) -> None:
    lines = ["# probe panels, written by `probe panel add`: one table per panel", ""]
    for panel in sorted(panels.values(), key=lambda p: p.name):
        lines += [
            f"[{panel.name}]",
            f"annotations = {_toml_string(str(panel.annotations))}",
            f"images = {_toml_string(str(panel.images))}",
            f"role = {_toml_string(panel.role)}",
            f"added = {_toml_string(panel.added)}",
        ]
        if panel.kind != "coco":
            lines += [f"kind = {_toml_string(panel.kind)}", f"split = {_toml_string(panel.split)}", f"no_hard = {str(panel.no_hard).lower()}"]
        lines.append("")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    os.replace(tmp, path)


def add_panel(
    name: str,
    annotations: str | Path,
    images: str | Path,
    role: str,
    *,
    cache: str | Path | None = None,
    replace: bool = False,
    kind: str = "coco",
    split: str = "",
    no_hard: bool = False,
) -> Panel:
    """Register a panel (paths made absolute). Checks its files, and its labels field by field (``schema.checked``), handing none out.

    ``kind="classes"``: ``images`` holds one sub-folder per class and ``annotations`` is that
    same folder; at least two classes must hold images.
    """
    if kind not in ("coco", "classes"):
        from .kinds import check_layout

        annotations, images = check_layout(kind, Path(annotations), Path(images) if images else None, split)
    if not NAME.match(name):
        raise ProbeError(None, f"panel name {name!r} may only hold letters, digits, - and _", "e.g. probe panel add val1k ...")
    if role not in ROLES:
        raise ProbeError(None, f"--role {role!r} is not one of {', '.join(ROLES)}", "use --role val")
    annotations, images = Path(annotations).resolve(), Path(images).resolve()
    if kind == "classes":
        _folder_classes(images, _class_folder_ids(images))
    elif kind == "coco" and not annotations.is_file():
        raise ProbeError(annotations, "is not a file", "pass --annotations with a COCO annotation file")
    elif kind == "coco" and (annotations.suffix.lower() != ".json" or annotations.stat().st_size == 0):  # its name and size: the file is not opened
        raise ProbeError(
            annotations,
            "is not a COCO annotation file (" + ("it is empty" if annotations.suffix.lower() == ".json" else "not a .json file") + ")",
            "pass --annotations with a COCO instances_*.json file",
        )
    if not images.is_dir():
        raise ProbeError(images, "is not a folder", "pass --images with the panel's image folder")
    from ..store.images import require_images

    require_images(images)  # a folder holding no images is refused here, before it is registered
    schema.checked(Panel(name, annotations, images, role, "", kind, split, no_hard))  # field by field, before it is registered
    path = _registry_path(cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".panels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        panels = load_registry(cache)
        if name in panels and not replace:
            raise ProbeError(path, f"already has a panel {name!r}", "choose another name, or pass --replace")
        panel = Panel(name, annotations, images, role, provenance.now(), kind, split, no_hard)
        panels[name] = panel
        _write_registry(path, panels)
        hygiene.forget(path.parent, name)  # its images are remembered again at its next read
    return panel


def get_panel(name: str, cache: str | Path | None = None) -> Panel:
    panels = load_registry(cache)
    if name not in panels:
        known = ", ".join(sorted(panels)) or "none"
        raise ProbeError(
            _registry_path(cache), f"has no panel {name!r} (registered: {known})", "add it with `probe panel add NAME --annotations A.json --images DIR --role val`"
        )
    return panels[name]


def train_and_val(train: str, val: str, cache: str | Path | None = None, *, use: str = "be fitted on") -> tuple[Panel, Panel]:
    """The two panels of a fit-then-score protocol (linear probe, k-NN), refused when the score
    could see the fit's own labels: one panel for both, a sealed test panel to fit on (``use``
    names what the train panel does), or a val panel registered with role train."""
    train_panel, val_panel = get_panel(train, cache), get_panel(val, cache)
    if train_panel.name == val_panel.name:
        raise ProbeError(None, f"--train and --val are both {train!r}", "score on a separate val panel")
    if train_panel.role == "test":
        raise ProbeError(train_panel.name, f"is a sealed test panel and cannot {use}", "use a train (or val) panel for --train")
    if val_panel.role == "train":
        raise ProbeError(val_panel.name, "has role train; scores are read on a val or test panel", "register the val images with --role val")
    return train_panel, val_panel


def list_panels(cache: str | Path | None = None) -> list[Panel]:
    return sorted(load_registry(cache).values(), key=lambda p: p.name)


def panel_images(name: str, cache: str | Path | None = None, checkpoint: str = "CKPT") -> Path:
    """The image folder of a panel (for ``probe extract --panel``); labels are not touched. An NYU
    panel's folder holds its depth maps beside the photographs, which extraction would read as
    images: refused."""
    panel = get_panel(name, cache)
    if panel.kind == "nyu":
        raise ProbeError(
            panel.name,
            "is an NYU panel, whose folder holds the depth maps (labels) beside the photographs: extracting it would store labels as images",
            f"probe depth keeps its record in any store of the checkpoint: `probe extract {shlex.quote(checkpoint)} --images PHOTOS` of another folder, "
            "or pass probe depth --store",
        )
    return panel.images


# ----------------------------------------------------------------------------------------------
# the one function that opens annotation files


@dataclass
class LabelRead:
    """What ``read_labels`` hands out: the labels, and the ledger entry that recorded the read."""

    coco: Any  # pycocotools.coco.COCO, restricted to the images read
    entry_id: str
    entry: dict[str, Any]
    panel: Panel
    image_map: dict[str, int] = field(default_factory=dict)  # store id → COCO image id (when images were given)

    @property
    def image_ids(self) -> list[int]:
        return sorted(self.coco.getImgIds())


def log_read(
    root: Path,
    *,
    panel: str,
    role: str,
    annotations: str,
    annotation_sha256: str,
    names: Sequence[str],
    purpose: str,
    command: str | None,
    checkpoint: str | None,
    unseal: str | None,
    **more: Any,
) -> ledger.Entry:
    """The ledger entry of one read of labels, appended before any label leaves: the panel and its
    role, the annotation bytes' hash, the images handed out (their count and the hash of their
    sorted names), ``more`` (what this kind of read adds), why, by which command, for which
    checkpoint, and the unseal reason. The one place a read's entry is assembled."""
    fields = {
        "time": provenance.now(),
        "panel": panel,
        "role": role,
        "annotations": annotations,
        "annotation_sha256": annotation_sha256,
        "images": len(names),
        "images_sha256": provenance.list_hash(sorted(names)),
        **more,
        "purpose": purpose,
        "command": command if command is not None else shlex.join(sys.argv),
        "checkpoint": checkpoint,
        "unseal": unseal.strip() if unseal else None,
        "toolkit_version": provenance.__version__,  # the probe that read them
    }
    return ledger.append(root, fields)


def log_checked_read(
    root: Path,
    panel: Panel,
    folder: Path,
    names: Sequence[str],
    *,
    annotations: str,
    annotation_sha256: str,
    purpose: str,
    command: str | None,
    checkpoint: str | None,
    unseal: str | None,
    **more: Any,
) -> ledger.Entry:
    """``log_read`` after the leak check: the images handed out (``names`` under ``folder``) are hashed
    and refused if another panel of the other role holds them, and their content hash joins the entry."""
    hashes, fresh = hygiene.content_hashes(root, folder, list(names))
    hygiene.check_overlap(root, panel.name, panel.role, annotation_sha256, hashes, fresh)
    return log_read(
        root,
        panel=panel.name,
        role=panel.role,
        annotations=annotations,
        annotation_sha256=annotation_sha256,
        names=names,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
        images_content_sha256=hashes.list_hash(),
        **more,
    )


def log_coco_read(root: Path, panel: Panel, annotation_sha256: str, file_names: list[str], clipped: int, before_entry=None, **read: Any) -> ledger.Entry:
    """The end of a COCO read (``read_labels``, ``coco_classes.read``): the images handed out
    (``file_names``, as the file writes them) hashed and refused if a panel of the other role holds
    them, ``before_entry`` (a last refusal), the ledger entry (``read``: purpose, command,
    checkpoint, unseal), and a note of the objects clipped."""
    hashes, fresh = hygiene.content_hashes(root, panel.images, file_names)
    hygiene.check_overlap(root, panel.name, panel.role, annotation_sha256, hashes, fresh)
    if before_entry is not None:
        before_entry()
    names = sorted(clean_name(name) for name in file_names)
    content = hashes.list_hash()
    where = {"panel": panel.name, "role": panel.role, "annotations": str(panel.annotations)}
    entry = log_read(root, **where, annotation_sha256=annotation_sha256, names=names, **read, images_content_sha256=content, clipped=clipped)
    if clipped:
        print(f"note: {panel.annotations}: {clipped} annotations reached outside their image and were clipped to it (ledger entry {entry.id[:12]})", file=sys.stderr)
    return entry


def _coco(dataset: dict[str, Any]):
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def check_readable(panel: str | Panel, unseal: str | None = None, cache: str | Path | None = None) -> Panel:
    """The panel, if it is registered and may be read (a sealed one needs an unseal reason);
    commands call it before their work so that a refused read costs nothing."""
    if isinstance(panel, str):
        panel = get_panel(panel, cache)
    if panel.sealed and not (unseal and unseal.strip()):
        raise ProbeError(panel.name, "is a sealed test panel", 'pass --unseal "reason" to open it (the reason is recorded in the ledger)')
    return panel


def open_for_reading(panel: str | Panel, kind: str, *, purpose: str, unseal: str | None, cache: str | Path | None, register: str) -> Panel:
    """The panel of ``kind`` a label reader may open (registered, unsealed when sealed, of that kind,
    read for a stated purpose), checked before the reader touches a file; ``register`` is the fix
    for a panel of another kind."""
    panel = check_readable(panel, unseal, cache)
    if panel.kind != kind:
        raise ProbeError(panel.name, f"is a {panel.kind} panel, not {'an' if kind[0] in 'aeiou' else 'a'} {kind} one", register)
    if not purpose:
        raise ProbeError(None, "a read of labels needs a purpose", "pass purpose='score' (or train, sweep, probe: why the labels are read)")
    return panel


def annotation_bytes(panel: Panel) -> tuple[bytes, Any]:
    """(the bytes the annotation hash is taken of, the dataset of a kind that is not one COCO file,
    else None), read inside the readers' guard; one line when a file cannot be read. Called by
    ``read_labels`` and ``coco_classes.read`` only, which hand labels out after the ledger entry."""
    inside.active = True
    try:
        if panel.kind not in ("coco", "coco20k"):
            from .kinds import load_dataset

            return load_dataset(panel, lambda path: Path(path).read_bytes())
        return panel.annotations.read_bytes(), None
    except OSError as error:
        raise ProbeError(
            getattr(error, "filename", None) or panel.annotations, f"cannot be read ({error.strerror})", "fix the path with `probe panel add --replace`"
        ) from None
    finally:
        inside.active = False


def read_labels(
    panel: str | Panel,
    *,
    purpose: str,
    checkpoint: str | None = None,
    images: Sequence[str] | None = None,
    unseal: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
    cover: str = "some",
    given: str = "the images given",
) -> LabelRead:
    """Open a panel's annotations, write the ledger entry, then return the labels.

    ``images`` (store ids) restricts what is handed out to the panel images they match; the
    ledger records how many images' labels left this function and the hash of their names.
    ``cover``: ``some`` refuses ``images`` (``given``: what they are, for the message) that match
    none of the panel's, ``all`` also any panel image they miss (``covered``).
    A sealed (``test``) panel needs ``unseal``, a reason; it is recorded.
    """
    root = cache_root(cache)
    panel = check_readable(panel, unseal, cache)
    if not purpose:
        raise ProbeError(None, "a read of labels needs a purpose", "pass purpose='score' (or train, sweep, probe: why the labels are read)")
    if panel.kind == "classes":
        raise ProbeError(panel.name, "is a classes panel, not an annotated one", "use it where image classes are read (probe knn)")
    raw, dataset = annotation_bytes(panel)
    if panel.kind in ("coco", "coco20k"):
        dataset = schema.coco_json(raw, panel.annotations)
    schema.check(dataset, panel.annotations, schema.header_size(panel.images))  # every field, every kind that becomes COCO: before any label leaves
    if panel.kind == "coco20k":
        from .kinds import coco20k_subset

        dataset = coco20k_subset(dataset, panel.annotations)
    file_names = {int(im["id"]): str(im.get("file_name", "")) for im in dataset["images"]}
    if not file_names:  # (COCO20k's subset of a file that is not COCO-2014 train)
        raise ProbeError(panel.annotations, "lists no images", "a panel needs at least one annotated image")
    schema.files_present(dataset, panel)
    image_map: dict[str, int] = {}
    if images is not None:
        image_map = match_images(images, file_names)
        keep = set(image_map.values())
        dataset = dict(dataset)
        dataset["images"] = [im for im in dataset["images"] if int(im["id"]) in keep]
        dataset["annotations"] = [a for a in dataset["annotations"] if int(a["image_id"]) in keep]
    dataset.setdefault("categories", [])
    sizes = hygiene.check_sizes(panel.annotations, panel.images, dataset["images"])
    dataset = dict(dataset)
    dataset["annotations"], clipped = hygiene.clip_geometry(dataset["annotations"], sizes)
    covered = (lambda: schema.covered(panel, len(set(image_map.values())), len(file_names), len(images), cover, given)) if images is not None else None
    entry = log_coco_read(
        root,
        panel,
        hashlib.sha256(raw).hexdigest(),
        [str(im.get("file_name", "")) for im in dataset["images"]],
        clipped,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
        before_entry=covered,  # a leak first: the cover is then the user's choice; before the ledger entry: no label leaves
    )
    return LabelRead(coco=_coco(dataset), entry_id=entry.id, entry=entry.fields, panel=panel, image_map=image_map)


# ----------------------------------------------------------------------------------------------
# image classes: a class-folder panel's sub-folders, or a COCO panel's largest category


def _class_folder_ids(folder: Path) -> list[str]:
    """The ids (CLASS/FILE) of a class-folder panel's images, sorted: names only, listed once."""
    if not folder.is_dir():
        raise ProbeError(folder, "is not a folder", "pass --classes-from-folders with a folder holding one sub-folder per class")
    from ..store.images import image_ids

    return image_ids(folder)


def _folder_classes(folder: Path, ids: list[str]) -> list[str]:
    """The sub-folders of ``folder`` that hold images (``ids``, its listing; sorted, as torchvision's ImageFolder); at least two."""
    loose = [i for i in ids if "/" not in i]
    if loose:
        raise ProbeError(
            folder, f"holds {len(loose)} images outside any class folder (e.g. {loose[0]!r})", "put every image in the sub-folder of its class (DIR/CLASS/IMAGE.jpg)"
        )
    classes = sorted({i.split("/", 1)[0] for i in ids})
    if len(classes) < 2:
        raise ProbeError(
            folder,
            f"has {len(classes)} class folder{'' if len(classes) == 1 else 's'} ({', '.join(classes) or 'none'})",
            "a classification panel needs at least two classes, one sub-folder each",
        )
    return classes


@dataclass
class ClassLabels:
    """One class per image, handed out by ``read_classes`` after its ledger entry."""

    image_ids: list[str]  # paths relative to the panel's folder (class-folder panels: CLASS/FILE)
    labels: np.ndarray  # (image,) int64 index into ``classes``
    classes: list[str]
    entry_id: str
    panel: Panel
    rule: str  # how an image's class was decided
    dropped: int = 0  # panel images without a class (COCO images with no annotation)


def read_classes(
    panel: str | Panel,
    *,
    purpose: str,
    checkpoint: str | None = None,
    unseal: str | None = None,
    cache: str | Path | None = None,
    command: str | None = None,
) -> ClassLabels:
    """Each image's class, after the ledger entry: the class folder it sits in, or, for a COCO
    panel, the category covering the largest annotated area (non-crowd ``area`` summed per
    category; equal areas go to the lower category id)."""
    if isinstance(panel, str):
        panel = get_panel(panel, cache)
    if panel.kind == "coco":  # entry by entry: k-NN needs each image's class, not an index of every object
        from .coco_classes import read

        return read(panel, purpose=purpose, checkpoint=checkpoint, unseal=unseal, cache=cache, command=command)
    if panel.sealed and not (unseal and unseal.strip()):
        raise ProbeError(panel.name, "is a sealed test panel", 'pass --unseal "reason" to open it (the reason is recorded in the ledger)')
    ids = _class_folder_ids(panel.images)
    classes = _folder_classes(panel.images, ids)
    listing = hashlib.sha256("\n".join(ids).encode()).hexdigest()
    root = cache_root(cache)
    hygiene.check_overlap(root, panel.name, panel.role, listing, *hygiene.content_hashes(root, panel.images, ids))
    entry = log_read(
        root,
        panel=panel.name,
        role=panel.role,
        annotations=str(panel.annotations),
        annotation_sha256=listing,
        names=ids,
        purpose=purpose,
        command=command,
        checkpoint=checkpoint,
        unseal=unseal,
    )
    number = {name: n for n, name in enumerate(classes)}
    labels = np.fromiter((number[i.split("/", 1)[0]] for i in ids), np.int64, len(ids))
    return ClassLabels(ids, labels, classes, entry.id, panel, "class folder")
