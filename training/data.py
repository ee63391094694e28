"""The training images: a folder read as images only, cut into SelfPatch's 10 crops.

Nothing but the listed image files is opened (no annotation, no class folder names: an image's
only identity is its path). Each crop set is a pure function of (seed, epoch, image index), drawn
under a forked torch generator, so a run's data do not depend on the number of workers or
processes, and a resumed run sees the same crops as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from probe_toolkit.infra.errors import ProbeError
from probe_toolkit.store.images import list_images, load_image, require_images

from .augment import MultiCrop
from .config import DataCfg


def crop_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one image's crops in one epoch."""
    digest = hashlib.sha256(f"{seed}:{epoch}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# the folder of photographs is a config key (data.images), not a flag of probe train
FOLDER_FIX = "set data.images to a folder of photographs, in the config or with --set data.images=DIR"


class ImageFolder(Dataset):
    """Images of a folder (recursively, sorted by relative path), each → the list of its crops."""

    def __init__(self, folder: str | Path, transform: MultiCrop, seed: int = 0):
        self.folder = Path(folder)
        self.refs = list_images(self.folder, FOLDER_FIX)
        self.transform = transform
        self.seed = seed

    @property
    def ids(self) -> list[str]:
        return [ref.id for ref in self.refs]

    @property
    def paths(self) -> list[Path]:
        return [ref.path for ref in self.refs]

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, key: tuple[int, int]) -> list[torch.Tensor]:
        """``(epoch, index)`` → that image's crops in that epoch."""
        epoch, index = key
        image = load_image(self.refs[index].path)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(crop_seed(self.seed, epoch, index))
            return self.transform(image)


class EpochSampler(DistributedSampler):
    """DistributedSampler (shuffle by seed + epoch, drop_last) that hands the epoch to the data set.

    The epoch travels with each index, so persistent workers see it without shared state.
    """

    def __iter__(self):
        return ((self.epoch, index) for index in super().__iter__())


@dataclass
class Batches:
    """Micro-batches of one process: ``loader`` yields lists of crops (B, 3, H, W), grouped by crop index."""

    dataset: ImageFolder
    sampler: EpochSampler
    loader: DataLoader
    steps_per_epoch: int
    accumulation: int

    def epoch(self, epoch: int):
        """Iterate one epoch: ``steps_per_epoch`` lists of ``accumulation`` micro-batches each."""
        self.sampler.set_epoch(epoch)
        micro = iter(self.loader)
        for _ in range(self.steps_per_epoch):
            yield [next(micro) for _ in range(self.accumulation)]


def require_folder(images: str) -> None:
    """data.images names a folder holding an image (read up to its first), or one line before any work."""
    if not images:
        raise ProbeError("data.images", "no image folder given", FOLDER_FIX)
    require_images(images, FOLDER_FIX)


def make_batches(cfg: DataCfg, batch_size: int, micro_batch: int, rank: int, world: int, seed: int) -> Batches:
    """The data of one process: DistributedSampler (shuffled by seed + epoch, drop_last) and micro-batches."""
    require_folder(cfg.images)
    transform = MultiCrop(tuple(cfg.global_scale), tuple(cfg.local_scale), cfg.local_crops, cfg.global_size, cfg.local_size)
    dataset = ImageFolder(cfg.images, transform, seed)
    if batch_size % (micro_batch * world):
        raise ProbeError(
            "optim.batch_size",
            f"{batch_size} images per step do not split into micro-batches of {micro_batch} on {world} processes",
            "make batch_size a multiple of micro_batch × processes",
        )
    accumulation = batch_size // (micro_batch * world)
    sampler = EpochSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    steps = len(sampler) // (micro_batch * accumulation)
    if steps < 1:
        raise ProbeError(cfg.images, f"holds {len(dataset)} images, fewer than one step of {batch_size}", "add images or lower optim.batch_size")
    loader = DataLoader(
        dataset,
        batch_size=micro_batch,
        sampler=sampler,
        num_workers=cfg.num_workers,
        drop_last=True,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=cfg.num_workers > 0,
    )
    return Batches(dataset, sampler, loader, steps, accumulation)
