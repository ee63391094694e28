"""Run ``probe`` as its console entry point does (exit status and stderr included), in-process."""

from __future__ import annotations

import sys

from probe_toolkit.cli import main


def probe_main(args: list[str], capsys):
    """(exit status, captured output) of ``probe ARGS``; bad input exits 2 through ``main``."""
    old = sys.argv
    sys.argv = ["probe", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    finally:
        sys.argv = old
    return code, capsys.readouterr()


def overridden(base: list[str], extra: tuple | list) -> list:
    """``base`` (flag, value pairs) without the flags ``extra`` names, then ``extra``: the CLI refuses an option given twice."""
    named = {flag for flag in extra if str(flag).startswith("--")}
    kept = [x for flag, value in zip(base[::2], base[1::2], strict=True) if flag not in named for x in (flag, value)]
    return [*kept, *extra]
