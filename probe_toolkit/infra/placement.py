"""Where a run's work goes: one ``Placement``, parsed once at the boundary (the CLI or the Python
API) and handed unchanged to the runner.

Local processes (``workers``, default every core), a dask.distributed scheduler
(``dask_address``), one shard of n (``shard``, or torchrun's RANK/WORLD_SIZE read here and
nowhere else), the decoder's backend and device, BLAS threads per task, and the memory a
search task's block products may hold. A placement says
only where numbers are computed, never which numbers: every placement gives the same bits
(``infra/runner.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ProbeError
from .settings import AtLeast, OneOf, SettingError, Settings, setting

BACKENDS = ("scipy", "torch")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement(Settings):
    """Where a run's work goes; each field declared once (``setting``), so its command-line option
    and its checks are derived from here (a protocol may change a default: ``Protocol.placement_defaults``)."""

    workers: int | None = setting(None, "Local processes, one BLAS thread each (default: every core; one with --device cuda).", AtLeast(1))
    dask_address: str | None = setting(None, "Run on a dask.distributed scheduler (e.g. tcp://host:8786).")
    shard: str | None = setting(None, "i/n: this process's share of the images (default from torchrun RANK/WORLD_SIZE).")
    backend: str = setting("scipy", "scipy (per image) or torch (a batch of images at once).", OneOf(BACKENDS))
    device: str = setting("cpu", "cpu or cuda (--backend torch).", OneOf(DEVICES))
    threads: int = setting(1, "BLAS threads while decoding (1: per-image problems are small).", AtLeast(1))
    work_memory: int | None = setting(
        None,
        "MiB of products one search task holds at once (knn, hummingbird): the bank's blocks are sized "
        "to fit (default: 64 for knn, 512 for hummingbird; the same numbers at any size).",
        AtLeast(16),
    )

    def check(self) -> None:
        if self.shard is not None:
            shard_of(self.shard)
        if self.workers is not None and self.dask_address:
            raise SettingError("workers", "workers and dask_address were both given", "drop workers (the cluster runs the analysis)", others=("dask_address",))

    @classmethod
    def parse(cls, environ: Mapping[str, str] | None = None, shardable: bool = True, **given: Any) -> Placement:
        """The placement of this process: the options given, with torchrun's environment as the
        shard when no ``shard`` is (RANK and WORLD_SIZE are read here only). ``shardable``: whether
        the command takes ``shard`` (a stray RANK's fix names it only then)."""
        environ = os.environ if environ is None else environ
        given = {k: v for k, v in given.items() if v is not None}
        if "shard" not in given:
            from_launcher = launcher_shard(environ, shardable)
            if from_launcher is not None:
                given["shard"] = from_launcher
        return cls.build(**given)

    @property
    def sharded(self) -> bool:
        return self.shard is not None

    def shard_pair(self) -> tuple[int, int]:
        return shard_of(self.shard) if self.shard else (0, 1)

    def local_workers(self) -> int | None:
        """The local processes a run starts: one drives a GPU (it batches the images itself); on
        the CPU, ``workers`` (None: every core); on a cluster, its workers (None here)."""
        return 1 if self.workers is None and self.device not in ("cpu", "auto") and not self.dask_address else self.workers

    def check_device(self, backend: bool = True) -> None:
        """The device is there, and the backend can reach it (``backend``: the protocol honours
        ``backend``; scipy runs on the CPU). Before any label read: a GPU asked for and absent is one line."""
        if backend and self.backend == "scipy" and self.device not in ("cpu", "auto"):
            raise SettingError("backend", f"device {self.device} needs backend torch (scipy runs on the CPU)", "set backend='torch'")
        if self.device == "cuda" and (self.backend == "torch" or not backend):
            try:
                import torch
            except ImportError:
                raise SettingError("backend", "backend torch needs torch, which is not installed", "pip install torch, or use backend='scipy'") from None
            if not torch.cuda.is_available():
                raise SettingError("device", f"device {self.device} is not available here: torch sees no CUDA GPU", "use device=cpu (or run on a machine with a GPU)")


def launcher_shard(environ: Mapping[str, str] | None = None, shardable: bool = True) -> str | None:
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
        raise ProbeError(
            "environment",
            f"RANK={rank} WORLD_SIZE={world} are set, but torchrun did not start this process (no TORCHELASTIC_RUN_ID)",
            "unset RANK and WORLD_SIZE for the whole run" + (f", or pass --shard {rank}/{world} to run that share on purpose" if shardable else ""),
        )
    try:
        return f"{int(rank)}/{int(world)}"
    except ValueError:
        raise ProbeError("environment", f"torchrun's RANK={rank!r} WORLD_SIZE={world!r} are not numbers", "start the run with torchrun again") from None


def sharded(shard: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this run is one shard: ``--shard`` given, or started by torchrun."""
    return shard is not None or launcher_shard(environ) is not None


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``i/n`` from the option, else torchrun's RANK/WORLD_SIZE, else (0, 1): one parser (``shard_of``), one error type."""
    return Placement.parse(shard=shard).shard_pair()


def shard_of(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise SettingError("shard", f"shard {text!r} is not i/n", "use e.g. shard='0/4'") from None
    if not 0 <= i < n:
        raise SettingError("shard", f"shard {i}/{n} is out of range", "use 0 <= i < n")
    return i, n
