"""Where a run's work goes: one ``Placement``, parsed once at the boundary (the CLI or the Python
API) and handed unchanged to the runner.

Local processes (``workers``, default every core), a dask.distributed scheduler
(``dask_address``), one shard of n (``shard``, or torchrun's RANK/WORLD_SIZE read here and
nowhere else), the decoder's backend and device, and BLAS threads per task. A placement says
only where numbers are computed, never which numbers: every placement gives the same bits
(``infra/runner.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ProbeError
from .settings import SettingError, at_least, one_of


@dataclass(frozen=True)
class Placement:
    workers: int | None = None  # None: every local core
    dask_address: str | None = None
    shard: str | None = None  # "i/n"; None: torchrun's RANK/WORLD_SIZE when set, else the whole run
    backend: str = "scipy"
    device: str = "cpu"
    threads: int = 1

    def __post_init__(self) -> None:
        if self.workers is not None:
            at_least("workers", self.workers, 1)
        at_least("threads", self.threads, 1)
        one_of("backend", self.backend, ("scipy", "torch"))
        one_of("device", self.device, ("auto", "cpu", "cuda"))
        if self.shard is not None:
            shard_of(self.shard)

    @classmethod
    def parse(cls, environ: Mapping[str, str] | None = None, **given: Any) -> Placement:
        """The placement of this process: the options given, with torchrun's environment as the
        shard when no ``shard`` is (RANK and WORLD_SIZE are read here only)."""
        environ = os.environ if environ is None else environ
        given = {k: v for k, v in given.items() if v is not None}
        if "shard" not in given:
            from_launcher = launcher_shard(environ)
            if from_launcher is not None:
                given["shard"] = from_launcher
        return cls(**given)

    @property
    def sharded(self) -> bool:
        return self.shard is not None

    def shard_pair(self) -> tuple[int, int]:
        return shard_of(self.shard) if self.shard else (0, 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def launcher_shard(environ: Mapping[str, str] | None = None) -> str | None:
    """torchrun's ``RANK/WORLD_SIZE`` as ``"i/n"``; None when no launcher shards this process.

    torchrun marks every rank with ``TORCHELASTIC_RUN_ID``. A ``RANK`` or ``WORLD_SIZE`` without
    it was left in the shell (by an earlier job, a notebook): taken silently, it would write a
    store that holds one image in n, so it is refused in one line naming both ways out.
    """
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ and "RANK" not in environ:
        return None
    rank, world = environ.get("RANK", "0"), environ.get("WORLD_SIZE", "1")
    if "TORCHELASTIC_RUN_ID" not in environ:
        if world.strip() in ("", "1") and rank.strip() in ("", "0"):
            return None  # one process of one: nothing to shard
        raise ProbeError("environment", f"RANK={rank} WORLD_SIZE={world} are set, but torchrun did not start this process (no TORCHELASTIC_RUN_ID)",
                         f"unset RANK and WORLD_SIZE for the whole run, or pass --shard {rank}/{world} to run that share on purpose")
    try:
        return f"{int(rank)}/{int(world)}"
    except ValueError:
        raise ProbeError("environment", f"torchrun's RANK={rank!r} WORLD_SIZE={world!r} are not numbers", "start the run with torchrun again") from None


def sharded(shard: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this run is one shard: ``--shard`` given, or started by torchrun."""
    return shard is not None or launcher_shard(environ) is not None


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``i/n`` from the option, else torchrun's RANK/WORLD_SIZE, else (0, 1)."""
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise ProbeError(None, f"--shard {shard!r} is not i/n", "use e.g. --shard 0/4") from None
    else:
        i, n = (int(x) for x in (launcher_shard() or "0/1").split("/"))
    if not 0 <= i < n:
        raise ProbeError(None, f"shard {i}/{n} is out of range", "use 0 <= i < n")
    return i, n


def shard_of(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise SettingError("shard", f"shard {text!r} is not i/n", "use e.g. shard='0/4'") from None
    if not 0 <= i < n:
        raise SettingError("shard", f"shard {i}/{n} is out of range", "use 0 <= i < n")
    return i, n
