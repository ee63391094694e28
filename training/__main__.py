"""``python -m training CONFIG [--set section.key=value ...] [--quiet]``: print the resolved config, then train."""

from __future__ import annotations

import argparse
import sys

from probe_toolkit.infra.errors import ProbeError

from .config import load_config
from .data import require_folder
from .loop import train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("config", help="a TOML file or a shipped name: selfpatch, contrastive, dino, tiny")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one setting (repeatable)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    options = parser.parse_args(argv)
    try:
        config = load_config(options.config, options.sets)
        require_folder(config.data.images)  # one line, not the config printed then refused
        print(config.to_json(), flush=True)
        run = train(options.config, options.sets, quiet=options.quiet)
    except ProbeError as error:
        print(f"error: {error.line()}", file=sys.stderr)
        return 2
    print(f"{run.steps} steps; checkpoint {run.checkpoint}; log {run.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
