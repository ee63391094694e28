"""``probe hummingbird`` from VOC-layout panels to a record: its views against torchvision's
transforms, every number against a plain re-implementation written here (torch's one-hot,
interpolation and softmax, an exhaustive float64 search, scipy's matching), the order of label
reads, refusals before any label is read, and the same numbers at any block size or worker count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from cli_runs import probe_main
from PIL import Image
from segmentation_folders import write_voc
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.labels import ledger
from probe_toolkit.labels.panels import list_panels
from probe_toolkit.results import records
from probe_toolkit.store import cache, hbird_views
from probe_toolkit.store.extract import Settings, extract

runner = CliRunner()
TRAIN = ["2007_000032", "2007_000039", "2007_000063", "2008_000002", "2009_000010"]
VAL = ["2007_000033", "2008_000001", "2010_000005"]
VIEWS = ("hbird512", "hbird512_aug0", "hbird512_aug1")
MEMORY = (100, 1000, None)  # 10 memory views: 10 and 100 patches each, and all 1024


def _scene(seed: int, size=(96, 72)) -> tuple[np.ndarray, np.ndarray]:
    """A textured image with coloured boxes and its label map (each box a class, a 255 band around it)."""
    rng = np.random.default_rng(seed)
    w, h = size
    pixels = rng.normal(110, 25, (h, w, 3)).clip(0, 255)
    label = np.zeros((h, w), np.uint8)
    for _ in range(2):
        cls = int(rng.integers(1, 21))
        x0, y0 = int(rng.integers(0, w - 30)), int(rng.integers(0, h - 30))
        x1, y1 = x0 + int(rng.integers(14, 30)), y0 + int(rng.integers(14, 30))
        label[max(y0 - 1, 0) : y1 + 1, max(x0 - 1, 0) : x1 + 1] = 255
        label[y0:y1, x0:x1] = cls
        pixels[y0:y1, x0:x1] = ((cls * 47) % 256, (cls * 91) % 256, (cls * 23) % 256)
    return pixels.astype(np.uint8), label


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    """A VOC2012 folder (train and val splits, palette masks), a tiny network's store of its
    images in the three Hummingbird views, and a cache where both panels are registered."""
    root = tmp_path_factory.mktemp("hbird")
    year = root / "VOCdevkit" / "VOC2012"
    labels = write_voc(year, {"train": TRAIN, "val": VAL}, lambda i, n: _scene(int(i.replace("_", "")), size=(96 + 8 * n, 72 + 4 * n)))
    checkpoint = write_checkpoint(root / "dino.pth", "dino-full", TINY, seed=3)
    store = extract(checkpoint, year / "JPEGImages", settings=Settings(views=VIEWS, chunk=4, dtype="float32"), cache_dir=root / "cache", quiet=True, batch_size=3).store
    c = str(root / "cache")
    for name, split, role in (("voc-train", "train", "train"), ("voc-val", "val", "val")):
        r = runner.invoke(app, ["panel", "add", name, "--voc-segmentation", str(year), "--split", split, "--role", role, "--cache", c])
        assert r.exit_code == 0, r.output
    return root, year, store, labels, checkpoint


# ----------------------------------------------------------------------------------------------
# the views, against torchvision's transforms (the reference's library)


def _reference_normalise(image: Image.Image) -> torch.Tensor:
    return TF.normalize(TF.to_tensor(image), [0.485, 0.456, 0.406], [0.229, 0.224, 0.255])


def _reference_memory_view(image: Image.Image, chosen, side: int) -> torch.Tensor:
    """open-hummingbird-eval's train chain, written out with torchvision (``CombTransforms``: the
    image-only transform, then the shared one): colour jitter on the whole PIL image, ToTensor,
    Normalize, then ``F.resized_crop`` of the float tensor (bilinear, antialias) with the drawn box."""
    for factor, adjust in (
        (chosen.brightness, TF.adjust_brightness),
        (chosen.contrast, TF.adjust_contrast),
        (chosen.saturation, TF.adjust_saturation),
        (chosen.hue, TF.adjust_hue),
    ):
        if factor is not None:
            image = adjust(image, factor)
    top, left, h, w = chosen.box
    return TF.resized_crop(_reference_normalise(image), top, left, h, w, [side, side], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)


def test_views_are_torchvisions_transforms_with_the_drawn_parameters(voc):
    root, year, store, labels, _ = voc
    ds = cache.open_store(store)
    image = Image.open(year / "JPEGImages" / f"{TRAIN[1]}.jpg").convert("RGB")
    squashed = TF.resize(image, [512, 512], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    assert torch.equal(hbird_views.pixels(image, "hbird512", f"{TRAIN[1]}.jpg"), _reference_normalise(squashed))
    for epoch, view in enumerate(hbird_views.AUGMENTED):
        chosen = hbird_views.draw(f"{TRAIN[1]}.jpg", epoch, *image.size)
        top, left, h, w = chosen.box
        assert 0 <= top and top + h <= image.height and 0 <= left and left + w <= image.width
        assert torch.equal(hbird_views.pixels(image, view, f"{TRAIN[1]}.jpg"), _reference_memory_view(image, chosen, 512))
        # the label: the same box, torchvision's nearest resize of the tensor (the reference's target path)
        y = labels[TRAIN[1]]
        target = TF.resized_crop(torch.from_numpy(y)[None], top, left, h, w, [512, 512], interpolation=TF.InterpolationMode.NEAREST)[0].numpy()
        assert np.array_equal(hbird_views.label_view(y, view, f"sub/{TRAIN[1]}.jpg"), target)  # keyed by file name, not folder
    # the store holds the network's tokens of exactly these pixels (one image re-run here)
    assert ds["tokens_hbird512_aug1"].shape == (len(TRAIN) + len(VAL), 1024, 128)


@pytest.mark.parametrize("side", [224, 504, 96])
def test_views_at_any_input_size_are_the_reference_chain_at_that_size(side):
    """``input_size`` 224 (hbird_evaluation's default) and 504 (DINOv2, as the README resizes it):
    the same draws, the reference's chain at that size; a box of exactly side × side is not resampled."""
    rng = np.random.default_rng(side)
    image = Image.fromarray(rng.integers(0, 256, (150, 201, 3)).astype(np.uint8))
    squashed = TF.resize(image, [side, side], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    assert torch.equal(hbird_views.pixels(image, "hbird512", "a.jpg", side=side), _reference_normalise(squashed))
    for epoch, view in enumerate(hbird_views.AUGMENTED):
        chosen = hbird_views.draw("a.jpg", epoch, *image.size)
        got = hbird_views.pixels(image, view, "a.jpg", side=side)
        assert got.shape == (3, side, side) and torch.equal(got, _reference_memory_view(image, chosen, side))
        label = rng.integers(0, 21, (150, 201)).astype(np.uint8)
        top, left, h, w = chosen.box
        target = TF.resized_crop(torch.from_numpy(label)[None], top, left, h, w, [side, side], interpolation=TF.InterpolationMode.NEAREST)[0].numpy()
        assert np.array_equal(hbird_views.label_view(label, view, "a.jpg", side=side), target)
    exact = hbird_views.Draw((10, 20, side, side), 1.05, None, 0.95, 0.04)  # the box already at the input size
    big = Image.fromarray(rng.integers(0, 256, (side + 30, side + 40, 3)).astype(np.uint8))
    assert torch.equal(hbird_views.augmented(big, exact, side), _reference_memory_view(big, exact, side))


def test_jitter_before_the_crop_is_not_the_old_order():
    """The order matters: jitter on the 8-bit crop (probe before this fix) lands up to many grey levels
    away from jitter on the whole image before the float crop (the reference)."""
    rng = np.random.default_rng(5)
    image = Image.fromarray(rng.integers(0, 256, (120, 160, 3)).astype(np.uint8))
    chosen = hbird_views.Draw((7, 11, 90, 120), 1.08, 0.92, 1.1, 0.07)
    old = TF.resized_crop(image, 7, 11, 90, 120, [128, 128], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    for factor, adjust in ((1.08, TF.adjust_brightness), (0.92, TF.adjust_contrast), (1.1, TF.adjust_saturation), (0.07, TF.adjust_hue)):
        old = adjust(old, factor)
    new = hbird_views.augmented(image, chosen, 128)
    grey = (new - _reference_normalise(old)).abs() * torch.tensor([0.229, 0.224, 0.255])[:, None, None] * 255
    assert torch.equal(new, _reference_memory_view(image, chosen, 128)) and float(grey.max()) > 10.0


def test_the_crop_falls_back_to_torchvisions_centre_crop():
    class Never:  # every draw of scale 2 and ratio 1: ten misses, then the fallback
        def uniform(self, low, high):
            return high if high > 1 else 0.0

        def integers(self, low, high):
            raise AssertionError("no crop fits")

    assert hbird_views.crop_box(100, 40, Never()) == ((40 - 40) // 2, (100 - 53) // 2, 40, 53)  # wide: h = height, w = round(h · 4/3)
    assert hbird_views.crop_box(30, 100, Never()) == ((100 - 40) // 2, 0, 40, 30)  # tall: w = width, h = round(w · 4/3)
    assert hbird_views.crop_box(50, 50, Never()) == (0, 0, 50, 50)


def test_hue_shift_is_torchvisions_for_negative_and_positive_shifts():
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (9, 11, 3)).astype(np.uint8))
    for shift in (-0.1, -0.037, 0.0, 0.05, 0.1):
        assert np.array_equal(np.asarray(hbird_views.adjust_hue(image, shift)), np.asarray(TF.adjust_hue(image, shift)))


# ----------------------------------------------------------------------------------------------
# the protocol, against a plain re-implementation


def _plain(store: Path, train: list, val: list, memory, k=30, temperature=0.02, epochs=2, seed=123, n_classes=21, patch=16, eps=1e-6, size=512):
    """Every number of the protocol, computed here from the store's tokens and the label PNGs'
    arrays; ``train``, ``val``: (store id, label map at the image's size) in the panels' order.
    ``patch``: the network's (at 512 a /14 network reads the view's top-left 36 × 36 patches, 504 px);
    ``eps``: its final LayerNorm's (DINOv3: 1e-5); ``size``: the views' (hbird@S and its memory views)."""
    ds = cache.open_store(store)
    from probe_toolkit.store.checkpoints import load_checkpoint
    from probe_toolkit.store.views import hbird_views as views_at

    query, *memory_views = views_at(size)
    grid = size // patch
    cut, cells = grid * patch, grid * grid
    ck = load_checkpoint(Path(ds.attrs["manifest"]["checkpoint"]["path"]))
    width = int(ds[f"tokens_{query}"].shape[-1])
    ln = torch.nn.LayerNorm(width, eps=eps).double()
    ln.weight.data, ln.bias.data = ck.backbone["norm.weight"].double(), ck.backbone["norm.bias"].double()

    def tokens(view, sid):
        x = torch.from_numpy(ds[f"tokens_{view}"].sel(image=sid).values.astype(np.float64))
        with torch.no_grad():
            return F.normalize(ln(x), dim=1).numpy()

    views = [(e, sid, y) for e in range(epochs) for sid, y in train]  # epoch-major, as the reference's loop
    dists, feats = [], []
    for e, sid, label in views:
        y = torch.from_numpy(hbird_views.label_view(label, memory_views[e], sid)[:cut, :cut].astype(np.int64))
        y[y == 255] = 0
        patches = y.reshape(grid, patch, grid, patch).permute(0, 2, 1, 3).reshape(cells, patch * patch)
        dists.append(F.one_hot(patches, n_classes).double().mean(1).numpy())
        feats.append(tokens(memory_views[e], sid))
    out = []
    for size in memory:
        rng = np.random.default_rng(seed)
        rows_f, rows_l = [], []
        for d, f in zip(dists, feats):
            if size is None:
                keep = np.arange(cells)
            else:
                n = max(1, size // len(views))
                present = d > 0
                freq = present.sum(0)
                score = np.array([sum(freq[c] for c in range(n_classes) if present[p, c]) for p in range(cells)], np.float32)
                filled = present.any(1)
                score[~filled] = 1e6
                score[filled] *= rng.random(int(filled.sum()), dtype=np.float32)
                keep = np.argsort(score, kind="stable")[:n]
            rows_f.append(f[keep])
            rows_l.append(d[keep])
        bank, bank_labels = np.concatenate(rows_f), np.concatenate(rows_l)
        confusion = np.zeros((n_classes, n_classes), np.int64)
        shown = {}
        for sid, label in val:
            q = tokens(query, sid)
            sim = q @ bank.T
            order = np.argsort(-sim, axis=1, kind="stable")[:, :k]
            top = torch.from_numpy(np.take_along_axis(sim, order, 1))
            weights = torch.softmax(top / temperature, dim=1)
            soft = torch.einsum("qk,qkc->qc", weights, torch.from_numpy(bank_labels[order]))
            up = F.interpolate(soft.T.reshape(1, n_classes, grid, grid).float(), size=(cut, cut), mode="bilinear", align_corners=False)[0]
            predicted = up.argmax(0).numpy()
            truth = hbird_views.label_view(label, query, sid)[:cut, :cut]
            keep = truth != 255
            confusion += np.bincount(truth[keep].astype(np.int64) * n_classes + predicted[keep], minlength=n_classes**2).reshape(n_classes, n_classes)
            two = torch.topk(up, 2, dim=0).values
            # where float32 rounding may decide (probe computes in float32, as the reference): the argmax's margin, and
            # the pixels read from a patch whose k-th and (k+1)-th cosines lie within 1e-6 (bilinear reads the 2 x 2 patches around)
            ranked = -np.sort(-sim, axis=1)
            near = (ranked[:, k - 1] - ranked[:, k] < 1e-6) if sim.shape[1] > k else np.zeros(len(sim), bool)
            near = near.reshape(grid, grid)
            spread = near.copy()
            for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)):
                spread |= np.roll(near, (dy, dx), axis=(0, 1))
            tied = spread.repeat(patch, 0).repeat(patch, 1)
            shown[sid] = (truth, predicted, (two[0] - two[1]).numpy(), tied)
        out.append((confusion, shown, len(bank)))
    return out


def _iou(c):
    tp = np.diag(c).astype(np.float64)
    return tp / np.maximum(c.sum(0) + c.sum(1) - tp, 1e-8)


def test_every_number_equals_a_plain_computation(voc, tmp_path):
    root, year, store, labels, _ = voc
    c = str(root / "cache")
    out = tmp_path / "hb.json"
    before = len(ledger.entries(root / "cache"))
    r = runner.invoke(
        app,
        ["hummingbird", str(store), "--train", "voc-train", "--val", "voc-val", "--memory", "100,1000,full", "--cache", c, "--json", str(out), "-q", "--workers", "1"],
    )
    assert r.exit_code == 0, r.output
    assert "published, other weights: DINO ViT-S/16" in r.output and "37.2" in r.output and "77.0" in r.output
    summary = json.loads(out.read_text())
    plain = _plain(store, [(f"{i}.jpg", labels[i]) for i in TRAIN], [(f"{i}.jpg", labels[i]) for i in VAL], MEMORY)
    from scipy.optimize import linear_sum_assignment

    for m, (confusion, _shown, rows) in enumerate(plain):
        assert summary["bank_rows"][m] == rows
        iou = _iou(confusion)
        assert summary["iou"][m] == pytest.approx(iou.tolist(), abs=1e-12)
        assert summary["miou"][m] == pytest.approx(iou.mean(), abs=1e-12)  # over all 21 classes, absent ones 0
        pair = confusion / np.maximum(confusion.sum(1, keepdims=True) + confusion.sum(0, keepdims=True) - confusion, 1e-8)
        rows_, cols = linear_sum_assignment(1 - pair)
        folded = np.zeros_like(confusion)
        mapping = np.zeros(21, np.int64)
        mapping[cols] = rows_
        for p in range(21):
            folded[:, mapping[p]] += confusion[:, p]
        assert summary["miou_hungarian"][m] == pytest.approx(_iou(folded).mean(), abs=1e-12)
        assert summary["miou_hungarian"][m] >= summary["miou"][m]
    saved = records.load(store, "hummingbird")
    assert list(saved.memory.values) == ["100", "1000", "full"] and list(saved.per_view.values) == [10, 100, 0]
    assert np.array_equal(saved.confusion.values, np.stack([p[0] for p in plain]))
    assert list(saved.shown.values) == [f"{i}.jpg" for i in VAL]
    assert saved.attrs["computed_on"]["scope"] == "panel" and saved.attrs["computed_on"]["images"] == len(VAL)  # `probe table` groups by these
    for j, name in enumerate(VAL):
        assert np.array_equal(saved.truth.values[j], plain[0][1][f"{name}.jpg"][0])
        for m in range(3):
            assert np.array_equal(saved.prediction.values[m, j], plain[m][1][f"{name}.jpg"][1])
    entries = ledger.entries(root / "cache")[before:]
    assert [e.fields["purpose"] for e in entries] == ["hummingbird: memory", "hummingbird: score"]  # the val labels after the memory
    assert [e.fields["panel"] for e in entries] == ["voc-train", "voc-val"] and summary["ledger"]["val"] == entries[1].id


def test_the_memory_reads_each_train_image_once_whatever_the_portions(voc, monkeypatch):
    """Building the memory a portion at a time touches each train view's tokens and label map once
    (a portion's work is its own images', never the data set's): counted, not timed."""
    from probe_toolkit import run
    from probe_toolkit.commands import hummingbird_memory
    from probe_toolkit.labels import label_maps
    from probe_toolkit.store import direct

    root, _, store, _, _ = voc
    read, decoded = [], []
    values, decode = direct.StoreArray.values, label_maps.LabelMaps._decoded
    monkeypatch.setattr(direct.StoreArray, "values", property(lambda self: read.append((self.name, self.shape[0])) or values.fget(self)))
    monkeypatch.setattr(label_maps.LabelMaps, "_decoded", lambda self, i, raw: decoded.append(len(self)) or decode(self, i, raw))
    monkeypatch.setattr(hummingbird_memory, "READ_BLOCK", 2)
    run("hummingbird", store, train="voc-train", val="voc-val", memory=(100,), augmentation_epochs=2, cache_dir=root / "cache", workers=1)
    for view in ("hbird512_aug0", "hbird512_aug1"):
        assert [n for name, n in read if name == f"tokens_{view}"] == [2, 2, 1]  # 5 train images, two at a time, once
    assert decoded.count(len(TRAIN)) == 2 * len(TRAIN)  # each train map decoded once per epoch (the val maps: once)


def test_a_run_opens_its_store_once_for_its_checks_and_its_run(voc, monkeypatch):
    """The checks before the run (current photographs, panel coverage) and the run itself
    (``panel_stores.locate``) share one opening of the store (``cache.one_opening_each`` around a
    store-reading run): each opening reads the store's flags and checks every array again."""
    from probe_toolkit import run

    root, _, store, _, _ = voc
    opened, real = [], cache._open_store
    monkeypatch.setattr(cache, "_open_store", lambda path, **kw: opened.append(Path(path).resolve()) or real(path, **kw))
    run("hummingbird", store, train="voc-train", val="voc-val", memory=(100,), augmentation_epochs=2, cache_dir=root / "cache", workers=1)
    assert opened == [Path(store).resolve()]


def test_the_photographs_check_looks_the_stores_ids_up_once_as_arrays(voc, monkeypatch):
    """The check that the panel's photographs are those extracted (every protocol, before its labels)
    looks the panel's ids up among the store's as sorted arrays (``infra.names.lookup``: once for the
    ids the store holds, once for their positions), not once per panel image (quadratic in the data
    set) nor through a set of a data set's names."""
    from probe_toolkit.infra import names
    from probe_toolkit.protocols import coverage

    root, _, store, _, _ = voc
    looked_up, lookup = [], names.lookup

    def counted(held, wanted):
        looked_up.append((len(held), len(wanted)))
        return lookup(held, wanted)

    def refused(*_):
        raise AssertionError("a set of the store's ids")

    monkeypatch.setattr(names, "lookup", counted)
    monkeypatch.setattr(coverage, "set", refused, raising=False)  # the module's name `set` before the builtin
    coverage.current_photographs(store, "voc-train", root / "cache")
    assert len(looked_up) == 2 and all(wanted <= len(TRAIN) + len(VAL) for _, wanted in looked_up)


def test_numbers_do_not_depend_on_blocks_or_workers(voc, monkeypatch):
    """Blocks of val views, of bank rows (``work_memory`` 16 MiB: 512 rows of products per block),
    portions of memory views and of label maps of any size (the memory built two views at a time,
    the maps decoded two at a time), on 1 or 2 workers: the same numbers. The two workers are
    forked before the train labels are read (a forked worker starts as a copy of the command's
    memory) and gone before the val labels are."""
    import multiprocessing

    from probe_toolkit import run
    from probe_toolkit.commands import hummingbird as command
    from probe_toolkit.commands import hummingbird_memory
    from probe_toolkit.labels import label_maps
    from probe_toolkit.protocols.context import RunContext

    root, year, store, labels, _ = voc
    first = run("hummingbird", store, train="voc-train", val="voc-val", memory=(100, None), cache_dir=root / "cache", workers=1)
    monkeypatch.setattr(command, "QUERY_BLOCK", 1)  # three blocks of the three val views: both workers search
    monkeypatch.setattr(hummingbird_memory, "READ_BLOCK", 2)
    monkeypatch.setattr(label_maps, "PORTION", 2)
    reads, read, others = [], RunContext.read, len(multiprocessing.active_children())

    def counted(self, role, *args, **kwargs):  # the command's worker processes alive at each label read
        reads.append((role, len(multiprocessing.active_children()) - others))
        return read(self, role, *args, **kwargs)

    monkeypatch.setattr(RunContext, "read", counted)
    second = run("hummingbird", store, train="voc-train", val="voc-val", memory=(100, None), cache_dir=root / "cache", workers=2, work_memory=16)
    assert reads == [("train", 2), ("val", 0)]
    a, b = (records.load(store, "hummingbird", r.run_id) for r in (first, second))
    for name in ("confusion", "prediction", "miou", "miou_hungarian", "bank_rows"):
        assert np.array_equal(a[name].values, b[name].values), name
    assert first.records[0].run_id != second.records[0].run_id  # two runs, two records


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]  # the GPU path where one is visible


@pytest.mark.parametrize("device", DEVICES)
def test_the_torch_search_gives_the_numpy_searchs_labels(voc, device):
    """--backend torch (on the CPU, and on a GPU where one is visible): every transferred label,
    every confusion count and every score equal the numpy path's; the record says which searched."""
    from probe_toolkit import run

    root, year, store, labels, _ = voc
    first = run("hummingbird", store, train="voc-train", val="voc-val", memory=(100, None), cache_dir=root / "cache", workers=1)
    second = run("hummingbird", store, train="voc-train", val="voc-val", memory=(100, None), cache_dir=root / "cache", workers=1, backend="torch", device=device)
    a, b = (records.load(store, "hummingbird", r.run_id) for r in (first, second))
    for name in ("confusion", "prediction", "truth", "miou", "miou_hungarian", "iou", "bank_rows"):
        assert np.array_equal(a[name].values, b[name].values), name
    assert "numpy" in a.attrs["search"] and f"torch on {device}" in b.attrs["search"]
    assert second.placement.backend == "torch"


@pytest.mark.parametrize("device", DEVICES)
def test_the_torch_search_equals_an_exhaustive_float64_search_with_ties_to_the_lower_row(device):
    from probe_toolkit.analyses import hummingbird as hb
    from probe_toolkit.analyses import search_torch as ht

    rng = np.random.default_rng(5)
    bank = hb.normalise(rng.normal(size=(700, 24)).astype(np.float32))
    bank[[40, 333, 650]] = bank[12]  # four equal rows: equal cosines rank by row
    queries = rng.normal(size=(90, 24)).astype(np.float32)
    queries[3] = bank[12]
    q = hb.normalise(queries)
    similarity, neighbour = ht.nearest(q, bank, 30, 128, device)
    exact = (q.astype(np.float64) @ bank.astype(np.float64).T).astype(np.float32)
    order = np.lexsort((np.broadcast_to(np.arange(700), exact.shape), -exact), axis=1)[:, :30]
    assert np.array_equal(neighbour, order) and np.array_equal(similarity, np.take_along_axis(exact, order, 1))
    assert neighbour[3, :4].tolist() == [12, 40, 333, 650]
    for block in (1, 29, 700, 5000):  # any block: the same answer, and the numpy path's
        assert all(np.array_equal(x, y) for x, y in zip(ht.nearest(q, bank, 30, block, device), (similarity, neighbour)))
    assert all(np.array_equal(x, y) for x, y in zip(hb.nearest(queries, bank, 30, 64), (similarity, neighbour)))


def test_a_gpu_asked_for_and_absent_is_refused_before_any_label_read(voc, capsys):
    root, year, store, labels, _ = voc
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    before = len(ledger.entries(root / "cache"))
    code, printed = probe_main(
        ["hummingbird", store, "--train", "voc-train", "--val", "voc-val", "--cache", root / "cache", "-q", "--backend", "torch", "--device", "cuda"], capsys
    )
    assert code == 2 and "no CUDA GPU" in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err
    code, printed = probe_main(["hummingbird", store, "--train", "voc-train", "--val", "voc-val", "--cache", root / "cache", "-q", "--device", "cuda"], capsys)
    assert code == 2 and "backend torch" in printed.err, printed.err
    assert len(ledger.entries(root / "cache")) == before


def test_a_store_made_in_the_old_augmentation_order_is_refused_not_read_or_grown(voc, tmp_path, capsys):
    """A store whose memory views were made before probe followed the reference's order (its manifest
    lacks the order) is refused by the protocol before any label read, and extraction into it stops
    rather than mixing the two orders in one view."""
    import shutil

    import zarr

    root, year, store, labels, checkpoint = voc
    copy = Path(shutil.copytree(store, tmp_path / "old.zarr"))
    group = zarr.open_group(copy, mode="r+", use_consolidated=False)
    old = dict(group.attrs["manifest"])
    assert old["per_view"]["hbird512_aug0"]["augmentation"] == hbird_views.ORDER and "augmentation" not in old["per_view"]["hbird512"]
    old["per_view"] = {v: {k: x for k, x in facts.items() if k != "augmentation"} for v, facts in old["per_view"].items()}
    group.attrs["manifest"] = old
    cache.consolidate(copy)
    before = len(ledger.entries(root / "cache"))
    code, printed = probe_main(["hummingbird", copy, "--train", "voc-train", "--val", "voc-val", "--cache", root / "cache", "-q"], capsys)
    err = " ".join(printed.err.split())
    assert code == 2 and "holds its hbird512_aug0 view in the order probe used before" in err and "--store NEW.zarr" in err, printed.err
    assert len(printed.err.strip().splitlines()) == 1 and len(ledger.entries(root / "cache")) == before
    with pytest.raises(Exception, match="augmentation differ"):
        extract(checkpoint, year / "JPEGImages", settings=Settings(views=("hbird512_aug0",), chunk=4, dtype="float32"), store=copy, quiet=True)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--memory", "5"], "--memory 5 is smaller than the 10 augmented train views"),
        (["--memory", "20000"], "asks 2000 patches of each of the 10 augmented train views, which hold 1024"),
        (["--memory", "100", "--k", "101"], "--k 101 exceeds the 100 bank rows at size 100"),
        (["--memory", "full,full"], "each once (got full,full)"),
        (["--augmentation-epochs", "3"], "--augmentation-epochs must be one of 1, 2 (got 3)"),
    ],
)
def test_refusals_come_before_any_label_read(voc, argv, words, capsys):
    root, year, store, labels, _ = voc
    before = len(ledger.entries(root / "cache"))
    code, printed = probe_main(["hummingbird", store, "--train", "voc-train", "--val", "voc-val", "--cache", root / "cache", "-q", *argv], capsys)
    err = " ".join(printed.err.split())
    assert code == 2 and words in err and len(printed.err.strip().splitlines()) == 1 and "Traceback" not in err, printed.err
    assert len(ledger.entries(root / "cache")) == before


def test_the_same_numbers_in_shards_and_on_a_dask_cluster(voc, monkeypatch, capsys):
    """Three shards (the last to finish sums the parts' confusion counts) and a dask cluster give
    the one-process run's record, every count, label and score the same bits; torchrun's
    RANK/WORLD_SIZE is a shard as --shard is."""
    distributed = pytest.importorskip("distributed")
    from probe_toolkit import run
    from probe_toolkit.commands import hummingbird as command

    root, year, store, labels, _ = voc
    monkeypatch.setattr(command, "QUERY_BLOCK", 1)  # one val image a block: three shards of the three val images
    given = dict(train="voc-train", val="voc-val", memory=(100, None), cache_dir=root / "cache")
    first = run("hummingbird", store, workers=1, **given)
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        clustered = run("hummingbird", store, dask_address=cluster.scheduler_address, **given)
    for shard in ("2/3", "0/3"):
        code, printed = probe_main(
            [
                "hummingbird",
                store,
                "--train",
                "voc-train",
                "--val",
                "voc-val",
                "--memory",
                "100,full",
                "--shard",
                shard,
                "--workers",
                "1",
                "--cache",
                root / "cache",
                "-q",
            ],
            capsys,
        )
        assert code == 0 and "waiting for shards" in printed.out and "mIoU" not in printed.out, printed
    monkeypatch.setenv("WORLD_SIZE", "3")  # torchrun's share: the middle one, which finds the others' parts and scores
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    sharded = run("hummingbird", store, workers=1, **given)
    assert sharded.placement.shard == "1/3" and not sharded.report.waiting
    parts = [records.load(store, f"hummingbird-part-{i}-of-3") for i in range(3)]
    assert [p.sizes["shown"] for p in parts] == [1, 1, 1]  # each share's shown image
    a = records.load(store, "hummingbird", first.run_id)
    for other in (clustered, sharded):
        b = records.load(store, "hummingbird", other.run_id)
        for name in ("confusion", "prediction", "truth", "miou", "miou_hungarian", "iou", "bank_rows"):
            assert np.array_equal(a[name].values, b[name].values), name
    assert np.array_equal(sum(p.confusion.values for p in parts), a.confusion.values)


def test_a_store_without_the_memory_views_is_refused_naming_the_extract(voc, tmp_path, capsys):
    root, year, store, labels, checkpoint = voc
    other = extract(checkpoint, year / "JPEGImages", settings=Settings(views=("hbird512",), chunk=4), store=tmp_path / "q.zarr", quiet=True).store
    before = len(ledger.entries(root / "cache"))
    code, printed = probe_main(["hummingbird", other, "--train", "voc-train", "--val", "voc-val", "--cache", root / "cache", "-q"], capsys)
    text = " ".join(printed.err.split())
    assert code == 2 and "has no hbird512_aug0 view for panel 'voc-train'" in text and "--views hbird512_aug0,hbird512_aug1" in text, printed.err
    assert len(ledger.entries(root / "cache")) == before


def test_a_panel_of_another_kind_or_a_sealed_one_is_refused(voc, tmp_path, capsys):
    root, year, store, labels, _ = voc
    c = root / "cache"
    before = len(ledger.entries(c))
    (tmp_path / "folders" / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "folders" / "cat" / "a.png")
    (tmp_path / "folders" / "dog").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "folders" / "dog" / "a.png")
    for argv in (
        ["panel", "add", "folders", "--classes-from-folders", tmp_path / "folders", "--role", "val"],
        ["panel", "add", "voc-test", "--voc-segmentation", year, "--split", "val", "--role", "test"],
    ):
        code, printed = probe_main([*argv, "--cache", c], capsys)
        assert code == 0, printed.err
    code, printed = probe_main(["hummingbird", store, "--train", "voc-train", "--val", "folders", "--cache", c, "-q"], capsys)
    assert code == 2 and "is a classes panel; hummingbird reads voc-segmentation or ade20k panels" in " ".join(printed.err.split()), printed.err
    fitting = sorted(f"{p.name} ({p.kind}, {p.role})" for p in list_panels(c) if p.kind == "voc-segmentation")
    assert len(fitting) >= 2 and printed.err.rstrip().endswith(f"pass one: registered, {', '.join(fitting)}"), printed.err  # the panels that would do
    code, printed = probe_main(["hummingbird", store, "--train", "voc-train", "--val", "voc-test", "--cache", c, "-q"], capsys)
    assert code == 2 and "is a sealed test panel" in printed.err, printed.err
    assert len(ledger.entries(c)) == before


def test_the_report_shows_the_record_its_figure_and_the_published_numbers_apart(voc, tmp_path, capsys):
    from probe_toolkit.report import write_report

    root, year, store, labels, _ = voc
    code, printed = probe_main(
        ["hummingbird", store, "--train", "voc-train", "--val", "voc-val", "--memory", "100,full", "--cache", root / "cache", "-q", "--workers", "1"], capsys
    )
    assert code == 0, printed.err
    saved = records.load(store, "hummingbird")
    written = write_report([store], tmp_path / "report", cache_dir=root / "cache", formats="png")
    section = next(s for s in written.report.sections if s.key == "hummingbird")
    from probe_toolkit.report.content import Table

    table, apart = [b for b in section.blocks if isinstance(b, Table)][:2]
    assert table.rows[0][1:] == [f"{100 * v:.2f}" for v in saved.miou.values]
    assert table.rows[1][1:] == [f"{100 * v:.2f}" for v in saved.miou_hungarian.values]
    # memory 100 and full are no published size: the published rows are not in this run's columns but in a table apart
    assert len(table.rows) == 3 and "published rows" not in table.caption and "input size 512 px" in table.caption
    assert [r[0] for r in apart.rows] == ["DINO ViT-S/16, 512 px", "DINOv2 ViT-S/14, 504 px"] and apart.rows[0][1:] == ["37.2", "43.1", "46.6"]
    assert "no number above is comparable" in apart.caption
    figure = section.figures()[0]
    assert "hummingbird-retrieval" in figure.name and (tmp_path / "report" / "figures" / figure.name).is_file()
    assert "hummingbird-retrieval" in (tmp_path / "report" / "report.md").read_text()


def test_the_views_tokens_do_not_depend_on_the_extraction_batch(voc, tmp_path):
    """A published reproduction drifted by 2.7 mIoU with the extraction batch: here the stored
    tokens of every Hummingbird view are the same bits at batch 1 as at batch 3."""
    root, year, store, labels, checkpoint = voc
    other = extract(checkpoint, year / "JPEGImages", settings=Settings(views=VIEWS, chunk=2, dtype="float32"), store=tmp_path / "b1.zarr", quiet=True, batch_size=1).store
    a, b = cache.open_store(store), cache.open_store(other)
    for view in VIEWS:
        assert np.array_equal(a[f"tokens_{view}"].values, b[f"tokens_{view}"].values), view


def test_a_relative_store_runs_on_a_cluster_whose_workers_sit_elsewhere(voc, tmp_path, monkeypatch):
    """Issue 46, class 7: a dask worker runs in a directory of its own. Its process is started
    here from another folder; the store is then given relative to this one. The memory files
    (``Shared``) went to the workers relative and were not found; every path a worker receives is
    now absolute (``runner.for_workers``), and the numbers are the local run's."""
    distributed = pytest.importorskip("distributed")
    from probe_toolkit import run

    root, year, store, labels, _ = voc
    given = dict(train="voc-train", val="voc-val", memory=(100,), cache_dir=root / "cache")
    local = run("hummingbird", store, workers=1, **given)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with distributed.LocalCluster(processes=True, n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster:
        monkeypatch.chdir(store.parent.parent)
        relative = Path(store.parent.name) / store.name
        clustered = run("hummingbird", relative, dask_address=cluster.scheduler_address, **given)
    a, b = records.load(store, "hummingbird", local.run_id), records.load(store, "hummingbird", clustered.run_id)
    assert np.array_equal(a.confusion.values, b.confusion.values) and np.array_equal(a.miou.values, b.miou.values)


def test_published_rows_join_a_table_only_at_their_input_and_memory_sizes():
    from probe_toolkit.analyses.hummingbird_published import comparable

    dino, dinov2 = ("DINO ViT-S/16, 512 px", (37.2, 43.1, 46.6)), ("DINOv2 ViT-S/14, 504 px", (70.2, 74.9, 77.0))
    assert comparable(["102400", "full"], 512) == (dino,) and comparable(["1024000"], 504) == (dinov2,)
    assert comparable(["102400"], 224) == () and comparable(["100", "full"], 512) == () and comparable(["100", "full"], 504) == ()


@pytest.mark.parametrize("layout, size", [("dino-full", 224), ("dinov2-reg-backbone", 504)])
def test_any_input_size_as_the_reference_resizes(voc, tmp_path, layout, size, capsys):
    """--size 224 (hbird_evaluation's default) on a /16 network, --size 504 on a /14 one (the README's DINOv2 size): the
    hbird@S views, every number against the plain computation at that size; a size off the patch is refused before any label read."""
    from probe_toolkit.demo.samples import TINY_DINOV2_REG
    from probe_toolkit.store.views import hbird_views as views_at

    root, year, _, labels, _ = voc
    arch, patch = (TINY, 16) if layout == "dino-full" else (TINY_DINOV2_REG, 14)
    checkpoint = write_checkpoint(tmp_path / "net.pth", layout, arch, seed=11)
    store = extract(
        checkpoint, year / "JPEGImages", settings=Settings(views=views_at(size), chunk=4, dtype="float32"), store=tmp_path / "s.zarr", quiet=True, batch_size=3
    ).store
    before = len(ledger.entries(root / "cache"))
    code, printed = probe_main(["hummingbird", store, "--train", "voc-train", "--val", "voc-val", "--cache", root / "cache", "-q", "--size", str(size + 2)], capsys)
    err = " ".join(printed.err.split())
    assert code == 2 and "not a multiple of the network's" in err and len(ledger.entries(root / "cache")) == before, printed.err
    out = tmp_path / "hb.json"
    code, printed = probe_main(
        [
            "hummingbird",
            store,
            "--train",
            "voc-train",
            "--val",
            "voc-val",
            "--cache",
            root / "cache",
            "-q",
            "--size",
            str(size),
            "--memory",
            "100,full",
            "--workers",
            "1",
            "--json",
            out,
        ],
        capsys,
    )
    assert code == 0, printed.err
    saved = records.load(store, "hummingbird")
    assert saved.attrs["grid"] == size // patch and saved.attrs["pixels_side"] == size and saved.attrs["views"]["query"] == views_at(size)[0]
    plain = _plain(store, [(f"{i}.jpg", labels[i]) for i in TRAIN], [(f"{i}.jpg", labels[i]) for i in VAL], (100, None), patch=patch, size=size)
    for m, (_, shown, rows) in enumerate(plain):
        assert int(saved.bank_rows.values[m]) == rows
        for j, name in enumerate(VAL):
            truth, predicted, margin, tied = shown[f"{name}.jpg"]
            got = saved.prediction.values[m, j]
            assert np.array_equal(saved.truth.values[j], truth)
            assert np.array_equal(got[(margin > 1e-5) & ~tied], predicted[(margin > 1e-5) & ~tied])


def test_a_block_the_panels_own_stores_lack_is_one_line_naming_both_and_the_pasted_fix_gives_the_blocks_numbers(voc, tmp_path, capsys):
    """A store of other photographs reads both panels' views from the stores beside it
    (``<network>-panel-<panel>.zarr``): at a block those stores lack, one line names both and the
    extraction that adds it to each (joined with ``&&``, each carrying ``--cache``), before any label
    read. Pasted, the rerun reads that block: the numbers of one store holding every view at that
    block, not the last block's, and the table says which block it read."""
    import shlex

    from probe_toolkit.demo.samples import sample_photos

    root, year, plain, _, checkpoint = voc
    c = root / "cache"
    main = extract(checkpoint, sample_photos(), settings=Settings(views=(224,), chunk=4, dtype="float32"), store=tmp_path / "photos" / "dino.zarr", quiet=True).store
    for panel, views in (("voc-train", "hbird512_aug0,hbird512_aug1"), ("voc-val", "hbird512")):
        beside = main.parent / f"dino-panel-{panel}.zarr"
        asked = ["extract", checkpoint, "--panel", panel, "--views", views, "--chunk", "4", "--dtype", "float32", "--store", beside, "--cache", c, "-q"]
        code, printed = probe_main(asked, capsys)
        assert code == 0, printed.err
    asked = ["hummingbird", main, "--train", "voc-train", "--val", "voc-val", "--memory", "100", "--cache", c, "--block", "0", "-q"]
    before = len(ledger.entries(c))
    code, printed = probe_main(asked, capsys)
    line = printed.err.strip()
    assert code == 2 and len(line.splitlines()) == 1, printed.err
    assert "dino-panel-voc-train.zarr, " in line and "dino-panel-voc-val.zarr (the panel stores beside" in line and "at --block 0" in line, line
    assert len(ledger.entries(c)) == before
    fixes = line.split("`")[1].split(" && ")
    assert len(fixes) == 2 and all(f.startswith("probe extract ") and " --blocks 0 --store " in f and f.endswith(f" --cache {c}") for f in fixes), fixes
    for fix in fixes:
        code, printed = probe_main([*shlex.split(fix)[1:], "-q"], capsys)
        assert code == 0, printed.err
    code, printed = probe_main(asked, capsys)
    assert code == 0 and printed.out.rstrip().endswith("read at block 0 (0-based, as probe extract --blocks counts)"), printed.err
    beside = records.load(main, "hummingbird")
    store = tmp_path / "every-view.zarr"  # one store of every view at block 0 (the module's store stays as it is)
    asked = ["extract", checkpoint, "--images", year / "JPEGImages", "--views", ",".join(VIEWS), "--blocks", "0", "--chunk", "4", "--dtype", "float32"]
    code, printed = probe_main([*asked, "--store", store, "-q"], capsys)
    assert code == 0, printed.err
    from probe_toolkit import run

    one = records.load(store, "hummingbird", run("hummingbird", store, train="voc-train", val="voc-val", memory=(100,), cache_dir=c, block=0).run_id)
    last = records.load(plain, "hummingbird", run("hummingbird", plain, train="voc-train", val="voc-val", memory=(100,), cache_dir=c).run_id)
    for name in ("confusion", "prediction", "miou"):
        assert np.array_equal(beside[name].values, one[name].values), name
    assert not np.array_equal(one["prediction"].values, last["prediction"].values)  # block 0's tokens, not the last block's
    assert records.runs(main, "hummingbird")[-1].meta["selection"]["block"] == 0
