"""``probe extract --for`` stores what the named protocols read and nothing else; a store grown for
another protocol adds only what that one reads; ``probe plan`` tells each array's size first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from cli_runs import probe_main
from test_knn import colour_folders

from probe_toolkit.demo.samples import TINY, write_checkpoint
from probe_toolkit.store import cache, plan
from probe_toolkit.store.checkpoints import load_checkpoint

PER_VIEW = ("done", "failed", "grid_rows", "grid_cols")


def data_arrays(store) -> set[str]:
    names = set(zarr.open_group(store, mode="r").array_keys())
    return {n for n in names if n not in cache.FLAGS and not n.startswith(tuple(f"{p}_" for p in PER_VIEW))}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    colour_folders(root / "data")
    return root, write_checkpoint(root / "dino.pth", "dino-full", TINY, seed=0)


def run(capsys, *args) -> str:
    code, printed = probe_main([str(a) for a in args], capsys)
    assert code == 0, printed.err
    return printed.out


def test_a_knn_plan_stores_the_class_token_and_its_normed_feature_only(folders, tmp_path, capsys):
    root, ckpt = folders
    store = tmp_path / "knn.zarr"
    run(capsys, "extract", ckpt, "--images", root / "data", "--for", "knn", "--dtype", "float32", "--store", store, "-q")
    assert data_arrays(store) == {"cls_tokens_eval224", "cls_normed_eval224"}  # no patch array
    ds = cache.open_store(store)
    norm = load_checkpoint(ckpt).backbone
    x = ds.cls_tokens_eval224.values.astype(np.float64)
    normed = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-6) * norm["norm.weight"].double().numpy() + norm["norm.bias"].double().numpy()
    np.testing.assert_allclose(ds.cls_normed_eval224.values, normed, atol=1e-5)  # DINO's k-NN feature: the class token through the final norm
    full = tmp_path / "full.zarr"
    run(capsys, "extract", ckpt, "--images", root / "data", "--views", "eval224", "--dtype", "float32", "--store", full, "-q")
    np.testing.assert_array_equal(ds.cls_tokens_eval224.values, cache.open_store(full).cls_tokens_eval224.values)
    # probe knn reads the planned store as the full one
    c = tmp_path / "cache"
    for name, split in (("tr", "train"), ("va", "val")):
        run(capsys, "panel", "add", name, "--classes-from-folders", root / "data" / split, "--role", split, "--cache", c)
    scores = []
    for s in (store, full):
        run(capsys, "knn", s, "--train", "tr", "--val", "va", "--k", "1,3", "--cache", c, "--json", tmp_path / "k.json", "-q")
        scores.append(json.loads((tmp_path / "k.json").read_text()))
    assert scores[0]["top1"] == scores[1]["top1"] and scores[0]["view"] == "eval224"

    # grown for Hummingbird: its three views' patch tokens, nothing else; what it held is untouched
    before = cache.open_store(store).cls_tokens_eval224.values
    run(capsys, "extract", ckpt, "--images", root / "data", "--for", "hummingbird", "--dtype", "float32", "--store", store, "-q")
    assert data_arrays(store) == {"cls_tokens_eval224", "cls_normed_eval224", "tokens_hbird512", "tokens_hbird512_aug0", "tokens_hbird512_aug1"}
    np.testing.assert_array_equal(cache.open_store(store).cls_tokens_eval224.values, before)
    # and for k-NN at the last two blocks: the block it lacks, as a part of the eval224 view
    run(capsys, "extract", ckpt, "--images", root / "data", "--for", "knn", "--blocks", "last2", "--dtype", "float32", "--store", store, "-q")
    assert data_arrays(store) - {"tokens_hbird512", "tokens_hbird512_aug0", "tokens_hbird512_aug1"} == {
        "cls_tokens_eval224",
        "cls_normed_eval224",
        "cls_tokens_b0_eval224.p1",
        "cls_normed_b0_eval224.p1",
    }
    grown = cache.open_store(store, arrays="cls_tokens_eval224")
    assert cache.require(grown, "cls_normed_eval224", block=0).attrs == {**cache.require(grown, "cls_normed_eval224", block=0).attrs, "block": 0}


def test_a_network_without_a_class_token_stores_its_patch_tokens_for_knn(folders, tmp_path, capsys):
    root, _ = folders
    ckpt = write_checkpoint(tmp_path / "sp.pth", "selfpatch-backbone", TINY, seed=1)
    run(capsys, "extract", ckpt, "--images", root / "data", "--for", "knn", "--store", tmp_path / "s.zarr", "-q")
    assert data_arrays(tmp_path / "s.zarr") == {"tokens_eval224"}  # the mean of the patch tokens is its feature (probe knn --feature mean)


def test_probe_plan_prints_each_arrays_size_before_any_work(capsys):
    out = run(capsys, "plan", "--for", "knn,hummingbird", "--images", "1000", "--arch", "vit-s16").replace("\n", " ")
    for name in ("cls_tokens_eval224", "cls_normed_eval224", "tokens_hbird512", "tokens_hbird512_aug0"):
        assert name in out
    assert "768 B" in out and "750.0 KiB" in out  # a class token, 384 float16; 32 x 32 patches x 384 x 2 bytes at /16
    moved = run(capsys, "plan", "--for", "knn", "--views", "eval@448", "--images", "10")
    assert "cls_tokens_eval@448" in moved and "eval224" not in moved
    stats = run(capsys, "plan", "--views", "square@2048", "--attention", "stats", "--images", "1").replace("\n", " ")
    assert "attention_entropy_square@2048" in stats and "statistics' tile" in stats and "a batch of 16" in stats


def test_plans_are_checked_before_any_work(folders, tmp_path, capsys):
    root, ckpt = folders
    code, printed = probe_main(["extract", str(ckpt), "--images", str(root / "data"), "--for", "propagate", "--store", str(tmp_path / "p.zarr")], capsys)
    assert code == 2 and "reads no store arrays" in printed.err
    code, printed = probe_main(["plan", "--views", "native", "--images", "10"], capsys)
    assert code == 2 and "pass --images a folder" in printed.err
    assert plan.wanted(["tokens_hbird512", "tokens_hbird512_aug1", "keys_480"], ["hbird@448"]) == ("tokens_hbird@448", "tokens_hbird@448_aug1", "keys_480")
    assert not (tmp_path / "p.zarr").exists()


def test_a_protocol_reading_several_blocks_plans_them(monkeypatch):
    """A protocol whose Reads declares blocks (DINOv2's linear protocol: the last 4) gets them planned unless --blocks is given."""
    from dataclasses import replace

    from probe_toolkit.cli.stores import planned_settings
    from probe_toolkit.protocols import registry

    knn = registry.get("knn")
    monkeypatch.setitem(registry._REGISTRY, "knn", replace(knn, reads=replace(knn.reads, blocks="last4")))
    assert planned_settings(None, "knn", "last", None, "last", "float16", 16, "auto", None).blocks == "last4"
    assert planned_settings(None, "knn", "3,7", None, "last", "float16", 16, "auto", None).blocks == "3,7"
