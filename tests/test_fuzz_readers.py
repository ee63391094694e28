"""Issue 46, class 6: every reader probe has, fed files that are not what their name says.

Each reader's file is taken from a real run (a checkpoint of each layout, a safetensors file, a
store's zarr metadata and chunks, a record's ``record.json``, the ledger, COCO / VOC / SPair
annotations, ADE / VOC / DAVIS masks, a ``--json`` summary, a decoder settings file, a masks
file, ``panels.toml``), then damaged by hypothesis: truncated, bytes flipped, bytes inserted,
random bytes, a JSON value of the wrong type put anywhere in it, or its text in another encoding.
The command (or, for label maps, the decoder function) that reads it must then end in one line
and exit 1 or 2, or succeed (a damage that leaves a valid file: a flipped byte in JSON's white
space), and never end in a traceback, nor print a number when it fails.

The default run draws few examples per reader (the whole file within a minute or so on a quiet
machine); ``-m slow`` runs each reader with many more.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import scenes_folder
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_catalogue import SCENES, coco, probe

from probe_toolkit.demo.samples import TINY, TINY_DINOV3, write_checkpoint
from probe_toolkit.infra.errors import ProbeError

# no shrinking in the default run: a failure is reported as drawn (each example runs a command)
FAST = settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None, phases=(Phase.explicit, Phase.generate))
SLOW = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)


# ----------------------------------------------------------------------------------------------
# damage


def _json_values() -> st.SearchStrategy:
    leaves = st.one_of(
        st.none(), st.booleans(), st.integers(-(10**6), 10**12), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.just("1"), st.just(-1)
    )
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)


def _retyped(data: bytes, draw) -> bytes:
    """A JSON document with one value somewhere replaced by a value of another type."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    paths: list[tuple] = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict):
            for k, v in list(node.items())[:40]:
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node[:40]):
                walk(v, (*path, i))

    walk(doc, ())
    path = draw(st.sampled_from(paths))
    value = draw(_json_values())
    if not path:
        return json.dumps(value, allow_nan=True).encode()
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def damaged(draw, data: bytes, text: bool = False) -> bytes:
    """``data`` damaged one way (``text``: JSON or XML, so retyping and re-encoding apply)."""
    ways = ["truncate", "flip", "insert", "random"] + (["retype", "retype", "encoding"] if text else [])
    way = draw(st.sampled_from(ways))
    if way == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if way == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            if out:
                at = draw(st.integers(0, len(out) - 1))
                out[at] ^= draw(st.integers(1, 255))
        return bytes(out)
    if way == "insert":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    if way == "random":
        return draw(st.binary(max_size=512))
    if way == "retype":
        return _retyped(data, draw)
    return data.decode("utf-8", "replace").encode(draw(st.sampled_from(["utf-16", "utf-32", "latin-1"])), "replace")


def held(result, *, quiet_stdout: bool = True) -> None:
    """The contract: success, or exit 1/2 with one line on stderr, no traceback, no number printed."""
    assert result.code != "traceback", result.err
    assert "Traceback" not in result.err, result.err
    if result.code != 0:
        assert result.code in (1, 2), (result.code, result.err)
        assert len(result.lines) == 1, result.err
        if quiet_stdout:
            assert not result.out.strip(), result.out


# ----------------------------------------------------------------------------------------------
# the world: a real file for every reader


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    two = {k: SCENES[k] for k in ("c.png", "d.png")}
    images = scenes_folder(root, two)
    w = SimpleNamespace(root=root, images=images, cache=root / "cache", count=iter(range(100_000)))
    w.ckpt = write_checkpoint(root / "tiny.pth", "dino-full", TINY, seed=0)
    w.safetensors = write_checkpoint(root / "v3.safetensors", "dinov3-hf", TINY_DINOV3, seed=1)
    w.store = root / "store" / "teacher.zarr"
    assert probe("extract", w.ckpt, "--images", images, "--views", "224,480", "--attention", "last", "--store", w.store, "--cache", w.cache, "-q").code == 0
    (root / "val.json").write_text(json.dumps(coco(["c.png", "d.png"])))
    assert probe("panel", "add", "va", "--annotations", root / "val.json", "--images", images, "--role", "val", "--cache", w.cache).code == 0
    assert probe("entropy", w.store, "--boot", "100", "--json", root / "summary.json", "-q").code == 0
    assert probe("decode", w.store, "--panel", "va", "--cache", w.cache, "--out", root / "masks.json", "-q").code == 0
    from probe_toolkit.results import records

    w.record = records.find(w.store, "entropy").path / "record.json"
    (root / "settings.json").write_text(
        json.dumps({"written_by": "probe", "settings": {"preset": "tokencut", "tau": 0.2, "eps": 1e-5}, "chosen_by": {"panel": "va", "metric": "segm_AP", "value": 0.5}})
    )
    from probe_toolkit.demo.spair import write_spair
    from probe_toolkit.demo.video import write_davis

    w.spair = write_spair(root / "SPair-71k", {"cat": 2}, keypoints=3, seed=2)
    w.davis = write_davis(root / "DAVIS", {"pair": 2}, size=(48, 32), seed=1)
    w.voc = _voc(root)
    return w


def _voc(root: Path) -> Path:
    year = root / "VOC2007"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (year / sub).mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (64, 48), (90, 100, 110)).save(year / "JPEGImages" / "x.jpg")
    (year / "Annotations" / "x.xml").write_text(
        "<annotation><size><width>64</width><height>48</height><depth>3</depth></size><object><name>box</name>"
        "<difficult>0</difficult><truncated>0</truncated><bndbox><xmin>4</xmin><ymin>5</ymin><xmax>40</xmax>"
        "<ymax>30</ymax></bndbox></object></annotation>"
    )
    (year / "ImageSets" / "Main" / "trainval.txt").write_text("x\n")
    return year


def _chunk(array: Path) -> Path:
    return sorted(p for p in (array / "c").rglob("*") if p.is_file())[0]


def swapped(path: Path, data: bytes, run: Callable[[], object]):
    """Run ``run`` with ``path`` holding ``data``, then put the file back as it was."""
    kept = path.read_bytes()
    try:
        path.write_bytes(data)
        return run()
    finally:
        path.write_bytes(kept)


# ----------------------------------------------------------------------------------------------
# readers: (name, the file in the world, whether it is text, the command reading it)

READERS: dict[str, tuple[Callable, bool, Callable]] = {
    "checkpoint-pth": (
        lambda w: w.ckpt,
        False,
        lambda w: probe("extract", w.ckpt, "--images", w.images, "--views", "224", "--limit", "1", "--store", w.root / "x" / f"{next(w.count)}.zarr", "-q"),
    ),
    "checkpoint-safetensors": (
        lambda w: w.safetensors,
        False,
        lambda w: probe("extract", w.safetensors, "--images", w.images, "--views", "224", "--limit", "1", "--store", w.root / "x" / f"{next(w.count)}.zarr", "-q"),
    ),
    "zarr-group-metadata": (lambda w: w.store / "zarr.json", True, lambda w: probe("info", w.store)),
    "zarr-array-metadata": (lambda w: w.store / "tokens_224" / "zarr.json", True, lambda w: probe("neighbours", w.store, "--boot", "100", "-q")),
    "zarr-chunk": (lambda w: _chunk(w.store / "tokens_224"), False, lambda w: probe("neighbours", w.store, "--boot", "100", "-q")),
    "zarr-flags-chunk": (lambda w: _chunk(w.store / "done_224"), False, lambda w: probe("entropy", w.store, "--boot", "100", "-q")),
    "record-json": (lambda w: w.record, True, lambda w: probe("results", w.store)),
    "ledger": (lambda w: w.cache / "ledger.jsonl", True, lambda w: probe("ledger", "verify", "--cache", w.cache)),
    "panels-toml": (lambda w: w.cache / "panels.toml", True, lambda w: probe("panel", "list", "--cache", w.cache)),
    "coco-panel": (
        lambda w: w.root / "val.json",
        True,
        lambda w: probe("panel", "add", "fz", "--annotations", w.root / "val.json", "--images", w.images, "--role", "val", "--replace", "--cache", w.cache),
    ),
    "voc-annotation": (
        lambda w: w.voc / "Annotations" / "x.xml",
        True,
        lambda w: probe("panel", "add", "fv", "--voc", w.voc, "--role", "val", "--replace", "--cache", w.cache),
    ),
    "spair-pair": (
        lambda w: sorted((w.spair / "PairAnnotation" / "test").glob("*.json"))[0],
        True,
        lambda w: probe("panel", "add", "fs", "--spair", w.spair, "--role", "val", "--replace", "--cache", w.cache),
    ),
    "spair-keypoints": (
        lambda w: sorted((w.spair / "ImageAnnotation" / "cat").glob("*.json"))[0],
        True,
        lambda w: probe("panel", "add", "fs", "--spair", w.spair, "--role", "val", "--replace", "--cache", w.cache),
    ),
    "summary-json": (lambda w: w.root / "summary.json", True, lambda w: probe("entropy", w.store, "--boot", "100", "--json", w.root / "summary.json", "-q")),
    "decoder-settings": (
        lambda w: w.root / "settings.json",
        True,
        lambda w: probe("decode", w.store, "--settings", w.root / "settings.json", "--out", w.root / "o" / f"{next(w.count)}.json", "-q"),
    ),
    "masks-json": (lambda w: w.root / "masks.json", True, lambda w: probe("score", w.root / "masks.json", "--panel", "va", "--cache", w.cache)),
}


def _check(w, name: str, data: bytes) -> None:
    path_of, _, run = READERS[name]
    meta = path_of(w).with_name(path_of(w).name.removesuffix(".json") + ".meta.json") if name == "masks-json" else None
    if meta is not None and meta.exists():  # a masks file's metadata binds its sha256: damage the masks of a foreign file instead
        meta.unlink()
    held(swapped(path_of(w), data, lambda: run(w)), quiet_stdout=name not in ("record-json", "ledger"))  # their commands list what they found


def _fuzz(name: str, budget: settings):
    text = READERS[name][1]

    @budget
    @given(data=st.data())
    def check(f, data):
        original = READERS[name][0](f).read_bytes()
        _check(f, name, data.draw(damaged(original, text)))

    return check


@pytest.mark.parametrize("name", list(READERS))
def test_a_damaged_file_is_one_line_never_a_traceback(f, name):
    _fuzz(name, FAST)(f)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(READERS))
def test_a_damaged_file_is_one_line_never_a_traceback_many_examples(f, name):
    _fuzz(name, SLOW)(f)


# ----------------------------------------------------------------------------------------------
# files that are not what their name says (the issue's own cases, each once)


def test_a_renamed_pth_and_random_bytes_as_safetensors(f):
    fake = f.root / "renamed.safetensors"
    for data in (f.ckpt.read_bytes(), bytes(range(256)) * 8, b"", b'\x08\x00\x00\x00\x00\x00\x00\x00{"a": 1}'):
        fake.write_bytes(data)
        result = probe("extract", fake, "--images", f.images, "--views", "224", "--store", f.root / "x" / f"{next(f.count)}.zarr", "-q")
        held(result)
        assert result.code == 2 and "renamed.safetensors" in result.lines[0], result.err


@pytest.mark.parametrize("text", ['{"zarr_format": 3, "node_type": "array"}', "[]", "null", '{"zarr_format": "three"}', "{"])
def test_a_garbled_array_zarr_json(f, text):
    held(swapped(f.store / "tokens_224" / "zarr.json", text.encode(), lambda: probe("neighbours", f.store, "--boot", "100", "-q")))


# ----------------------------------------------------------------------------------------------
# label maps: the decoders the segmentation and video readers apply to every mask


MASKS = {
    "voc-segmentation": ("probe_toolkit.labels.voc_segmentation", "decode"),
    "ade20k": ("probe_toolkit.labels.ade_segmentation", "decode"),
    "davis": ("probe_toolkit.labels.davis_folders", "_indexed"),
}


def _mask_png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.arange(48 * 32, dtype=np.uint8).reshape(32, 48) % 3).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("kind", list(MASKS))
@FAST
@given(data=st.data())
def test_a_damaged_mask_is_a_probe_error(kind, data):
    import importlib

    module, function = MASKS[kind]
    decode = getattr(importlib.import_module(module), function)
    raw = data.draw(damaged(_mask_png()))
    try:
        decode(raw, Path(f"/masks/{kind}.png"))
    except ProbeError as error:
        assert error.line().count("\n") == 0
