"""The ``probe`` command line: parse, call one function, print. No science lives here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .errors import ProbeError

app = typer.Typer(
    name="probe",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    help="What did this frozen ViT checkpoint learn about patches? Measured without labels leaking.",
)
console = Console()
err_console = Console(stderr=True)

CacheOpt = Annotated[Optional[Path], typer.Option("--cache", help="Cache root (default: $PROBE_CACHE or ./cache).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


def main() -> None:
    """Console entry point: bad input becomes one line on stderr and exit status 2."""
    try:
        app(standalone_mode=False)
    except ProbeError as error:
        err_console.print(f"[bold red]error:[/] {error.line()}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as error:  # click usage errors carry their own exit code
        import click

        if isinstance(error, click.ClickException):
            error.show()
            sys.exit(error.exit_code)
        raise
