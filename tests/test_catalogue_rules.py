"""Issue 46 through the real CLI: each class closed by one rule, a case per rule, run as the
catalogue runs its cases (``test_catalogue.test_case``: the exit status, one line naming the
problem and the fix, no traceback, nothing the user owns changed, no ledger line, and the
corrected rerun succeeds).

- pairing (``store/pairing.py``, called once from ``protocols/api.run``): a checkpoint beside a
  store of another checkpoint or network, masks beside a store that is no longer the one they
  were cut from, a panel sibling extracted with other settings;
- stale inputs (``store/sources.changed``: size and mtime, the sha256 where they moved): a
  photograph changed in place after extraction, read by every path that pairs stored features
  with files read now (protocols through ``api.run``, the report's pictures, ``probe extract``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import test_catalogue as catalogue
from conftest import synthetic_scene
from test_catalogue import SCENES, Case, coco, probe, refused, w, write  # noqa: F401  (w: the catalogue's world)

from probe_toolkit.demo.samples import TINY, write_checkpoint

# ----------------------------------------------------------------------------------------------
# the world's additions, each made once per module


def _other_checkpoint(w) -> Path:
    path = w.root / "other.pth"
    if not path.exists():
        write_checkpoint(path, "dino-full", TINY, seed=7)
    return path


def _davis(w) -> Path:
    from probe_toolkit.demo.video import write_davis

    root = w.root / "DAVIS"
    if not root.exists():
        write_davis(root, {"pair": 3}, size=(64, 48), seed=3)
    return root


def propagate(w, checkpoint, *more) -> list:
    return [
        "propagate",
        checkpoint,
        "--davis",
        _davis(w),
        "--out",
        w.root / "out" / f"davis-{next(w.count)}",
        "--n-last-frames",
        "2",
        "--workers",
        "1",
        "--cache",
        w.cache,
        "-q",
        *more,
    ]


def _davis_rgb(w) -> Path:
    """A copy of the DAVIS folder whose first frame's annotation was saved as RGB (converted, its
    colours' grey levels were read as object ids, and the sequence propagated and scored on them)."""
    from PIL import Image

    root = w.root / "DAVIS-rgb"
    if not root.exists():
        shutil.copytree(_davis(w), root)
        for path in sorted((root / "Annotations" / "480p" / "pair").glob("*.png"))[:1]:
            Image.open(path).convert("RGB").save(path)
    return root


def _edited(w) -> tuple[Path, Path]:
    """A copy of the scenes, its store (views 224, 480) and val panel ``ed`` on c.png and d.png."""
    folder, store = w.root / "edited", w.root / "stores" / "edited" / "teacher.zarr"
    if not store.exists():
        shutil.copytree(w.images, folder)
        assert probe("extract", w.ckpt, "--images", folder, "--views", "224,480", "--chunk", "2", "--store", store, *w.q).code == 0
        write(w.root / "ed.json", json.dumps(coco(["c.png", "d.png"])))
        assert probe("panel", "add", "ed", "--annotations", w.root / "ed.json", "--images", folder, "--role", "val", "--cache", w.cache).code == 0
    return folder, store


_kept: dict[str, bytes] = {}


def _edit_in_place(w) -> None:
    """The user re-saves c.png in place: the same size, other pixels (only its bytes tell)."""
    folder, _ = _edited(w)
    _kept.setdefault("c.png", (folder / "c.png").read_bytes())
    synthetic_scene(folder / "c.png", SCENES["c.png"][0], [], seed=99)


def _restore(w) -> None:
    folder, _ = _edited(w)
    (folder / "c.png").write_bytes(_kept["c.png"])


def _replaced_store(w) -> Path:
    """Masks decoded from a store, whose path then holds another checkpoint's store."""
    store, masks = w.root / "stores" / "replaced" / "teacher.zarr", w.root / "replaced-masks.json"
    if not masks.exists():
        assert probe("extract", w.ckpt, "--images", w.images, "--views", "480", "--store", store, *w.q).code == 0
        assert probe("decode", store, "--out", masks, *w.q).code == 0
    shutil.rmtree(store)
    assert probe("extract", _other_checkpoint(w), "--images", w.images, "--views", "480", "--store", store, *w.q).code == 0
    return masks


def _sibling_of_other_settings(w) -> Path:
    """Train and val folders with panels ``sibtr`` and ``sibva``, the train panel's store, and
    beside it the val panel's sibling extracted with timm's position interpolation (other tokens)."""
    store = w.root / "stores" / "sib" / "teacher.zarr"
    if not store.exists():
        for name, role, names in (("sibtr", "train", ["a.png", "b.png"]), ("sibva", "val", ["c.png", "d.png"])):
            folder = w.root / name
            folder.mkdir()
            for n in names:
                shutil.copy(w.images / n, folder / n)
            write(w.root / f"{name}.json", json.dumps(coco(names)))
            assert probe("panel", "add", name, "--annotations", w.root / f"{name}.json", "--images", folder, "--role", role, "--cache", w.cache).code == 0
        assert probe("extract", w.ckpt, "--panel", "sibtr", "--views", "224", "--store", store, *w.q).code == 0
        sibling = store.with_name("teacher-panel-sibva.zarr")
        assert probe("extract", w.ckpt, "--panel", "sibva", "--views", "224", "--interp", "timm", "--store", sibling, *w.q).code == 0
    return store


def _sibling_fixed(w) -> None:
    sibling = w.root / "stores" / "sib" / "teacher-panel-sibva.zarr"
    shutil.rmtree(sibling)
    assert probe("extract", w.ckpt, "--panel", "sibva", "--views", "224", "--store", sibling, *w.q).code == 0


def _coco_with(**change) -> Callable:
    """val.json's COCO data with one field of its first annotation changed."""

    def make(w) -> Path:
        data = coco(["c.png", "d.png"])
        data["annotations"][0].update(change)
        return write(w.root / "bad" / f"schema-{'-'.join(change)}.json", json.dumps(data))

    return make


def _add(name: str, annotations) -> Callable:
    return lambda w: ["panel", "add", name, "--annotations", annotations(w), "--images", w.images, "--role", "val", "--cache", w.cache]


def _good(name: str) -> Callable:
    return _add(name, lambda w: w.root / "val.json")


def _spair(w, outside: bool) -> Path:
    """A SPair-71k folder; ``outside``: one keypoint of one image moved past its right edge."""
    from probe_toolkit.demo.spair import write_spair

    root = w.root / ("spair-outside" if outside else "spair")
    if not root.exists():
        write_spair(root, {"cat": 3}, keypoints=4, seed=1)
        if outside:
            note = sorted((root / "ImageAnnotation" / "cat").glob("*.json"))[0]
            data = json.loads(note.read_text())
            key = next(k for k, v in data["kps"].items() if v is not None)
            data["kps"][key] = [data["image_width"] + 40, data["kps"][key][1]]
            note.write_text(json.dumps(data))
    return root


def _partial_masks(w) -> Path:
    """The decoder's masks of c.png only (the val panel holds c.png and d.png)."""
    masks = [m for m in json.loads(w.masks.read_text()) if m["file_name"] == "c.png"]
    return write(w.root / "out" / "c-only-masks.json", json.dumps(masks))


def _voc_box_outside(w) -> Path:
    root, _ = catalogue._voc(w)
    bad = w.root / "VOC-outside"
    if not bad.exists():
        shutil.copytree(root, bad)
        note = bad / "Annotations" / "c.xml"
        note.write_text(note.read_text().replace("<xmax>96</xmax>", "<xmax>300</xmax>", 1))
    return bad


SHORT = ["--iterations", "2", "--batch-size", "2", "--crop", "32", "--size", "32", "--stride", "21", "--chunk", "1", "--workers", "1"]
SEG_TRAIN, SEG_VAL = ["2007_000001", "2007_000002", "2007_000003"], ["2008_000001", "2008_000002"]


def _voc_seg(w) -> Path:
    """A VOC2012 folder (train and val share JPEGImages/), panels seg-train and seg-val."""
    from segmentation_folders import box_scene, write_voc

    year = w.root / "VOCdevkit" / "VOC2012"
    if not year.exists():
        write_voc(
            year, {"train": SEG_TRAIN, "val": SEG_VAL}, lambda i, n: box_scene(int(i.replace("_", "")), (80 + 8 * n, 64), classes=21, other_band=False, box=16, room=20)
        )
        for name, split in (("seg-train", "train"), ("seg-val", "val")):
            added = probe("panel", "add", name, "--voc-segmentation", year, "--split", split, "--role", split, "--cache", w.cache)
            assert added.code == 0, added.err
    return year


def _seg_checkpoint(w) -> Path:
    path = w.root / "seg.pth"
    if not path.exists():
        _voc_seg(w)
        write_checkpoint(path, "dino-full", TINY, seed=11)
    return path


def segment(w) -> list:
    return ["segment", _seg_checkpoint(w), "--train", "seg-train", "--val", "seg-val", *SHORT, "--cache", w.cache, "-q"]


def _dinov3_store(w) -> Path:
    """A DINOv3 store (its interpolation recorded as "none": no position table) with one chunk flipped."""
    from probe_toolkit.demo.samples import TINY_DINOV3

    store = w.root / "stores" / "v3" / "teacher.zarr"
    if not store.exists():
        checkpoint = write_checkpoint(w.root / "v3.pth", "dinov3-official", TINY_DINOV3, seed=4)
        assert probe("extract", checkpoint, "--images", w.small, "--views", "224", "--chunk", "1", "--store", store, *w.q).code == 0
    chunk = sorted(p for p in (store / "tokens_224" / "c").rglob("*") if p.is_file())[-1]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x5A
    chunk.write_bytes(bytes(data))
    return store


RULES = [
    Case(  # issue 46's trial, round four
        "propagate-rgb-annotation",
        lambda w: [*propagate(w, w.ckpt)[:3], _davis_rgb(w), *propagate(w, w.ckpt)[4:]],
        2,
        ("DAVIS-rgb", "00000.png", "of mode RGB, not an indexed"),
        lambda w: propagate(w, w.ckpt),
    ),
    # --- class 1: inputs that must belong together ---
    Case(
        "propagate-store-of-another-checkpoint",
        lambda w: propagate(w, _other_checkpoint(w), "--store", w.store),
        2,
        ("teacher.zarr", "was extracted from", "tiny.pth", "other.pth", "leave --store out", " --images "),  # the same photographs, whole
        lambda w: propagate(w, _other_checkpoint(w)),
    ),
    Case(
        "propagate-store-of-another-network",
        lambda w: propagate(w, w.ckpt, "--network", "student", "--store", w.store),
        2,
        ("holds the teacher network", "--network teacher", " --images ", " --network student"),
        lambda w: propagate(w, w.ckpt, "--store", w.store),
    ),
    Case(
        "score-masks-of-a-store-replaced-since",
        lambda w: ["score", _replaced_store(w), "--panel", "va", "--cache", w.cache],
        2,
        ("replaced-masks.json", "another store", "checkpoint", "`probe decode "),
        lambda w: ["score", w.root / "replaced-masks.json", "--panel", "va", "--cache", w.cache],
        printed_fix=True,  # the decode into the same file, pasted
    ),
    Case(
        "linear-panel-sibling-of-other-settings",
        lambda w: ["linear", _sibling_of_other_settings(w), "--train", "sibtr", "--val", "sibva", "--level", "image", *w.q],
        2,
        ("teacher-panel-sibva.zarr", "extracted otherwise", "interpolation dino vs timm", "move"),
        lambda w: ["linear", _sibling_of_other_settings(w), "--train", "sibtr", "--val", "sibva", "--level", "image", *w.q],
        after=_sibling_fixed,
    ),
    Case(
        "decode-panel-whose-files-are-other-files-of-the-same-names",
        lambda w: ["decode", w.store, "--panel", "sealed", "--unseal", "final numbers", *w.q],
        2,
        ("held/c.png", "is another file than", "scenes/c.png", "probe extract", "--panel sealed"),
        lambda w: ["decode", catalogue._held_store(w), "--panel", "sealed", "--unseal", "final numbers", *w.q],
    ),
    # --- class 3: labels checked field by field when added; scorers refuse predictions of none (or, without --allow-partial, part) ---
    Case("coco-image-id-a-string", _add("s1", _coco_with(image_id="1")), 2, ("schema-image_id.json", "image_id '1'", "not a whole number"), _good("s1")),
    Case("coco-category-id-unknown", _add("s2", _coco_with(category_id=9)), 2, ("category_id 9 names no listed category",), _good("s2")),
    Case("coco-box-wholly-outside", _add("s3", _coco_with(bbox=[400, 8, 20, 20])), 2, ("lies wholly outside its 112×80 image",), _good("s3")),
    Case("coco-box-of-text", _add("s4", _coco_with(bbox="0 0 4 4")), 2, ("not four finite numbers",), _good("s4")),
    Case("coco-polygon-of-two-points", _add("s5", _coco_with(segmentation=[[1, 1, 4, 4]])), 2, ("not a polygon of 3 or more",), _good("s5")),
    Case("coco-iscrowd-2", _add("s6", _coco_with(iscrowd=2)), 2, ("iscrowd 2 is not 0 or 1",), _good("s6")),
    Case(
        "coco-file-edited-after-add-with-string-ids",
        lambda w: ["score", w.masks, "--panel", "s7", "--cache", w.cache],
        2,
        ("s7.json", "image_id '1'"),
        lambda w: ["score", w.masks, "--panel", "s7", "--cache", w.cache],
        setup=catalogue.panel_file("s7", (lambda d: (d["annotations"][0].update(image_id="1"), d)[1])(coco(["c.png", "d.png"]))),
        after=catalogue.repair_panel("s7"),
    ),
    Case(
        "coco-not-utf8",
        _add("s8", lambda w: write(w.root / "bad" / "latin.json", b'{"images": [{"file_name": "caf\xe9.png"}]}')),
        2,
        ("latin.json", "not JSON"),
        _good("s8"),
    ),
    Case(
        "spair-keypoint-outside-its-image",
        lambda w: ["panel", "add", "sp1", "--spair", _spair(w, True), "--role", "val", "--cache", w.cache],
        2,
        ("kps entry", "lies outside its"),
        lambda w: ["panel", "add", "sp1", "--spair", _spair(w, False), "--role", "val", "--cache", w.cache],
    ),
    Case(
        "voc-box-outside-its-size",
        lambda w: ["panel", "add", "vo1", "--voc", _voc_box_outside(w), "--role", "val", "--cache", w.cache],
        2,
        ("c.xml", "outside its 112×80 <size>"),
        lambda w: ["panel", "add", "vo1", "--voc", catalogue._voc(w)[0], "--role", "val", "--cache", w.cache],
    ),
    Case(
        "score-masks-of-none-of-the-panels-images",
        lambda w: ["score", w.root / "bad" / "ab-masks.json", "--panel", "va", "--cache", w.cache],
        2,
        ("va", "none of its 2 images", "no image"),
        lambda w: ["score", w.masks, "--panel", "va", "--cache", w.cache],
        setup=lambda w, mp: probe("decode", catalogue._small_store(w, "224,480", "small480"), "--out", w.root / "bad" / "ab-masks.json", *w.q),
    ),
    Case(
        "score-masks-of-part-of-the-panel",
        lambda w: ["score", _partial_masks(w), "--panel", "va", "--cache", w.cache],
        2,
        ("va", "1 of its 2 images", "--allow-partial"),
        lambda w: ["score", _partial_masks(w), "--panel", "va", "--allow-partial", "--cache", w.cache],
    ),
    # --- class 5: a fix that is a command works when pasted ---
    Case(
        "segment-without-its-store-prints-the-extract-that-makes-it",
        segment,
        2,
        ("was not written by probe extract for this checkpoint", "run `probe extract ", "or pass --store STORE"),
        segment,
        printed_fix=True,
    ),
    Case(
        "dinov3-store-repair-line",
        lambda w: ["neighbours", w.root / "stores" / "v3" / "teacher.zarr", "--boot", "100", "-q"],
        1,
        ("fails its checksum", "--repair"),
        lambda w: ["neighbours", w.root / "stores" / "v3" / "teacher.zarr", "--boot", "100", "-q"],
        setup=lambda w, mp: _dinov3_store(w),
        printed_fix=True,
    ),
    Case("segment-scale-reversed", lambda w: [*segment(w), "--scale", "2.0,0.5"], 2, ("--scale 2.0,0.5", "use e.g. --scale 0.5,2.0"), segment),
    Case(
        "dinov3-extract-with-a-position-rule",
        lambda w: ["extract", w.root / "v3.pth", "--images", w.small, "--views", "224", "--interp", "dino", "--store", w.fresh(), *w.q],
        2,
        ("--interp dino", "omit --interp"),
        lambda w: ["extract", w.root / "v3.pth", "--images", w.small, "--views", "224", "--store", w.fresh(), *w.q],
    ),
    # --- class 2: photographs changed in place since extraction ---
    Case(
        "decode-panel-of-a-photograph-edited-in-place",
        lambda w: ["decode", _edited(w)[1], "--panel", "ed", *w.q],
        2,
        ("edited/c.png", "has changed", "was extracted from it", "probe extract", "teacher-new.zarr"),
        lambda w: ["decode", _edited(w)[1], "--panel", "ed", *w.q],
        setup=lambda w, mp: _edit_in_place(w),
        after=_restore,
    ),
    Case(
        "extract-rerun-over-a-photograph-edited-in-place",
        lambda w: ["extract", w.ckpt, "--images", _edited(w)[0], "--views", "224,480", "--chunk", "2", "--store", _edited(w)[1], *w.q],
        2,
        ("edited/c.png", "has changed", "new store"),
        lambda w: ["extract", w.ckpt, "--images", _edited(w)[0], "--views", "224,480", "--chunk", "2", "--store", _edited(w)[1], *w.q],
        setup=lambda w, mp: _edit_in_place(w),
        after=_restore,
    ),
    Case(
        "report-picture-of-a-photograph-edited-in-place",
        lambda w: ["report", _edited(w)[1], "--follow", "c.png", "--out", w.root / "out" / "ed-report"],
        2,
        ("edited/c.png", "has changed"),
        lambda w: ["report", _edited(w)[1], "--follow", "c.png", "--out", w.root / "out" / "ed-report"],
        setup=lambda w, mp: _edit_in_place(w),
        after=_restore,
    ),
    Case(
        "score-masks-of-a-photograph-edited-since",
        lambda w: ["score", _edited(w)[1] / "results" / "decoder-masks.json", "--panel", "ed", "--cache", w.cache],
        2,
        ("edited/c.png", "has changed"),
        lambda w: ["score", _edited(w)[1] / "results" / "decoder-masks.json", "--panel", "ed", "--cache", w.cache],
        setup=lambda w, mp: (probe("decode", _edited(w)[1], *w.q), _edit_in_place(w)),
        after=_restore,
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in RULES])
def test_rule(case, w, monkeypatch):
    catalogue.test_case(case, w, monkeypatch)


def test_hummingbird_reads_each_panel_from_the_per_panel_store_that_holds_its_views(w):
    """The README tour's per-panel stores: VOC's train and val panels share JPEGImages/, so
    ``probe extract --panel`` of either holds every image; the val panel's tokens are read from
    the sibling that holds its view, not from the first store holding its images (whose missing
    view the error named, with the very extract already run as its fix)."""
    _voc_seg(w)
    folder = w.root / "stores" / "per-panel"
    train, val = folder / "teacher-panel-seg-train.zarr", folder / "teacher-panel-seg-val.zarr"
    assert probe("extract", w.ckpt, "--panel", "seg-train", "--views", "hbird512_aug0,hbird512_aug1", "--store", train, "--cache", w.cache, "-q").code == 0
    assert probe("extract", w.ckpt, "--panel", "seg-val", "--views", "hbird512", "--store", val, "--cache", w.cache, "-q").code == 0
    run = probe("hummingbird", train, "--train", "seg-train", "--val", "seg-val", "--memory", "30", "--workers", "1", "--cache", w.cache, "-q")
    assert run.code == 0, run.err


def test_the_printed_new_store_command_extracts_the_edited_photographs(w):
    """The stale refusal's fix is a command: pasted, it extracts the photographs as they are now
    into a new store, which then decodes and scores on the panel."""
    folder, store = _edited(w)
    _edit_in_place(w)
    try:
        result = probe("decode", store, "--panel", "ed", *w.q)
        refused(result, 2, ("has changed",))
        import fix_commands

        (command,) = fix_commands.printed(result.lines[0].split("extract these into a new store: ", 1)[1])
        assert probe(*command, "-q").code == 0
        fresh = Path(command[command.index("--store") + 1])
        again = probe("decode", fresh, "--panel", "ed", *w.q)
        assert again.code == 0, again.err
    finally:
        _restore(w)


def test_a_photograph_copied_with_the_same_bytes_is_current(w, tmp_path):
    """Size and mtime moved but the bytes are those extracted (a copy, a touch): hashed, found
    the same, accepted."""
    import os

    folder, store = _edited(w)
    os.utime(folder / "d.png", ns=(1, 1))
    run = probe("decode", store, "--panel", "ed", *w.q)
    assert run.code == 0, run.err


def test_stats_and_digests_are_recorded_for_every_finished_image(w):
    import zarr

    _, store = _edited(w)
    group = zarr.open_group(str(store), mode="r")
    stats, digests = np.asarray(group["image_stat"][:]), np.asarray(group["image_sha256"][:])
    assert stats.shape == (4, 2) and stats.all() and digests.any(axis=1).all()


def test_a_panel_sibling_of_an_edited_photograph_is_extracted_again_at_its_name(w):
    """A store the protocols find by its name (``<network>-panel-<panel>.zarr``) holding an edited
    photograph: the fix was a new ``…-new.zarr`` no protocol looks for (the rerun refused again);
    it is the extraction at the sibling's own name, once the old one is moved aside."""
    import fix_commands

    folder = w.root / "sibstale"
    if not folder.exists():
        folder.mkdir()
        for name in ("c.png", "d.png"):
            shutil.copy(w.images / name, folder / name)
        assert probe("panel", "add", "sibstale", "--annotations", w.root / "val.json", "--images", folder, "--role", "val", "--cache", w.cache).code == 0
    sibling = w.root / "stores" / "sibstale" / "teacher-panel-sibstale.zarr"
    assert probe("extract", w.ckpt, "--panel", "sibstale", "--views", "480", "--store", sibling, "--cache", w.cache, "-q").code == 0
    synthetic_scene(folder / "c.png", SCENES["c.png"][0], [], seed=98)
    result = probe("decode", sibling, "--panel", "sibstale", "--cache", w.cache, "-q")
    refused(result, 2, ("c.png", "has changed", f"move {sibling} aside", f"--store {sibling} "))
    (command,) = fix_commands.printed(result.lines[0])
    sibling.rename(sibling.with_name("old.zarr"))
    assert probe(*command, "-q").code == 0
    again = probe("decode", sibling, "--panel", "sibstale", "--cache", w.cache, "-q")
    assert again.code == 0, again.err
