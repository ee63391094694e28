"""``python tests/held_run.py AT FD probe ARGS...``: ``probe ARGS`` that stops in the middle of
its work and waits there to be killed, so a test can kill it mid-run without racing it.

``AT`` is where it stops: ``block`` (the first block is back from the local workers, which stay
alive with blocks in flight), ``readout`` (the first forward pass of an extraction is done; ``readout-processes``: the
same, with images decoded and runs written in processes, as beside a GPU) or ``save`` (a record is written under its
temporary name, before its rename).
``FD`` is the write end of a pipe the test reads: ``held`` is written to it when the run stops there
(and the test reads end-of-file if the run ends first), so the test waits on that event, not on a clock.
Nothing else of the run is changed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_HELD = threading.Lock()


def hold(fd: int) -> None:
    """Say ``held`` once (the forward pass may run on several threads, ``store.streams``), then wait."""
    if _HELD.acquire(blocking=False):
        os.write(fd, b"held")
        os.close(fd)
    while True:  # until the test kills this process; a signal handler that raises ends the wait
        signal.pause()


def main() -> None:
    at, fd, *args = sys.argv[1:]
    fd = int(fd)
    if at == "block":
        from probe_toolkit.infra import runner

        real = runner._bounded

        def bounded(*a, **k):
            for index, item in enumerate(real(*a, **k)):
                yield item
                if index == 0:
                    hold(fd)

        runner._bounded = bounded
    elif at in ("readout", "readout-processes"):
        from probe_toolkit.store.backbone import Backbone
        from probe_toolkit.store.dinov3 import Dinov3Backbone

        if at == "readout-processes":  # decode and write in processes, as beside a GPU
            from probe_toolkit.store import extract

            extract.decoder_processes = lambda device: True

        for network in (Backbone, Dinov3Backbone):  # extraction's forward pass is the backbone's capture

            def capture(self, *a, _real=network.capture, **k):
                out = _real(self, *a, **k)
                hold(fd)
                return out

            network.capture = capture
    elif at == "save":
        from probe_toolkit.results import records

        real_meta = records.write_meta

        def write_meta(path, meta):
            real_meta(path, meta)
            hold(fd)  # the record is written under its temporary name, not yet renamed

        records.write_meta = write_meta
    else:
        raise SystemExit(f"unknown AT {at!r}")
    from probe_toolkit.cli import main as probe

    sys.argv = ["probe", *args]
    probe()


if __name__ == "__main__":
    main()
