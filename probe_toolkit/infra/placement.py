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
from dataclasses import asdict, dataclass
from typing import Any, Mapping

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
    def parse(cls, environ: Mapping[str, str] | None = None, **given: Any) -> "Placement":
        """The placement of this process: the options given, with torchrun's environment as the
        shard when no ``shard`` is (RANK and WORLD_SIZE are read here only)."""
        environ = os.environ if environ is None else environ
        given = {k: v for k, v in given.items() if v is not None}
        if "shard" not in given and "WORLD_SIZE" in environ:
            given["shard"] = f"{int(environ.get('RANK', 0))}/{int(environ['WORLD_SIZE'])}"
        return cls(**given)

    @property
    def sharded(self) -> bool:
        return self.shard is not None

    def shard_pair(self) -> tuple[int, int]:
        return shard_of(self.shard) if self.shard else (0, 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sharded(shard: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this run is one shard: ``--shard`` given, or started by torchrun."""
    return shard is not None or "WORLD_SIZE" in (os.environ if environ is None else environ)


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``i/n`` from the option, else torchrun's RANK/WORLD_SIZE, else (0, 1)."""
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise ProbeError(None, f"--shard {shard!r} is not i/n", "use e.g. --shard 0/4") from None
    else:
        i, n = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
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
