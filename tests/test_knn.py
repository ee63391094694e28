"""``probe knn``: DINO's weighted k-NN against a brute-force numpy vote, and end to end on class folders."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
from cli_runs import probe_main
from PIL import Image
from typer.testing import CliRunner

from probe_toolkit.analyses import knn
from probe_toolkit.cli import app
from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.provenance import list_hash
from probe_toolkit.labels import ledger
from probe_toolkit.labels.panels import read_classes
from probe_toolkit.results import records
from probe_toolkit.store import cache
from probe_toolkit.store.extract import Settings, extract

runner = CliRunner()


def brute_force(train, train_labels, test, n_classes, k, T):
    """Every test image against every train image in float64, one image at a time."""
    tr = train / np.linalg.norm(train, axis=1, keepdims=True)
    preds, top5 = [], []
    for q in test:
        q = q / np.linalg.norm(q)
        sims = tr @ q
        order = sorted(range(len(sims)), key=lambda i: (-sims[i], i))[:k]
        votes = np.zeros(n_classes)
        for i in order:
            votes[train_labels[i]] += np.exp(sims[i] / T)
        ranked = sorted(range(n_classes), key=lambda c: (-votes[c], c))
        preds.append(ranked[0])
        top5.append([c for c in ranked[:5] if votes[c] > 0])  # a class no neighbour voted for is no hit
    return np.array(preds), top5


def dino_knn_classifier(train, train_labels, test, test_labels, k, T, num_classes=1000):
    """facebookresearch/dino eval_knn.py ``knn_classifier`` as its main() calls it (num_classes
    left at 1000), written out here in torch; one chunk (it needs 100 test images or more)."""
    import torch

    train = torch.nn.functional.normalize(torch.as_tensor(train), dim=1)
    test = torch.nn.functional.normalize(torch.as_tensor(test), dim=1)
    targets, candidates = torch.as_tensor(test_labels), torch.as_tensor(train_labels)
    distances, indices = (test @ train.T).topk(k, largest=True, sorted=True)
    retrieved = torch.gather(candidates.view(1, -1).expand(len(test), -1), 1, indices)
    one_hot = torch.zeros(len(test) * k, num_classes).scatter_(1, retrieved.reshape(-1, 1), 1)
    probs = (one_hot.view(len(test), k, num_classes) * distances.div(T).exp().view(len(test), k, 1)).sum(1)
    correct = probs.sort(1, True)[1].eq(targets.view(-1, 1))
    return correct[:, :1].sum().item() / len(test), correct[:, : min(5, k)].sum().item() / len(test)


def clustered(n, centres, rng, spread=1.2):
    n_classes, dim = centres.shape
    labels = rng.integers(0, n_classes, n)
    return (centres[labels] + spread * rng.normal(size=(n, dim))).astype(np.float32), labels


@pytest.mark.parametrize("n_classes", [7, 3])
def test_blocked_running_topk_equals_brute_force(n_classes):
    rng = np.random.default_rng(n_classes)
    centres = rng.normal(size=(n_classes, 16))
    train, train_labels = clustered(230, centres, rng)
    test, test_labels = clustered(37, centres, rng)  # fewer than 100 test images: DINO's chunking would fail
    ks = (1, 3, 10, 20, 100, 200)  # k < 5: at most k classes hold votes
    result = knn.classify(
        lambda a, b: train[a:b],
        len(train),
        train_labels,
        lambda a, b: test[a:b],
        len(test),
        test_labels,
        n_classes,
        ks=ks,
        temperature=0.07,
        test_block=8,
        train_block=50,
    )
    for j, k in enumerate(ks):
        preds, top5 = brute_force(train.astype(np.float64), train_labels, test.astype(np.float64), n_classes, k, 0.07)
        np.testing.assert_array_equal(result.predictions[j], preds)
        assert result.top1[j] == pytest.approx(np.mean(preds == test_labels))
        if n_classes > 5:
            assert result.top5[j] == pytest.approx(np.mean([t in r for t, r in zip(test_labels, top5)]))
        else:
            assert np.isnan(result.top5[j])  # undefined with 5 classes or fewer, never a crash or a fake 100 %
    # the kept neighbours are the 5 most similar, best first
    tr = train / np.linalg.norm(train, axis=1, keepdims=True)
    sims = (test / np.linalg.norm(test, axis=1, keepdims=True)) @ tr.T
    np.testing.assert_array_equal(result.neighbours, np.argsort(-sims, axis=1, kind="stable")[:, :5])
    assert 0.5 < result.top1[3] <= 1.0  # the clusters are separable: a wrong vote would not reach this


@pytest.mark.parametrize("values", [1, 13, 300, 2**20])
def test_votes_ranked_a_portion_of_rows_at_a_time_are_the_whole_rankings(monkeypatch, values):
    """``ranked_votes`` ranks ``VOTE_VALUES // classes`` rows at a time (one row, a few, all of
    them): the classes are those of the brute-force vote of every row at once, ties to the lower
    class, unvoted classes -1 after the first; the ks in any order."""
    rng = np.random.default_rng(values)
    n_classes, n_test, ks = 23, 41, (20, 1, 7, 3)
    neighbour = rng.integers(0, 60, (n_test, 20))
    train_labels = rng.integers(0, n_classes, 60)
    similarity = np.round(rng.uniform(-1, 1, (n_test, 20)), 1).astype(np.float32)  # rounded: equal votes happen
    similarity = -np.sort(-similarity, axis=1)
    monkeypatch.setattr(knn, "VOTE_VALUES", values)
    got = knn.ranked_votes(similarity, neighbour, train_labels, n_classes, ks, 0.07, 5)
    assert got.shape == (n_test, len(ks), 5) and got.dtype == np.int64
    weights = np.exp(similarity.astype(np.float32) / np.float32(0.07))
    for j, k in enumerate(ks):
        for row in range(n_test):
            votes = np.zeros(n_classes, np.float32)
            for rank in range(k):
                votes[train_labels[neighbour[row, rank]]] += weights[row, rank]
            ranked = sorted(range(n_classes), key=lambda c: (-votes[c], c))
            expected = [c if (i == 0 or votes[c] > 0) else -1 for i, c in enumerate(ranked[:5])]
            assert got[row, j].tolist() == expected


def test_top5_counts_as_dinos_script():
    """Against DINO's own formula: a class without votes is no top-5 hit (its 1000 class columns
    bury it among empty ones), and with k < 5 only k classes can be. Spread-out clusters leave
    many test images with fewer than 5 voted classes, where the two rules would differ."""
    rng = np.random.default_rng(5)
    n_classes = 12
    centres = rng.normal(size=(n_classes, 16))
    train, train_labels = clustered(400, centres, rng, spread=2.5)
    test, test_labels = clustered(300, centres, rng, spread=2.5)
    ks = (1, 2, 3, 10, 20)
    result = knn.classify(lambda a, b: train[a:b], len(train), train_labels, lambda a, b: test[a:b], len(test), test_labels, n_classes, ks=ks, temperature=0.07)
    for j, k in enumerate(ks):
        top1, top5 = dino_knn_classifier(train, train_labels, test, test_labels, k, 0.07)
        assert result.top1[j] == pytest.approx(top1)
        assert result.top5[j] == pytest.approx(top5)
    # the old rule (empty classes in index order) counted more: this data tells the two apart
    votes_k1 = result.top5[0]
    assert votes_k1 == pytest.approx(result.top1[0])  # k = 1: one voted class, top-5 is top-1
    assert result.top5[2] < 1.0


def test_k_above_the_train_set_is_refused():
    x = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError):
        knn.classify(lambda a, b: x[a:b], 4, np.array([0, 1, 0, 1]), lambda a, b: x[a:b], 4, np.array([0, 1, 0, 1]), 2, ks=(10,), temperature=0.07)


def _image(path, colour, seed, sd=20.0):
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(colour)[None, None] + rng.normal(0, sd, (64, 80, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def colour_folders(data, sd=20.0) -> None:
    """``data``/train and ``data``/val, one sub-folder per colour class (red, green, blue) holding
    4 and 2 images of that colour under Gaussian noise of ``sd``."""
    colours = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200)}
    for split, n in (("train", 4), ("val", 2)):
        for c, (name, colour) in enumerate(colours.items()):
            for i in range(n):
                _image(data / split / name / f"{i}.png", colour, seed=100 * c + 10 * i + (split == "val"), sd=sd)


@pytest.fixture(scope="module")
def class_folders(tmp_path_factory):
    """train/ and val/ with one sub-folder per class, a tiny network's store over both."""
    root = tmp_path_factory.mktemp("knn")
    colour_folders(root / "data")
    checkpoint = write_checkpoint(root / "dino.pth", "dino-full", TINY, seed=0)
    store = extract(checkpoint, root / "data", settings=Settings(views=(224,), attention="none", chunk=8), cache_dir=root / "cache", quiet=True).store
    return root, store


def test_knn_command_end_to_end(class_folders, tmp_path):
    root, store = class_folders
    c = str(tmp_path / "cache")
    for name, role in (("tr", "train"), ("va", "val")):
        r = runner.invoke(
            app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / ("train" if role == "train" else "val")), "--role", role, "--cache", c]
        )
        assert r.exit_code == 0, r.output
    out = tmp_path / "knn.json"
    r = runner.invoke(app, ["knn", str(store), "--train", "tr", "--val", "va", "--k", "1,3,12", "--temperature", "0.2", "--cache", c, "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(out.read_text())
    assert summary["temperature"] == 0.2  # the T the vote used, not DINO's default
    assert summary["feature"].startswith("class token after the final LayerNorm")
    assert summary["counts"] == {"train": 12, "val": 6, "classes": 3, "val_dropped": 0, "train_dropped": 0}
    assert summary["top5"] == [None, None, None]
    # the same vote recomputed here from the stored class tokens and the checkpoint's final norm
    ds = cache.open_store(store)
    from probe_toolkit.store.checkpoints import load_checkpoint

    ck = load_checkpoint(root / "dino.pth")
    w, b = ck.backbone["norm.weight"].double().numpy(), ck.backbone["norm.bias"].double().numpy()

    def feats(prefix):
        ids = [i for i in ds.image.values.tolist() if i.startswith(prefix)]
        x = ds.cls_tokens_224.sel(image=ids).values.astype(np.float64)
        x = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-6) * w + b
        return x, np.array([["blue", "green", "red"].index(i.split("/")[1]) for i in ids])

    tr, trl = feats("train/")
    va, val = feats("val/")
    for j, k in enumerate((1, 3, 12)):
        preds, _ = brute_force(tr, trl, va, 3, k, 0.2)
        assert summary["top1"][j] == pytest.approx(np.mean(preds == val))
    saved = records.load(store, "knn")
    assert list(saved.k.values) == [1, 3, 12] and saved.attrs["feature"] == "cls-normed" and saved.attrs["temperature"] == 0.2
    on = saved.attrs["computed_on"]  # the val images scored: `probe table` puts only records of the same images in one column
    assert on["scope"] == "panel" and on["images"] == len(saved.image) and on["images_sha256"] == list_hash([str(i) for i in saved.image.values])
    purposes = [e.fields["purpose"] for e in ledger.entries(tmp_path / "cache")]
    assert purposes == ["knn: neighbours' classes", "knn: score"]


def test_knn_refuses_a_val_panel_of_role_train(class_folders, tmp_path, capsys):
    """Scores are read on a val (or test) panel: one registered as train is refused before any label is read."""
    root, store = class_folders
    c = str(tmp_path / "cache")
    for name, split in (("tr", "train"), ("also-train", "val")):
        code, printed = probe_main(["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", "train", "--cache", c], capsys)
        assert code == 0, printed.err
    code, printed = probe_main(["knn", str(store), "--train", "tr", "--val", "also-train", "--cache", c, "-q"], capsys)
    assert code == 2 and "has role train" in printed.err and len(printed.err.strip().splitlines()) == 1
    assert not ledger.entries(tmp_path / "cache")  # refused before any label was read


def test_bad_classification_panels_are_one_line(tmp_path, capsys):
    one = tmp_path / "one"
    _image(one / "cat" / "a.png", (10, 10, 10), 0)
    flat = tmp_path / "flat"
    _image(flat / "a.png", (10, 10, 10), 0)
    for folder, needle in ((one, "1 class folder"), (flat, "outside any class folder")):
        code, printed = probe_main(["panel", "add", "p", "--classes-from-folders", str(folder), "--role", "train", "--cache", str(tmp_path / "c")], capsys)
        err = printed.err
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "c" / "panels.toml").exists()


def test_knn_reads_dinos_eval_view_when_the_store_has_it(class_folders, tmp_path):
    """A store with only the 224 view is read and says so; grown with eval224 (short side 256,
    crop 224, DINO's eval_knn.py transform), the same command reads that view: its predictions
    and cosines are a brute force on the eval224 class tokens, not on the 224 ones."""
    root, _ = class_folders
    c = str(tmp_path / "cache")
    for name, split in (("tr", "train"), ("va", "val")):
        r = runner.invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", c])
        assert r.exit_code == 0, r.output
    store, out = tmp_path / "s.zarr", tmp_path / "knn.json"
    ks = (1, 3, 12)

    def knn_json():
        r = runner.invoke(app, ["knn", str(store), "--train", "tr", "--val", "va", "--k", "1,3,12", "--cache", c, "--json", str(out), "-q"])
        assert r.exit_code == 0, r.output
        return json.loads(out.read_text()), r.output

    extract(root / "dino.pth", root / "data", settings=Settings(views=(224,), attention="none", chunk=8), store=store, quiet=True)
    old, printed = knn_json()
    assert old["view"] == "224" and "not DINO's" in old["view_text"] and "probe extract --views eval224" in old["view_text"]
    line = next(line for line in printed.splitlines() if line.startswith("view: 224 view"))  # the terminal's: the whole extraction
    pasted = line.split("`")[1]
    assert pasted.startswith(f"probe extract {root / 'dino.pth'} --images {root / 'data'} --views eval224 ") and pasted.endswith(f"--store {store}")
    assert records.load(store, "knn").attrs["view"] == "224"
    r = runner.invoke(app, [*shlex.split(pasted)[1:], "-q"])
    assert r.exit_code == 0, r.output
    summary, _ = knn_json()
    saved = records.load(store, "knn")
    assert summary["view"] == saved.attrs["view"] == "eval224"
    assert summary["view_text"] == saved.attrs["view_text"] and summary["view_text"].startswith("eval224 view: short side 256")
    assert "not DINO's" not in summary["view_text"]
    ds = cache.open_store(store)
    from probe_toolkit.store.checkpoints import load_checkpoint

    ck = load_checkpoint(root / "dino.pth")
    w, b = ck.backbone["norm.weight"].double().numpy(), ck.backbone["norm.bias"].double().numpy()

    def feats(view, ids):
        x = ds[f"cls_tokens_{view}"].sel(image=ids).values.astype(np.float64)
        return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-6) * w + b

    train_ids, val_ids = [str(i) for i in saved.train_image.values], [str(i) for i in saved.image.values]
    train_labels = np.array([saved["class"].values.tolist().index(i.split("/")[1]) for i in train_ids])
    val_labels = saved.label.values
    cosines = {}
    for view in ("eval224", "224"):
        tr, va = feats(view, train_ids), feats(view, val_ids)
        cosines[view] = np.sort((va / np.linalg.norm(va, axis=1, keepdims=True)) @ (tr / np.linalg.norm(tr, axis=1, keepdims=True)).T, axis=1)[:, ::-1][:, :5]
        if view == "eval224":
            for j, k in enumerate(ks):
                preds, _ = brute_force(tr, train_labels, va, 3, k, 0.07)
                np.testing.assert_array_equal(saved.prediction.values[j], preds)
                assert summary["top1"][j] == pytest.approx(np.mean(preds == val_labels))
    np.testing.assert_allclose(saved.similarity.values, cosines["eval224"], atol=1e-5)
    assert np.abs(saved.similarity.values - cosines["224"]).max() > 1e-3  # the 224 view's features would give other cosines


def test_class_folder_panels_of_two_roles_may_not_share_an_image(class_folders, tmp_path, capsys, monkeypatch):
    """A val image that is a train image under another name (same bytes) is refused before any
    label is read, as for COCO panels; unchanged files are hashed once, a changed file again."""
    import shutil

    from probe_toolkit.infra.errors import ProbeError
    from probe_toolkit.labels import hygiene

    root, _ = class_folders
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    shutil.copyfile(data / "train" / "red" / "0.png", data / "val" / "blue" / "copy.png")
    c = tmp_path / "cache"
    for name, split in (("tr", "train"), ("va", "val")):
        code, printed = probe_main(["panel", "add", name, "--classes-from-folders", str(data / split), "--role", split, "--cache", str(c)], capsys)
        assert code == 0, printed.err
    hashed = []
    real = hygiene.file_sha256
    monkeypatch.setattr(hygiene, "file_sha256", lambda path: hashed.append(path.name) or real(path))

    def read(name):
        return read_classes(name, purpose="test", cache=c, command="test")

    assert len(read("tr").image_ids) == 12 and len(hashed) == 12
    with pytest.raises(ProbeError) as refused:
        read("va")
    assert "(val) shares 1 images with panel 'tr' (train), e.g. 'blue/copy.png' = 'red/0.png' (same content)" in str(refused.value)
    assert len(hashed) == 12 + 7 and len(ledger.entries(c)) == 1  # the val labels were never read
    assert not (c / "panel-hashes.json").read_text().count("/val/")  # a refused read leaves the cache as it was
    (data / "val" / "blue" / "copy.png").unlink()
    hashed.clear()
    assert len(read("va").image_ids) == 6 and len(hashed) == 6
    hashed.clear()
    assert len(read("va").image_ids) == 6 and hashed == []  # nothing changed: a stat per file, no read
    _image(data / "val" / "red" / "0.png", (1, 2, 3), seed=5)  # new bytes under an old name
    read("va")
    assert hashed == ["0.png"]


def test_knn_imports_no_torch_and_needs_no_checkpoint_with_a_recorded_norm(class_folders, tmp_path):
    """Extraction records the final LayerNorm in the manifest, so ``probe knn`` reads neither torch
    nor the checkpoint; a store extracted before that (no ``final_norm`` in its manifest) rereads
    the norm from the checkpoint, sha256 checked, and gives the same numbers."""
    import shutil

    import zarr
    from test_startup import loaded, loaded_by

    root, store = class_folders
    c = str(tmp_path / "cache")
    for name, split in (("tr", "train"), ("va", "val")):
        r = runner.invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", c])
        assert r.exit_code == 0, r.output
    copy = Path(shutil.copytree(store, tmp_path / "teacher.zarr"))
    meta = cache.manifest(copy)
    assert meta["final_norm"]["encoding"] == "float32 little-endian, base64"
    args = ["--train", "tr", "--val", "va", "--k", "1,3,12", "--cache", c, "-q", "--workers", "1"]
    heavy, first = loaded(["knn", str(copy), *args, "--json", str(tmp_path / "new.json")])
    assert "torch" not in heavy and "timm" not in heavy
    assert first == []  # the panels' stores read with zarr alone: xarray and pandas come only to save the result
    recorded = records.load(copy, "knn")
    group = zarr.open_group(copy, mode="r+", use_consolidated=False)
    old = dict(group.attrs["manifest"])
    del old["final_norm"]
    group.attrs["manifest"] = old
    cache.consolidate(copy)
    assert "torch" in loaded_by(["knn", str(copy), *args, "--json", str(tmp_path / "old.json")])
    reread = records.load(copy, "knn")
    for name in ("prediction", "neighbour", "similarity", "top1"):
        np.testing.assert_array_equal(recorded[name].values, reread[name].values)
    assert json.loads((tmp_path / "new.json").read_text())["top1"] == json.loads((tmp_path / "old.json").read_text())["top1"]


def test_recorded_final_norm_is_torchs_layernorm():
    import torch

    from probe_toolkit.store import parts

    rng = np.random.default_rng(0)
    weight, bias = torch.from_numpy(rng.normal(size=48).astype(np.float32)), torch.from_numpy(rng.normal(size=48).astype(np.float32))
    manifest = {"arch": {"final_norm": True, "width": 48}, "final_norm": parts.record_final_norm({"norm.weight": weight, "norm.bias": bias})}
    norm = parts.final_norm(manifest, "store.zarr")
    x = (3 * rng.normal(size=(64, 48)) + 1).astype(np.float32)
    layer = torch.nn.LayerNorm(48, eps=1e-6)
    layer.load_state_dict({"weight": weight, "bias": bias})
    with torch.no_grad():
        expected = layer(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(norm.weight, weight.numpy())
    np.testing.assert_allclose(norm(x), expected, rtol=0, atol=4e-6)
    manifest["arch"]["width"] = 64
    with pytest.raises(ProbeError, match="final norm of 48 channels"):
        parts.final_norm(manifest, "store.zarr")
    manifest["final_norm"]["bias"] = "not base64!"
    with pytest.raises(ProbeError, match="unreadable final norm"):
        parts.final_norm(manifest, "store.zarr")


@pytest.mark.parametrize("device", ["cpu", *(["cuda"] if __import__("torch").cuda.is_available() else [])])
def test_the_torch_backend_gives_the_numpy_record(class_folders, tmp_path, device):
    """``--backend torch --device cpu`` (and cuda where a GPU is visible): the same neighbours,
    cosines, predictions and accuracies as the numpy search, bit for bit; the record says which
    searched, and the train bank's file is gone after the run."""
    from probe_toolkit import run

    root, store = class_folders
    c = tmp_path / "cache"
    for name, split in (("tr", "train"), ("va", "val")):
        r = runner.invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", str(c)])
        assert r.exit_code == 0, r.output
    first = run("knn", store, train="tr", val="va", ks=(1, 3, 12), cache_dir=c, workers=1)
    second = run("knn", store, train="tr", val="va", ks=(1, 3, 12), cache_dir=c, workers=1, backend="torch", device=device)
    a, b = (records.load(store, "knn", r.run_id) for r in (first, second))
    for name in ("neighbour", "similarity", "prediction", "top1", "label"):
        assert np.array_equal(a[name].values, b[name].values, equal_nan=True), name
    assert a.attrs["search"].endswith("(numpy)") and b.attrs["search"].endswith(f"(torch on {device})")
    assert not list(Path(records.results_path(store, "")).glob(".knn-bank*"))


def test_a_gpu_asked_for_and_absent_is_refused_before_any_label_read(class_folders, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    root, store = class_folders
    c = tmp_path / "cache"
    for name, split in (("tr", "train"), ("va", "val")):
        code, printed = probe_main(["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", str(c)], capsys)
        assert code == 0, printed.err
    for extra, words in ((["--backend", "torch", "--device", "cuda"], "no CUDA GPU"), (["--device", "cuda"], "backend torch")):
        code, printed = probe_main(["knn", str(store), "--train", "tr", "--val", "va", "--cache", str(c), "-q", *extra], capsys)
        assert code == 2 and words in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err
    assert not ledger.entries(c)


def test_work_memory_sizes_the_blocks_not_the_numbers(class_folders, tmp_path, capsys):
    """``--work-memory`` bounds a search task's block products (the train bank's rows per block,
    ``analyses.search.block_rows``): the record is the default's; below 16 MiB it is refused in one line."""
    from probe_toolkit import run
    from probe_toolkit.analyses import search

    root, store = class_folders
    c = tmp_path / "cache"
    for name, split in (("tr", "train"), ("va", "val")):
        code, printed = probe_main(["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", str(c)], capsys)
        assert code == 0, printed.err
    assert search.block_rows(None, 1024, 4096) == 4096 and search.block_rows(64, 1024, 4096) == 4096 and search.block_rows(16, 1024, 4096) == 1024
    assert search.block_rows(16, 10**6, 4096) == 256
    first = run("knn", store, train="tr", val="va", ks=(1, 3), cache_dir=c, workers=1)
    second = run("knn", store, train="tr", val="va", ks=(1, 3), cache_dir=c, workers=1, work_memory=16)
    a, b = (records.load(store, "knn", r.run_id) for r in (first, second))
    assert all(np.array_equal(a[n].values, b[n].values) for n in ("neighbour", "similarity", "prediction"))
    code, printed = probe_main(["knn", str(store), "--train", "tr", "--val", "va", "--cache", str(c), "-q", "--work-memory", "8"], capsys)
    assert code == 2 and "work-memory" in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err


def test_an_id_list_is_hashed_a_few_thousand_ids_at_a_time():
    """``list_hash`` is the sha256 of the ids joined by newlines (block edges included), fed a block at
    a time: every record's ``computed_on`` hashes its store's ids, 100 k of them at scale, and the
    whole list as Python strings plus their joined text sat on top of the run's peak."""
    import hashlib
    import tracemalloc

    from probe_toolkit.infra.provenance import HASHED_AT_ONCE

    ids = [f"2008_{i:06d}.jpg" for i in range(8 * HASHED_AT_ONCE + 7)]
    for n in (0, 1, HASHED_AT_ONCE - 1, HASHED_AT_ONCE, HASHED_AT_ONCE + 1, len(ids)):
        assert list_hash(ids[:n]) == hashlib.sha256("\n".join(ids[:n]).encode()).hexdigest()
    stored = np.asarray(ids, dtype=np.dtypes.StringDType())  # as a store's image coordinate reads
    tracemalloc.start()
    try:
        digest = list_hash(map(str, stored))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert digest == list_hash(ids) and peak < 1_000_000, peak  # before: ~2.9 MB, every id a string at once and their text
