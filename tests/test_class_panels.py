"""Class-folder panels (ImageNet's layout) read as names: one listing, no ``Path`` per image.

Registering and reading a class-folder panel of ImageNet's 1.28 M images must not hold a
``Path`` per image or list the folder several times; the classes, the ledger's listing hash and
the memo's path keys must stay what they were.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import hygiene, ledger, panels
from probe_toolkit.store import images


def _tree(root: Path, classes: dict[str, list[str]]) -> Path:
    for c, names in classes.items():
        (root / c).mkdir(parents=True)
        for n, name in enumerate(names):
            Image.new("RGB", (8 + n, 8), (len(c) * 20 % 255, n * 30 % 255, 7)).save(root / c / name)
    return root


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab./é ", max_size=12), st.sampled_from(["/", "/data", "/data/", "/a b/é"]))
def test_memo_keys_are_the_text_of_the_joined_path(name, folder):
    """The memo's key of a name is ``str(folder.absolute() / name)`` whatever the name, joined as
    text only where ``Path`` would not rewrite it."""
    assert hygiene._Paths(Path(folder), [name])[0] == str(Path(folder).absolute() / name)


def test_a_listings_refs_give_the_paths_they_gave(tmp_path, monkeypatch):
    root = _tree(tmp_path / "photos", {"b": ["x.jpg", "y.png"], "a": ["z.jpg"]})
    refs = images.list_images(Path(str(root) + "/"))
    assert [r.id for r in refs] == ["a/z.jpg", "b/x.jpg", "b/y.png"]
    assert [r.path for r in refs] == [root / "a/z.jpg", root / "b/x.jpg", root / "b/y.png"]
    assert all(isinstance(r.path, Path) and not hasattr(r, "__dict__") for r in refs)
    monkeypatch.chdir(tmp_path)  # a folder given as ./photos: the path as before, made from the text listed
    assert [r.path for r in images.list_images("./photos")] == [Path("photos/a/z.jpg"), Path("photos/b/x.jpg"), Path("photos/b/y.png")]


def test_require_images_reads_the_listing_up_to_its_first_image(tmp_path, monkeypatch):
    _tree(tmp_path / "p", {"a": ["1.jpg", "2.jpg"], "b": ["3.jpg"]})
    taken = []

    def counting(folder):
        for found in listed(folder):
            taken.append(found)
            yield found

    listed = images._image_files
    monkeypatch.setattr(images, "_image_files", counting)
    assert images.require_images(tmp_path / "p") is None
    assert len(taken) == 1
    monkeypatch.undo()
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(ProbeError) as mine:
            images.require_images(folder)
        with pytest.raises(ProbeError) as theirs:
            images.list_images(folder)
        assert str(mine.value) == str(theirs.value)


def test_a_class_folder_panel_is_listed_once_as_names(tmp_path, monkeypatch):
    """``panel add`` and ``read_classes`` list the folder once each, by name; the classes are
    torchvision ImageFolder's (sorted folders, an image's class the index of its folder) and the
    ledger's listing hash is the sha256 of the sorted ids joined by newlines, as before."""
    names = {"n02": ["b.jpg", "a.jpg"], "n10": ["c.jpg"], "n01": ["d.png", "e.jpg", "f.jpg"]}
    root = _tree(tmp_path / "train", names)
    calls = {"image_ids": 0}
    listed = images.image_ids

    def counted(folder):
        calls["image_ids"] += 1
        return listed(folder)

    def refused(folder):
        raise AssertionError("a Path per image")

    monkeypatch.setattr(images, "image_ids", counted)
    monkeypatch.setattr(images, "list_images", refused)
    cache = tmp_path / "cache"
    panels.add_panel("cf", root, root, "train", cache=cache, kind="classes")
    assert calls["image_ids"] == 1
    got = panels.read_classes("cf", purpose="test", cache=cache, command="test")
    assert calls["image_ids"] == 2
    ids = sorted(f"{c}/{n}" for c, ns in names.items() for n in ns)  # the reference: ImageFolder's rule written out
    classes = sorted(names)
    assert got.image_ids == ids and got.classes == classes
    assert got.labels.dtype == np.int64
    assert got.labels.tolist() == [classes.index(i.split("/")[0]) for i in ids]
    entry = ledger.find(cache, got.entry_id)
    assert entry.fields["annotation_sha256"] == hashlib.sha256("\n".join(ids).encode()).hexdigest()
    memo = json.loads((cache / hygiene.MEMO).read_text())
    assert sorted(memo) == sorted(str(root.absolute() / i) for i in ids)


def test_a_loose_image_and_one_class_are_still_refused(tmp_path):
    root = _tree(tmp_path / "train", {"a": ["x.jpg"], "b": ["y.jpg"]})
    Image.new("RGB", (8, 8)).save(root / "loose.jpg")
    with pytest.raises(ProbeError, match="1 images outside any class folder"):
        panels.add_panel("cf", root, root, "train", cache=tmp_path / "c", kind="classes")
    one = _tree(tmp_path / "one", {"a": ["x.jpg"]})
    with pytest.raises(ProbeError, match="has 1 class folder"):
        panels.add_panel("cf", one, one, "train", cache=tmp_path / "c", kind="classes")
