"""Adding a protocol is one module and one registry entry: a toy protocol declared here, as a new
module of ``probe_toolkit/protocols/`` would declare it, gets its command (flags, help, its
terminal table), its Python API call, its record and its report section, with no edit in
``cli/``, ``results/tables.py`` or ``report/``. The numbers are checked against numpy on the
store's own tokens, read here with zarr."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
import zarr
from typer.testing import CliRunner

from probe_toolkit.infra.settings import Positive, Settings, setting
from probe_toolkit.protocols import api, registry
from probe_toolkit.protocols.context import Outcome, Saving
from probe_toolkit.protocols.registry import Command, Difference, Input, Protocol, Reads, Reference


@dataclass(frozen=True)
class ToySettings(Settings):
    scale: float = setting(1.0, "Factor on each image's mean token.", Positive())  # default, help and constraint: declared once


@dataclass
class ToyReport(Outcome):
    store: Path
    means: np.ndarray

    def summary(self) -> dict[str, Any]:
        return {"means": self.means.tolist()}


def run(inputs, settings: ToySettings, context) -> ToyReport:
    import xarray as xr

    from probe_toolkit.store import cache

    ds = cache.open_store(inputs.store, arrays=["tokens_224"])
    means = settings.scale * np.asarray(cache.require(ds, "tokens_224").values, np.float64).mean(axis=(1, 2))
    result = xr.Dataset({"mean": ("image", means)}, coords={"image": [str(i) for i in ds.image.values]})
    return context.finish(ToyReport(Path(inputs.store), means), Saving(inputs.store, "toy", result))


def table(report: ToyReport) -> list[str]:
    return [f"toy: {len(report.means)} images, scale {report.run.settings.scale:g}, mean {report.means.mean():.9f}"]


def section(ctx):
    from probe_toolkit.report.content import Section, Table

    found = {s.label: s.result("toy") for s in ctx.stores if s.result("toy") is not None}
    out = Section("toy", "Toy: mean token per image")
    if not found:
        out.missing("No toy results yet: run `probe toy-mean STORE`.")
    for label, ds in found.items():
        out.blocks.append(Table(["store", "mean"], [[label, f"{float(ds['mean'].values.mean()):.9f}"]]))
    return out


TOY = Protocol(
    name="toy",
    summary="The mean of each image's 224 tokens, scaled.",
    settings=ToySettings,
    inputs=(Input("store", "A store written by probe extract.", "store", required=True),),
    reads=Reads(arrays=("tokens_224",), views=("224",)),
    results=("toy",),
    references=(Reference("none: a test's protocol", "tests/test_contract_new_protocol.py"),),
    differences=(Difference("none", "a test's protocol", "none"),),
    run=run,
    result=ToyReport,
    command=Command(
        help="Mean token of each image, times --scale.", options=("scale", "quiet"), table=table, name="toy-mean"
    ),  # a command may be named otherwise than its protocol
    sections=(section,),
    placement=(),
)


@pytest.fixture
def store(tiny_stores, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_stores["dino"], tmp_path / "teacher.zarr", ignore=shutil.ignore_patterns("results")))


def expected_means(store: Path, scale: float) -> np.ndarray:
    """Independent of probe's reader: the tokens array read with zarr, finished images only."""
    group = zarr.open_group(str(store), mode="r")
    tokens = np.asarray(group["tokens_224"][:], np.float64)
    done = np.asarray(group["done_224"][:], bool) if "done_224" in group else np.ones(len(tokens), bool)
    return scale * tokens[done].mean(axis=(1, 2))


def test_a_new_protocol_needs_one_module_and_one_registry_entry(store, monkeypatch):
    from probe_toolkit.cli import protocols as cli_protocols
    from probe_toolkit.report import sections

    monkeypatch.setitem(registry._REGISTRY, "toy", TOY)  # what registry.register does when the module is imported
    app = typer.Typer()
    app.callback()(lambda: None)  # a group of commands, as probe's app is
    cli_protocols.build(TOY, app)  # what the CLI does for every registered protocol when it starts

    shown = CliRunner().invoke(app, ["toy-mean", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "--scale" in shown.output and "Factor on each image's mean token." in shown.output

    printed = CliRunner().invoke(app, ["toy-mean", str(store), "--scale", "2.5", "-q"])
    assert printed.exit_code == 0, printed.output
    want = expected_means(store, 2.5)
    assert f"toy: {len(want)} images, scale 2.5, mean {want.mean():.9f}" in printed.output

    with pytest.raises(registry.ProbeError, match="toy takes no keyword scal; did you mean scale"):  # a misspelt keyword is refused, not recorded
        api.run("toy", store, scal=2.5)
    run = api.run("toy", store, scale=2.5)  # the Python API: the same numbers, a second record
    np.testing.assert_allclose(run.report.means, want, rtol=1e-12)
    assert [r.result for r in run.records] == ["toy"] and run.records[0].meta["settings"] == {"scale": 2.5}
    assert run.records[0].meta["differences"] == [{"what": "none", "why": "a test's protocol", "effect": "none"}]

    assert section in sections.builders()  # the report gathers it from the registry, after decode's and before training's
    report = sections.gather([store])
    keys = [s.key for s in report.sections]
    assert keys.index("toy") > keys.index("linear") and keys.index("toy") < keys.index("training")
    shown_tables = [b for b in report.section("toy").blocks if hasattr(b, "rows")]  # (a caveat note on the tiny random network comes first)
    assert [t.rows for t in shown_tables] == [[[report.stores[0], f"{want.mean():.9f}"]]]


def test_every_registered_protocol_has_a_command_or_is_reached_through_one():
    from probe_toolkit import cli

    commands = {c.name for c in cli.app.registered_commands}
    for protocol in registry.protocols():
        if protocol.command is not None:
            assert (protocol.command.name or protocol.name) in commands
            registry.resolve(protocol.command.table)
        for target in protocol.sections:
            assert callable(registry.resolve(target)), (protocol.name, target)
    assert {p.name for p in registry.protocols() if p.command is None} <= {"decode", "decode-stream", "score", "decode-sweep"}
