"""probe overcluster from a VOC-layout panel to record and report on tiny DINO, DINOv2 (registers, /14) and DINOv3
networks. The record's mIoU equals NeCo's pipeline written out here: the stored tokens read with zarr, a layer norm
without its affine part (standardising over all tokens removes any per-channel scale and shift, so the final norm's
weights cannot matter), scikit-learn's StandardScaler, faiss's PCAMatrix and Kmeans with NeCo's settings, torch's
nearest interpolation, and the matching by the loops of test_labelfree_science. Labels are read once, through the
ledger, after the clustering; a panel of another kind is refused before any label read."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import zarr
from cli_runs import probe_main
from PIL import Image
from segmentation_folders import write_voc
from test_hummingbird_protocol import _scene as voc_scene
from test_labelfree_science import hungarian_written_out, many_to_one_written_out

from probe_toolkit.demo import samples
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

VAL = ["2007_000033", "2007_000042", "2008_000002", "2009_000010", "2010_000005"]
NETWORKS = {
    "dino": ("dino-full", samples.TINY, 16, 1e-6),
    "dinov2-reg": ("dinov2-reg-backbone", samples.TINY_DINOV2_REG, 14, 1e-6),
    "dinov3": ("dinov3-official", samples.TINY_DINOV3, 16, 1e-5),
}


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    root = tmp_path_factory.mktemp("overcluster")
    voc = root / "VOCdevkit" / "VOC2012"
    write_voc(voc, {"val": VAL}, lambda i, n: voc_scene(int(i.replace("_", "")), size=(96 + 8 * n, 72 + 4 * n)))
    cache = root / "cache"
    from typer.testing import CliRunner

    from probe_toolkit.cli import app

    done = CliRunner().invoke(app, ["panel", "add", "voc-val", "--voc-segmentation", str(voc), "--split", "val", "--role", "val", "--cache", str(cache)])
    assert done.exit_code == 0, done.output
    return root, voc, cache


def neco_written_out(store, voc, ks, seeds, eps, patch, iterations=10, restarts=1):
    import faiss
    from sklearn.preprocessing import StandardScaler

    group = zarr.open_group(str(store), mode="r")
    ids = [str(i) for i in group["image"][:]]
    tokens = np.asarray(group["tokens_hbird@448"][:], np.float64)
    n, p, d = tokens.shape
    side = int(round(p**0.5))
    x = tokens.reshape(-1, d)
    x = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps)  # layer norm, no affine
    x = StandardScaler().fit_transform(x).astype(np.float32)
    pca = faiss.PCAMatrix(d, 50)
    pca.train(x)
    x = pca.apply_py(x)
    cut = side * patch
    truth = []
    for i in ids:
        label = np.asarray(Image.open(voc / "SegmentationClass" / f"{i.rsplit('.', 1)[0]}.png"))
        big = torch.nn.functional.interpolate(torch.as_tensor(label[None, None].astype(np.float32)), size=(448, 448), mode="nearest")[0, 0]
        truth.append(torch.nn.functional.interpolate(big[None, None, :cut, :cut], size=(100, 100), mode="nearest")[0, 0].long().numpy())
    truth = np.stack(truth)
    keep = truth != 255
    out = {}
    for k in ks:
        scores = []
        for seed in range(seeds):
            km = faiss.Kmeans(50, k, niter=iterations, nredo=restarts, seed=seed, verbose=False, gpu=False, spherical=False)
            km.train(x)
            assigned = km.index.search(x, 1)[1][:, 0].reshape(n, 1, side, side)
            up = torch.nn.functional.interpolate(torch.as_tensor(assigned).float(), size=(100, 100), mode="nearest")[:, 0].long().numpy()
            if k == 21:
                scores.append(hungarian_written_out(truth[keep], up[keep], 21))
            else:
                scores.append(many_to_one_written_out(truth[keep], up[keep], k, 21))
        out[k] = float(np.mean(scores))
    return out


@pytest.mark.parametrize("network", list(NETWORKS))
def test_overcluster_is_necos_pipeline_and_reads_labels_only_to_score(panel, network, tmp_path, capsys):
    root, voc, cache = panel
    layout, arch, patch, eps = NETWORKS[network]
    checkpoint = samples.write_checkpoint(tmp_path / f"{layout}.pth", layout, arch, seed=4)
    store = extract(
        checkpoint,
        voc / "JPEGImages",
        settings=Settings(views=("hbird@448",), chunk=4, dtype="float32"),
        store=tmp_path / "voc.zarr",
        cache_dir=cache,
        quiet=True,
        batch_size=2,
    ).store
    ledger = cache / "ledger.jsonl"
    before = ledger.read_text().splitlines() if ledger.exists() else []
    code, printed = probe_main(
        ["overcluster", store, "--panel", "voc-val", "--k", "21,40", "--seeds", "2", "--iterations", "10", "--restarts", "1", "--cache", cache, "-q"], capsys
    )
    assert code == 0, printed.err
    ds = records.load(store, "overcluster")
    want = neco_written_out(store, voc, (21, 40), 2, eps, patch)
    assert float(ds.miou.sel(k=21)) == pytest.approx(want[21], abs=1e-12)
    assert float(ds.miou.sel(k=40)) == pytest.approx(want[40], abs=1e-12)
    assert ds.attrs["matching"] == {"21": "hungarian", "40": "many-to-one"} and ds.attrs["grid"] == 448 // patch and ds.attrs["view"] == "hbird@448"
    added = ledger.read_text().splitlines()[len(before) :]
    assert len(added) == 1 and json.loads(added[0])["purpose"] == "overcluster: score"
    assert ds.attrs["ledger"] == hashlib.sha256(added[0].encode()).hexdigest()  # the record names the entry its labels came from
    assert "Overclustering on voc-val" in printed.out and f"{100 * want[40]:.2f}" in printed.out
    from probe_toolkit.report.content import Table
    from probe_toolkit.report.context import Context
    from probe_toolkit.report.sections_labelfree import overcluster
    from probe_toolkit.report.sources import LedgerBook, open_stores

    section = overcluster(Context(open_stores([store], None, None), None, 34, None, LedgerBook()))
    rows = [row for b in section.blocks if isinstance(b, Table) for row in b.rows]
    assert rows[1][:3] == ["40", "many-to-one", f"{100 * want[40]:.2f}"]


def test_overcluster_refuses_before_any_label_read(panel, tmp_path, capsys):
    root, voc, cache = panel
    checkpoint = samples.write_checkpoint(tmp_path / "dino.pth", "dino-full", samples.TINY, seed=4)
    store = extract(
        checkpoint, voc / "JPEGImages", settings=Settings(views=("224",), chunk=4), store=tmp_path / "s.zarr", cache_dir=cache, quiet=True, batch_size=2
    ).store
    ledger = cache / "ledger.jsonl"
    before = ledger.read_text() if ledger.exists() else ""
    code, printed = probe_main(["overcluster", store, "--panel", "voc-val", "--cache", cache, "-q"], capsys)
    assert code == 2 and "--views hbird@448" in printed.err and len(printed.err.strip().splitlines()) == 1
    code, printed = probe_main(["overcluster", store, "--panel", "voc-val", "--k", "10", "--cache", cache, "-q"], capsys)
    assert code == 2 and "21 classes" in printed.err
    assert (ledger.read_text() if ledger.exists() else "") == before and not (store / "results").exists()


SIBLING_RUN = """
import json, sys

from probe_toolkit.analyses import overcluster as oc

threads, kmeans = [], oc.kmeans


def counted(*args, **keywords):
    out = kmeans(*args, **keywords)
    import faiss

    threads.append(faiss.omp_get_max_threads())  # the OpenMP threads faiss's k-means had
    return out


oc.kmeans = counted
from probe_toolkit import run

done = run("overcluster", sys.argv[1], panel="voc-val", k=(21, 30), seeds=2, restarts=1, iterations=10, cache_dir=sys.argv[2])
print(json.dumps({"threads": threads, "miou": done.report.miou}))
"""


def test_overcluster_reads_the_panel_beside_the_store_and_clusters_on_one_thread(panel, tmp_path):
    """A store of other images whose panel sibling (``<network>-panel-<panel>.zarr``, as ``probe extract --panel`` names it)
    holds the panel's hbird@448 view: the run reads the sibling and saves its record in the store, with the numbers the
    sibling gives on its own. Run in a fresh process (faiss not yet loaded), every k-means has one OpenMP thread: faiss is
    loaded before the thread limit, which binds only the libraries already loaded (otherwise its first run spread over
    every core, the clusters machine-dependent and, on a busy machine, 20 times slower)."""
    import os
    import subprocess
    import sys

    root, voc, cache = panel
    checkpoint = samples.write_checkpoint(tmp_path / "dino.pth", "dino-full", samples.TINY, seed=4)
    store = extract(
        checkpoint, samples.sample_photos(), settings=Settings(views=("224",), chunk=4), store=tmp_path / "net.zarr", cache_dir=cache, quiet=True, batch_size=4
    ).store
    sibling = extract(
        checkpoint,
        voc / "JPEGImages",
        settings=Settings(views=("hbird@448",), chunk=4, dtype="float32"),
        store=tmp_path / "net-panel-voc-val.zarr",
        cache_dir=cache,
        quiet=True,
        batch_size=2,
    ).store
    done = subprocess.run([sys.executable, "-c", SIBLING_RUN, str(store), str(cache)], capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["threads"] == [1] * 4  # 2 ks × 2 seeds
    ds = records.load(store, "overcluster")
    assert ds.attrs["counts"]["images"] == len(VAL) and not (sibling / "results").exists()
    from probe_toolkit import run

    alone = run("overcluster", sibling, panel="voc-val", k=(21, 30), seeds=2, restarts=1, iterations=10, cache_dir=cache).report
    assert alone.miou == found["miou"] == [float(v) for v in ds.miou.values]
