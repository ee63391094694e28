"""``probe decode --view native``, ``--view native_crop`` and ``--view native_resized``: each image
cut on its own rows x cols grid, masks at its own size.

The references below are plain, independent re-implementations written here (float64, dense
``scipy.linalg.eigh`` of the generalized problem, loops over the grid), run image by image on the
(rows, cols) keys that TokenCut's and LOST's code would see on the zero-padded image, or DSM's
on the image cut to whole patches (native_crop), or TokenCut's saliency code's on the image
resized to round(side/p) patches (native_resized), whose masks come back by torch's
``F.interpolate(mode='nearest')`` as its object_discovery.py brings them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.linalg
import scipy.ndimage
import torch
from decoder_scenes import run_main
from PIL import Image
from pycocotools import mask as mask_utils
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.labels.masks import decode_rle, saved_masks
from probe_toolkit.results import records
from probe_toolkit.store import cache
from probe_toolkit.store.create import create_store

runner = CliRunner()
P = 16
# (name, height, width, planted objects as patch rectangles (r0, r1, c0, c1) on the native grid)
SCENES = [
    ("wide.png", 100, 170, [(4, 7, 7, 11)]),  # 7 x 11, the object touches the bottom-right (partial) patches
    ("tall.png", 150, 90, [(1, 5, 1, 4), (6, 9, 2, 5)]),  # 10 x 6
    ("low.png", 64, 130, [(1, 3, 2, 6)]),  # 4 x 9
]


def grid_of(h, w, view="native"):
    """native: padded up to whole patches (TokenCut, LOST); native_crop: cut down to them (DSM);
    native_resized: round(side/p), Python's round (TokenCut's resize_pil), at least 1."""
    if view == "native_resized":
        return max(1, round(h / P)), max(1, round(w / P))
    return (h // P, w // P) if view == "native_crop" else (-(-h // P), -(-w // P))


def planted(rows, cols, objects, seed, channels=12, noise=0.05, away=False):
    """Keys with a mean per object and one for the background: orthogonal (a well-posed Fiedler
    vector for the cuts and DSM), or with objects pointing away from the background (dot -0.5),
    so that LOST's positive graph separates them (with orthogonal means it spans the grid)."""
    rng = np.random.default_rng(seed)
    label = np.zeros((rows, cols), dtype=int)
    for k, (r0, r1, c0, c1) in enumerate(objects):
        label[r0:r1, c0:c1] = k + 1
    means = np.linalg.qr(rng.standard_normal((channels, len(objects) + 1)))[0].T
    if away:
        means = np.vstack([means[0], -0.5 * means[0] + np.sqrt(0.75) * means[1:]])
    return (means[label.ravel()] + noise * rng.standard_normal((rows * cols, channels))).astype(np.float32)


@pytest.fixture(scope="module")
def native_stores(tmp_path_factory):
    """(view, away) -> that view's store of the scenes, made once per module on first use."""
    made = {}

    def store(view="native", away=False):
        if (view, away) not in made:
            made[view, away] = make_native(tmp_path_factory.mktemp(f"{view}-{'away' if away else 'centre'}"), away=away, view=view)
        return made[view, away]

    return store


@pytest.fixture(scope="module")
def native(native_stores):
    return native_stores()


def make_native(folder, away, view="native"):
    """A store holding only keys_<view> (NaN padding past each image's rows·cols patches)."""
    grids = [grid_of(h, w, view) for _, h, w, _ in SCENES]
    most = max(r * c for r, c in grids)
    keys = np.full((len(SCENES), most, 12), np.nan, dtype=np.float32)
    per_image = []
    for i, ((_, _h, _w, objects), (r, c)) in enumerate(zip(SCENES, grids)):
        per_image.append(planted(r, c, objects, seed=i, away=away))
        keys[i, : r * c] = per_image[-1]
    manifest = {
        "kind": "probe-store",
        "checkpoint": {"path": "synthetic.pth", "sha256": "cd" * 32, "format": "synthetic"},
        "network": "teacher",
        "arch": {"width": 12, "patch": P, "class_token": False},
        "views": [view],
        "per_view": {view: {"patch": P, "patches": most}},
        "interpolation": "dino",
        "attention": "none",
        "dtype": "float32",
        "chunk": 2,
        "image_list_sha256": "0" * 64,
        "n_images": len(SCENES),
    }
    rows = np.array([g[0] for g in grids]), np.array([g[1] for g in grids])
    store = folder / "store.zarr"
    writer = create_store(store, manifest, [s[0] for s in SCENES], {f"keys_{view}": ((f"patch_{view}", "channel"), (most, 12))}, view_grids={view: rows})
    sizes = np.array([[h, w] for _, h, w, _ in SCENES])
    for start in range(0, len(SCENES), 2):
        stop = min(start + 2, len(SCENES))
        writer.write(start, {f"keys_{view}": keys[start:stop]}, sizes[start:stop], np.zeros(stop - start, dtype=bool))
    return store, per_image, grids


# ----------------------------------------------------------------------------------------------
# the references, plain


def ref_fiedler(keys, tau, eps, center, painted=None):
    f = np.asarray(keys, dtype=np.float64)
    if center:
        f = f - f.mean(axis=0)
    if painted is not None:
        f = np.where(painted[:, None], 0.0, f)
    norm = np.linalg.norm(f, axis=1, keepdims=True)
    f = np.divide(f, norm, out=np.zeros_like(f), where=norm > 0)
    w = np.where(f @ f.T > tau, 1.0, eps)
    d = np.diag(w.sum(axis=1))
    _, vectors = scipy.linalg.eigh(d - w, d, subset_by_index=[1, 2])
    x = vectors[:, 0]
    return -x if x[np.argmax(np.abs(x))] < 0 else x


def ref_component(side, seed, rows, cols, structure=None):
    labels, _ = scipy.ndimage.label(side.reshape(rows, cols), structure=structure)
    return (labels == labels.reshape(-1)[seed]).reshape(-1)


def ref_tokencut(keys, rows, cols, center):
    x = ref_fiedler(keys, 0.2, 1e-5, center)
    return [ref_component(x > x.mean(), int(np.argmax(x)), rows, cols)]


def ref_maskcut(keys, rows, cols, tau=0.15, count=3):
    n = rows * cols
    corners = [0, cols - 1, n - cols, n - 1]
    painted, previous, out = np.zeros(n, bool), None, []
    for t in range(count):
        if t and (~painted).sum() <= 0.01 * n:
            break
        x = ref_fiedler(keys, tau, 1e-5, False, painted if t else None)
        side = x > x.mean()
        seed = int(np.argmax(x))
        if sum(side[k] for k in corners) >= 3:
            side, seed = ~side, int(np.argmax(-x))
        found = ref_component(side, seed, rows, cols)
        if previous is not None and ((found & previous).sum() / (found | previous).sum() > 0.5 or found.sum() <= 0.01 * n):
            break
        mask = found & ~painted
        if not mask.any():
            break
        out.append(mask)
        previous, painted = found, painted | found
    return out


def ref_lost(keys, rows, cols, k=100):
    a = np.asarray(keys, dtype=np.float64) @ np.asarray(keys, dtype=np.float64).T
    degree = [sum(1 for j in range(len(a)) if j != i and a[i, j] > 0) for i in range(len(a))]
    order = sorted(range(len(a)), key=lambda i: (degree[i], i))
    seed = order[0]
    similar = [p for p in order[:k] if a[seed, p] > 0]
    expansion = a[similar].sum(axis=0)
    return [ref_component(expansion > 0, seed, rows, cols)]


def ref_dsm(keys, rows, cols):
    f = np.asarray(keys, dtype=np.float64)
    f = f / np.linalg.norm(f, axis=1, keepdims=True)
    w = np.maximum(f @ f.T, 0.0)
    w = w / w.max()
    d = np.diag(np.maximum(w.sum(axis=1), 1e-12))
    _, vectors = scipy.linalg.eigh(d - w, d, subset_by_index=[1, 2])
    v = vectors[:, 0]
    v = -v if v[np.argmax(np.abs(v))] < 0 else v
    if 0.5 < np.mean(v > 0) < 1.0:
        v = -v
    labels, count = scipy.ndimage.label((v > 0).reshape(rows, cols), structure=np.ones((3, 3)))
    sizes = [(labels == k).sum() for k in range(1, count + 1)]
    return [(labels == 1 + int(np.argmax(sizes))).reshape(-1)]


REFERENCES = {
    "centred": lambda k, r, c: ref_tokencut(k, r, c, True),
    "tokencut": lambda k, r, c: ref_tokencut(k, r, c, False),
    "maskcut": ref_maskcut,
    "lost": ref_lost,
    "dsm": ref_dsm,
}


def interpolated(patch_mask, rows, cols, h, w):
    """TokenCut's saliency masks at the original size: torch's F.interpolate(size=(h, w), mode='nearest')."""
    grid = torch.from_numpy(np.asarray(patch_mask, dtype=bool).reshape(rows, cols))
    return (torch.nn.functional.interpolate(grid[None, None].float(), size=(h, w), mode="nearest")[0, 0] > 0).numpy()


def pixels(patch_mask, rows, cols, h, w, view="native"):
    """The original-size mask, pixel by pixel: pixel (y, x) lies in patch (y // p, x // p), or in
    none past the grid (native_crop's last < p rows and columns); resized, torch's nearest."""
    if view == "native_resized":
        return interpolated(patch_mask, rows, cols, h, w)
    grid = patch_mask.reshape(rows, cols)
    out = np.zeros((h, w), dtype=bool)
    for y in range(h):
        for x in range(w):
            out[y, x] = y // P < rows and x // P < cols and grid[y // P, x // P]
    return out


# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("view", ["native", "native_crop", "native_resized"])
@pytest.mark.parametrize("preset", list(REFERENCES))
def test_every_preset_cuts_each_image_on_its_own_grid(native_stores, preset, view, tmp_path):
    store, per_image, grids = native_stores(view, away=preset == "lost")
    assert grids == [grid_of(h, w, view) for _, h, w, _ in SCENES]
    out = tmp_path / "m.json"
    result = runner.invoke(app, ["decode", str(store), "--view", view, "--preset", preset, "-q", "--workers", "1", "--out", str(out), "--cache", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    saved = records.load(store, "decoder")
    assert saved.attrs["view"] == view and saved.sizes["patch"] == max(r * c for r, c in grids)
    np.testing.assert_array_equal(saved["grid_rows"].values, [g[0] for g in grids])
    np.testing.assert_array_equal(saved["grid_cols"].values, [g[1] for g in grids])
    results = json.loads(out.read_text())
    for i, ((name, h, w, _), keys, (r, c)) in enumerate(zip(SCENES, per_image, grids)):
        expected = REFERENCES[preset](keys, r, c)
        n = int(saved["n_masks"].values[i])
        assert n == len(expected), (preset, name)
        masks = saved["masks"].values[i].astype(bool)
        for k, ref in enumerate(expected):
            np.testing.assert_array_equal(masks[k, : r * c], ref, err_msg=f"{preset} {name} mask {k}")
        assert not masks[:, r * c :].any()  # padding never becomes a mask
        mine = sorted((x for x in results if x["file_name"] == name), key=lambda x: x["mask"])
        assert [x["segmentation"]["size"] for x in mine] == [[h, w]] * n
        for x, ref in zip(mine, expected):
            full = decode_rle(x["segmentation"])
            np.testing.assert_array_equal(full, pixels(ref, r, c, h, w, view))
            assert x["patch_box"] == box_of_patches(ref, r, c, h, w, view)
            if view == "native_resized":
                continue
            assert not full[r * P :].any() and not full[:, c * P :].any()  # native_crop: the strip under no patch is 0
            x1, y1, x2, y2 = x["patch_box"]
            assert x2 <= min(c * P, w) and y2 <= min(r * P, h) and x1 % P == 0 and y1 % P == 0  # patch-aligned, inside the view


def box_of_patches(patch_mask, rows, cols, h, w, view):
    """LOST's box of the mask's patches, in pixels: the pixel extent of the filled patch rectangle
    drawn as the mask is drawn (so box and mask agree in every view)."""
    r, c = np.nonzero(np.asarray(patch_mask, dtype=bool).reshape(rows, cols))
    filled = np.zeros((rows, cols), dtype=bool)
    filled[r.min() : r.max() + 1, c.min() : c.max() + 1] = True
    ys, xs = np.nonzero(pixels(filled.ravel(), rows, cols, h, w, view))
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


@pytest.mark.parametrize("h, w", [(500, 333), (256, 257), (300, 200), (24, 40), (264, 280), (122, 382), (9, 23)])
def test_native_resized_masks_come_back_as_torchs_nearest_interpolate(h, w):
    """Random patch masks on the round(h/16) x round(w/16) grid, drawn at h x w by labels.masks,
    equal F.interpolate(mode='nearest') (float32 source indices: 122 x 382 has borders where the
    exact quotient y * rows / h picks another patch), and the box is the mask's patches' extent."""
    from probe_toolkit.labels.masks import patch_box_native, upsample_native

    rows, cols = grid_of(h, w, "native_resized")
    if (h, w) == (122, 382):  # the exact quotient picks patch 4 for row 61 and 12 for column 191; torch picks 3 and 11
        assert 61 * rows // h == 4 and 191 * cols // w == 12
        assert interpolated(np.arange(rows) == 3, rows, 1, h, 1)[61, 0] and interpolated(np.arange(cols) == 11, 1, cols, 1, w)[0, 191]
    rng = np.random.default_rng(h * w)
    for _ in range(3):
        mask = rng.random((rows, cols)) < 0.4
        mask[rng.integers(rows), rng.integers(cols)] = True
        ours = upsample_native(mask, h, w, P, "native_resized")
        assert ours.shape == (h, w)
        np.testing.assert_array_equal(ours, interpolated(mask, rows, cols, h, w))
        assert patch_box_native(mask, h, w, P, "native_resized") == box_of_patches(mask, rows, cols, h, w, "native_resized")


def test_planted_object_box_and_corloc_at_the_original_size(native, tmp_path):
    """The object at the bottom-right of wide.png (patches rows 4..6, cols 7..10 of 7 x 11) is the
    pixel box [112, 64, 170, 100]: the last row and column of patches are clipped at the edge."""
    store, _, _ = native
    folder = tmp_path / "panel"
    (folder / "images").mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for i, (name, h, w, objects) in enumerate(SCENES, start=1):
        Image.fromarray(np.full((h, w, 3), 90, np.uint8)).save(folder / "images" / name)
        coco["images"].append({"id": i, "file_name": name, "height": h, "width": w})
        for r0, r1, c0, c1 in objects:
            m = np.zeros((h, w), dtype=bool)
            m[r0 * P : r1 * P, c0 * P : c1 * P] = True  # numpy clips at the image edge
            rle = mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": i,
                    "category_id": 1,
                    "segmentation": rle,
                    "bbox": mask_utils.toBbox(rle).tolist(),
                    "area": float(m.sum()),
                    "iscrowd": 0,
                }
            )
    (folder / "panel.json").write_text(json.dumps(coco))
    root = tmp_path / "cache"
    added = runner.invoke(
        app, ["panel", "add", "val", "--annotations", str(folder / "panel.json"), "--images", str(folder / "images"), "--role", "val", "--cache", str(root)]
    )
    assert added.exit_code == 0, added.output
    out = tmp_path / "m.json"
    result = runner.invoke(
        app, ["decode", str(store), "--view", "native", "--preset", "tokencut", "--panel", "val", "-q", "--workers", "1", "--out", str(out), "--cache", str(root)]
    )
    assert result.exit_code == 0, result.output
    wide = next(x for x in json.loads(out.read_text()) if x["file_name"] == "wide.png")
    assert wide["patch_box"] == [112.0, 64.0, 170.0, 100.0]
    assert wide["bbox"] == [112.0, 64.0, 58.0, 36.0]
    scores = records.load(store, "scores_val")
    assert float(scores["corloc"]) == 1.0
    # the sweep decodes the same native keys: TokenCut finds every planted box, LOST's k = 100 graph here does not
    (tmp_path / "g.toml").write_text('preset = ["tokencut", "lost"]\ncenter = [false]\ntau = [0.2]\neps = [1e-5]\nmasks = [1]\n')
    swept = runner.invoke(
        app,
        [
            "decode-sweep",
            str(store),
            "--view",
            "native",
            "--panel",
            "val",
            "--grid",
            str(tmp_path / "g.toml"),
            "--metric",
            "corloc",
            "-q",
            "--workers",
            "1",
            "--cache",
            str(root),
            "--json",
            str(tmp_path / "t.json"),
        ],
    )
    assert swept.exit_code == 0, swept.output
    table = {row["preset"]: row for row in json.loads((tmp_path / "t.json").read_text())["table"]}
    assert table["tokencut"]["corloc"] == 1.0 and table["lost"]["corloc"] < 1.0


@pytest.mark.parametrize("view", ["native", "native_resized"])
def test_own_size_shards_assemble_the_one_process_decode(native_stores, view, tmp_path, capsys):
    """Two shards of whole chunks (2 + 1 images, each on its own grid) give the one-process arrays
    and masks JSON, and the shards' arrays still carry each image's grid."""
    import shutil

    store = tmp_path / "store.zarr"
    shutil.copytree(native_stores(view)[0], store)
    args = ["decode", str(store), "--view", view, "--preset", "tokencut", "-q", "--workers", "1", "--cache", str(tmp_path / "c")]
    assert run_main(args, capsys)[0] == 0
    whole = records.load(store, "decoder").load()
    one = (store / "results" / "decoder-masks.json").read_text()
    shutil.rmtree(store / "results")
    assert run_main([*args, "--shard", "0/2"], capsys) == (0, "")
    assert records.load(store, "decoder") is None and records.load(store, "decoder-part-0-of-2")["masks"].shape[0] == 2
    assert run_main([*args, "--shard", "1/2"], capsys)[0] == 0
    sharded = records.load(store, "decoder").load()
    assert set(sharded.variables) == set(whole.variables)
    for name in whole.variables:
        np.testing.assert_array_equal(sharded[name].values, whole[name].values, err_msg=name)
    np.testing.assert_array_equal(sharded["grid_rows"].values, [grid_of(h, w, view)[0] for _, h, w, _ in SCENES])
    assert (store / "results" / "decoder-masks.json").read_text() == one


@pytest.mark.parametrize("view", ["native", "native_crop"])
def test_the_torch_backend_batches_each_grid_and_gives_the_scipy_masks(native_stores, view, tmp_path, capsys):
    """Images of one grid decode as one batch; every certified mask equals the scipy path's, and
    the masks JSON draws each on its own grid."""
    store, _, grids = native_stores(view)
    got = {}
    for backend in ("scipy", "torch"):
        out = tmp_path / f"{backend}.json"
        code, err = run_main(
            [
                "decode",
                str(store),
                "--view",
                view,
                "--preset",
                "tokencut",
                "--masks",
                "2",
                "--backend",
                backend,
                "-q",
                "--workers",
                "1",
                "--out",
                str(out),
                "--cache",
                str(tmp_path / "c"),
            ],
            capsys,
        )
        assert code == 0, err
        got[backend] = (records.load(store, "decoder").load(), json.loads(out.read_text()))
    (scipy_ds, scipy_json), (torch_ds, torch_json) = got["scipy"], got["torch"]
    assert not torch_ds["degenerate"].values.any() and torch_ds.attrs["backend"] == "torch"
    for name in ("masks", "n_masks", "grid_rows", "grid_cols"):
        np.testing.assert_array_equal(torch_ds[name].values, scipy_ds[name].values, err_msg=name)
    np.testing.assert_allclose(torch_ds["score"].values, scipy_ds["score"].values, rtol=1e-6)
    assert [x["segmentation"] for x in torch_json] == [x["segmentation"] for x in scipy_json]
    assert len({tuple(g) for g in grids}) == len(grids)  # three grids: three batches of one


def test_a_bad_view_is_one_line(native, tmp_path, capsys):
    store, _, _ = native
    code, err = run_main(["decode", str(store), "--view", "natve", "-q", "--cache", str(tmp_path / "c")], capsys)
    assert code == 2 and "--view 'natve' is not one of" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------------------------
# DSM on the view its code reads: lukemelas/deep-spectral-segmentation extract/extract.py cuts each
# image to whole patches (images[:, :, :H_patch * P, :W_patch * P]), the native_crop view


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, tiny_checkpoints):
    """Synthetic scenes of SCENES' sizes (none a multiple of 16 on both sides), extracted with the
    tiny DINO checkpoint in the three own-size views."""
    from conftest import synthetic_scene

    folder = tmp_path_factory.mktemp("scenes")
    for i, (name, h, w, objects) in enumerate(SCENES):
        synthetic_scene(folder / name, (w, h), [(c0 * P, r0 * P, c1 * P, r1 * P) for r0, r1, c0, c1 in objects], seed=i)
    store = folder / "store.zarr"
    result = runner.invoke(
        app,
        [
            "extract",
            str(tiny_checkpoints["dino-full"]),
            "--images",
            str(folder),
            "--views",
            "native,native_crop,native_resized",
            "--dtype",
            "float32",
            "--store",
            str(store),
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    return store, folder


def decode_dsm(store, view, tmp_path, *extra):
    out, summary = tmp_path / f"{view}.json", tmp_path / f"{view}-summary.json"
    result = runner.invoke(
        app,
        [
            "decode",
            str(store),
            "--view",
            view,
            "--preset",
            "dsm",
            *extra,
            "-q",
            "--workers",
            "1",
            "--out",
            str(out),
            "--json",
            str(summary),
            "--cache",
            str(tmp_path / "cache"),
        ],
    )
    assert result.exit_code == 0, result.output
    masks = {x["file_name"]: decode_rle(x["segmentation"]) for x in json.loads(out.read_text())}
    return records.load(store, "decoder"), masks, json.loads(summary.read_text())


def test_dsm_on_native_crop_is_dsms_rule_on_the_cut_images_keys(extracted, tmp_path):
    store, _ = extracted
    ds = cache.open_store(store, arrays="keys_native_crop")
    keys = cache.require(ds, "keys_native_crop").values
    saved, crop_masks, summary = decode_dsm(store, "native_crop", tmp_path)
    assert summary["published_view"] == "native_crop" and summary["warnings"] == []
    ids = [str(v) for v in saved.image.values]
    for i, name in enumerate(ids):
        _, h, w, _ = next(s for s in SCENES if s[0] == name)
        r, c = grid_of(h, w, "native_crop")
        assert (int(saved["grid_rows"].values[i]), int(saved["grid_cols"].values[i])) == (r, c)
        (expected,) = ref_dsm(keys[i, : r * c], r, c)
        np.testing.assert_array_equal(saved["masks"].values[i, 0, : r * c].astype(bool), expected, err_msg=name)
        full = crop_masks[name]
        assert full.shape == (h, w) and not full[r * P :].any() and not full[:, c * P :].any()  # the uncut strip: no patch, 0
        np.testing.assert_array_equal(full, pixels(expected, r, c, h, w))
    _, native_masks, native_summary = decode_dsm(store, "native", tmp_path)
    assert native_summary["published_view"] == "native_crop" and len(native_summary["warnings"]) == 1
    assert "cut to whole patches (native_crop view); these are the native view's keys" in native_summary["warnings"][0]
    differ = [name for name in ids if not np.array_equal(native_masks[name], crop_masks[name])]
    assert differ, "the padded and the cut image give the same DSM masks on every image"


@pytest.mark.parametrize("view", ["native_crop", "native_resized"])
def test_dsm_colour_term_on_native_crop_resizes_the_whole_photograph(extracted, tmp_path, view):
    """DSM's extract.py resizes the file itself to the cut grid (Image.open(...).resize((W_pad_lr,
    H_pad_lr), Image.BILINEAR), W_pad_lr = W // P): the colour affinity of the whole photograph.
    native_resized's keys saw the whole photograph too, so its photograph is resized the same way."""
    from probe_toolkit.analyses.dsm import dsm, knn_color_affinity

    store, folder = extracted
    keys = cache.require(cache.open_store(store, arrays=f"keys_{view}"), f"keys_{view}").values
    saved, _, _ = decode_dsm(store, view, tmp_path, "--color-lambda", "10")
    for i, name in enumerate(str(v) for v in saved.image.values):
        r, c = int(saved["grid_rows"].values[i]), int(saved["grid_cols"].values[i])
        small = np.asarray(Image.open(folder / name).convert("RGB").resize((c, r), Image.BILINEAR), dtype=np.float64) / 255
        want = dsm(keys[i, : r * c], (r, c), color=knn_color_affinity(small), color_lambda=10.0).mask
        np.testing.assert_array_equal(saved["masks"].values[i, 0, : r * c].astype(bool), want, err_msg=name)


def test_native_crop_on_a_store_without_it_says_how_to_get_it(native, tmp_path, capsys):
    store, _, _ = native
    code, err = run_main(["decode", str(store), "--view", "native_crop", "--preset", "dsm", "-q", "--cache", str(tmp_path / "c")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "has no array keys_native_crop" in err and "rerun `probe extract " in err and "--views native_crop" in err


# ----------------------------------------------------------------------------------------------
# TokenCut's saliency table on the view its script reads: unsupervised_saliency_detection/
# get_saliency.py resizes each image with LANCZOS to round(side/16)*16 (native_resized)


def saliency_panel(folder, root):
    """The planted boxes as 0/255 mask PNGs named like the scenes, registered as panel ``sal``."""
    masks = folder.parent / (folder.name + "-masks")
    masks.mkdir(exist_ok=True)
    for name, h, w, objects in SCENES:
        m = np.zeros((h, w), np.uint8)
        for r0, r1, c0, c1 in objects:
            m[r0 * P : r1 * P, c0 * P : c1 * P] = 255
        Image.fromarray(m).save(masks / name)
    added = runner.invoke(app, ["panel", "add", "sal", "--images", str(folder), "--masks", str(masks), "--role", "val", "--cache", str(root)])
    assert added.exit_code == 0, added.output


def test_tokencut_on_native_resized_is_tokencuts_cut_of_the_resized_images_keys(extracted, tmp_path):
    store, folder = extracted
    root = tmp_path / "cache"
    saliency_panel(folder, root)
    keys = cache.require(cache.open_store(store, arrays="keys_native_resized"), "keys_native_resized").values

    def decode(view):
        out, summary = tmp_path / f"{view}.json", tmp_path / f"{view}-summary.json"
        result = runner.invoke(
            app,
            [
                "decode",
                str(store),
                "--view",
                view,
                "--preset",
                "tokencut",
                "--panel",
                "sal",
                "-q",
                "--workers",
                "1",
                "--out",
                str(out),
                "--json",
                str(summary),
                "--cache",
                str(root),
            ],
        )
        assert result.exit_code == 0, result.output
        return records.load(store, "decoder"), json.loads(out.read_text()), json.loads(summary.read_text())

    saved, results, summary = decode("native-resized")  # the hyphen spelling
    assert saved.attrs["view"] == "native_resized"
    assert summary["published_view"] == "native_resized" and summary["warnings"] == []
    assert records.load(store, "saliency_sal").attrs["view"] == "native_resized"
    for i, name in enumerate(str(v) for v in saved.image.values):
        _, h, w, _ = next(s for s in SCENES if s[0] == name)
        r, c = grid_of(h, w, "native_resized")
        assert (int(saved["grid_rows"].values[i]), int(saved["grid_cols"].values[i])) == (r, c)
        (expected,) = ref_tokencut(keys[i, : r * c], r, c, False)
        np.testing.assert_array_equal(saved["masks"].values[i, 0, : r * c].astype(bool), expected, err_msg=name)
        (entry,) = [x for x in results if x["file_name"] == name]
        np.testing.assert_array_equal(decode_rle(entry["segmentation"]), interpolated(expected, r, c, h, w))
        np.testing.assert_array_equal(saved_masks(saved, i, h, w, (h, w))[0], interpolated(expected, r, c, h, w))  # the report's drawing
    assert grid_of(100, 170, "native_resized") == (6, 11) != grid_of(100, 170, "native")  # wide.png: another grid, not only a border
    _, _, native_summary = decode("native")
    assert native_summary["published_view"] == "native_resized" and len(native_summary["warnings"]) == 1
    assert native_summary["warnings"][0].startswith(
        "TokenCut's saliency table (unsupervised_saliency_detection/get_saliency.py) resizes each image with LANCZOS to round(·/16)·16; these are the native view's keys"
    )
    import probe_toolkit as probe

    scored = {view: probe.run("score", tmp_path / f"{view}.json", panel="sal", cache_dir=root).report.warnings for view in ("native-resized", "native")}
    assert scored["native-resized"] == [] and scored["native"] == native_summary["warnings"]  # probe score says it too
    code = runner.invoke(
        app,
        [
            "decode",
            str(store),
            "--view",
            "native_resized",
            "--preset",
            "tokencut",
            "-q",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "x.json"),
            "--json",
            str(tmp_path / "x-summary.json"),
            "--cache",
            str(root),
        ],
    )
    assert code.exit_code == 0, code.output  # no panel: CorLoc's published view (native) is the one named
    assert json.loads((tmp_path / "x-summary.json").read_text())["published_view"] == "native"


def test_native_resized_on_a_store_without_it_says_how_to_get_it(native, tmp_path, capsys):
    store, _, _ = native
    code, err = run_main(["decode", str(store), "--view", "native_resized", "--preset", "tokencut", "-q", "--cache", str(tmp_path / "c")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "has no array keys_native_resized" in err and "rerun `probe extract " in err and "--views native_resized" in err
