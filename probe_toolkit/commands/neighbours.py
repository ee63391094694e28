"""``probe neighbours``: window-neighbour statistics of every store, saved as ``results/neighbours_g<grid>``.

The view (224 or 96) picks the tokens; the grid is whatever that view holds in each store
(ViT-S/16 at 224 px: 14 × 14; ViT-S/8: 28 × 28; DINOv2 /14: 16 × 16), so stores of different
patch sizes can be measured in one call, each saved under its own grid's name.
"""

from __future__ import annotations

from pathlib import Path

from ..analyses.grid import grid_side
from ..infra.progress import within
from ..infra.runner import per_image
from ..infra.settings import SettingError
from ..protocols.context import Inputs, RunContext
from ..protocols.neighbours import NeighboursSettings
from ..store.cache import extract_into, open_store, require
from .runs import OverStoresReport, finish, over_stores

DEFAULT_VIEW = "224"


def held_grids(store: Path) -> dict[str, int]:
    """The grid side each token view of a store holds, from its arrays' shapes (any block's: a store
    of ``--blocks B`` alone holds ``tokens_bB_224`` and no ``tokens_224``; every block has the grid)."""
    from ..analyses.neighbours import VIEWS
    from ..store import layout

    ds = open_store(store, done_only=False, plain=True)
    found = {}
    for name in map(str, ds):
        parsed = layout.parse(name)
        if parsed.kind == "tokens" and parsed.view in VIEWS and parsed.view not in found:
            found[parsed.view] = grid_side(ds[name].shape[1], name)
    return {view: found[view] for view in VIEWS if view in found}


def choose_view(stores: list[Path], view: str | None, grid: int | None) -> str:
    """``--view`` as given (default 224), or the view whose grid is ``--grid`` in every store.

    ``--grid`` is kept for old command lines: it must be the grid the store holds, else one
    line names the grids it has.
    """
    from ..analyses.neighbours import view_array

    if grid is None:
        view = DEFAULT_VIEW if view is None else str(view)
        view_array(view)
        return view
    for store in dict.fromkeys(stores):
        held = held_grids(store)
        matching = [v for v, g in held.items() if g == grid]
        if (view is None and not matching) or (view is not None and held.get(str(view), grid) != grid):
            has = ", ".join(f"{g}×{g} patches at {v}" for v, g in held.items()) or "no token array"
            fix = f"pass view={view or DEFAULT_VIEW} without grid" if held else f"extract its tokens: `{extract_into(open_store(store, plain=True), DEFAULT_VIEW)}`"
            raise SettingError("grid", f"holds {has}, not {grid}×{grid} (grid={grid})", fix, store, others=("view",))
        if view is None:
            view = matching[0]
    view_array(view)
    return str(view)


def run(inputs: Inputs, settings: NeighboursSettings, context: RunContext) -> OverStoresReport:
    """Every store's tokens measured against the window, saved as ``results/neighbours_g<grid>`` (``_nowrap`` without the wrap)."""
    from ..analyses.neighbours import neighbours, view_array
    from ..analyses.stats import Bootstrap

    s = settings
    array = view_array(choose_view(inputs.stores, s.view, s.grid))

    def analyse(ds, progress, where):
        tokens = require(ds, array)
        side = grid_side(tokens.shape[1], array)
        with within(f"bootstrap: {s.boot:,} resamples", s.boot) as boot:  # a line of its own while they run
            return neighbours(
                tokens,
                side,
                k=s.k,
                top=s.top,
                wrap=s.wrap,
                metric=s.distance,
                boot=Bootstrap(s.boot, s.seed, progress=boot),
                run_blocks=per_image(where, progress=progress),
            )

    runs = over_stores(inputs.stores, analyse, array, s.partial, context)
    suffix = "" if s.wrap else "_nowrap"
    names = {store: f"neighbours_g{result.attrs['grid']}{suffix}" for store, (_, result) in runs.items()}
    return finish(next(iter(names.values()), "neighbours"), runs, context, names=names)
