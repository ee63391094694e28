"""The contract every protocol passes through: the registry, self-validating settings, one
placement, records that are never overwritten, the Python API equal to the CLI, one view table."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from cli_runs import probe_main

import probe_toolkit as probe
from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.placement import Placement
from probe_toolkit.infra.settings import SettingError
from probe_toolkit.protocols import api, registry
from probe_toolkit.results import records
from probe_toolkit.store import grids, images, views

EXPECTED = {
    "entropy",
    "neighbours",
    "decode",
    "decode-stream",
    "score",
    "decode-sweep",
    "linear",
    "knn",
    "attention-masks",
    "propagate",
    "correspond",
    "hummingbird",
    "linear-segmentation",
    "rank",
    "position",
    "similarity",
    "overcluster",
    "linear-depth",
    "linear-dinov2",
}

# (protocol, a bad value, the parameter its error must name)
BAD = [
    ("entropy", {"boot": 0}, "boot"),
    ("entropy", {"patch": -1}, "patch"),
    ("neighbours", {"k": 9}, "k"),
    ("neighbours", {"distance": "cosine"}, "distance"),
    ("decode", {"tau": 1.0}, "tau"),
    ("decode", {"eps": 0.0}, "eps"),
    ("decode", {"masks": 0}, "masks"),
    ("decode", {"view": "512"}, "view"),
    ("decode", {"preset": "ncut"}, "preset"),
    ("decode-sweep", {"view": "224"}, "view"),
    ("linear", {"level": "pixel"}, "level"),
    ("linear", {"epochs": 0}, "epochs"),
    ("knn", {"temperature": 0.0}, "temperature"),
    ("hummingbird", {"memory": (102400, 0)}, "memory"),
    ("hummingbird", {"temperature": -1.0}, "temperature"),
    ("hummingbird", {"matching": "greedy"}, "matching"),
    ("knn", {"ks": (10, 0)}, "ks"),
    ("knn", {"feature": "gap"}, "feature"),
    ("attention-masks", {"mass": 1.0}, "mass"),
    ("attention-masks", {"row": "first"}, "row"),
    ("correspond", {"thresholds": (0.1, 1.5)}, "thresholds"),
    ("correspond", {"instances": -1}, "instances"),
    ("propagate", {"topk": 0}, "topk"),
    ("propagate", {"n_last_frames": 0}, "n_last_frames"),
    ("propagate", {"preset": "dinov2"}, "preset"),
    ("propagate", {"temperature": 0.0}, "temperature"),
    ("decode", {"keys": "after"}, "keys"),
    ("decode-sweep", {"keys": "auto"}, "keys"),
    ("linear-segmentation", {"stride": 600}, "stride"),
    ("linear-segmentation", {"warmup": 40000}, "warmup"),
    ("linear-segmentation", {"preset": "dinov1"}, "preset"),
    ("rank", {"view": "native"}, "view"),
    ("rank", {"tokens": ("cls",)}, "tokens"),
    ("position", {"held_out": 1.0}, "held_out"),
    ("similarity", {"examples": "pixel"}, "examples"),
    ("similarity", {"batch": 3}, "batch"),
    ("overcluster", {"k": (100, 100)}, "k"),
    ("overcluster", {"seeds": 0}, "seeds"),
    ("linear-segmentation", {"scale": (2.0, 0.5)}, "scale"),
    ("linear-depth", {"preset": "dinov2-lin2"}, "preset"),
    ("linear-depth", {"warmup": 38400}, "warmup"),
    ("linear-depth", {"crop": (416,)}, "crop"),
    ("linear-depth", {"batch_size": 1}, "batch_size"),
    ("decode", {"ties": "random"}, "ties"),
    ("linear-dinov2", {"n_last_blocks": (1, 0)}, "n_last_blocks"),
    ("linear-dinov2", {"learning_rates": (0.1, -1.0)}, "learning_rates"),
    ("linear-dinov2", {"epoch_length": 0}, "epoch_length"),
    ("correspond", {"num_corr": 0}, "num_corr"),
    ("correspond", {"scale_factor": 0.3}, "scale_factor"),
]


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def store(tiny_stores, tmp_path) -> Path:
    """A private copy of the tiny DINO store (the session's store is shared), without results."""
    copy = tmp_path / "teacher.zarr"
    shutil.copytree(tiny_stores["dino"], copy, ignore=shutil.ignore_patterns("results"))
    return copy


def test_the_registry_holds_every_protocol_each_declared_once():
    found = {p.name: p for p in probe.list_protocols()}
    assert set(found) == EXPECTED
    for p in found.values():
        assert dataclasses.is_dataclass(p.settings) and p.settings.__dataclass_params__.frozen, p.name
        assert p.references and all(r.paper and r.code for r in p.references), p.name
        assert p.summary and p.differences and p.results, p.name
        p.settings()  # the defaults are valid
    with pytest.raises(ProbeError, match="no protocol named 'ncut'.*protocols: entropy"):
        registry.get("ncut")


@pytest.mark.parametrize("name,given,parameter", BAD, ids=[f"{n}-{p}" for n, _, p in BAD])
def test_settings_refuse_bad_values_naming_the_parameter(name, given, parameter):
    with pytest.raises(SettingError) as caught:
        registry.get(name).make_settings(**given)
    assert caught.value.parameter == parameter
    assert caught.value.problem.startswith(f"{parameter} must") or caught.value.problem.startswith(f"{parameter} ")
    assert "--" not in caught.value.problem  # the science layer names parameters, not flags


def test_an_unknown_setting_is_refused_with_the_known_ones():
    with pytest.raises(SettingError, match="taus is not a setting.*known: center, color_lambda, eps"):
        registry.get("decode").make_settings(taus=0.3)


def test_the_cli_names_the_flag_where_the_api_names_the_parameter(store, capsys):
    code, printed = probe_main(["entropy", store, "--boot", "0", "-q"], capsys)
    assert code == 2 and printed.err.strip().startswith("error: --boot must be an integer in [100, 100000] (got 0): there would be no interval")
    assert "Traceback" not in printed.err and "use e.g. --boot 1000" in printed.err
    with pytest.raises(SettingError, match=r"^boot must be an integer in \[100, 100000\] \(got 0\).*use e.g. boot=1000$"):
        probe.run("entropy", store, boot=0)
    code, printed = probe_main(["decode", store, "--tau", "1.5", "-q"], capsys)
    assert code == 2 and "--tau must be a number in [-1, 1) (got 1.5)" in printed.err
    assert not (store / "results").exists()  # refused before any work


def test_placement_parses_once_and_reaches_the_protocol_unchanged(monkeypatch, store):
    torchrun = {"RANK": "1", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "job"}
    assert Placement.parse(environ=torchrun).shard == "1/3"
    assert Placement.parse(environ=torchrun, shard="0/2").shard == "0/2"  # the option wins
    assert Placement.parse(environ={"RANK": "1", "WORLD_SIZE": "3"}, shard="0/2").shard == "0/2"  # given on purpose: the shell's are not read
    with pytest.raises(ProbeError, match="torchrun did not start this process"):  # left in a shell: refused, not followed
        Placement.parse(environ={"RANK": "1", "WORLD_SIZE": "3"})
    assert Placement.parse(environ={}).shard is None and Placement.parse(environ={}).shard_pair() == (0, 1)
    for bad, parameter in (({"workers": 0}, "workers"), ({"shard": "3/3"}, "shard"), ({"backend": "jax"}, "backend"), ({"threads": 0}, "threads")):
        with pytest.raises(SettingError) as caught:
            Placement(**bad)
        assert caught.value.parameter == parameter
    protocol = registry.get("entropy")
    seen = []
    fake = dataclasses.replace(protocol, run=_observing(seen))
    monkeypatch.setitem(registry._REGISTRY, "entropy", fake)
    where = Placement(workers=2, dask_address=None, shard="0/1")
    api.run("entropy", [store], placement=where)
    assert seen == [where] and seen[0] is where
    api.run("entropy", [store], workers=3)
    assert seen[1] == Placement(workers=3)


def test_run_ids_sort_in_the_order_runs_began_even_if_the_clock_is_set_back(monkeypatch):
    import datetime as dt

    monkeypatch.setattr(records, "_last", None)  # restored after the test: later runs keep the real clock

    later = records.new_run_id(dt.datetime(2027, 1, 1, tzinfo=dt.UTC))
    earlier_clock = records.new_run_id(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert earlier_clock > later and earlier_clock.startswith("20270101-000000-000001")
    assert records.RUN_ID.match(later) and records.RUN_ID.match(earlier_clock)


def test_two_runs_give_two_records_and_neither_is_changed(store):
    first = probe.run("entropy", store, boot=100)
    assert [r.result for r in first.records] == ["entropy"]
    record = first.records[0]
    assert record.path == store / "results" / "entropy" / first.run_id
    meta = json.loads((record.path / "record.json").read_text())
    assert meta["protocol"] == "entropy" and meta["settings"]["boot"] == 100 and meta["placement"]["threads"] == 1
    assert meta["inputs"]["stores"] == [str(store.absolute())] and meta["toolkit_version"] == probe.__version__
    before = _tree_hash(record.path)
    second = probe.run("entropy", store, boot=120, seed=1)
    assert second.run_id != first.run_id and second.run_id > first.run_id
    assert [r.run_id for r in records.runs(store, "entropy")] == [first.run_id, second.run_id]
    assert _tree_hash(record.path) == before  # the first record is untouched
    assert records.load(store, "entropy").attrs["record"]["run_id"] == second.run_id  # the latest by default
    assert records.load(store, "entropy", run=first.run_id).attrs["record"]["run_id"] == first.run_id


def test_a_run_saving_several_results_gives_them_one_run_id(store, tmp_path):
    run = probe.run("decode", store, preset="tokencut", view="480", workers=1, out=tmp_path / "masks.json")
    assert [r.result for r in run.records] == ["decoder"] and run.records[0].run_id == run.run_id
    meta = run.records[0].meta
    assert meta["settings"]["preset"] == "tokencut" and meta["inputs"]["out"] == str((tmp_path / "masks.json").absolute())


def test_results_written_before_records_still_read_and_are_kept(store):
    legacy = store / "results" / "entropy"
    legacy.parent.mkdir(parents=True, exist_ok=True)
    xr.Dataset({"h": ("image", np.arange(3.0))}, attrs={"date": "2026-12-01T00:00:00+00:00"}).to_zarr(legacy, zarr_format=3, consolidated=False)
    found = records.runs(store, "entropy")
    assert [r.run_id for r in found] == ["legacy"] and found[0].meta["legacy"] and found[0].created.startswith("2026-12-01")
    assert list(records.load(store, "entropy")["h"].values) == [0.0, 1.0, 2.0]
    run = probe.run("entropy", store, boot=100)
    assert [r.run_id for r in records.runs(store, "entropy")] == ["legacy", run.run_id]  # migrated, not replaced
    assert list(records.load(store, "entropy", run="legacy")["h"].values) == [0.0, 1.0, 2.0]
    assert "h" not in records.load(store, "entropy")


def test_shard_parts_keep_one_slot_each(store):
    part = xr.Dataset({"x": ("image", np.zeros(2))})
    path = records.save(store, "decoder-part-0-of-2", part, {"a": 1})
    assert path == store / "results" / "decoder-part-0-of-2"
    again = records.save(store, "decoder-part-0-of-2", part, {"a": 2})
    assert again == path and records.load(store, "decoder-part-0-of-2").attrs["a"] == 2
    assert not records.every_record(store)  # parts are a run's working state, not records


def test_the_api_and_the_cli_give_identical_numbers(store, capsys, tmp_path):
    code, printed = probe_main(["entropy", store, "--boot", "150", "--seed", "3", "-q", "--json", tmp_path / "cli.json"], capsys)
    assert code == 0, printed.err
    by_cli = records.load(store, "entropy")
    run = probe.run("entropy", [store], boot=150, seed=3, json_path=tmp_path / "api.json")
    by_api = records.load(store, "entropy")
    assert by_api.attrs["record"]["run_id"] == run.run_id != by_cli.attrs["record"]["run_id"]
    for name in by_cli.data_vars:
        assert np.array_equal(by_cli[name].values, by_api[name].values, equal_nan=True), name
    assert json.loads((tmp_path / "cli.json").read_text()) == json.loads((tmp_path / "api.json").read_text())


def test_probe_results_lists_every_record_and_probe_list_the_catalogue(store, capsys):
    first = probe.run("entropy", store, boot=100)
    second = probe.run("neighbours", store, boot=100)
    code, printed = probe_main(["results", store], capsys)
    assert code == 0 and first.run_id in printed.out and second.run_id in printed.out and "neighbours_g" in printed.out
    code, printed = probe_main(["results", store, "--result", "knn"], capsys)
    assert code == 2 and "holds no record of 'knn'" in printed.err
    code, printed = probe_main(["list"], capsys)
    assert code == 0
    for name in (*EXPECTED, *views.NAMES, "vit-s16", "davis", "facebookresearch/dino", "valeoai/LOST"):
        assert name in printed.out, name


def test_views_are_declared_once():
    assert images.VIEW_NAMES == views.NAMES
    assert grids.JOINED_VIEWS == views.JOINED == ("hbird512_aug0", "hbird512_aug1", "native_crop", "native_resized")
    assert views.canonical("native-crop") == "native_crop" and views.canonical(480) == "480"
    assert views.of_array("keys_native_resized") == "native_resized" and views.of_array("tokens_224") == "224"
    assert views.of_array("tokens_hbird512_aug1") == "hbird512_aug1" and views.of_array("tokens_hbird512") == "hbird512"
    with pytest.raises(SettingError, match="view '512' is not one of 96, 224, eval224, 480, hbird512, hbird512_aug0, hbird512_aug1, native"):
        views.canonical("512")
    assert set(views.OWN_SIZE) == {"native", "native_crop", "native_resized"}


def test_a_store_holding_none_of_a_panels_images_is_refused_before_any_label_read(tmp_path, capsys):
    from decoder_scenes import Scene, make_store, planted_keys, write_panel

    from probe_toolkit.labels import panels

    held = [Scene("one.png", 96, 128, [(3, 9, 4, 12)]), Scene("two.png", 160, 160, [(2, 7, 2, 7)])]
    other = [Scene("three.png", 96, 128, [(3, 9, 4, 12)]), Scene("four.png", 160, 160, [(2, 7, 2, 7)])]
    keys = np.stack([planted_keys(16, s.objects, channels=24, noise=0.01, seed=i) for i, s in enumerate(held)])
    store = make_store(tmp_path / "store.zarr", held, keys)
    root = tmp_path / "cache"
    for name, scenes in (("va", other), ("mine", held)):
        annotations, folder = write_panel(tmp_path / name, scenes, 16)
        panels.add_panel(name, annotations, folder, "val", cache=root)
    code, printed = probe_main(["decode", store, "--panel", "va", "--cache", root, "-q"], capsys)
    assert code == 2 and "holds none of the 2 images of panel 'va'" in printed.err and len(printed.err.strip().splitlines()) == 1
    assert not (root / "ledger.jsonl").exists() and not (store / "results").exists()  # no label read, no work
    run = probe.run("decode", store, panel="mine", cache_dir=root, workers=1)
    assert run.records and run.records[0].meta["inputs"]["coverage"] == {"panel": "mine", "panel_images": 2, "held": 2}
    assert {r.result for r in run.records} == {"decoder", "scores_mine"} and len({r.run_id for r in run.records}) == 1


def test_a_store_holding_part_of_a_panel_is_refused_unless_allowed(tmp_path, capsys):
    from decoder_scenes import Scene, make_store, planted_keys, write_panel

    from probe_toolkit.labels import panels

    held = [Scene("one.png", 96, 128, [(3, 9, 4, 12)]), Scene("two.png", 160, 160, [(2, 7, 2, 7)])]
    keys = np.stack([planted_keys(16, s.objects, channels=24, noise=0.01, seed=i) for i, s in enumerate(held)])
    store = make_store(tmp_path / "store.zarr", held, keys)
    root = tmp_path / "cache"
    annotations, folder = write_panel(tmp_path / "wide", [*held, Scene("three.png", 96, 128, [(3, 9, 4, 12)])], 16)
    panels.add_panel("wide", annotations, folder, "val", cache=root)
    code, printed = probe_main(["decode", store, "--panel", "wide", "--cache", root, "-q"], capsys)
    assert code == 2 and "holds 2 of the 3 images of panel 'wide'" in printed.err and "--allow-partial" in printed.err
    assert len(printed.err.strip().splitlines()) == 1
    assert not (root / "ledger.jsonl").exists() and not (store / "results").exists()
    code, printed = probe_main(["decode", store, "--panel", "wide", "--allow-partial", "--cache", root, "-q"], capsys)
    assert code == 0, printed.err
    (record,) = [r for r in records.every_record(store) if r.result == "scores_wide"]
    assert record.meta["inputs"]["coverage"] == {"panel": "wide", "panel_images": 3, "held": 2}


def test_a_dinov3_store_runs_through_the_protocols(tmp_path, photos):
    """DINOv3's 1 + 4 + N tokens through extraction, entropy, neighbours, the decoders and the
    attention masks, each run kept as its own record (tiny random network, the shipped photos)."""
    from probe_toolkit.demo.samples import ARCHS, write_checkpoint
    from probe_toolkit.store.extract import Settings, extract

    checkpoint = write_checkpoint(tmp_path / "v3.pth", "dinov3-official", ARCHS["tiny-dinov3"], seed=0)
    store = extract(checkpoint, photos, settings=Settings(views=("224", "native", "native_crop"), chunk=4), store=tmp_path / "s.zarr", quiet=True, batch_size=4).store
    from probe_toolkit.store import cache

    assert cache.open_store(store)["attention_224"].shape[-1] == 1 + 4 + 14 * 14  # class, 4 storage tokens, patches
    assert probe.run("entropy", store, boot=100).records
    probe.run("neighbours", store, boot=100)
    for preset in ("tokencut", "lost", "dsm"):
        run = probe.run("decode", store, preset=preset, view="native_crop" if preset == "dsm" else "native", workers=1, out=tmp_path / f"{preset}.json")
        assert run.report.n_images == 7 and run.report.n_masks == 7, preset
    masks = probe.run("attention-masks", store, workers=1)
    assert masks.report.n_images == 7
    assert [r.result for r in records.every_record(store)].count("decoder") == 3


def _observing(seen: list) -> object:
    """A protocol's run that only notes the placement it was handed (and ends as every run ends)."""
    from probe_toolkit.protocols.context import Outcome

    def run(inputs, settings, context):
        seen.append(context.placement)
        return context.finish(Outcome())

    return run


PLACED = {"workers": 2, "dask_address": "tcp://127.0.0.1:9", "shard": "0/2", "backend": "torch", "device": "cuda", "threads": 2}


def test_a_placement_field_a_protocol_does_not_honour_is_refused_before_any_work(monkeypatch, tmp_path):
    """Every registered protocol, every placement field: one it declares (``Protocol.placement``)
    reaches its execution unchanged; any other, given away from its default, is a SettingError
    naming it before the execution starts (no work, no record claiming a placement the run never had)."""
    refused = {}
    monkeypatch.setattr(Placement, "check_device", lambda self, backend=True: None)  # no GPU here: the device is taken as present
    for protocol in registry.protocols():
        reached: list[Placement] = []
        fake = dataclasses.replace(protocol, run=_observing(reached), inputs=protocol.inputs[:1])  # only the source: the test is about the placement
        monkeypatch.setitem(registry._REGISTRY, protocol.name, fake)
        for field, value in PLACED.items():
            reached.clear()
            if field in protocol.placement:
                api.run(protocol.name, tmp_path / "absent", **{field: value})
                assert [getattr(p, field) for p in reached] == [value], (protocol.name, field)
            else:
                with pytest.raises(SettingError) as caught:
                    api.run(protocol.name, tmp_path / "absent", **{field: value})
                assert caught.value.parameter == field and reached == [], (protocol.name, field)
                refused.setdefault(protocol.name, []).append(field)
        api.run(protocol.name, tmp_path / "absent", shard="0/1")  # one shard of one is the whole run
    # what the executions read, from their code (commands/*): linear and score read no placement at all
    assert refused["linear"] == refused["score"] == list(PLACED)
    assert refused["entropy"] == refused["neighbours"] == ["shard", "backend", "device", "threads"]
    assert refused["correspond"] == ["backend", "threads"]  # its pairs spread over workers, a cluster or shards; --device runs NAVI's network
    assert refused["hummingbird"] == ["threads"]  # and its search runs on --backend/--device
    assert refused["propagate"] == ["backend", "threads"] and refused["decode-stream"] == ["threads"] and "decode" not in refused


@pytest.mark.parametrize("flag,value", [("--workers", "2"), ("--dask-address", "tcp://127.0.0.1:9")])
def test_linear_refuses_placement_options_it_would_ignore(store, capsys, tmp_path, flag, value):
    before = sorted(p.name for p in store.rglob("*"))
    code, printed = probe_main(["linear", store, "--train", "tr", "--val", "va", "--cache", tmp_path / "cache", flag, value], capsys)
    lines = [line for line in printed.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and f"linear does not use {flag}" in lines[0] and f"drop {flag}" in lines[0], printed.err
    assert sorted(p.name for p in store.rglob("*")) == before and not (tmp_path / "cache").exists()  # no ledger line, no record
