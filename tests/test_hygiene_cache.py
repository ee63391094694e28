"""labels/hash_files.py + hygiene: the label-hygiene cache files read member by member give the
answers, refusals and written bytes of the whole-file reading they replaced (re-implemented below
with json.loads and dicts, independently of probe's code), without holding a Python object per
image of the files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.labels import hygiene


def _dump(obj) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _load(path: Path) -> dict:
    try:
        found = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _old_hashes(root: Path, folder: Path, names: list[str]):
    memo, out, fresh = _load(root / "panel-hashes.json"), {}, {}
    for name in names:
        path = (folder / name).absolute()
        stat = path.stat()
        seen = memo.get(str(path))
        if not (isinstance(seen, list) and len(seen) == 3 and seen[:2] == [stat.st_size, stat.st_mtime_ns]):
            seen = fresh[str(path)] = [stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()]
        out[seen[2]] = name
    return out, fresh


def _refusal(name, role, other, other_role, count, mine, theirs) -> str:
    return f"({role}) shares {count} images with panel {other!r} ({other_role}), e.g. {mine!r} = {theirs!r} (same content)"


_FIX = "remove the shared images from one panel: a panel of one role must not hold another's images"


def _old_overlap(root: Path, panel: str, role: str, annotation: str, hashes: dict, fresh: dict) -> None:
    index = _load(root / "panel-images.json")
    for other, seen in sorted(index.items()):
        if other == panel or seen.get("role") == role:
            continue
        shared = sorted(set(hashes) & set(seen.get("hashes", {})))
        if shared:
            raise ProbeError(panel, _refusal(panel, role, other, seen.get("role"), len(shared), hashes[shared[0]], seen["hashes"][shared[0]]), _FIX)
    mine = index.get(panel, {})
    kept = mine.get("hashes", {}) if mine.get("annotation_sha256") == annotation and mine.get("role") == role else {}
    entry = {"role": role, "annotation_sha256": annotation, "hashes": {**kept, **hashes}}
    if index.get(panel) != entry:
        (root / "panel-images.json").write_bytes(_dump({**index, panel: entry}))
    if fresh:
        (root / "panel-hashes.json").write_bytes(_dump({**_load(root / "panel-hashes.json"), **fresh}))


def _new(root, folder, names, panel, role, annotation):
    hashes, fresh = hygiene.content_hashes(root, folder, names)
    content = hashes.list_hash()
    hygiene.check_overlap(root, panel, role, annotation, hashes, fresh)
    return hashes.as_dict(), dict(fresh.items()), content


def _old(root, folder, names, panel, role, annotation):
    hashes, fresh = _old_hashes(root, folder, names)
    _old_overlap(root, panel, role, annotation, hashes, fresh)
    return hashes, fresh, hashlib.sha256("\n".join(sorted(hashes)).encode()).hexdigest()


def _files(root: Path) -> dict[str, bytes | None]:
    return {n: (root / n).read_bytes() if (root / n).is_file() else None for n in ("panel-images.json", "panel-hashes.json")}


@pytest.fixture()
def world(tmp_path):
    rng = np.random.default_rng(4)
    folder = tmp_path / "images"
    names = []
    for i in range(40):
        path = folder / f"c{i % 3}" / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(20 + i % 7) if i not in (7, 31) else b"same bytes")  # 7 and 31: one content
        names.append(f"c{i % 3}/{i:03d}.png")
    cache = tmp_path / "cache"
    cache.mkdir()
    memo = {}
    for i, name in enumerate(names[:30]):  # a memo: 30 known, 10 new; some stale; strangers; a repeated key
        path = (folder / name).absolute()
        stat = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        memo[str(path)] = [stat.st_size, stat.st_mtime_ns + (i % 9 == 4), digest]
    memo["/elsewhere/é.png"] = [3, 4, "ab" * 32]
    text = _dump(memo).decode()
    stale = next(iter(memo))
    text = text[:-2] + f',"{stale}":[1,2,"{"00" * 32}"]' + "}\n"  # the last one counts
    (cache / "panel-hashes.json").write_text(text)
    outsider = hashlib.sha256(b"outsider").hexdigest()
    index = {"zz-other": {"role": "train", "annotation_sha256": "a", "hashes": {outsider: "o.png"}}}
    (cache / "panel-images.json").write_bytes(_dump(index))
    return folder, names, cache


def _both(tmp_path, cache, folder, names, *read):
    a, b = tmp_path / "a", tmp_path / "b"
    for copy in (a, b):
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(cache, copy)
    outcome = []
    for root, read_with in ((a, _old), (b, _new)):
        try:
            got = read_with(root, folder, names, *read)
        except ProbeError as error:
            got = ("refused", str(error).splitlines()[0].split(": ", 1)[-1])
        outcome.append((got, _files(root)))
    return outcome


def test_a_read_gives_the_old_answers_and_writes_the_old_bytes(world, tmp_path):
    folder, names, cache = world
    (old, old_files), (new, new_files) = _both(tmp_path, cache, folder, names, "tr", "train", "ann1")
    assert new == old and new_files == old_files
    assert list(new[0]) == list(old[0])  # the dict's order too (the written index follows it)
    assert new[0][hashlib.sha256(b"same bytes").hexdigest()] == "c1/031.png"  # the last of two copies
    assert len(new[1]) == 10 + 3 + 1  # new files, stale mtimes (4, 13, 22), the repeated key's wrong entry
    shutil.rmtree(cache)
    shutil.copytree(tmp_path / "b", cache)  # the second read: nothing hashed, nothing written
    (old2, old_files2), (new2, new_files2) = _both(tmp_path, cache, folder, names, "tr", "train", "ann1")
    assert new2 == old2 and new2[1] == {} and new_files2 == old_files2 == new_files
    for changed in (("tr", "train", "ann2"), ("tr", "val", "ann1"), ("tr2", "train", "ann1")):
        assert _both(tmp_path, cache, folder, names[:25], *changed)[0] == _both(tmp_path, cache, folder, names[:25], *changed)[1]
    (old3, _), (new3, new_files3) = _both(tmp_path, cache, folder, names[32:], "tr", "train", "ann1")
    assert new3 == old3 and new_files3 == new_files  # a subset of the same names: nothing written


def test_a_shared_image_is_refused_with_the_old_line_and_nothing_written(world, tmp_path):
    folder, names, cache = world
    _new(cache, folder, names[:20], "tr", "train", "ann1")
    shutil.copy(folder / names[7], folder / "c0" / "copy.png")  # same bytes as 7 and 31
    val = ["c0/copy.png", *names[30:]]
    (old, old_files), (new, new_files) = _both(tmp_path, cache, folder, val, "va", "val", "ann1")
    assert new == old and new[0] == "refused"
    assert new[1] == _refusal("va", "val", "tr", "train", 1, "c1/031.png", "c1/007.png") + "; " + _FIX
    assert new_files == old_files == _files(cache)
    a, b = (("tr", "train", folder, names[:20]), ("va", "val", folder, val))
    with pytest.raises(ProbeError) as refused:
        hygiene.check_apart(a, b, tmp_path / "b")
    assert str(refused.value).count("\n") <= 1 and _refusal("va", "val", "tr", "train", 1, "c1/031.png", "c1/007.png") in str(refused.value)


@pytest.mark.parametrize("damage", ["garbage{", "[1, 2]", '{"tr": {"role": "train"}} x', "\ufeff{}"])
def test_an_unreadable_cache_file_is_rebuilt_as_before(world, tmp_path, damage):
    folder, names, cache = world
    for name in ("panel-images.json", "panel-hashes.json"):
        (cache / name).write_text(damage)
        (old, old_files), (new, new_files) = _both(tmp_path, cache, folder, names, "tr", "train", "ann1")
        assert new == old and new_files == old_files


def test_the_cache_files_are_read_without_an_object_per_image(tmp_path):
    """A memo of 10 k other paths and an index of 3 × 4 k digests: the whole-file reading (the
    re-implementation above) peaks near 4 times each file's size (a dict of lists / of strings),
    this one under 2.5 times (the text and its bytes while read, and a chunk of members)."""
    folder = tmp_path / "images"
    folder.mkdir()
    names = [f"{i}.png" for i in range(5)]
    for i, name in enumerate(names):
        (folder / name).write_bytes(bytes([i]))
    root = tmp_path / "cache"
    root.mkdir()
    rng = np.random.default_rng(0)
    memo = {f"/data/set/train/n{i:08d}/img_{i:08d}.JPEG": [1000 + i, 1796559286709694735 + i, rng.bytes(32).hex()] for i in range(10_000)}
    (root / "panel-hashes.json").write_bytes(_dump(memo))
    index = {f"p{p}": {"role": "val", "annotation_sha256": "0" * 64, "hashes": {rng.bytes(32).hex(): f"img_{i:08d}.JPEG" for i in range(4_000)}} for p in range(3)}
    (root / "panel-images.json").write_bytes(_dump(index))
    del memo, index
    sizes = {n: (root / n).stat().st_size for n in ("panel-hashes.json", "panel-images.json")}
    hashes, fresh = hygiene.content_hashes(root, folder, names)  # first read: hashes and remembers the 5
    hygiene.check_overlap(root, "mine", "train", "1" * 64, hashes, fresh)
    sizes = {n: (root / n).stat().st_size for n in sizes}
    tracemalloc.start()
    try:
        hashes, fresh = hygiene.content_hashes(root, folder, names)
        memo_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        hygiene.check_overlap(root, "mine", "train", "1" * 64, hashes, fresh)
        index_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    tracemalloc.start()
    try:
        old_hashes, _ = _old_hashes(root, folder, names)
        old_memo_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        _old_overlap(root, "mine", "train", "1" * 64, old_hashes, {})
        old_index_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(fresh) == 0 and len(hashes) == 5 and hashes.as_dict() == old_hashes
    assert memo_peak < 2.5 * sizes["panel-hashes.json"] < old_memo_peak, (memo_peak, old_memo_peak, sizes)
    assert index_peak < 2.5 * sizes["panel-images.json"] < old_index_peak, (index_peak, old_index_peak, sizes)
    assert os.path.getsize(root / "panel-images.json") == sizes["panel-images.json"]


@pytest.mark.parametrize("layout", [{"indent": 1}, {"ensure_ascii": False}, {"separators": (",", ":"), "ensure_ascii": False}])
def test_files_of_another_layout_are_read_member_by_member_with_the_same_answers(world, tmp_path, layout):
    folder, names, cache = world
    _new(cache, folder, names[:20], "tr", "train", "ann1")
    odd = folder / "c0" / 'é "q".png'
    odd.write_bytes(b"odd")
    for name in ("panel-images.json", "panel-hashes.json"):
        found = json.loads((cache / name).read_text())
        if name == "panel-images.json":
            found["tr"]["hashes"][hashlib.sha256(b"odd").hexdigest()] = odd.name
            found["tr"]["hashes"]["not a digest"] = 3
        (cache / name).write_text(json.dumps(found, **layout))
    for read in (("tr", "train", "ann1"), ("va", "val", "ann1"), ("tr", "train", "ann2")):
        for group in (names[:20], [*names[20:], "c0/" + odd.name], names[:10]):
            (old, old_files), (new, new_files) = _both(tmp_path, cache, folder, group, *read)
            assert new == old and new_files == old_files


def test_the_memo_keys_are_the_names_absolute_paths_made_when_asked(tmp_path, monkeypatch):
    """``content_hashes`` keys the memo by each name's absolute path text, made one at a time (a list of
    a 100 k panel's paths sat beside the memo's text while it was read): the same texts as before,
    for a relative folder and names Path would normalise."""
    monkeypatch.chdir(tmp_path)
    names = ["a.png", "sub/b.png", "./c.png", "d//e.png"]
    for folder in (Path("rel/images"), tmp_path / "images", Path(".")):
        made = hygiene._Paths(folder, names)
        assert len(made) == 4 and list(made) == [str((folder / name).absolute()) for name in names]
