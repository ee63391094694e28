"""What extraction overlaps with the forward pass changes nothing stored: the first run decoded
while the checkpoint is read, images decoded on several threads, each run's pass begun before the
last run is collected (store/ahead.py), and freed blocks reused (infra/memory.py) instead of
mapped anew."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import zarr

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store import extract as extraction
from probe_toolkit.store import extract_load, images
from probe_toolkit.store.extract import Settings, extract


def _arrays(path):
    group = zarr.open_group(path, mode="r")
    return {name: group[name][:] for name in group.array_keys()}


def test_first_run_decoded_during_setup_gives_the_same_store(tmp_path, tiny_checkpoints, image_dir, monkeypatch):
    settings = Settings(views=(224, 480), chunk=3)
    taken = []
    real = extraction._decode_first_run

    def watched(*args):
        early = real(*args)
        taken.append(early[0])
        return early

    monkeypatch.setattr(extraction, "_decode_first_run", watched)
    early = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "early.zarr", batch_size=2, quiet=True)
    assert taken == [(0, 3, ("224", "480"))] and early.done == 7
    # a second shard's first run and a --limit cut inside it are guessed too
    extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "shard.zarr", shard="1/2", limit=1, batch_size=2, quiet=True)
    assert taken[-1] == (3, 4, ("224", "480"))
    monkeypatch.setattr(extraction, "_decode_first_run", lambda *args: None)
    plain = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "plain.zarr", batch_size=2, quiet=True)
    a, b = _arrays(early.store), _arrays(plain.store)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f"), name


def test_a_bad_image_in_the_early_run_fails_as_before(tmp_path, tiny_checkpoints, photos):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "a-broken.jpg").write_bytes((photos / "rocket.jpg").read_bytes()[:300])
    (folder / "b.jpg").write_bytes((photos / "coffee.jpg").read_bytes())
    with pytest.raises(ProbeError, match="a-broken.jpg.*--on-error skip"):
        extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,)), store=tmp_path / "a.zarr", quiet=True)
    assert not (tmp_path / "a.zarr").exists()  # nothing left that blocks the corrected run
    # the checkpoint's error still comes before the image folder's
    with pytest.raises(ProbeError, match="no such checkpoint"):
        extract(tmp_path / "missing.pth", tmp_path / "no-folder", settings=Settings(views=(224,)), store=tmp_path / "b.zarr", quiet=True)
    with pytest.raises(ProbeError, match="no-folder.*not a folder"):
        extract(tiny_checkpoints["dino-backbone"], tmp_path / "no-folder", settings=Settings(views=(224,)), store=tmp_path / "b.zarr", quiet=True)


def _mixed_folder(tmp_path, photos):
    """Photos with a broken file and one too small for a /16 native view, in the middle of runs."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    names = sorted(p.name for p in photos.glob("*.jpg"))
    for i, name in enumerate(names):
        (folder / f"{i:02d}-{name}").write_bytes((photos / name).read_bytes())
    (folder / "03a-broken.jpg").write_bytes((photos / names[0]).read_bytes()[:300])
    images.load_image(photos / names[1]).resize((9, 12)).save(folder / "05a-tiny.png")
    return folder


def test_runs_passed_ahead_store_the_same_bytes_and_fail_where_they_did(tmp_path, tiny_checkpoints, photos, monkeypatch):
    """Extraction on two streams (each run's pass begun before the last is collected) against one
    (each run in turn): the same store for a folder with a broken file, a tiny image and a last run
    of a single image (passed on the forwarding thread's own copy of the network), and with
    ``--on-error fail`` the same error at the same run, the runs before it written and kept."""
    folder = _mixed_folder(tmp_path, photos)
    settings = Settings(views=(224, 480), attention="last", chunk=2)
    stores, errors = {}, {}
    for count in (1, 2):
        monkeypatch.setattr(extraction, "cpu_streams", lambda device, count=count: count)
        report = extract(tiny_checkpoints["dino-backbone"], folder, settings=settings, store=tmp_path / f"s{count}.zarr", on_error="skip", batch_size=2, quiet=True)
        stores[count] = (report.skipped, report.done, _arrays(report.store))
        with pytest.raises(ProbeError) as raised:
            extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=2), store=tmp_path / f"f{count}.zarr", batch_size=2, quiet=True)
        errors[count] = (str(raised.value), np.asarray(_arrays(tmp_path / f"f{count}.zarr")["done"]))
    (skipped, done, one), (skipped2, done2, two) = stores[1], stores[2]
    assert skipped == skipped2 and len(skipped) == 1 and done == done2 == 8 and one.keys() == two.keys()
    for name in one:
        assert np.array_equal(one[name], two[name], equal_nan=one[name].dtype.kind == "f"), name
    assert errors[1][0] == errors[2][0] and "03a-broken.jpg" in errors[1][0]
    # the broken file is the 5th image (runs of 2): the two runs before its run are written and kept
    assert errors[1][1].tolist() == errors[2][1].tolist() == [True] * 4 + [False] * 5


def test_any_number_of_decoding_threads_gives_the_same_store(tmp_path, tiny_checkpoints, photos, monkeypatch):
    folder = _mixed_folder(tmp_path, photos)
    seen, real = set(), images.load_photo

    def watched(path):
        seen.add(threading.current_thread().name.split("_")[0])
        return real(path)

    monkeypatch.setattr(images, "load_photo", watched)
    settings = Settings(views=(224, 480, "native"), chunk=3)
    stores = {}
    for n in (1, 3):
        seen.clear()
        report = extract(
            tiny_checkpoints["dino-backbone"], folder, settings=settings, store=tmp_path / f"d{n}.zarr", on_error="skip", batch_size=2, decoders=n, quiet=True
        )
        assert seen == {"probe-decode"}  # every image decoded on the pool, none on the loop
        stores[n] = (report, _arrays(report.store))
    (one, a), (three, b) = stores[1], stores[3]
    assert one.skipped == three.skipped and len(one.skipped) == 2
    assert "03a-broken.jpg" in one.skipped[0] and "05a-tiny.png" in one.skipped[1]  # in image order
    # 8 images written in some view now; the tiny one fails its native view, so it is recorded as failed
    # (the global flag: failed in any view) and is not done: 7 done + 2 failed = the 9 images
    assert one.written == three.written == 8 and one.done == three.done == 7 and one.failed == three.failed == 2 and a.keys() == b.keys()
    assert one.done + one.failed == one.n_images == 9
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f"), name
    assert a["failed_native"].sum() == 2 and a["failed_224"].sum() == 1


def test_runs_written_at_once_give_the_same_store_and_one_chunk_is_never_shared(tmp_path, tiny_checkpoints, image_dir, monkeypatch):
    """Several savers may write runs of different chunks together; two runs of one chunk (a store
    grown where part of a chunk already has a view) never are. Asserted on results only: whatever
    the threads' interleaving, no write starts on a chunk another write holds, and the grown
    store equals one written by a single saver. (Whether writes overlapped at all is up to the
    scheduler, so it is not asserted.)"""
    from probe_toolkit.store.writer import StoreWriter

    lock, live, shared, written, real = threading.Lock(), {}, [], [], StoreWriter.write_views

    def watched(self, start, views, sizes, files=None):
        home = start // self.chunk
        with lock:
            if home in live.values():
                shared.append(home)
            live[start] = home
            written.append(home)
        try:
            return real(self, start, views, sizes, files)
        finally:
            with lock:
                del live[start]

    monkeypatch.setattr(StoreWriter, "write_views", watched)
    grown = tmp_path / "grown.zarr"
    extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,), chunk=2), store=grown, limit=3, decoders=1, quiet=True)
    written.clear()
    extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224, 480), chunk=2), store=grown, batch_size=2, decoders=3, quiet=True)
    assert written and not shared  # runs were written, and none began on a chunk another run was writing
    monkeypatch.setattr(StoreWriter, "write_views", real)
    one = extract(
        tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224, 480), chunk=2), store=tmp_path / "one.zarr", batch_size=2, decoders=1, quiet=True
    )
    a, b = _arrays(grown), _arrays(one.store)
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f"), name


def test_the_first_bad_image_in_image_order_fails_the_run(tmp_path, tiny_checkpoints, photos, monkeypatch):
    folder = _mixed_folder(tmp_path, photos)
    (folder / "04a-broken.jpg").write_bytes(b"not an image")
    real = images.load_photo

    def slow_first_break(path):  # the later broken file is found first
        if "03a-broken" in str(path):
            threading.Event().wait(0.3)
        return real(path)

    monkeypatch.setattr(images, "load_photo", slow_first_break)
    with pytest.raises(ProbeError, match="03a-broken.jpg"):
        extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=8), store=tmp_path / "s.zarr", decoders=4, quiet=True)
    assert not (tmp_path / "s.zarr").exists()


def test_the_bomb_check_holds_on_every_decoding_thread_and_the_filters_are_left_alone(tmp_path, photos):
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    Image.new("1", (10_000, 10_000)).save(tmp_path / "bomb.png")  # 1e8 pixels: PIL warns, the probe refuses
    Image.new("1", (10_000, 10_000)).save(tmp_path / "bomb.gif")
    files = [*sorted(photos.glob("*.jpg")), tmp_path / "bomb.png", tmp_path / "bomb.gif"] * 6
    before = list(warnings.filters)

    def outcome(path):
        try:
            return images.load_image(path).size
        except ProbeError as error:
            return "refused" if "decompression-bomb" in str(error) else str(error)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with ThreadPoolExecutor(6) as pool:
            seen = list(pool.map(outcome, files))
        after = list(warnings.filters)
    assert [s for s, f in zip(seen, files) if "bomb" in f.name] == ["refused"] * 12
    assert all(isinstance(s, tuple) for s, f in zip(seen, files) if "bomb" not in f.name)
    assert not [w for w in shown if issubclass(w.category, Image.DecompressionBombWarning)]  # refused, never just printed
    assert after[1:] == before and list(warnings.filters) == before


def test_decoding_threads_default_to_the_cores_the_forward_leaves(monkeypatch):
    monkeypatch.setattr(extract_load.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(extract_load.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(extract_load.torch, "get_num_threads", lambda: 8)
    assert extract_load.decoder_threads(None, "auto") == 1  # torch takes every core
    monkeypatch.setattr(extract_load.torch, "get_num_threads", lambda: 2)
    assert extract_load.decoder_threads(None, "cpu") == 6
    monkeypatch.setattr(extract_load.torch.cuda, "is_available", lambda: True)
    assert extract_load.decoder_threads(None, "auto") == 7  # beside a GPU: every core but one
    assert extract_load.decoder_threads(None, "cpu") == 6
    monkeypatch.setattr(extract_load.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert extract_load.decoder_threads(None, "cuda") == 16 and extract_load.decoder_threads(3, "cuda") == 3
    with pytest.raises(ProbeError, match="--decoders 0 must be a whole number of at least 1"):
        extract_load.decoder_threads(0, "auto")


REUSE = """
import json, resource
import numpy as np
from probe_toolkit.infra.memory import keep_memory_flat, reusing_blocks

def faults():  # page faults of allocating, touching and freeing a 64 MiB block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.ones(1 << 23)
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

pinned = keep_memory_flat()
before = [faults() for _ in range(3)]
with reusing_blocks() as applied:
    inside = [faults() for _ in range(3)]
after = [faults() for _ in range(3)]
print(json.dumps({"pinned": pinned, "applied": applied, "before": before, "inside": inside, "after": after}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_reused_blocks_are_not_faulted_in_again_and_the_pin_comes_back():
    out = subprocess.run([sys.executable, "-c", REUSE], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    if not (seen["pinned"] and seen["applied"]):
        pytest.skip("not glibc")
    assert min(seen["before"]) > 0  # pinned: every large block is a fresh mapping
    assert seen["inside"][-1] * 10 <= min(seen["before"])  # reused: the same pages serve again
    assert min(seen["after"]) * 10 >= min(seen["before"]) * 9  # the pin is back


def test_chunks_are_plain_zstd_frames(tmp_path, tiny_checkpoints, image_dir):
    """The GIL-releasing encoder (store/codec.py) writes frames any zstd reader decodes to the values."""
    import google_crc32c
    from numcodecs import Zstd

    from probe_toolkit.store.codec import ZstdReleasingGil

    path = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,), chunk=4), store=tmp_path / "s.zarr", quiet=True).store
    group = zarr.open_group(path, mode="r")
    assert isinstance(group["attention_224"].compressors[0], ZstdReleasingGil)
    assert '"name": "zstd"' in (path / "attention_224" / "zarr.json").read_text()
    for name in ("attention_224", "tokens_224"):
        values = group[name][:4]
        frame = path / name / "c" / "/".join(["0"] * values.ndim)  # the first chunk (one along every other axis)
        data = frame.read_bytes()  # a zstd frame, then its crc32c (zarr's crc32c codec, store/integrity.py)
        assert int.from_bytes(data[-4:], "little") == google_crc32c.value(data[:-4])
        raw = Zstd(level=1).decode(data[:-4])
        assert np.array_equal(np.frombuffer(raw, dtype=np.float16).reshape(values.shape), values)


def test_images_decoded_in_processes_give_the_same_store(tmp_path, tiny_checkpoints, photos):
    """Beside a GPU images are decoded and runs written in processes (extract_load.host_pool; the
    arrays cross as shared memory, writer.shared_views): the same bits as threads, failed images
    recorded in the same order."""
    folder = _mixed_folder(tmp_path, photos)
    settings = Settings(views=(224, 480, "native"), chunk=2)  # five runs: shared buffers are reused
    reports = {}
    for tag, processes, n in (("threads", False, 1), ("processes", True, 2)):
        reports[tag] = extract(
            tiny_checkpoints["dino-backbone"],
            folder,
            settings=settings,
            store=tmp_path / f"{tag}.zarr",
            on_error="skip",
            batch_size=2,
            decoders=n,
            processes=processes,
            quiet=True,
        )
    one = reports["threads"]
    a = _arrays(one.store)
    assert len(one.skipped) == 2 and a["failed_native"].sum() == 2
    other = reports["processes"]
    assert other.skipped == one.skipped and (other.written, other.done) == (one.written, one.done)
    b = _arrays(other.store)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


def test_a_bad_image_decoded_in_a_process_fails_the_run_and_leaves_nothing(tmp_path, tiny_checkpoints, photos):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}-ok.jpg").write_bytes((photos / "coffee.jpg").read_bytes())
    (folder / "0-broken.jpg").write_bytes((photos / "rocket.jpg").read_bytes()[:300])
    with pytest.raises(ProbeError, match="0-broken.jpg.*--on-error skip"):
        extract(tiny_checkpoints["dino-backbone"], folder, settings=Settings(views=(224,), chunk=2), store=tmp_path / "a.zarr", decoders=2, processes=True, quiet=True)
    assert not (tmp_path / "a.zarr").exists()
    report = extract(
        tiny_checkpoints["dino-backbone"],
        folder,
        settings=Settings(views=(224,), chunk=2),
        store=tmp_path / "a.zarr",
        decoders=2,
        processes=True,
        on_error="skip",
        quiet=True,
    )
    assert report.done == 4 and report.failed == 1 and report.written == 4 and "0-broken.jpg" in report.skipped[0]


def test_a_failed_write_in_a_writing_process_is_the_runs_error_and_the_rerun_completes(tmp_path, tiny_checkpoints, image_dir):
    """A writing process that cannot write a chunk (a folder stands where the chunk file goes)
    fails the run in one line; its run is not marked done, and the corrected rerun resumes to
    the same store as threads write."""
    settings = Settings(views=(224,), chunk=2)
    store = tmp_path / "p.zarr"
    extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=store, limit=2, decoders=2, processes=True, quiet=True)
    chunk = store / "tokens_224" / "c" / "1" / "0" / "0"
    assert (store / "tokens_224" / "c" / "0" / "0" / "0").is_file() and not chunk.exists()
    chunk.mkdir(parents=True)
    with pytest.raises(ProbeError, match="could not be written"):
        extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=store, decoders=2, processes=True, quiet=True)
    done = zarr.open_group(store, mode="r")["done_224"][:]
    assert done[:2].all() and not done[2:4].any()
    chunk.rmdir()
    report = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=store, decoders=2, processes=True, quiet=True)
    assert report.done == 7
    plain = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "t.zarr", decoders=1, processes=False, quiet=True)
    a, b = _arrays(store), _arrays(plain.store)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def test_shared_views_hand_shared_tensors_over_as_tensors():
    import torch

    from probe_toolkit.store.writer import shared_views

    whole = torch.arange(24, dtype=torch.float16).reshape(4, 6).share_memory_()
    plain = np.ones((4, 6), np.float16)
    out = shared_views({"224": ({"a": whole.numpy(), "b": plain, "c": whole.numpy()[:2]}, np.zeros(4, bool))})
    data, _ = out["224"]
    assert isinstance(data["a"], torch.Tensor) and data["a"].is_shared() and data["a"].data_ptr() == whole.data_ptr()
    assert torch.equal(data["a"], whole) and data["b"] is plain and isinstance(data["c"], np.ndarray)


def test_shared_buffers_are_shared_and_reused_only_once_given_back():
    import torch

    from probe_toolkit.store.writer import SharedBuffers, shared_tensors, shared_views

    buffers = SharedBuffers()
    a = buffers.take((3, 5), torch.float16)
    b = buffers.take((3, 5), torch.float16)
    assert a.is_shared() and a.shape == (3, 5) and a.dtype == torch.float16 and a.data_ptr() != b.data_ptr()
    sent = shared_views({"224": ({"x": a.numpy()}, np.zeros(3, bool))})
    buffers.give_back(shared_tensors(sent))
    assert buffers.take((3, 5), torch.float16).data_ptr() == a.data_ptr()  # the one given back
    assert buffers.take((3, 5), torch.float16).data_ptr() not in (a.data_ptr(), b.data_ptr())  # b was never given back
    assert buffers.take((5, 3), torch.float16).shape == (5, 3)


def test_without_room_in_shared_memory_processes_give_way_to_threads(tmp_path, tiny_checkpoints, image_dir, monkeypatch):
    """A run whose buffers would not fit in /dev/shm (where a tensor that does not fit ends its
    process with a bus error) decodes and writes on threads: the same store."""
    from probe_toolkit.store.extract_load import shared_memory_room

    assert shared_memory_room(0, str(tmp_path)) and not shared_memory_room(1 << 60, str(tmp_path))
    assert not shared_memory_room(0, str(tmp_path / "missing"))
    seen, real = set(), images.load_photo

    def watched(path):
        seen.add(threading.current_thread().name.split("_")[0])
        return real(path)

    monkeypatch.setattr(images, "load_photo", watched)
    monkeypatch.setattr(extraction, "shared_memory_room", lambda needed: False)
    settings = Settings(views=(224,), chunk=3)
    crowded = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "c.zarr", decoders=2, processes=True, quiet=True)
    assert seen == {"probe-decode"}  # decoded on this process's threads
    plain = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=settings, store=tmp_path / "p.zarr", decoders=1, quiet=True)
    a, b = _arrays(crowded.store), _arrays(plain.store)
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
