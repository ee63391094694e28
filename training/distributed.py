"""One process or many: torchrun's environment → a process group (NCCL on GPU, gloo on CPU), else world size 1."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.infra.lifeline import follow_parent


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    owned: bool = False  # this call created the process group, so it closes it

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def pick_device(preference: str = "auto", local_rank: int = 0) -> torch.device:
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda":
        if not torch.cuda.is_available():
            raise ProbeError("run.device", "cuda asked for but no GPU is visible", "use run.device=cpu or auto")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if preference == "cpu":
        return torch.device("cpu")
    raise ProbeError("run.device", f"{preference!r} is not auto, cpu or cuda", "pick one")


def stop_with_launcher(rank: int, interval: float = 0.5) -> threading.Thread:
    """Exit this process when its launcher dies.

    torchrun starts each rank in a session of its own, so a SIGKILL to the launcher's process
    group never reaches the ranks, which would train on to the end. A daemon thread watches the
    parent pid; when the launcher is gone (the rank is re-parented) it prints one line and exits
    with status 143 at once (no collective can finish without the launcher's other ranks). The
    rule is ``probe_toolkit.infra.lifeline``'s, which ``probe`` commands under torchrun follow too."""
    parent = os.getppid()
    return follow_parent(parent, interval=interval, say=f"training rank {rank}: its launcher (pid {parent}) is gone; stopping")


def init_distributed(device: str = "auto") -> Dist:
    """Join torchrun's group when ``WORLD_SIZE`` > 1 (``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR/PORT`` from the environment)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch_device = pick_device(device, local_rank)
    if world > 1:
        stop_with_launcher(rank)
    owned = world > 1 and not dist.is_initialized()
    if owned:
        dist.init_process_group(backend="nccl" if torch_device.type == "cuda" else "gloo")
    return Dist(rank, world, local_rank, torch_device, owned)


def all_gather_objects(obj, ctx: Dist) -> list:
    """Every process's ``obj`` (picklable), in rank order; ``[obj]`` on one process."""
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: Dist) -> None:
    if ctx.distributed:
        dist.barrier()


def close(ctx: Dist) -> None:
    if ctx.owned and dist.is_initialized():
        dist.destroy_process_group()
