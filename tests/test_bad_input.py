"""Bad images and bad stores: converted when they can be, one clear line and exit 2 when not."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.cache import open_store, require
from probe_toolkit.store.extract import Settings, extract
from probe_toolkit.store.images import list_images, load_image

PROBE = [sys.executable, "-m", "probe_toolkit"]


def run_probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PROBE, *args], capture_output=True, text=True)


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_modes_are_converted_not_failed(tmp_path, photos):
    base = Image.open(photos / "chelsea.jpg")
    base.convert("CMYK").save(tmp_path / "cmyk.jpg")
    base.convert("P").save(tmp_path / "palette.png")
    base.convert("RGBA").save(tmp_path / "rgba.png")
    ramp = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "sixteen.png")
    for name in ("cmyk.jpg", "palette.png", "rgba.png", "sixteen.png"):
        assert load_image(tmp_path / name).mode == "RGB"
    sixteen = np.asarray(load_image(tmp_path / "sixteen.png"))[..., 0]
    assert sixteen[0, 0] == 0 and sixteen[-1, -1] == round(65520 / 65535 * 255)  # scaled, not clipped


def test_exif_orientation_is_left_as_stored(tmp_path):
    """The pixels as stored, as the peers' loaders (PIL open + convert, no EXIF transpose) read them."""
    from probe_toolkit.store.images import header_size

    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 255, (32, 64, 3), dtype=np.uint8))
    exif = picture.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    picture.save(tmp_path / "rotated.png", exif=exif)
    peer = Image.open(tmp_path / "rotated.png").convert("RGB")
    assert load_image(tmp_path / "rotated.png").size == (64, 32) == peer.size == header_size(tmp_path / "rotated.png")
    np.testing.assert_array_equal(np.asarray(load_image(tmp_path / "rotated.png")), np.asarray(peer))


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("zero.jpg", b"", "not an image"),
        ("text.jpg", b"this is not a picture", "not an image"),
        ("corrupt.jpg", b"\xff\xd8\xff\xe0" + b"\x00" * 64, "not an image PIL can read"),
    ],
)
def test_unreadable_files_name_themselves(tmp_path, name, content, needle):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ProbeError, match=needle) as error:
        load_image(tmp_path / name)
    assert name in error.value.line()


def test_truncated_jpeg(tmp_path, photos):
    data = (photos / "rocket.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(ProbeError, match="truncated"):
        load_image(tmp_path / "cut.jpg")


def test_decompression_bomb_is_refused(tmp_path):
    Image.new("1", (10_000, 10_000)).save(tmp_path / "bomb.png")  # 1e8 pixels, a few kB on disk
    with pytest.raises(ProbeError, match="decompression-bomb"):
        load_image(tmp_path / "bomb.png")


def test_folder_without_images_and_other_files(tmp_path, tiny_checkpoints):
    (tmp_path / "notes.txt").write_text("not a picture")
    one_line_error(run_probe("extract", str(tiny_checkpoints["dino-backbone"]), "--images", str(tmp_path)), "holds no images")
    with pytest.raises(ProbeError, match="is not a folder"):
        list_images(tmp_path / "missing")


def test_cli_bad_image_exits_2_and_skip_records_it(tmp_path, tiny_checkpoints, photos):
    (tmp_path / "a.jpg").write_bytes((photos / "coffee.jpg").read_bytes())
    (tmp_path / "b.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "readme.txt").write_text("other files are not images and are not read")
    ckpt = str(tiny_checkpoints["dino-backbone"])
    one_line_error(run_probe("extract", ckpt, "--images", str(tmp_path), "--views", "224", "--cache", str(tmp_path / "c"), "-q"), "b.jpg", "--on-error skip")
    # nothing half written: the store holds no finished image, and a skip run completes it
    skipped = run_probe("extract", ckpt, "--images", str(tmp_path), "--views", "224", "--cache", str(tmp_path / "c"), "-q", "--on-error", "skip")
    assert skipped.returncode == 0 and "b.jpg" in skipped.stderr and "1/2 images extracted" in skipped.stdout and "1 recorded as failed" in skipped.stdout


def test_incomplete_store_and_missing_array(tmp_path, tiny_checkpoints, image_dir):
    report = extract(tiny_checkpoints["dino-backbone"], image_dir, settings=Settings(views=(224,), chunk=2), store=tmp_path / "s.zarr", limit=2, quiet=True)
    with pytest.raises(ProbeError, match=r"incomplete: 2/7.*--partial"):
        open_store(report.store, allow_partial=False)
    assert open_store(report.store).sizes["image"] == 2
    with pytest.raises(ProbeError, match=r"no array keys_480; rerun `probe extract \S+ --images \S+ --views 480 .*--store \S+s.zarr`"):
        require(open_store(report.store), "keys_480")


def test_not_a_store(tmp_path):
    with pytest.raises(ProbeError, match="not a probe store"):
        open_store(tmp_path)


def test_a_path_is_printed_as_written_never_as_markup_or_an_emoji(tmp_path):
    # SPair's pair names end in ``:cat:``; a folder may hold ``[bold]``: rich would style, drop or
    # mis-parse them, so the line would name a file that does not exist
    odd = tmp_path / "x[bold]:cat:" / "[dim]nope.zarr"
    odd.parent.mkdir()
    one_line_error(run_probe("info", str(odd)), f"{odd}: is not a probe store")


# --- panels ---------------------------------------------------------------------------------


@pytest.fixture()
def panel_dir(tmp_path):
    from probe_toolkit.demo.scenes import write_panel

    annotations = write_panel(tmp_path / "panel", 2, seed=5)
    return tmp_path / "panel", annotations


def _add(cache, annotations, images, name="p"):
    return run_probe("panel", "add", name, "--annotations", str(annotations), "--images", str(images), "--role", "val", "--cache", str(cache))


@pytest.mark.parametrize(
    "content, needle, refused_by",
    [
        ("this is { not json", "is not a COCO annotation file", "add"),
        ('{"info": {}, "licenses": []}', "is not a COCO annotation file", "add"),
        ('{"images": [], "annotations": [], "categories": []}', "lists no image", "add"),
        ('{"images": [{"id": 1, "file_name": "ghost.png", "width": 8, "height": 8}], "annotations": [], "categories": []}', "holds no object", "add"),
        (
            '{"images": [{"id": 1, "file_name": "ghost.png", "width": 8, "height": 8}], "categories": [{"id": 1, "name": "x"}],'
            ' "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4], "area": 16, "iscrowd": 0}]}',
            "not in",
            "add",
        ),
    ],
)
def test_bad_annotation_files_are_one_line_at_the_first_read(tmp_path, panel_dir, content, needle, refused_by):
    """A file that is no COCO file, lists no image or object, or names an image its folder lacks is
    refused when the panel is added (its schema and its files are checked there), in one line."""
    folder, _ = panel_dir
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    cache = tmp_path / "cache"
    added = _add(cache, bad, folder / "images")
    if refused_by == "add":
        one_line_error(added, "bad.json", needle)
        return
    assert added.returncode == 0, added.stderr
    (tmp_path / "masks.json").write_text("[]")
    result = run_probe("score", str(tmp_path / "masks.json"), "--panel", "p", "--cache", str(cache))
    one_line_error(result, "bad.json", needle)


def test_a_panel_without_images_is_refused(tmp_path, panel_dir):
    _, annotations = panel_dir
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(_add(tmp_path / "cache", annotations, empty), "holds no images")


@pytest.mark.parametrize("suffix", ["jpg", "png"])
def test_an_annotation_sized_as_the_exif_orientation_shows_it_is_refused(tmp_path, suffix):
    """Images are read as stored: an annotation made on the rotated display would not line up."""
    from probe_toolkit.labels import hygiene

    picture = Image.new("RGB", (64, 32), "white")
    exif = picture.getexif()
    exif[0x0112] = 6
    picture.save(tmp_path / f"rotated.{suffix}", exif=exif)
    stored = [{"id": 1, "file_name": f"rotated.{suffix}", "width": 64, "height": 32}]
    assert hygiene.check_sizes(tmp_path / "a.json", tmp_path, stored) == {1: (64, 32)}
    shown = [{"id": 1, "file_name": f"rotated.{suffix}", "width": 32, "height": 64}]
    with pytest.raises(ProbeError, match="EXIF orientation") as refused:
        hygiene.check_sizes(tmp_path / "a.json", tmp_path, shown)
    assert "as stored" in refused.value.line() and "\n" not in refused.value.line()
    Image.new("RGB", (32, 64), "white").save(tmp_path / f"upright.{suffix}")
    upright = [{"id": 2, "file_name": f"upright.{suffix}", "width": 64, "height": 32}]
    with pytest.raises(ProbeError, match="but the file is 32×64"):  # no orientation: the plain mismatch
        hygiene.check_sizes(tmp_path / "a.json", tmp_path, upright)


def test_a_label_read_takes_sizes_from_the_headers(tmp_path, monkeypatch):
    """Sizes come from each file's header: no image of a panel is decoded (a PNG's EXIF, which may
    follow its pixels, is looked for only where a size disagrees)."""
    from PIL import ImageFile

    from probe_toolkit.labels import hygiene

    for i, suffix in enumerate(("png", "jpg")):
        Image.new("RGB", (40 + i, 30), "white").save(tmp_path / f"{i}.{suffix}")
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail(f"{self.filename} was decoded"))
    listed = [{"id": i, "file_name": f"{i}.{suffix}", "width": 40 + i, "height": 30} for i, suffix in enumerate(("png", "jpg"))]
    assert hygiene.check_sizes(tmp_path / "a.json", tmp_path, listed) == {0: (40, 30), 1: (41, 30)}


def test_an_option_of_one_value_given_twice_is_refused_before_any_work(tmp_path):
    # the parser would keep the last value and run on 480 alone
    one_line_error(run_probe("extract", str(tmp_path / "x.pth"), "--views", "224", "--views=480"), "--views", "2 times (224, 480)")
    assert not list(tmp_path.iterdir())


def test_a_fix_carries_the_runs_cache_into_whole_commands_only():
    """A run given ``--cache C`` adds it to each whole command of its fix (each part of ``&&``), so
    that, pasted, it reads the same panels; a command only named, or an option named without its
    value (``probe decode --out``), stays as written, never ``probe decode --out --cache C``."""
    from probe_toolkit.cli import carried

    args = ["knn", "s.zarr", "--cache", "my cache"]
    assert carried("run `probe knn s.zarr --train a --val b`", args) == "run `probe knn s.zarr --train a --val b --cache 'my cache'`"
    both = carried("`probe extract c.pth --panel p --store x.zarr && probe knn s.zarr --train a --val b`", args)
    assert both == "`probe extract c.pth --panel p --store x.zarr --cache 'my cache' && probe knn s.zarr --train a --val b --cache 'my cache'`"
    for named in ("pass the file `probe decode --out` wrote", "see `probe extract`", "`probe info --verify` reads them", "`probe knn s --cache d`"):
        assert carried(named, args) == named
    assert carried("run `probe knn s.zarr --train a --val b`", ["knn", "s.zarr"]) == "run `probe knn s.zarr --train a --val b`"
