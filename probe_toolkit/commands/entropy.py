"""``probe entropy``: attention entropy of every store, saved as ``results/entropy``."""

from __future__ import annotations

from pathlib import Path

from ..infra.errors import ProbeError
from ..infra.progress import within
from ..infra.runner import per_image
from ..infra.settings import SettingError
from ..protocols.context import Inputs, RunContext
from ..protocols.entropy import EntropySettings
from ..store import grids
from ..store.cache import depth, extract_into, open_store, require
from .runs import OverStoresReport, finish, over_stores


def needs(store: Path, view: str, block: int | None = None) -> str:
    """What ``probe entropy`` reads of ``store`` at ``view``: its explicit maps where they hold ``block``
    (every block's maps, or the last block's where the run reads the last), else the statistics."""
    import zarr

    from ..store.group import array_names
    from ..store.layout import split_unit

    if not (Path(store) / "zarr.json").is_file():
        return f"attention_{view}"  # open_store says what it is not
    group = zarr.open_group(store, mode="r", use_consolidated=False)
    held = [split_unit(name)[0] for name in array_names(group)]  # maps added later are a part (attention_224.p1: store/layout.py)
    maps, stats = f"attention_{view}", f"attention_entropy_{view}"
    depth = ((dict(group.attrs).get("manifest") or {}).get("arch") or {}).get("depth")
    last = block is None or depth is None or block == int(depth) - 1
    if f"attention_blocks_{view}" in held or (maps in held and last) or not any(name.startswith(stats) for name in held):
        return maps  # require's one line names the flag where neither is there
    return next(name for name in held if name.startswith(stats))


def run(inputs: Inputs, settings: EntropySettings, context: RunContext) -> OverStoresReport:
    """Every store's attention rows measured, saved as ``results/entropy`` in each. ``settings.view``: the view
    whose attention it reads, its explicit maps (``attention_<view>``) where a store holds them, else its
    statistics (``probe extract --attention stats``; ``analyses.entropy_stats``)."""
    from ..analyses.entropy import entropy
    from ..analyses.stats import Bootstrap
    from ..store.views import canonical

    view = canonical(settings.view)
    read = {Path(store).resolve(): needs(store, view, context.block) for store in inputs.stores}
    if settings.patch is not None and any(name != f"attention_{view}" for name in read.values()):
        held = next(str(store) for store in inputs.stores if read[Path(store).resolve()] != f"attention_{view}")
        raise SettingError(
            "patch",
            f"holds the {view} view's attention statistics, not its maps: patch={settings.patch} follows one token's row, which statistics do not keep",
            f"drop patch, or extract the maps: `{extract_into(open_store(held, plain=True), view, 'last')}`",
            held,
        )

    def analyse(ds, progress, where):
        with within(f"bootstrap: {settings.boot:,} resamples", settings.boot) as boot:  # a line of its own while they run
            arch = ds.attrs["manifest"].get("arch", {})
            cls, registers = bool(arch.get("class_token", False)), int(arch.get("registers", 0))
            bootstrap, blocks_run = Bootstrap(settings.boot, settings.seed, progress=boot), per_image(where, progress=progress)
            if not read[Path(ds.attrs["store"]).resolve()].startswith(f"attention_{view}"):  # the statistics (needs)
                from ..analyses.entropy_stats import entropy_from_statistics

                result = entropy_from_statistics(
                    require(ds, f"attention_entropy_{view}"),
                    require(ds, f"attention_distance_{view}"),
                    require(ds, f"grid_rows_{view}"),
                    require(ds, f"grid_cols_{view}"),
                    class_token=cls,
                    registers=registers,
                    block=-1 if context.block is None else context.block,
                    boot=bootstrap,
                    run_blocks=blocks_run,
                )
                return read_at(result, ds)
            blocks = require(ds, f"attention_blocks_{view}") if f"attention_blocks_{view}" in ds else None
            grid = None if view == "224" else grids.fixed_grid(ds, view)
            result = entropy(
                require(ds, f"attention_{view}"),
                class_token=cls,
                registers=registers,
                blocks=blocks,
                patch=settings.patch,
                grid=grid,
                boot=bootstrap,
                run_blocks=blocks_run,
            )
            return read_at(result, ds)

    def read_at(result, ds):
        """The result with the block its summary measured (0-based; the last where the run named none), which its table's title names."""
        last = depth(ds)
        block = context.block if context.block is not None else (last - 1 if last is not None else None)
        if block is not None:
            result.attrs["block"] = int(block)
            result.attrs["last_block"] = last is not None and int(block) == last - 1
        return result

    runs = over_stores(inputs.stores, analyse, lambda store: read[Path(store).resolve()], settings.partial, context)
    followed = None
    if settings.patch is not None:
        followed = 0
        for store, (_, result) in runs.items():
            ids = [str(i) for i in result.image.values]
            if settings.image is not None and settings.image not in ids:
                raise ProbeError(store, f"has no finished image {settings.image!r}", "pass an id from the store's image list")
            followed = ids.index(settings.image) if settings.image is not None else 0
    return finish("entropy", runs, context, followed)
