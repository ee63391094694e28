"""probe rank, probe position and probe similarity from store to record to report on tiny DINO, DINOv2 (with
registers) and DINOv3 networks. Every number of a record equals the formula computed here on the store's tokens read
with zarr (RankMe from an SVD, LiDAR as RADIO writes it, linear CKA from centred Gram matrices, the minibatch
estimator from Song's HSIC₁); pairing errors are one line before any record is written."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from cli_runs import probe_main
from test_labelfree_science import (
    cka_written_out,
    hsic1_written_out,
    lidar_written_out,
    rankme_by_svd,
)

from probe_toolkit import run
from probe_toolkit.demo.samples import ARCHS, sample_photos, write_checkpoint
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.results import records
from probe_toolkit.store.extract import Settings, extract

NETWORKS = {"dino": ("dino-full", "tiny"), "dinov2": ("dinov2-reg-backbone", "tiny-dinov2-reg"), "dinov3": ("dinov3-official", "tiny-dinov3")}
HBIRD = ("hbird512", "hbird512_aug0", "hbird512_aug1")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("labelfree")
    photos = root / "photos"
    photos.mkdir()
    for name in sorted(p.name for p in sample_photos().iterdir() if p.suffix == ".jpg")[:6]:
        shutil.copy(sample_photos() / name, photos / name)
    out = {}
    for name, (layout, arch) in NETWORKS.items():
        checkpoint = write_checkpoint(root / f"{name}.pth", layout, ARCHS[arch], seed=3)
        views = ("224", *HBIRD) if name == "dino" else ("224",)
        out[name] = extract(checkpoint, photos, settings=Settings(views=views, chunk=4), store=root / f"{name}.zarr", quiet=True, batch_size=4).store
    fewer = root / "fewer"
    fewer.mkdir()
    for name in sorted(p.name for p in photos.iterdir())[:4]:
        shutil.copy(photos / name, fewer / name)
    out["fewer"] = extract(root / "dinov3.pth", fewer, settings=Settings(views=("224",), chunk=4), store=root / "fewer.zarr", quiet=True, batch_size=4).store
    return out


def tokens(store, name: str) -> np.ndarray:
    group = zarr.open_group(str(store), mode="r")
    return np.asarray(group[name][:], np.float32).astype(np.float64)


def test_rank_records_rankme_and_its_curve_from_the_svd(stores, capsys):
    code, printed = probe_main(["rank", stores["dino"], stores["dinov2"], stores["dinov3"], "--sizes", "64,256,100000", "-q"], capsys)
    assert code == 0, printed.err
    assert "RankMe at the 224 view" in printed.out
    for name in ("dino", "dinov2", "dinov3"):
        ds = records.load(stores[name], "rank")
        patch = tokens(stores[name], "tokens_224")
        rows = patch.reshape(-1, patch.shape[-1])
        assert float(ds.rankme.sel(tokens="patch")) == pytest.approx(rankme_by_svd(rows), rel=1e-9)
        assert float(ds.rankme.sel(tokens="class")) == pytest.approx(rankme_by_svd(tokens(stores[name], "cls_tokens_224")), rel=1e-9)
        order = np.random.default_rng(0).permutation(len(rows))
        assert float(ds.curve.sel(tokens="patch", n=256)) == pytest.approx(rankme_by_svd(rows[np.sort(order[:256])]), rel=1e-9)
        assert np.isnan(float(ds.curve.sel(tokens="patch", n=100000)))  # more rows than the store holds
        assert int(ds.rows.sel(tokens="patch")) == len(rows) and ds.attrs["block"] == ARCHS[NETWORKS[name][1]].depth - 1
        assert ds.attrs["computed_on"]["images"] == len(patch)  # the report's freshness checks the record against the store
    dino = records.load(stores["dino"], "rank")
    views = np.stack([tokens(stores["dino"], f"cls_tokens_{v}") for v in HBIRD], axis=1)
    assert float(dino.lidar) == pytest.approx(lidar_written_out(views), rel=1e-8)
    v2 = records.load(stores["dinov2"], "rank")
    assert np.isnan(float(v2.lidar)) and "--views hbird512,hbird512_aug0,hbird512_aug1" in v2.attrs["lidar_note"]
    assert "no LiDAR" in printed.out


def test_position_probe_is_seeded_and_scored_on_held_out_images(stores):
    first = run("position", [stores["dino"], stores["dinov2"]], held_out=0.34, epochs=2)
    again = run("position", [stores["dino"], stores["dinov2"]], held_out=0.34, epochs=2)
    for a, b in zip(first.report.stores, again.report.stores):
        assert a.fit.l1 == b.fit.l1 and a.fit.loss == b.fit.loss  # the same bits
        assert a.images == {"train": 4, "held_out": 2}
    dinov2 = records.load(stores["dinov2"], "position")
    assert dinov2.attrs["grid"] == 16 and float(dinov2.chance) == pytest.approx(16 / 30)  # G / (2(G − 1)) at 16 × 16
    assert 0 < float(dinov2.l1) < 1.5 and first.records[0].meta["settings"]["held_out"] == 0.34
    assert dinov2.attrs["computed_on"]["images"] == 6


def test_similarity_between_checkpoints_is_the_formula_and_refuses_other_images(stores, capsys):
    a, b = tokens(stores["dino"], "tokens_224"), tokens(stores["dinov3"], "tokens_224")
    result = run("similarity", stores["dino"], other=stores["dinov3"], batch=4, epochs=3, seed=2)
    ds = records.load(stores["dino"], "similarity")
    x, y = a.reshape(len(a), -1), b.reshape(len(b), -1)
    assert float(ds.cka.sel(set="a:1", other="b:1")) == pytest.approx(cka_written_out(x, y), rel=1e-9)
    rng, xy, xx, yy = np.random.default_rng(2), 0.0, 0.0, 0.0
    for _ in range(3):
        order = rng.permutation(len(x))
        rows = np.sort(order[:4])  # 6 images: one full batch of 4 per epoch, the rest dropped
        k, g = x[rows] @ x[rows].T, y[rows] @ y[rows].T
        xy, xx, yy = xy + hsic1_written_out(k, g), xx + hsic1_written_out(k, k), yy + hsic1_written_out(g, g)
    assert float(ds.cka_minibatch.sel(set="a:1", other="b:1")) == pytest.approx(xy / np.sqrt(xx * yy), rel=1e-8)
    assert result.records[0].meta["inputs"]["other"] == str(stores["dinov3"].absolute()) and ds.attrs["computed_on"]["images"] == len(a)
    c = run("similarity", stores["dino"], other=stores["dinov3"], examples="class", estimators=("full",)).report
    assert c.cka[0, 1] == pytest.approx(cka_written_out(tokens(stores["dino"], "cls_tokens_224"), tokens(stores["dinov3"], "cls_tokens_224")), rel=1e-9)
    before = len(records.runs(stores["dino"], "similarity"))
    code, printed = probe_main(["similarity", stores["dino"], "--other", stores["fewer"], "-q"], capsys)
    assert code == 2 and "holds other images than" in printed.err and len(printed.err.strip().splitlines()) == 1
    code, printed = probe_main(["similarity", stores["dino"], "--other", stores["dinov2"], "-q"], capsys)
    assert code == 2 and "pair up only on one grid" in printed.err and "--examples class" in printed.err
    code, printed = probe_main(["similarity", stores["dino"], "-q"], capsys)
    assert code == 2 and "holds one block" in printed.err
    assert len(records.runs(stores["dino"], "similarity")) == before  # nothing written by a refusal


def test_the_report_draws_rank_position_and_the_cka_matrix(stores):
    from probe_toolkit.report import sections_labelfree
    from probe_toolkit.report.content import Figure, Table
    from probe_toolkit.report.context import Context
    from probe_toolkit.report.sources import LedgerBook, open_stores

    for name in ("dino", "dinov2", "dinov3"):
        run("rank", stores[name], sizes=(64,))
        run("position", stores[name], held_out=0.34, epochs=1)
    run("similarity", stores["dino"], other=stores["dinov3"], batch=4)
    views = open_stores([stores["dino"], stores["dinov2"], stores["dinov3"]], None, None)
    ctx = Context(views, None, 34, None, LedgerBook())
    built = {f.__name__: f(ctx) for f in (sections_labelfree.rank, sections_labelfree.position, sections_labelfree.similarity)}
    cells = {name: [c for b in section.blocks if isinstance(b, Table) for row in b.rows for c in row] for name, section in built.items()}
    v3 = records.load(stores["dinov3"], "rank")
    assert f"{float(v3.rankme.sel(tokens='patch')):.2f} of {ARCHS['tiny-dinov3'].width}" in cells["rank"]
    assert f"{float(records.load(stores['dinov2'], 'position').l1):.4f}" in cells["position"]
    cka = records.load(stores["dino"], "similarity")
    assert f"{float(cka.cka_minibatch.sel(set='a:1', other='b:1')):.3f}" in cells["similarity"]
    drawn = {name: [b.name for b in section.blocks if isinstance(b, Figure)] for name, section in built.items()}
    assert any("rank-by-block" in f for f in drawn["rank"]) and any("position-by-block" in f for f in drawn["position"])
    assert any("cka-cka_minibatch" in f for f in drawn["similarity"]) and len(drawn["similarity"]) == 2


def test_every_block_a_store_holds(tmp_path):
    """A store extracted with every block: similarity compares its blocks, rank and position read any block, and the
    report's per-block figure draws them (tokens of block B read here from zarr as `tokens_b<B>_224`)."""
    from probe_toolkit.protocols import api, registry
    from probe_toolkit.report.sections_labelfree import by_block

    def at_block(name: str, block: int, **keywords):  # the run context with a block, as plan's --block will set it
        context = api.prepare(registry.get(name), store, None, None, keywords)
        context.block = block
        with records.opened(context.stamp):
            return registry.resolve(registry.get(name).run)(context.inputs, context.settings, context)

    checkpoint = write_checkpoint(tmp_path / "dino.pth", "dino-full", ARCHS["tiny"], seed=5)
    store = extract(checkpoint, sample_photos(), settings=Settings(views=("224",), blocks="all", chunk=4), store=tmp_path / "all.zarr", quiet=True, batch_size=4).store
    first, last = tokens(store, "tokens_b0_224"), tokens(store, "tokens_224")
    cka = run("similarity", store, estimators=("full",)).report
    assert cka.sets == ["a:0", "a:1"]
    assert cka.cka[0, 1] == pytest.approx(cka_written_out(first.reshape(len(first), -1), last.reshape(len(last), -1)), rel=1e-9)
    for block in (0, 1):
        at_block("rank", block, sizes=(64,), lidar=False)
        at_block("position", block, held_out=0.3, epochs=1)
    ranks = by_block(store, "rank", {"view": "224"})
    assert sorted(ranks) == [0, 1]
    assert float(ranks[0].rankme.sel(tokens="patch")) == pytest.approx(rankme_by_svd(first.reshape(-1, first.shape[-1])), rel=1e-9)
    assert sorted(by_block(store, "position", {"view": "224", "grid": 14})) == [0, 1]


def test_position_on_synthetic_stores_reads_a_linear_code_and_not_noise(stores, tmp_path):
    """The dino store's 224 tokens overwritten (with zarr) by tokens that hold their (row, col) linearly at one norm: the
    probe's held-out error is about 0; overwritten by noise: about chance, the best constant's L1 (0.538 at 14 × 14)."""
    from probe_toolkit.analyses.position import chance_l1, targets

    rng = np.random.default_rng(11)
    coded, noise = shutil.copytree(stores["dino"], tmp_path / "coded.zarr"), shutil.copytree(stores["dino"], tmp_path / "noise.zarr")
    for store in (coded, noise):
        shutil.rmtree(store / "results", ignore_errors=True)
    group = zarr.open_group(str(coded), mode="r+")
    n, p, d = group["tokens_224"].shape
    t = targets(14, 14).astype(np.float64)
    basis = np.linalg.qr(rng.normal(size=(d, 3)))[0].T
    code = np.concatenate([t, np.sqrt(3.0 - (t**2).sum(axis=1, keepdims=True))], axis=1) @ basis
    group["tokens_224"][:] = np.repeat(code[None], n, axis=0).astype(group["tokens_224"].dtype)
    zarr.open_group(str(noise), mode="r+")["tokens_224"][:] = rng.normal(size=(n, p, d)).astype(group["tokens_224"].dtype)
    linear = run("position", coded, held_out=0.34, epochs=300).report.stores[0].fit
    blind = run("position", noise, held_out=0.34, epochs=300).report.stores[0].fit
    assert linear.l1 < 1e-3  # position linearly in the tokens: error ≈ 0 (measured 2.6e-5)
    assert blind.chance == pytest.approx(chance_l1(14, 14)) == pytest.approx(14 / 26)
    assert abs(blind.l1 - blind.chance) < 0.1  # no position in the tokens: chance level (measured 0.568; a fit of the training noise only adds)


def test_similarity_says_how_to_get_its_minibatch_estimator_in_a_command_that_works_when_pasted(stores, capsys):
    import shlex

    from probe_toolkit.report import sections_labelfree

    for examples in ("class", "patch"):  # 6 images, fewer than a minibatch of 256; patch tokens: whole images instead
        note = run("similarity", stores["dino"], other=stores["dinov3"], examples=examples).report.minibatch_note
        assert note.endswith(f"--examples {'image' if examples == 'patch' else examples} --batch 6")
        written = records.load(stores["dino"], "similarity")
        assert np.isnan(float(written.cka_minibatch.sel(set="a:1", other="b:1")))
        shown = sections_labelfree.placeholders(written.attrs["minibatch_note"], written.attrs["stores"])  # the report names no folder
        assert shown.endswith(f"probe similarity STORE --other OTHER --view 224 --examples {'image' if examples == 'patch' else examples} --batch 6")
        code, printed = probe_main([*shlex.split(note.partition(": probe ")[2]), "-q"], capsys)
        assert code == 0, printed.err
        ds = records.load(stores["dino"], "similarity")
        assert ds.attrs["minibatch_note"] == "" and ds.attrs["batch"] == 6
        assert np.isfinite(float(ds.cka_minibatch.sel(set="a:1", other="b:1")))


def test_lidar_at_a_block_reads_that_blocks_views_or_says_the_extraction_that_adds_them(stores, tmp_path, capsys):
    """``probe rank --block 0``: LiDAR from the Hummingbird views' class tokens of block 0 (``cls_tokens_b0_*``,
    written out here in float64 as RADIO computes it), not the last block's; a store holding those views at the last
    block alone still gives RankMe at block 0, and LiDAR is left out with the extraction that adds them at that block."""
    photos = sample_photos()
    checkpoint = write_checkpoint(tmp_path / "dino.pth", "dino-full", ARCHS["tiny"], seed=3)
    every = extract(checkpoint, photos, settings=Settings(views=("224", *HBIRD), blocks="all", chunk=4), store=tmp_path / "all.zarr", quiet=True, batch_size=4).store
    code, printed = probe_main(["rank", every, "--block", "0", "--sizes", "64", "-q"], capsys)
    assert code == 0, printed.err
    ds = records.load(every, "rank")
    views = np.stack([tokens(every, f"cls_tokens_b0_{v}") for v in HBIRD], axis=1)
    assert ds.attrs["block"] == 0 and float(ds.lidar) == pytest.approx(lidar_written_out(views), rel=1e-8)
    last = np.stack([tokens(every, f"cls_tokens_{v}") for v in HBIRD], axis=1)
    assert float(ds.lidar) != pytest.approx(lidar_written_out(last), rel=1e-3)
    code, printed = probe_main(["rank", stores["dino"], "--block", "0", "--sizes", "64", "-q"], capsys)
    assert code == 2, printed.err  # the dino store holds the 224 tokens at the last block only: refused, naming the extraction
    plain = extract(checkpoint, photos, settings=Settings(views=("224", *HBIRD), blocks=(0,), chunk=4), store=tmp_path / "b0.zarr", quiet=True, batch_size=4).store
    apart = extract(checkpoint, photos, settings=Settings(views=("224",), blocks=(0,), chunk=4), store=tmp_path / "apart.zarr", quiet=True, batch_size=4).store
    extract(checkpoint, photos, settings=Settings(views=HBIRD, chunk=4), store=apart, quiet=True, batch_size=4)  # the views at the last block alone
    for store, lidar in ((plain, True), (apart, False)):
        code, printed = probe_main(["rank", store, "--block", "0", "--sizes", "64", "-q"], capsys)
        assert code == 0, printed.err
        ds = records.load(store, "rank")
        assert ds.attrs["block"] == 0 and np.isnan(float(ds.lidar)) != lidar
    note = ds.attrs["lidar_note"]
    assert "augmented views at block 0: probe extract " in note and " --views hbird512,hbird512_aug0,hbird512_aug1 " in note, note
    code, printed = probe_main([*shlex.split(note.split("at block 0: ")[1])[1:], "-q"], capsys)  # the note's extraction, pasted
    assert code == 0, printed.err
    code, printed = probe_main(["rank", apart, "--block", "0", "--sizes", "64", "-q"], capsys)
    assert code == 0, printed.err
    views = np.stack([tokens(apart, f"cls_tokens_b0_{v}.p1") for v in HBIRD], axis=1)  # added to the store as a later part
    assert float(records.load(apart, "rank").lidar) == pytest.approx(lidar_written_out(views), rel=1e-8)


def test_a_network_without_class_token_is_refused_with_the_flag_that_reads_its_patches(stores, capsys):
    """SelfPatch's backbone has no class token: rank's default (class and patch rows) and
    similarity's ``--examples class`` are refused in one line naming the caller's own flag, whose
    value, given, measures the patch rows."""
    root = Path(stores["dino"]).parent
    checkpoint = write_checkpoint(root / "selfpatch.pth", "selfpatch-full", ARCHS["tiny"], seed=3)
    store = extract(checkpoint, root / "photos", settings=Settings(views=("224",), chunk=4), store=root / "selfpatch.zarr", quiet=True, batch_size=4).store
    for asked, flag in ((["rank", store, "--sizes", "64"], ["--tokens", "patch"]), (["similarity", store, "--other", stores["dino"]], ["--examples", "patch"])):
        code, printed = probe_main([*asked, *([] if flag[0] == "--tokens" else ["--examples", "class"]), "-q"], capsys)
        assert code == 2 and len(printed.err.strip().splitlines()) == 1, printed.err
        assert printed.err.rstrip().endswith(f"has no class token (its network has none); read its patch rows instead: {' '.join(flag)}"), printed.err
        code, printed = probe_main([*asked, *flag, "-q"], capsys)
        assert code == 0, printed.err
    assert "tokens=patch" in str(pytest.raises(ProbeError, run, "rank", store).value)  # the Python caller's keyword


def test_full_cka_beyond_its_memory_is_refused_with_the_flags_that_fit(stores, capsys, monkeypatch):
    """Full CKA on whole images past its memory bound: one line naming the command line's flags
    (``--estimators minibatch``, ``--examples patch``); either, given, runs."""
    from probe_toolkit.commands import similarity as command

    monkeypatch.setattr(command, "MEMORY", 1024)
    asked = ["similarity", stores["dino"], "--other", stores["dinov3"], "--batch", "4"]
    code, printed = probe_main([*asked, "-q"], capsys)
    assert code == 2 and len(printed.err.strip().splitlines()) == 1, printed.err
    assert "full CKA on whole images would hold" in printed.err and printed.err.rstrip().endswith(
        "use the minibatch estimator alone: --estimators minibatch, or compare every patch token: --examples patch"
    ), printed.err
    for given in (["--estimators", "minibatch"], ["--examples", "patch"]):
        code, printed = probe_main([*asked, *given, "-q"], capsys)
        assert code == 0, printed.err


def test_a_view_of_own_sizes_is_refused_with_views_of_one_size(stores, capsys):
    code, printed = probe_main(["rank", stores["dino"], "--view", "native", "-q"], capsys)
    assert code == 2 and printed.err.strip() == (
        "error: --view native has each image at its own size: its rows do not pair up; use one of a fixed size, e.g. --view 224 or --view short@448"
    ), printed.err
