"""``probe correspond`` and the SPair-71k panel kind: every number against probe3d's procedure
written out here per keypoint (plain Python and float64), on a synthetic SPair folder."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from cli_runs import probe_main
from PIL import Image

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.demo.spair import write_spair
from probe_toolkit.labels import ledger
from probe_toolkit.labels.guard import forbid_label_reads
from probe_toolkit.labels.panels import add_panel
from probe_toolkit.results.records import load
from probe_toolkit.store import images
from probe_toolkit.store.extract import Settings, extract


def test_square_view_pads_white_then_resizes_then_centres_on_whole_patches():
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (30, 50, 3), dtype=np.uint8))
    canvas = np.full((50, 50, 3), 255, np.uint8)
    canvas[:30] = np.asarray(picture)
    big = np.asarray(Image.fromarray(canvas).resize((800, 800), Image.Resampling.BICUBIC), np.float32) / 255.0
    want = ((big - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32).transpose(2, 0, 1)
    np.testing.assert_allclose(images.square(picture, 16).numpy(), want, atol=1e-6)
    at14 = images.square(picture, 14).numpy()  # 800 → 812 = 58 patches: 6 zero rows and columns each side
    assert at14.shape == (3, 812, 812) and images.fixed_grid("square800", 14) == (58, 58) and images.fixed_grid("square800", 16) == (50, 50)
    np.testing.assert_allclose(at14[:, 6:806, 6:806], want, atol=1e-6)
    assert not at14[:, :6].any() and not at14[:, 806:].any() and not at14[:, :, :6].any()


# ----------------------------------------------------------------------------------------------
# probe3d's evaluate_spair_correspondence.py, keypoint by keypoint


def plain_keypoints(note, size):
    side = max(size)
    out = []
    for k in range(len(note["kps"])):
        p = note["kps"][str(k)]
        out.append(None if p is None else (int(np.float32(int(p[0]) * 800) / np.float32(side)), int(np.float32(int(p[1]) * 800) / np.float32(side))))
    return out


def bilinear(grid, x, y):
    """grid (rows, cols, D) float64 at the continuous position (x, y) in patch units (align_corners=True)."""
    rows, cols = grid.shape[:2]
    x0, y0 = int(math.floor(x)), int(math.floor(y))
    fx, fy = x - x0, y - y0
    total = np.zeros(grid.shape[2])
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            if 0 <= y0 + dy < rows and 0 <= x0 + dx < cols:
                total += wy * wx * grid[y0 + dy, x0 + dx]
    return total


def plain_pair(src_grid, trg_grid, src_kps, trg_kps, box, size):
    rows, cols = trg_grid.shape[:2]
    scale = max(box[2] - box[0], box[3] - box[1]) / max(size)
    errors = {}
    for k, (s, t) in enumerate(zip(src_kps, trg_kps)):
        if s is None or t is None:
            continue
        u, v = s[0] / 800 * (cols - 1), s[1] / 800 * (rows - 1)
        feature = bilinear(src_grid, u, v)
        best, where = -np.inf, None
        for r in range(rows):
            for c in range(cols):
                value = float(feature @ trg_grid[r, c])
                if value > best:
                    best, where = value, (c, r)
        px, py = where[0] / cols, where[1] / cols
        errors[k] = math.hypot(px - t[0] / 800, py - t[1] / 800) / scale
    return errors


def plain_errors(grids: dict[str, np.ndarray], pairs, rows: int, cols: int) -> list[np.ndarray]:
    """Per pair, (K,) errors (NaN where a keypoint is not in both): probe3d's procedure one keypoint at a time, in
    float64 numpy (the keypoints moved into the view as ``process_keypoints`` moves them)."""
    out = []
    for p in pairs:
        src, trg = grids[p.source], grids[p.target]
        src = src / np.maximum(np.linalg.norm(src, axis=2, keepdims=True), 1e-12)
        trg = (trg / np.maximum(np.linalg.norm(trg, axis=2, keepdims=True), 1e-12)).reshape(rows * cols, -1)
        s_kps = plain_keypoints({"kps": {str(i): v for i, v in enumerate(p.source_kps)}}, p.source_size)
        t_kps = plain_keypoints({"kps": {str(i): v for i, v in enumerate(p.target_kps)}}, p.target_size)
        box = p.target_box
        scale = max(box[2] - box[0], box[3] - box[1]) / max(p.target_size)
        errors = np.full(len(s_kps), np.nan)
        for k in range(len(s_kps)):
            if s_kps[k] is None or t_kps[k] is None:
                continue
            x, y = s_kps[k][0] / 800 * (cols - 1), s_kps[k][1] / 800 * (rows - 1)
            x0, y0 = int(math.floor(x)), int(math.floor(y))
            feature = np.zeros(src.shape[2])
            for dy, wy in ((0, 1 - (y - y0)), (1, y - y0)):
                for dx, wx in ((0, 1 - (x - x0)), (1, x - x0)):
                    if 0 <= y0 + dy < rows and 0 <= x0 + dx < cols:
                        feature += wy * wx * src[y0 + dy, x0 + dx]
            best = int(np.argmax(trg @ feature))
            errors[k] = math.hypot((best % cols) / cols - t_kps[k][0] / 800, (best // cols) / cols - t_kps[k][1] / 800) / scale
        out.append(errors)
    return out


def assert_plain_errors(record, ds, folder, side: int) -> tuple[list, dict[str, np.ndarray]]:
    """Every pair's errors in ``record`` equal ``plain_errors`` on the store's square800 tokens
    (``ds``, a side × side grid); the panel's test pairs and those plain errors by pair name."""
    from probe_toolkit.labels.spair import parse

    pairs, _, _ = parse(folder, "test", lambda p: p.read_bytes())
    grids = {str(i): v.reshape(side, side, -1).astype(np.float64) for i, v in zip(ds.image.values, ds["tokens_square800"].values)}
    errors = dict(zip([p.name for p in pairs], plain_errors(grids, pairs, side, side)))
    for i, name in enumerate(record.pair.values):
        want = errors[str(name)]
        np.testing.assert_allclose(record.error.values[i][: want.size], want, rtol=1e-5, atol=1e-6, equal_nan=True)
    return pairs, errors


@pytest.fixture(scope="module")
def spair(tmp_path_factory):
    root = tmp_path_factory.mktemp("spair")
    folder = write_spair(root / "SPair-71k", {"cat": 4, "dog": 3}, seed=4)
    checkpoint = write_checkpoint(root / "dino.pth", "dino-full", TINY, seed=0)
    cache = root / "cache"
    panel = add_panel("sp-test", folder, None, "test", cache=cache, kind="spair", split="test")
    assert panel.images == (folder / "JPEGImages").resolve()
    store = extract(checkpoint, panel.images, settings=Settings(views=("square800",), dtype="float32"), cache_dir=cache, quiet=True).store
    return folder, checkpoint, cache, store


def test_pck_equals_the_plain_per_keypoint_procedure(spair, capsys, tmp_path):
    import xarray as xr

    folder, _, cache, store = spair
    notes = {}
    for path in (folder / "ImageAnnotation").rglob("*.json"):
        notes[f"{path.parent.name}/{path.stem}.jpg"] = json.loads(path.read_text())
    pairs = [json.loads(p.read_text()) for p in sorted((folder / "PairAnnotation" / "test").glob("*.json"))]
    ds = xr.open_zarr(store)
    ids = [str(i) for i in ds.image.values]
    tokens = ds["tokens_square800"].values.astype(np.float64)
    grids = {}
    for i, image_id in enumerate(ids):
        grid = tokens[i].reshape(50, 50, -1)
        grids[image_id] = grid / np.maximum(np.linalg.norm(grid, axis=2, keepdims=True), 1e-12)
    errors = {}
    for p in pairs:
        src, trg = f"{p['category']}/{p['src_imname']}", f"{p['category']}/{p['trg_imname']}"
        src_size, trg_size = tuple(p["src_imsize"][:2]), tuple(p["trg_imsize"][:2])
        errors[p["filename"]] = plain_pair(
            grids[src], grids[trg], plain_keypoints(notes[src], src_size), plain_keypoints(notes[trg], trg_size), p["trg_bndbox"], trg_size
        )
    instances = 3
    expected = {}
    for category in ("cat", "dog"):
        for b, vp in zip(("0", "1", "2", "all"), (0, 1, 2, None)):
            chosen = [p for p in pairs if p["category"] == category and (vp is None or p["viewpoint_variation"] == vp)]
            random.seed(20)
            random.shuffle(chosen)
            values = [e for p in chosen[:instances] for e in errors[p["filename"]].values()]
            expected[(category, b)] = [100 * np.mean([e < t for e in values]) if values else np.nan for t in (0.05, 0.1, 0.15)]
    out = tmp_path / "c.json"
    for workers in ("1", "2"):
        code, printed = probe_main(
            [
                "correspond",
                str(store),
                "--panel",
                "sp-test",
                "--unseal",
                "test of the tests",
                "--instances",
                str(instances),
                "--json",
                str(out),
                "--workers",
                workers,
                "--cache",
                str(cache),
                "-q",
            ],
            capsys,
        )
        assert code == 0, printed.err
        assert "PCK@0.1" in printed.out and "mean of categories" in printed.out
        record = load(store, "correspond")
        for (category, b), want in expected.items():
            np.testing.assert_allclose(record.pck.sel(category=category, bin=b).values, want, rtol=0, atol=1e-4)  # float32 mean, as the reference
        for b in ("0", "1", "2", "all"):
            np.testing.assert_allclose(record.pck_mean.sel(bin=b).values, np.nanmean([expected[(c, b)] for c in ("cat", "dog")], axis=0), atol=1e-4)
        for i, name in enumerate(record.pair.values):
            got = record.error.values[i]
            want = errors[str(name)]
            assert sorted(want) == [k for k in range(got.size) if np.isfinite(got[k])]
            np.testing.assert_allclose([got[k] for k in sorted(want)], [want[k] for k in sorted(want)], rtol=1e-5, atol=1e-6)
        summary = json.loads(out.read_text())
        assert summary["mean"]["0.1"][3] == pytest.approx(float(record.pck_mean.sel(bin="all", threshold=0.1)))
    entries = [e.fields for e in ledger.entries(cache)]
    assert [e["purpose"] for e in entries] == ["correspond: score"] * 2 and entries[0]["unseal"] == "test of the tests"


def test_labels_are_read_only_through_the_ledger_and_the_seal_holds(spair, capsys):
    folder, _, cache, store = spair
    before = len(ledger.entries(cache))
    code, printed = probe_main(["correspond", str(store), "--panel", "sp-test", "--cache", str(cache), "-q"], capsys)
    assert code == 2 and "sealed" in printed.err and len(printed.err.strip().splitlines()) == 1
    assert len(ledger.entries(cache)) == before
    annotations = [*(folder / "PairAnnotation").rglob("*.json"), *(folder / "ImageAnnotation").rglob("*.json")]
    from probe_toolkit.protocols.api import run

    with forbid_label_reads(annotations) as opened:
        run("correspond", store, panel="sp-test", unseal="guard", instances=1, cache_dir=cache, workers=1)
    assert len(opened) == len(annotations)


def test_a_broken_panel_is_refused_when_added_in_one_line_with_the_count(tmp_path, capsys):
    folder = write_spair(tmp_path / "SPair-71k", {"cat": 2}, seed=1)
    pair_files = sorted((folder / "PairAnnotation" / "test").glob("*.json"))
    data = json.loads(pair_files[0].read_text())
    data["viewpoint_variation"] = "wide"
    data["trg_bndbox"] = [10, 10, 5]
    pair_files[0].write_text(json.dumps(data))
    note = next((folder / "ImageAnnotation" / "cat").glob("*.json"))
    broken = json.loads(note.read_text())
    broken["kps"]["1"] = [3]
    note.write_text(json.dumps(broken))
    code, printed = probe_main(["panel", "add", "bad", "--spair", str(folder), "--role", "val", "--cache", str(tmp_path / "c")], capsys)
    lines = printed.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, printed.err  # the first problem (file, entry, field; fix) and how many more
    assert f"{pair_files[0]}: pair {data['filename']}: field viewpoint_variation is 'wide'" in lines[0]
    assert "; " in lines[0] and lines[0].endswith(f"(2 more problems in {folder})"), lines[0]
    assert not (tmp_path / "c" / "panels.toml").exists()
    code, printed = probe_main(["panel", "add", "bad", "--spair", str(folder), "--split", "train", "--role", "val", "--cache", str(tmp_path / "c")], capsys)
    assert code == 2 and "--split 'train'" in printed.err


def test_the_report_shows_the_saved_pck_and_draws_one_pair(spair):
    from probe_toolkit.report.content import Figure, Table
    from probe_toolkit.report.sections import gather

    _, _, cache, store = spair
    record = load(store, "correspond")
    if record is None:
        from probe_toolkit.protocols.api import run

        run("correspond", store, panel="sp-test", unseal="report", cache_dir=cache, workers=1)
        record = load(store, "correspond")
    section = next(s for s in gather([store], cache_dir=cache).sections if s.key == "correspond")
    tables = [b for b in section.blocks if isinstance(b, Table)]
    means = {(row[1], b): row[2 + i] for row in tables[0].rows for i, b in enumerate(("0", "1", "2", "all"))}
    for t in record.threshold.values:
        for b in ("0", "1", "2", "all"):
            value = float(record.pck_mean.sel(bin=b, threshold=t))
            assert means[(f"{float(t):g}", b)] == (f"{value:.1f}" if np.isfinite(value) else "–")
    figures = [b for b in section.blocks if isinstance(b, Figure)]
    assert len(figures) == 1 and figures[0].png[:8] == b"\x89PNG\r\n\x1a\n" and "square800" in figures[0].caption


@pytest.mark.parametrize("layout, arch", [("dinov2-reg-backbone", "TINY_DINOV2_REG"), ("dinov3-official", "TINY_DINOV3")])
def test_dinov2_at_14_and_dinov3_run_from_panel_to_record(layout, arch, tmp_path, capsys):
    """/14 (DINOv2 with registers): the square800 view centre-padded to 812 px, 58 × 58 patches;
    DINOv3 (4 storage tokens, RoPE): 50 × 50. The errors equal a plain numpy float64 per-keypoint loop."""
    import xarray as xr

    from probe_toolkit.demo import samples

    folder = write_spair(tmp_path / "SPair-71k", {"cat": 2}, seed=2)
    checkpoint = write_checkpoint(tmp_path / f"{layout}.pth", layout, getattr(samples, arch), seed=1)
    cache = tmp_path / "cache"
    add_panel("sp", folder, None, "val", cache=cache, kind="spair", split="test")
    store = extract(checkpoint, folder / "JPEGImages", settings=Settings(views=("square800",), dtype="float32"), cache_dir=cache, quiet=True).store
    code, printed = probe_main(["correspond", str(store), "--panel", "sp", "--workers", "1", "--cache", str(cache), "-q"], capsys)
    assert code == 0, printed.err
    side = 58 if "dinov2" in layout else 50
    ds = xr.open_zarr(store)
    assert ds.sizes["patch_square800"] == side * side
    record = load(store, "correspond")
    assert record.attrs["grid"] == [side, side]
    assert_plain_errors(record, ds, folder, side)


def test_the_same_pck_at_one_and_two_workers_on_a_cluster_and_in_shards(spair, capsys, monkeypatch):
    """Every number of the record (PCK table, means, every error and match) is the same bits at
    --workers 1 and 2, on a dask cluster, and in three shards (the last one to finish scores)."""
    distributed = pytest.importorskip("distributed")
    from probe_toolkit.commands import correspond as command
    from probe_toolkit.protocols.api import run

    folder, _, cache, store = spair
    monkeypatch.setattr(command, "BLOCK", 2)  # several blocks of pairs, so workers and shards split them
    given = dict(panel="sp-test", unseal="placement", instances=3, cache_dir=cache)
    runs = [run("correspond", store, workers=1, **given), run("correspond", store, workers=2, **given)]
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        runs.append(run("correspond", store, dask_address=cluster.scheduler_address, **given))
    saved = [load(store, "correspond", r.run_id) for r in runs]
    n_pairs = saved[0].sizes["pair"]
    assert n_pairs > 6  # three shards of whole 2-pair blocks: each holds some
    for shard, last in (("2/3", False), ("0/3", False), ("1/3", True)):
        code, printed = probe_main(
            ["correspond", store, "--panel", "sp-test", "--unseal", "shards", "--instances", "3", "--shard", shard, "--workers", "1", "--cache", cache, "-q"], capsys
        )
        assert code == 0, printed.err
        assert ("PCK@0.1" in printed.out) == last and ("waiting for shards" in printed.out) != last, printed.out
    saved.append(load(store, "correspond"))
    parts = [load(store, f"correspond-part-{i}-of-3") for i in range(3)]
    sizes = [p.sizes["pair"] for p in parts]
    assert all(size > 0 and size % 2 == 0 for size in sizes[:2]) and sum(sizes) == n_pairs  # whole blocks, every pair once
    for other in saved[1:]:
        for name in ("pck", "pck_mean", "error", "predicted", "sampled", "source_xy", "target_xy"):
            np.testing.assert_array_equal(other[name].values, saved[0][name].values, err_msg=name)
        assert list(other.pair.values) == list(saved[0].pair.values)
    assert [r.placement.dask_address is not None for r in runs] == [False, False, True]


def test_a_block_the_panels_own_store_lacks_is_one_line_naming_that_store_before_any_label(spair, capsys, tmp_path):
    """A store of other photographs reads the panel's tokens from the store beside it
    (``<network>-panel-<panel>.zarr``): a block that store lacks is refused naming its extraction,
    which works when pasted, and no label is read before."""
    import shlex

    from probe_toolkit.demo.samples import sample_photos

    _, checkpoint, cache, _ = spair
    main = extract(checkpoint, sample_photos(), settings=Settings(views=(224,)), store=tmp_path / "photos" / "teacher.zarr", quiet=True).store
    beside = main.parent / "teacher-panel-sp-test.zarr"
    code, printed = probe_main(["extract", str(checkpoint), "--panel", "sp-test", "--views", "square800", "--store", str(beside), "--cache", str(cache), "-q"], capsys)
    assert code == 0, printed.err
    asked = ["correspond", str(main), "--panel", "sp-test", "--unseal", "test of the tests", "--cache", str(cache), "--block", "0", "-q"]
    before = len(ledger.entries(cache))
    code, printed = probe_main(asked, capsys)
    said = f"{beside} (the panel store beside {main}) holds none of what correspond reads (tokens_square800) at --block 0"
    assert code == 2 and len(printed.err.strip().splitlines()) == 1 and said in printed.err
    assert len(ledger.entries(cache)) == before
    code, printed = probe_main([*shlex.split(printed.err.split("`")[1])[1:], "-q"], capsys)
    assert code == 0, printed.err
    code, printed = probe_main(asked, capsys)
    assert code == 0, printed.err
    from probe_toolkit.results import records

    assert records.runs(main, "correspond")[-1].meta["selection"]["block"] == 0


def test_a_panel_no_store_holds_at_a_block_is_refused_with_the_extraction_at_that_block(spair, capsys, tmp_path):
    """A store of other photographs and no store of the panel's beside it, at ``--block 0``: the
    line's extraction writes the panel's store at that block (``--blocks 0``), so that the pasted
    command and the rerun are all it takes; the rerun's table says the block it read."""
    import shlex

    from probe_toolkit.demo.samples import sample_photos
    from probe_toolkit.results import records

    _, checkpoint, cache, _ = spair
    main = extract(checkpoint, sample_photos(), settings=Settings(views=(224,)), store=tmp_path / "photos" / "teacher.zarr", quiet=True).store
    asked = ["correspond", str(main), "--panel", "sp-test", "--unseal", "test of the tests", "--cache", str(cache), "--block", "0", "-q"]
    before = len(ledger.entries(cache))
    code, printed = probe_main(asked, capsys)
    fix = printed.err.split("`")[1]
    assert code == 2 and len(printed.err.strip().splitlines()) == 1 and " --blocks 0 --store " in fix, printed.err
    assert len(ledger.entries(cache)) == before
    code, printed = probe_main([*shlex.split(fix)[1:], "-q"], capsys)
    assert code == 0, printed.err
    code, printed = probe_main(asked, capsys)
    assert code == 0 and printed.out.rstrip().endswith("read at block 0 (0-based, as probe extract --blocks counts)"), printed.err
    assert records.runs(main, "correspond")[-1].meta["selection"]["block"] == 0


def test_a_store_holding_another_size_than_the_annotation_names_a_new_extraction(spair, capsys, monkeypatch):
    """Where the store holds an image at another size than its annotation (photographs replaced
    before stores recorded their digests), the line's fix is the whole extraction of the panel's
    photographs into a new store, never a placeholder."""
    from probe_toolkit.commands import correspond as command

    folder, checkpoint, cache, store = spair
    held = command._sizes
    monkeypatch.setattr(command, "_sizes", lambda ds, ids: {k: (w + 1, h) for k, (w, h) in held(ds, ids).items()})
    code, printed = probe_main(["correspond", str(store), "--panel", "sp-test", "--unseal", "test of the tests", "--cache", str(cache), "-q"], capsys)
    fix = printed.err.split("`")[1]
    assert code == 2 and len(printed.err.strip().splitlines()) == 1 and "its annotation says" in printed.err, printed.err
    assert fix.startswith(f"probe extract {checkpoint} --images {folder / 'JPEGImages'} --views square800 ")
    assert f"--store {store.with_name('teacher-new.zarr')} --cache {cache}" in fix
