"""The ``probe`` command line: parse, call one function, print. No science and no table lives here.

A protocol's command is built from its registry entry (``protocols.py``: its options, its call
of the Python API ``protocols.api.run``, the table it prints from ``results/tables.py``); the
other modules declare the commands on stores, panels and reports, and object discovery's.
"""

from __future__ import annotations

import sys

import typer

from . import discovery, panels, protocols, stores  # noqa: F401,E402  (each registers its commands)
from .app import app, console, err_console, flag  # noqa: F401  (the app and consoles, for tests and the entry point)

protocols.build_all()  # every other protocol's command, from its registry entry
from . import workflow  # noqa: F401,E402  (train, demo, report: listed last)


def main() -> None:
    """Console entry point: a failure is one line on stderr and a status (2 bad input, 1 integrity, 130 interrupted, 143 SIGTERM)."""
    from ..infra.lifeline import terminate_as_interrupt

    previous = terminate_as_interrupt()  # a SIGTERM cleans up as Ctrl-C does, then exits 143
    try:
        _main()
    finally:
        if previous is not None:
            import signal

            signal.signal(signal.SIGTERM, previous)


def _main() -> None:

    from ..infra.collector import fewer_full_collections
    from ..infra.errors import EXIT_INTEGRITY, EXIT_INTERRUPTED, IntegrityError, Interrupted, ProbeError, os_error_line
    from ..infra.lifeline import STATUS, follow_launcher, terminated
    from ..infra.memory import keep_memory_flat
    from ..infra.settings import SettingError

    fewer_full_collections()  # before the command's imports (torch, timm)
    follow_launcher()  # under torchrun: this rank stops when its launcher is killed
    keep_memory_flat()
    try:
        refuse_repeated(sys.argv[1:])
        code = app(standalone_mode=False)  # typer returns the status of typer.Exit (and 130 on Ctrl-C) here
    except IntegrityError as error:
        _say("integrity:", "bold red", carried(error.line(), sys.argv[1:]))
        sys.exit(EXIT_INTEGRITY)
    except SettingError as error:  # the API names the parameter; the command line names its flag
        _say("error:", "bold red", carried(flagged(error), sys.argv[1:]))
        sys.exit(2)
    except ProbeError as error:
        _say("error:", "bold red", carried(error.line(), sys.argv[1:]))
        sys.exit(2)
    except Interrupted as error:
        _say(f"{_stopped(terminated())}:", "bold yellow", str(error))
        sys.exit(STATUS if terminated() else EXIT_INTERRUPTED)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print(f"{_stopped(terminated())}; nothing half-written is kept, rerun the command", highlight=False)
        sys.exit(STATUS if terminated() else EXIT_INTERRUPTED)
    except OSError as error:  # a full disk, a read-only folder, a file where a folder belongs: one line, not a traceback
        _say("error:", "bold red", os_error_line(error))
        sys.exit(2)
    except Exception as error:  # usage errors (typer's bundled click) carry their own message and exit code
        if callable(getattr(error, "show", None)) and isinstance(getattr(error, "exit_code", None), int):
            error.show()
            sys.exit(error.exit_code)
        raise
    if code == EXIT_INTERRUPTED:
        err_console.print(f"{_stopped(terminated())}; nothing half-written is kept, rerun the command", highlight=False)
        code = STATUS if terminated() else code
    if isinstance(code, int) and code:
        sys.exit(code)


def _say(label: str, style: str, line: str) -> None:
    """One failure line: the label styled, the message as plain text (a path or a file's own text may hold
    ``[tag]`` or ``:name:``, which rich would read as markup or an emoji code)."""
    from rich.text import Text

    err_console.print(Text.assemble((label, style), " ", line), highlight=False, soft_wrap=True)


def refuse_repeated(args: list[str]) -> None:
    """An option that takes one value, given twice (``--views 224 --views 480``), is refused: the
    parser would keep the last and run on 480 alone. Options that repeat on purpose (``--sequence``)
    and switches pass. The command is looked up only when a flag does repeat."""
    from collections import Counter

    from ..infra.errors import ProbeError

    flags = [a.split("=", 1)[0] for a in args if a.startswith("--") and a != "--"]
    twice = [f for f, n in Counter(flags).items() if n > 1]
    if not twice:
        return
    command, _ = _command(args)
    single = {o for p in getattr(command, "params", []) if not getattr(p, "multiple", False) and not getattr(p, "is_flag", False) for o in p.opts}
    for flag_ in twice:
        if flag_ in single:
            values = [args[i + 1] if "=" not in a and i + 1 < len(args) else a.partition("=")[2] for i, a in enumerate(args) if a.split("=", 1)[0] == flag_]
            raise ProbeError(
                flag_,
                f"is given {len(values)} times ({', '.join(values)}); the last would be used alone",
                f"give it once (e.g. {flag_} {','.join(values)} where it takes a list)",
            )


def carried(line: str, args: list[str]) -> str:
    """A fix printed by a run given ``--cache DIR`` carries it: each whole command in backticks
    (each of commands joined with ``&&``) whose command takes ``--cache`` and does not name it gets
    it, so that, pasted, it reads the panels, ledger and stores the failed run read (issue 46,
    class 5), wherever it was built."""
    import re
    import shlex

    given = next((a.partition("=")[2] for a in args if a.startswith("--cache=")), None)
    if given is None and "--cache" in args[:-1]:
        given = args[args.index("--cache") + 1]
    if not given:
        return line

    def add(text: str) -> str:
        try:
            words = shlex.split(text)[1:]
        except ValueError:
            return text
        command, depth = _command(words)
        rest = words[depth:]
        takes = command is not None and any("--cache" in getattr(p, "opts", ()) for p in command.params)
        if not text.startswith("probe ") or not takes or not rest or "--cache" in words:  # a command only named (`probe extract`) stays a name
            return text
        last = next((p for p in command.params if rest[-1] in getattr(p, "opts", ())), None)
        if last is not None and not getattr(last, "is_flag", False):  # an option named without its value (`probe decode --out`): a name too
            return text
        return f"{text} --cache {shlex.quote(given)}"

    return re.sub(r"`(probe [^`]+)`", lambda match: "`" + " && ".join(map(add, match.group(1).split(" && "))) + "`", line)


def _command(words: list[str]) -> tuple[object | None, int]:
    """The (sub)command ``words`` name, and how many words name it (None, 0: no command)."""
    import typer

    command, depth = typer.main.get_command(app), 0
    for word in words:
        if not hasattr(command, "commands") or word not in command.commands:
            break
        command, depth = command.commands[word], depth + 1
    return (command if depth else None), depth


def _stopped(by_sigterm: bool) -> str:
    return "terminated (SIGTERM)" if by_sigterm else "interrupted"


def flagged(error) -> str:
    """A setting's error as the command line says it: the parameter spelled as its flag, a value
    as typed (``tau must ...`` → ``--tau must ...``; ``SettingError.line``); a value a free text
    writes as Python does, ``(0.5, 2.0)``, as the flag takes it: ``0.5,2.0``."""
    import re

    name = flag(error.parameter)
    return re.sub(
        rf"({re.escape(name)} )[(\[]([^()\[\]]*)[)\]]", lambda m: m.group(1) + ",".join(v.strip() for v in m.group(2).split(",") if v.strip()), error.line(flag)
    )
