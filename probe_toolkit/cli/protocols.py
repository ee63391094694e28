"""Every protocol's command, built from its registry entry (``Protocol.command``): the first
input, the options in the order ``--help`` lists them, the progress bar, one call of ``run``,
and the terminal table the entry names. Adding a protocol adds its command without an edit here.

Typer reads a command's options from its signature, so each command is one function whose
``__signature__`` is made from the entry. An option is derived from what declares it: a setting
from its settings field (help, type, default, the flag from ``infra/spelling.py``), a placement
field from ``Placement``'s (with the protocol's own default, ``Protocol.placement_defaults``), an
input from its ``Input``; an ``Option`` of the entry may only reword the help of those, or declare
an option of the command alone (``decode --size``). Object discovery (decode, score, decode-sweep)
has its own command bodies in ``discovery.py``: several sources and presets in one command.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..infra.errors import ProbeError
from ..infra.settings import declared as declared_setting
from ..infra.settings import default_of, spelled
from ..protocols import registry
from ..protocols.context import Progress
from .app import GROUPS, SHARED, app, console, err_console, flag, run, show

TYPES = {"str": str, "int": int, "float": float, "bool": bool, "path": Path, "strs": list[str], "negated": bool, "either": bool, "ints": str, "floats": str}
KEYWORDS = {"cache": "cache_dir"}  # a shared option's name → the keyword ``run`` takes
LISTS = {"ints": (int, "integers"), "floats": (float, "numbers")}
INPUT_KINDS = {"store": "path", "checkpoint": "path", "masks": "path", "panel": "str"}


def _kind(hint: Any) -> str:
    """The command line's kind of a settings field's type (``int | None`` → int, ``tuple[float, ...]`` → floats)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _kind(args[0])
    if typing.get_origin(hint) is tuple:
        items = {a for a in typing.get_args(hint) if a is not Ellipsis}
        return "ints" if items == {int} else "floats" if items <= {float, int} else "str"
    return {int: "int", float: "float", bool: "bool", Path: "path"}.get(hint, "str")


def _from_field(cls: type, field: dataclasses.Field, override: registry.Option | None, default: Any = dataclasses.MISSING) -> registry.Option:
    """A settings (or placement) field as an option: its declaration, its help perhaps reworded."""
    found = declared_setting(field)
    hint = typing.get_type_hints(cls)[field.name]
    kind = found.cli or ("str" if found.parse else _kind(hint))
    value = default_of(field) if default is dataclasses.MISSING else default
    if kind in ("ints", "floats") or found.parse:
        value = None if value is None else (found.spell or spelled)(value)
    example = (
        (found.spell or spelled)(default_of(field) if default_of(field) is not None else found.constraint.example())
        if (default_of(field) is not None or found.constraint is not None)
        else ""
    )
    return registry.Option(field.name, override.help if override else found.help, kind, value, example, found.parse)


def spec(protocol: registry.Protocol, name: str, override: registry.Option | None = None) -> registry.Option | None:
    """The option that declares ``name`` for this protocol: a setting, a placement field or an
    input (None: a shared option of the command line, ``SHARED``)."""
    from ..infra.placement import Placement

    fields = {f.name: f for f in dataclasses.fields(protocol.settings)}
    if name in fields and declared_setting(fields[name]) is not None:
        return _from_field(protocol.settings, fields[name], override)
    placement = {f.name: f for f in dataclasses.fields(Placement)}
    if name in placement:
        return _from_field(Placement, placement[name], override, protocol.placement_defaults.get(name, placement[name].default))
    found = protocol.input(name)
    if found is not None:
        default = registry.REQUIRED if found.required else found.default
        return registry.Option(name, override.help if override else found.help, INPUT_KINDS.get(found.kind, found.kind), default)
    if override is not None:  # an option of this command alone
        return registry.Option(override.name, override.help, override.kind, override.default, override.example, override.parse)
    return None


def _option(option: registry.Option) -> inspect.Parameter:
    """The typer parameter of one option: its flag, its help, its type as typed and its default."""
    required = option.default is registry.REQUIRED
    default = False if option.kind == "negated" else inspect.Parameter.empty if required else option.default
    kind = TYPES["str" if option.parse else option.kind]
    annotation = kind if required or default is not None else Optional[kind]  # noqa: UP045 (typer reads typing.Optional of a runtime type)
    flags = f"{flag(option.name)}/--no-{flag(option.name)[2:]}" if option.kind == "either" else flag(option.name)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, typer.Option(flags, help=option.help)])


def _value(option: registry.Option, text: Any) -> Any:
    """What ``run`` receives for what was typed: a negated switch flipped, a list or a custom spelling parsed."""
    if option.kind == "negated":
        return not text
    if text is None or not (option.parse or option.kind in LISTS):
        return text
    if option.parse:
        return option.parse(text)
    cast, what = LISTS[option.kind]
    try:
        return tuple(cast(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ProbeError(flag(option.name), f"{text!r} is not a list of {what}", f"use {flag(option.name)} {option.example}") from None


def _names(item: registry.Option | str) -> list[tuple[str, registry.Option | None]]:
    if isinstance(item, registry.Option):
        return [(item.name, item)]
    return [(name, None) for name in GROUPS.get(item, (item,))]


def _parameters(protocol: registry.Protocol) -> tuple[list[inspect.Parameter], dict[str, registry.Option]]:
    cli = protocol.command
    many = protocol.source == "stores"
    first = protocol.input(protocol.source)
    parameters = [
        inspect.Parameter(protocol.source, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[list[Path] if many else Path, typer.Argument(help=first.help)])
    ]
    declared: dict[str, registry.Option] = {}
    if protocol.source in ("store", "stores"):  # every protocol that reads a store reads any block of it
        parameters += [
            inspect.Parameter("block", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BLOCK),
            inspect.Parameter("blocks", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BLOCKS),
        ]
    for item in cli.options:
        for name, override in _names(item):
            found = spec(protocol, name, override)
            if found is not None:
                declared[name] = found
                parameters.append(_option(found))
            else:
                annotation, default = SHARED[name]
                parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default))
    return parameters, declared


def declared(protocol: str | registry.Protocol, target: typer.Typer = app):
    """Register the function it decorates as ``probe <name>`` (the protocol's, or its command's own name), with the options and help of the
    protocol's ``Command``; the function receives the protocol's source and the keywords for ``run``
    (flags parsed, shared options renamed: ``cache`` → ``cache_dir``)."""
    protocol = registry.get(protocol) if isinstance(protocol, str) else protocol
    name = protocol.command.name or protocol.name
    parameters, options = _parameters(protocol)

    def register(body):
        def command(**typed: Any) -> None:
            source = typed.pop(protocol.source)
            sweep = _blocks(typed.pop("blocks", None))
            given = {KEYWORDS.get(n, n): _value(options[n], v) if n in options else v for n, v in typed.items()}
            if sweep is None:
                body(source, given)
                _read_at(given.get("block"))
                return
            if given.get("block") is not None:
                raise ProbeError("--block", "and --blocks are both given", "give one: --block 11, or --blocks 3,7,11 (one record per block)")
            from ..protocols.api import check_blocks

            check_blocks(protocol.name, source, sweep, {k: v for k, v in given.items() if k != "block"})  # every block, before the first run
            for block in sweep:  # one run, one record, one table per block
                err_console.print(f"[bold]block {block}[/]", highlight=False)
                body(source, {**given, "block": block})
                _read_at(block)

        command.__signature__ = inspect.Signature(parameters)
        command.__doc__ = protocol.command.help
        command.__name__ = command.__qualname__ = name.replace("-", "_") + "_command"
        target.command(name)(command)
        return body

    return register


BLOCK = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--block",
        help="The store's block to read (0-based, as probe extract --blocks counts; default: the last).",
    ),
]
BLOCKS = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--blocks",
        help="Run once per block (0-based, comma-separated, e.g. 3,7,11): one record and one table each, each naming its block.",
    ),
]


def _read_at(block: int | None) -> None:
    """Below a run's table, on the table's stream, the block it read where one was asked (``--block``,
    each of ``--blocks``): the numbers are that block's, and a table printed alone must say so."""
    if block is not None:
        console.print(f"read at block {block} ({'from the end' if block < 0 else '0-based'}, as probe extract --blocks counts)", highlight=False)


def _blocks(text: str | None) -> list[int] | None:
    """``--blocks 3,7,11`` as integers (None: not given)."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ProbeError("--blocks", f"{text!r} is not a list of block indices", "use e.g. --blocks 3,7,11") from None
    if not values:
        raise ProbeError("--blocks", "is empty", "use e.g. --blocks 3,7,11")
    return values


class Bars(Progress):
    """The command line's ``Progress``: rich bars counting the run's ``unit`` (one task per
    ``task``, labelled by the protocol's command when the run names none), its steps as dim lines."""

    def __init__(self, bar, label: str, quiet: bool):
        self.bar, self.label, self.quiet = bar, label, quiet

    def task(self, label: str | None = None, total: int | None = None) -> Callable[[int], None]:
        handle = self.bar.add_task(label or self.label, total=total)
        return lambda n=1: self.bar.advance(handle, n)

    def step(self, text: str) -> None:
        if not self.quiet:
            err_console.print(f"[dim]{text}[/]", highlight=False)

    def spell(self, parameter: str) -> str:
        return flag(parameter)

    def note(self, text: str) -> None:
        import sys

        print(text, file=sys.stderr)


@contextmanager
def shown(unit: str | None, label: str, quiet: bool) -> Iterator[Bars]:
    """A run's progress on the command line: a bar counting ``unit`` (None: its steps as lines), or nothing with ``--quiet``."""
    from ..infra.progress import bar

    with bar(unit or "steps", quiet or unit is None) as drawn:
        yield Bars(drawn, label, quiet)


def build(protocol: registry.Protocol, target: typer.Typer = app) -> None:
    """Register ``probe <protocol.name>`` on ``target`` from the protocol's ``Command``: run it
    under its progress bar, print its table."""
    cli = protocol.command

    @declared(protocol, target)
    def command(source: Any, given: dict[str, Any]) -> None:
        unit, label = cli.progress or ("images", protocol.name)
        with shown(unit, label, given.pop("quiet", False)) as progress:
            result = run(protocol.name, source, progress=progress, **given).report
        show(registry.resolve(cli.table)(result))


def build_all() -> None:
    """Every protocol's command that the CLI does not write by hand, in the registry's order."""
    for protocol in registry.protocols():
        if protocol.command is not None and not protocol.command.explicit:
            build(protocol)
