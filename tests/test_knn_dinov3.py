"""``probe knn`` on a DINOv3 store: ``--feature auto`` is the feature DINOv3's own ``eval/knn.py`` uses.

DINOv3's k-NN (facebookresearch/dinov3 ``dinov3/eval/knn.py``) wraps the eval model in
``ModelWithNormalize``: the model's output is ``head(x_norm_clstoken)`` with an identity head, i.e.
the class token through the final LayerNorm (eps 1e-5), the 4 storage tokens unused, then L2
normalisation; ``KnnModule`` votes with softmax(top-k cosines / T) over the max-k neighbours. The
test recomputes that here from timm's own network, loaded by timm from the timm-layout file (not
through probe's loader), and compares predictions and top-1 for every k.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_knn import colour_folders
from typer.testing import CliRunner

from probe_toolkit.cli import app
from probe_toolkit.demo.samples import TINY_DINOV3, write_checkpoint
from probe_toolkit.results import records
from probe_toolkit.store import images
from probe_toolkit.store.extract import Settings, extract

runner = CliRunner()
CLASSES = ("blue", "green", "red")


def timm_dinov3(arch, state):
    """timm's DINOv3 network built here by name, the file's timm-named tensors loaded strictly by torch."""
    import timm

    model = timm.create_model(
        "vit_small_patch16_dinov3_qkvb",
        pretrained=False,
        embed_dim=arch.width,
        depth=arch.depth,
        num_heads=arch.heads,
        mlp_ratio=arch.mlp_hidden / arch.width,
        num_classes=0,
    )
    model.load_state_dict(state, strict=True)
    return model.eval()


def dinov3_knn(train, train_labels, test, ks, T, n_classes):
    """``KnnModule.forward`` on one rank, written out: top max-k cosines, softmax(sims / T), one-hot votes summed over the first k."""
    train = torch.nn.functional.normalize(torch.as_tensor(train, dtype=torch.float64), dim=1)
    test = torch.nn.functional.normalize(torch.as_tensor(test, dtype=torch.float64), dim=1)
    sims, idx = (test @ train.T).topk(max(ks), largest=True, sorted=True)
    labels = torch.as_tensor(train_labels)[idx]
    weights = torch.softmax(sims / T, dim=1)[:, :, None]
    votes = torch.nn.functional.one_hot(labels, n_classes) * weights
    return {k: votes[:, :k].sum(1).argmax(1).numpy() for k in ks}


@pytest.fixture(scope="module")
def dinov3_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("knn3")
    colour_folders(root / "data", sd=40.0)
    checkpoint = write_checkpoint(root / "v3.pth", "dinov3-timm", TINY_DINOV3, seed=3)
    store = extract(checkpoint, root / "data", settings=Settings(views=("eval224",), attention="none", chunk=8), cache_dir=root / "cache", quiet=True).store
    return root, checkpoint, store


def test_knn_auto_reads_dinov3s_class_token_through_its_final_norm(dinov3_folders, tmp_path):
    root, checkpoint, store = dinov3_folders
    c = str(tmp_path / "cache")
    for name, split in (("tr", "train"), ("va", "val")):
        r = runner.invoke(app, ["panel", "add", name, "--classes-from-folders", str(root / "data" / split), "--role", split, "--cache", c])
        assert r.exit_code == 0, r.output
    out = tmp_path / "knn.json"
    ks, T = (1, 3, 12), 0.07
    r = runner.invoke(app, ["knn", str(store), "--train", "tr", "--val", "va", "--k", "1,3,12", "--feature", "auto", "--cache", c, "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    summary = json.loads(out.read_text())
    saved = records.load(store, "knn")
    assert saved.attrs["feature"] == "cls-normed" and saved.attrs["view"] == "eval224"
    assert "dinov3/eval/knn.py" in saved.attrs["source"] and "eps 1e-5" in summary["feature"]

    model = timm_dinov3(TINY_DINOV3, torch.load(checkpoint, weights_only=True))
    by_id = {ref.id: ref for ref in images.list_images(root / "data")}

    def features(ids):
        batch = torch.stack([images.views(images.load_image(by_id[i].path), ("eval224",))["eval224"] for i in ids])
        with torch.no_grad():
            return model.forward_features(batch)[:, 0].double().numpy()  # x_norm_clstoken: token 0 after the final norm

    train_ids, val_ids = [str(i) for i in saved.train_image.values], [str(i) for i in saved.image.values]
    train_labels = np.array([CLASSES.index(i.split("/")[1]) for i in train_ids])
    val_labels = np.array([CLASSES.index(i.split("/")[1]) for i in val_ids])
    tr, va = features(train_ids), features(val_ids)
    predicted = dinov3_knn(tr, train_labels, va, ks, T, len(CLASSES))
    for j, k in enumerate(ks):
        np.testing.assert_array_equal(saved.prediction.values[j], predicted[k])
        assert summary["top1"][j] == pytest.approx(np.mean(predicted[k] == val_labels))
    cosines = np.sort((va / np.linalg.norm(va, axis=1, keepdims=True)) @ (tr / np.linalg.norm(tr, axis=1, keepdims=True)).T, axis=1)[:, ::-1][:, :5]
    np.testing.assert_allclose(saved.similarity.values, cosines, atol=5e-5)  # float32 store and norm against float64 here
    assert saved.attrs["counts"]["train"] == 12
