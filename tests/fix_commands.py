"""The commands a one-line error prints as its fix, read back with the CLI's own parser.

A fix that is a command must work when pasted (issue 46, class 5): every flag it names exists on
that command, every value parses as the option's type (``--interp none`` is refused by the parser
of ``probe extract``; ``--interpolation`` is no flag; a tuple ``(0.5, 2.0)`` is no value), and,
where the command is complete (no placeholder such as CKPT or STORE, no ``...``), running it is
what makes the corrected rerun succeed.
"""

from __future__ import annotations

import re
import shlex

PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:\.[a-z]+)?|NEW\.zarr|/absolute/path/to/.*|.*\.\.\..*|\"?reason\"?)$")


def printed(line: str) -> list[list[str]]:
    """Every ``probe …`` command in an error line: in backticks, or running from ``probe `` to the
    end of the line (or a ``;`` that ends the command), as arguments after ``probe``."""
    found = [m.group(1) for m in re.finditer(r"`probe ([^`]+)`", line)]
    rest = re.sub(r"`[^`]*`", "", line)
    for m in re.finditer(r"(?:^|[:;] |\(|, |then |e\.g\. |run |it: |store: |them: |again: )probe ([a-z][\w-]*(?: [^;`)]*)?)", rest):
        found.append(m.group(1))
    out = []
    for text in found:
        try:
            args = shlex.split(text.strip() if text.strip().endswith("...") else text.strip().rstrip(".,"))  # "..." is the user's to fill
        except ValueError:
            args = text.split()
        if args and args[0] != "--help":
            out.append(args)
    return out


def complete(args: list[str]) -> bool:
    """No placeholder (CKPT, STORE, NAME, ``...``): the command can be run as printed."""
    return not any(PLACEHOLDER.match(a) for a in args)


def mention(args: list[str]) -> bool:
    """A command named rather than printed whole: its name alone (``run `probe extract` first``), with
    its flags alone (``probe decode --out``), or with a placeholder or ``...`` for what the user fills
    in. The flags it names must still exist and its values parse."""
    if not complete(args):
        return True
    words = [a for a in args if not a.startswith("-")]  # a command and its flags named, no value: "see probe decode --out"
    return options_of(words) is not None and len(words) <= 2


def _rest(context) -> list[str]:
    """What a group's context left for its subcommand (click 8's ``protected_args``, typer's bundled click's ``_protected_args``)."""
    return [*getattr(context, "protected_args", getattr(context, "_protected_args", [])), *context.args]


def parse_error(args: list[str]) -> str | None:
    """None when ``probe ARGS`` parses (the command and every option exist, every value has the
    option's type); else the parser's complaint. Nothing is run."""
    import typer

    from probe_toolkit.cli import app

    group = typer.main.get_command(app)
    try:
        context = group.make_context("probe", list(args), resilient_parsing=False)
        command, parent = group, context
        rest = _rest(context)
        while hasattr(command, "get_command") and rest:
            name, rest = rest[0], rest[1:]
            sub = command.get_command(parent, name)
            if sub is None:
                return f"no command {name!r}"
            parent = sub.make_context(name, rest, parent=parent, resilient_parsing=False)
            command, rest = sub, _rest(parent)
        if rest:
            return f"unexpected arguments {rest}"
    except Exception as error:  # noqa: BLE001 - click's usage errors, whatever their class
        if type(error).__name__ in ("MissingParameter", "BadOptionUsage") and mention(args):  # named, not given whole (typer bundles its click)
            return None
        said = error.format_message() if hasattr(error, "format_message") else str(error)
        return f"{type(error).__name__}: {said}"
    return None


def options_of(args: list[str]) -> set[str] | None:
    """Every option spelling of the command ``probe ARGS`` names (``panel add`` included), or None
    when ARGS names no command."""
    import typer

    from probe_toolkit.cli import app

    command = typer.main.get_command(app)
    for word in args:
        if not hasattr(command, "commands") or word not in command.commands:
            break
        command = command.commands[word]
    if hasattr(command, "commands"):
        return None
    return {spelling for p in command.params for spelling in (*p.opts, *p.secondary_opts)}


def foreign_flags(line: str, args: list[str]) -> list[str]:
    """Flags a line names outside the commands it prints that ``probe ARGS``'s command lacks: a
    fix telling ``probe segment`` to use ``--on-error skip``, which only ``probe extract`` has."""
    known = options_of([str(a) for a in args])
    if known is None:
        return []
    outside = re.sub(r"`[^`]*`", "", line)
    for command in printed(line):
        outside = outside.replace(" ".join(command), "")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", outside))
    return sorted(f for f in flags if f not in known and f not in ("--help",))
