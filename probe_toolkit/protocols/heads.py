"""What the protocols that train a head on the network's own crops share (``linear-segmentation``,
``linear-depth``): settings read against a preset's published values, and the one-process rule."""

from __future__ import annotations

from ..infra.settings import Settings

UNSCORED = ("seed", "chunk", "figure_images")  # settings that change no published value


class PresetSettings(Settings):
    """A protocol's settings whose ``None`` fields take a preset's published values (``resolved``)."""

    preset: str

    @property
    def resolved(self) -> dict:  # overridden: the values the run uses, the preset's filled in
        return self.as_dict()

    def unpublished(self) -> list[str]:
        """The settings that differ from the preset's published values (the seed, the network's
        chunk and the figure's images change no published value)."""
        published = type(self)(preset=self.preset).resolved
        mine = self.resolved
        return [k for k in mine if k not in UNSCORED and mine[k] != published[k]]


def one_process(name: str, placement) -> None:
    """The head trains in this process: shards and a dask cluster, which would each get a part of
    the work or none, are refused before any work."""
    from ..infra.errors import ProbeError

    if placement.sharded:
        raise ProbeError(None, f"{name} does not run in shards (shard {placement.shard}, or torchrun's RANK/WORLD_SIZE)",
                         "run it as one process (--device cuda for the full schedule)")
    if placement.dask_address:
        raise ProbeError(None, f"{name} does not run on a dask cluster (--dask-address)",
                         "run it as one process; --workers sets the threads that decode and augment the crops")


def checkpoint_options() -> tuple:
    """The options of such a protocol's command beside its settings: the store that keeps the
    record, the network, the device, the threads that make the crops."""
    from .registry import Option

    return (Option("store", "Store that keeps the record (default: the checkpoint's store for --network under --cache).", "path"),
            Option("network", "teacher or student.", default="teacher"),
            Option("device", "cpu, cuda or auto.", default="cpu"),
            Option("workers", "Threads that decode and augment the crops (default 2).", "int"))
