"""What a store records of its photographs' files is what its features came from: the sha256 of
the bytes each image was decoded from and the file's size and mtime as it was opened, taken by
the decoding itself (one read of each file), never by a second pass over the folder afterwards.
The expected values here come from hashlib and os.stat on the files as the test wrote them."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest
import zarr

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import images, sources
from probe_toolkit.store.extract import Settings, extract


def _folder(tmp_path, photos, count=5):
    folder = tmp_path / "photos"
    folder.mkdir()
    names = sorted(p.name for p in photos.glob("*.jpg"))[:count]
    for i, name in enumerate(names):
        shutil.copy(photos / name, folder / f"{i:02d}-{name}")
    return folder, sorted(p.name for p in folder.iterdir())


def _recorded(store):
    group = zarr.open_group(str(store), mode="r")
    ids = [str(v) for v in group["image"][:]]
    return ids, np.asarray(group["image_sha256"][:]), np.asarray(group["image_stat"][:])


def test_the_store_holds_each_files_sha256_and_stat_without_reading_it_again(tmp_path, tiny_checkpoints, photos, monkeypatch):
    folder, names = _folder(tmp_path, photos)
    expected = {n: (hashlib.sha256((folder / n).read_bytes()).digest(), os.stat(folder / n)) for n in names}
    hashed = []
    monkeypatch.setattr(sources, "file_digest", lambda path: hashed.append(path))  # the old pass after the run
    report = extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=2), store=tmp_path / "s.zarr", batch_size=2, quiet=True)
    assert report.done == len(names) and hashed == []
    ids, digests, stats = _recorded(report.store)
    assert ids == names
    for name, row, stat in zip(ids, digests, stats):
        sha, found = expected[name]
        assert row.tobytes() == sha
        assert tuple(stat) == (found.st_size, found.st_mtime_ns)


def test_a_file_replaced_after_it_was_decoded_keeps_the_sha256_of_the_decoded_bytes(tmp_path, tiny_checkpoints, photos, monkeypatch):
    """The file is swapped for another photograph once its image was decoded: the store's features
    are the first file's, so its sha256 must be too, and a later command finds the file changed
    (a hash taken after the run named the new bytes, and nothing found the store stale)."""
    folder, names = _folder(tmp_path, photos)
    victim, other = folder / names[0], folder / names[1]
    before = hashlib.sha256(victim.read_bytes()).digest()
    real = images.load_photo

    def swapped_after(path):
        photo = real(path)
        if path == victim:
            victim.write_bytes(other.read_bytes())
        return photo

    monkeypatch.setattr(images, "load_photo", swapped_after)
    report = extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=2), store=tmp_path / "s.zarr", batch_size=2, quiet=True)
    ids, digests, _ = _recorded(report.store)
    assert digests[ids.index(names[0])].tobytes() == before
    assert [(p.name, why.split(" (")[0]) for p, why in sources.changed(report.store, [(n, folder / n) for n in names])] == [(names[0], "has changed")]


def test_a_file_changed_while_a_store_grows_is_one_line_and_nothing_of_its_run_is_written(tmp_path, tiny_checkpoints, photos, monkeypatch):
    """Checked unchanged when the run began, replaced before its image was decoded for the new
    view: its old 224 features beside new 480 ones would be two files' numbers under one id."""
    folder, names = _folder(tmp_path, photos)
    store = tmp_path / "s.zarr"
    extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=2), store=store, batch_size=2, quiet=True)
    victim, other = folder / names[2], folder / names[1]
    real = images.load_photo

    def swapped_before(path):
        if path == victim:
            victim.write_bytes(other.read_bytes())
        return real(path)

    monkeypatch.setattr(images, "load_photo", swapped_before)
    with pytest.raises(ProbeError) as raised:
        extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224, 480), chunk=2), store=store, batch_size=2, decoders=1, quiet=True)
    line = raised.value.line()
    assert names[2] in line and "has changed while the run lasted" in line and "new store" in line
    done = np.asarray(zarr.open_group(str(store), mode="r")["done_480"][:], dtype=bool)
    assert not done[2:4].any()  # the victim's run (chunk 1): nothing of the 480 view
    ids, digests, _ = _recorded(store)
    assert digests[2].tobytes() != hashlib.sha256(victim.read_bytes()).digest()  # the old bytes' sha256 stays


def test_a_store_extracted_before_files_were_hashed_as_decoded_gets_them_on_its_next_run(tmp_path, tiny_checkpoints, photos):
    """An older store has no ``image_sha256`` or ``image_stat``: the next extraction of it (nothing
    left to extract) records every finished image's from the files, as before."""
    folder, names = _folder(tmp_path, photos, count=3)
    store = tmp_path / "s.zarr"
    settings = Settings(views=(224,), chunk=2)
    extract(tiny_checkpoints["dino-backbone"], folder, settings=settings, store=store, batch_size=2, quiet=True)
    for name in ("image_sha256", "image_stat"):
        shutil.rmtree(store / name)
    from probe_toolkit.store.group import consolidate

    consolidate(store)
    again = extract(tiny_checkpoints["dino-backbone"], folder, settings=settings, store=store, batch_size=2, quiet=True)
    assert again.written == 0
    ids, digests, stats = _recorded(store)
    assert [row.tobytes() for row in digests] == [hashlib.sha256((folder / n).read_bytes()).digest() for n in ids]
    assert [tuple(s) for s in stats] == [(os.stat(folder / n).st_size, os.stat(folder / n).st_mtime_ns) for n in ids]


def test_a_rerun_hashes_only_the_finished_images_an_older_run_left_unrecorded(tmp_path, tiny_checkpoints, photos, monkeypatch):
    """Growing a store reads the records once, when the run begins (the stale check): only images
    finished without a record are hashed from their files after the run, and a store whose every
    image is recorded is not scanned again (a scan of a 100 k-image store took 12 s)."""
    folder, names = _folder(tmp_path, photos)
    store = tmp_path / "s.zarr"
    settings = Settings(views=(224,), chunk=2)
    extract(tiny_checkpoints["dino-backbone"], folder, settings=settings, store=store, batch_size=2, quiet=True)
    group = zarr.open_group(str(store), mode="r+")
    group["image_sha256"][3] = np.zeros(32, np.uint8)  # as an extraction before records were taken left it
    group["image_stat"][3] = np.zeros(2, np.int64)
    hashed, real = [], sources.file_digest

    def counted(path):
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(sources, "file_digest", counted)
    again = extract(tiny_checkpoints["dino-backbone"], folder, settings=settings, store=store, batch_size=2, quiet=True)
    assert again.written == 0 and hashed == [names[3]]
    ids, digests, stats = _recorded(store)
    assert digests[3].tobytes() == hashlib.sha256((folder / names[3]).read_bytes()).digest()
    assert tuple(stats[3]) == (os.stat(folder / names[3]).st_size, os.stat(folder / names[3]).st_mtime_ns)
    scans = []
    monkeypatch.setattr(sources, "record_digests", lambda *args: scans.append(args))
    extract(tiny_checkpoints["dino-backbone"], folder, settings=settings, store=store, batch_size=2, quiet=True)
    assert scans == []


def test_a_file_that_cannot_be_read_is_one_line_saying_so_not_a_decoding_error(tmp_path):
    """Gone since the folder was listed, or a folder at that name: the line says it cannot be read."""
    (tmp_path / "a-folder.jpg").mkdir()
    for path, why in ((tmp_path / "gone.jpg", "No such file"), (tmp_path / "a-folder.jpg", "Is a directory")):
        with pytest.raises(ProbeError) as refused:
            images.load_photo(path)
        line = refused.value.line()
        assert line.startswith(str(path)) and f"cannot be read ({why}" in line and "readable file" in line and "decoded" not in line
