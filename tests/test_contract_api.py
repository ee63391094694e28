"""The registry-wide contract of settings declared once and a strict API: for every protocol, each
setting's command-line option is derived from its field (no default written twice), an invalid
value generated from its constraint is refused by the CLI (naming the flag) and by the API
(naming the parameter), an unknown keyword is refused with the valid names, a bad placement
leaves the ledger without an entry, and every fix command is spelled as the parser reads it."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from cli_runs import probe_main
from typer.main import get_command

import probe_toolkit as probe
from probe_toolkit.infra.settings import SettingError, declared, default_of, spelled
from probe_toolkit.infra.spelling import fix_command, flag
from probe_toolkit.protocols import registry

CONVERTED = [p for p in registry.protocols() if p.run is not None]
LEGACY = [p.name for p in registry.protocols() if p.run is None]


def _command(protocol: registry.Protocol):
    from probe_toolkit.cli import app

    name = protocol.command.name or protocol.name
    return get_command(app).commands[name]


def _required(protocol: registry.Protocol, cache=None) -> dict[str, str]:
    """Placeholder values of the required inputs besides the source (settings are checked before
    any input is opened), and the cache where the protocol takes one."""
    given = {i.name: f"absent-{i.name}" for i in protocol.inputs[1:] if i.required}
    return {**given, "cache_dir": cache} if cache is not None and protocol.input("cache_dir") else given


def _cli_required(protocol: registry.Protocol) -> list[str]:
    return [word for name, value in _required(protocol).items() for word in (flag(name), value)]


def _invalid(protocol: registry.Protocol) -> list[tuple[str, object]]:
    out = []
    for field in dataclasses.fields(protocol.settings):
        found = declared(field)
        if found is not None and found.constraint is not None:
            out += [(field.name, value) for value in found.constraint.invalid()]
    return out


CASES = [(p.name, name, value) for p in CONVERTED for name, value in _invalid(p)]


def test_every_protocol_declares_its_settings_inputs_and_differences_the_new_way():
    assert CONVERTED, "no protocol runs through the run context"
    for protocol in CONVERTED:
        assert protocol.inputs and protocol.inputs[0].name == protocol.source, protocol.name
        assert protocol.differences and all(isinstance(d, registry.Difference) and d.what and d.why and d.effect for d in protocol.differences)
        for field in dataclasses.fields(protocol.settings):
            assert declared(field) is not None, f"{protocol.name}: setting {field.name} is not declared with infra.settings.setting"


@pytest.mark.parametrize("protocol", [p for p in CONVERTED if p.command is not None], ids=lambda p: p.name)
def test_every_setting_has_a_derived_option_and_no_literal_default(protocol):
    options = {o.name: o for o in _command(protocol).params}
    for field in dataclasses.fields(protocol.settings):
        found = declared(field)
        assert field.name in options, f"{protocol.name}: --{field.name} missing from its command"
        option = options[field.name]
        assert flag(field.name) in option.opts or (found.cli == "either" and option.opts[0] == flag(field.name))
        default = default_of(field)
        if found.cli == "negated":
            assert option.default is False
        elif default is None:
            assert option.default is None
        elif isinstance(default, tuple) or found.parse:
            assert option.default == (found.spell or spelled)(default)
        else:
            assert option.default == default, (protocol.name, field.name)
    for item in protocol.command.options:  # an Option of the entry may reword a setting's help, never repeat its default
        if isinstance(item, registry.Option) and (item.name in options and item.name in {f.name for f in dataclasses.fields(protocol.settings)}):
            assert item.default is None, f"{protocol.name}: --{item.name} repeats its default"


@pytest.mark.parametrize("name,parameter,value", CASES, ids=[f"{n}-{p}-{v!r}" for n, p, v in CASES])
def test_an_invalid_value_is_refused_by_the_api_and_the_cli_naming_the_parameter(name, parameter, value, tmp_path, capsys):
    protocol = registry.get(name)
    with pytest.raises(SettingError) as caught:
        probe.run(name, tmp_path / "absent", **_required(protocol, tmp_path / "cache"), **{parameter: value})
    assert caught.value.parameter == parameter and caught.value.line().startswith(f"{parameter} must"), caught.value.line()
    assert "--" not in caught.value.line().split(";")[0]  # the API names the keyword, not a flag
    if protocol.command is None:
        return
    found = declared({f.name: f for f in dataclasses.fields(protocol.settings)}[parameter])
    typed = (found.spell or spelled)(value) if isinstance(value, tuple) or found.parse else str(value)
    cache = ["--cache", tmp_path / "cache"] if protocol.input("cache_dir") else []
    code, printed = probe_main([protocol.command.name or name, tmp_path / "absent", *_cli_required(protocol), flag(parameter), typed, *cache], capsys)
    assert code == 2 and printed.err.startswith(f"error: {flag(parameter)} must"), printed.err
    assert not (tmp_path / "cache").exists()  # refused before any panel or ledger is opened


@pytest.mark.parametrize("protocol", registry.protocols(), ids=lambda p: p.name)
def test_an_unknown_keyword_is_refused_with_the_valid_names(protocol, tmp_path):
    with pytest.raises(SettingError) as caught:
        probe.run(protocol.name, tmp_path / "absent", bot=0)
    assert caught.value.parameter == "bot" and f"{protocol.name} takes no keyword bot" in caught.value.line()
    assert "valid: " in caught.value.fix and protocol.source in caught.value.fix


def test_a_misspelt_keyword_is_refused_with_the_name_it_resembles(tmp_path):
    with pytest.raises(SettingError, match="entropy takes no keyword bot; did you mean boot"):
        probe.run("entropy", tmp_path / "absent", bot=0)


@pytest.mark.parametrize("protocol", [p for p in CONVERTED if p.reads.labels], ids=lambda p: p.name)
def test_a_bad_placement_is_refused_before_any_label_read(protocol, tmp_path):
    placed = {"workers": 2, "dask_address": "tcp://127.0.0.1:9"}
    with pytest.raises(SettingError) as caught:
        probe.run(protocol.name, tmp_path / "absent", **_required(protocol, tmp_path / "cache"), **placed)
    assert caught.value.parameter == "workers"
    assert not (tmp_path / "cache" / "ledger.jsonl").exists()


def test_the_api_renders_the_parameter_and_the_cli_the_flag():
    error = SettingError("ks", requirement="a non-empty list of integers ≥ 1", value=(10, 0), example=(10, 20))
    assert error.line() == "ks must be a non-empty list of integers ≥ 1 (got (10, 0)); use e.g. ks=(10, 20)"
    assert error.line(flag) == "--k must be a non-empty list of integers ≥ 1 (got 10,0); use e.g. --k 10,20"


def test_fix_commands_are_spelled_as_the_parser_reads_them():
    """Every option of every command is spelled by ``infra.spelling.flag``, so a fix built by
    ``fix_command`` from keywords is the command line the parser takes."""
    from probe_toolkit.cli import app

    def walk(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            if isinstance(param, typer.core.TyperOption) and param.name not in ("help", "quiet"):
                yield path, param

    wrong = [
        (" ".join(path), param.name, param.opts) for path, param in walk(get_command(app), []) if flag(param.name) not in param.opts and flag(param.name) != "--cache"
    ]
    assert wrong == [], "options whose flag is not infra.spelling.flag(name): add them to FLAGS"
    assert (
        fix_command("extract", "CKPT", views=("224", "480"), panel="voc 07", quiet=True, sequences=["a", "b"])
        == "probe extract CKPT --views 224,480 --panel 'voc 07' --quiet --sequence a --sequence b"
    )


def test_every_protocol_runs_through_the_run_context():
    """The protocols not yet converted to ``run(inputs, settings, context)`` (this list only shrinks)."""
    assert LEGACY == []


def test_a_table_in_results_takes_its_protocols_result_type_declared_in_results():
    """Every protocol's result type lives in ``results/`` (beside its table, before commands/ in the flow), and
    its table's ``report`` is annotated with it: the table reads that type's fields, nothing guessed."""
    import inspect

    for protocol in registry.protocols():
        assert isinstance(protocol.result, str) and protocol.result.startswith("results."), (protocol.name, protocol.result)
        if protocol.command is None:  # decode-stream: printed by decode's command
            continue
        table = registry.resolve(protocol.command.table)
        annotated = inspect.signature(table).parameters["report"].annotation.split(" | ")  # correspond's: CorrespondReport | NaviReport
        assert registry.resolve(protocol.result).__name__ in annotated, (protocol.name, protocol.command.table)
