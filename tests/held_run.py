"""``python tests/held_run.py AT MARKER probe ARGS...``: ``probe ARGS`` that stops in the middle of
its work and waits there to be killed, so a test can kill it mid-run without racing it.

``AT`` is where it stops: ``block`` (the first block is back from the local workers, which stay
alive with blocks in flight) or ``readout`` (the first forward pass of an extraction is done; ``readout-processes``: the
same, with images decoded and runs written in processes, as beside a GPU).
``MARKER`` is written when it stops there. Nothing else of the run is changed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def hold(marker: Path) -> None:
    marker.write_text("held")
    time.sleep(600)  # the test kills this process long before


def main() -> None:
    at, marker, *args = sys.argv[1:]
    marker = Path(marker)
    if at == "block":
        from probe_toolkit.infra import runner

        real = runner._bounded

        def bounded(*a, **k):
            for index, item in enumerate(real(*a, **k)):
                yield item
                if index == 0:
                    hold(marker)

        runner._bounded = bounded
    elif at in ("readout", "readout-processes"):
        from probe_toolkit.store.backbone import Backbone

        if at == "readout-processes":  # decode and write in processes, as beside a GPU
            from probe_toolkit.store import extract

            extract.decoder_processes = lambda device: True

        real_readout = Backbone.readout

        def readout(self, *a, **k):
            out = real_readout(self, *a, **k)
            hold(marker)
            return out

        Backbone.readout = readout
    else:
        raise SystemExit(f"unknown AT {at!r}")
    from probe_toolkit.cli import main as probe

    sys.argv = ["probe", *args]
    probe()


if __name__ == "__main__":
    main()
