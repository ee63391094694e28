"""Every protocol's command, built from its registry entry (``Protocol.command``): the first
input, the options in the order ``--help`` lists them, the progress bar, one call of ``run``,
and the terminal table the entry names. Adding a protocol adds its command without an edit here.

Typer reads a command's options from its signature, so each command is one function whose
``__signature__`` is made from the entry: a setting's flag comes from ``FLAGS``, an option every
command spells alike from ``SHARED``. Object discovery (decode, score, decode-sweep) has its own
commands in ``discovery.py``: several sources and presets in one command.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..infra.errors import ProbeError
from ..protocols import registry
from .app import GROUPS, SHARED, app, counted, err_console, flag, run, show

TYPES = {"str": str, "int": int, "float": float, "bool": bool, "path": Path, "strs": list[str], "negated": bool, "either": bool, "ints": str, "floats": str}
KEYWORDS = {"cache": "cache_dir"}  # a shared option's name → the keyword ``run`` takes
LISTS = {"ints": (int, "integers"), "floats": (float, "numbers")}


def _option(option: registry.Option) -> inspect.Parameter:
    """The typer parameter of one option: its flag, its help, its type as typed and its default."""
    required = option.default is registry.REQUIRED
    default = False if option.kind == "negated" else inspect.Parameter.empty if required else option.default
    kind = TYPES["str" if option.parse else option.kind]
    annotation = kind if required or default is not None else Optional[kind]  # noqa: UP045 (typer reads typing.Optional of a runtime type)
    flags = f"{flag(option.name)}/--no-{flag(option.name)[2:]}" if option.kind == "either" else flag(option.name)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, typer.Option(flags, help=option.help)])


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


def _parameters(protocol: registry.Protocol) -> tuple[list[inspect.Parameter], dict[str, registry.Option]]:
    spec = protocol.command
    many = protocol.source == "stores"
    parameters = [inspect.Parameter(protocol.source, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    annotation=Annotated[list[Path] if many else Path, typer.Argument(help=spec.source)])]
    declared: dict[str, registry.Option] = {}
    for item in spec.options:
        if isinstance(item, registry.Option):
            declared[item.name] = item
            parameters.append(_option(item))
            continue
        for name, (annotation, default) in (GROUPS[item] if item in GROUPS else {item: SHARED[item]}).items():
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
            body(source, {KEYWORDS.get(n, n): _value(options[n], v) if n in options else v for n, v in typed.items()})

        command.__signature__ = inspect.Signature(parameters)
        command.__doc__ = protocol.command.help
        command.__name__ = command.__qualname__ = name.replace("-", "_") + "_command"
        target.command(name)(command)
        return body

    return register


def build(protocol: registry.Protocol, target: typer.Typer = app) -> None:
    """Register ``probe <protocol.name>`` on ``target`` from the protocol's ``Command``: run it
    under its progress bar, print its table."""
    spec = protocol.command

    @declared(protocol, target)
    def command(source: Any, given: dict[str, Any]) -> None:
        if spec.progress is None:
            report = run(protocol.name, source, **given).report
        else:
            unit, hook, task = spec.progress
            quiet = given.pop("quiet")
            if unit is None:  # each step as a line on stderr
                def step(what: str) -> None:
                    if not quiet:
                        err_console.print(f"[dim]{what}[/]", highlight=False)

                report = run(protocol.name, source, **{hook: step}, **given).report
            else:
                report = counted(protocol.name, unit, quiet, source, hook=hook, task=task, **given)
        show(registry.resolve(spec.table)(report, given))


def build_all() -> None:
    """Every protocol's command that the CLI does not write by hand, in the registry's order."""
    for protocol in registry.protocols():
        if protocol.command is not None and not protocol.command.explicit:
            build(protocol)
