"""How a store names its arrays: kind, block, view and part, in one place.

``<kind>_<view>`` is the array of the network's last block, as every store has named it
(``tokens_224``, ``cls_keys_480``, ``keys_rope_native``); ``<kind>_b<B>_<view>`` the same kind at
block ``B`` (0-based, as DINOv2's and DINOv3's ``get_intermediate_layers`` count blocks:
``tokens_b3_224``). Each array records its block and facet in its attributes too (``block``,
``facet``); an array written before blocks were chosen holds the last block.

A view is extracted in parts: what its first run stores is part 0 (its arrays named as above,
its flags ``done_<view>``); what a later run adds to a view the store already holds (another
block, another facet) is part ``n``, with its own flags, grids and patch dimension: the view
name followed by ``.p<n>`` (``tokens_b3_224.p1``, ``done_224.p1``). A part is the unit of
completion, as the view was: a store growing a part stays readable in the parts it had.
``unit`` (the view and its part) is what ``grids.view_of`` returns.

Arrays holding every block at once carry a ``block`` dimension (``attention_blocks_<view>``, the
attention statistics ``attention_<statistic>_<view>``) and are read one block at a time by
``store.cache.require(ds, name, block=B)``.

Torch-free, plain strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import views

_PART = re.compile(r"^(.*)\.p(\d+)$")
_BLOCK = re.compile(r"^(.*)_b(\d+)$")

# what each facet of ``probe extract --facets`` stores, as array kinds: the patch tokens' array, and
# beside it ``cls_<kind>`` (the class token) and, for a register network, ``registers_<kind>``
FACETS = {"tokens": "tokens", "normed": "normed", "q": "queries", "k": "keys", "v": "values"}
FACET_OF = {kind: facet for facet, kind in FACETS.items()} | {"queries_rope": "q", "keys_rope": "k"}
# the statistics ``--attention stats`` stores per block and head (``store.attention_stats``)
STATISTICS = ("entropy", "distance", "cls", "storage", "topk")
BLOCKED = ("attention_blocks", *(f"attention_{s}" for s in STATISTICS))  # kinds whose arrays hold every block along ``block``


@dataclass(frozen=True)
class ArrayName:
    kind: str  # tokens, cls_tokens, registers, keys_rope, normed, cls_normed, queries, values, attention, attention_entropy, ...
    view: str  # the view's canonical name
    block: int | None = None  # None: the last block (the name every store has used)
    part: int = 0

    @property
    def unit(self) -> str:
        """The view and part: the unit of completion (flags ``done_<unit>``, grids, patch dimension)."""
        return unit(self.view, self.part)

    @property
    def name(self) -> str:
        return f"{self.kind}{'' if self.block is None else f'_b{self.block}'}_{self.unit}"

    @property
    def facet(self) -> str | None:
        """The ``--facets`` choice the array belongs to (``cls_keys`` → k, ``registers`` → tokens), or None."""
        base = self.kind.removeprefix("cls_").removeprefix("registers_")
        if self.kind == "registers":
            return "tokens"
        return FACET_OF.get(base)


def unit(view: str, part: int = 0) -> str:
    return f"{view}.p{part}" if part else view


def split_unit(name: str) -> tuple[str, int]:
    """``224.p1`` → (``224``, 1); ``224`` → (``224``, 0)."""
    found = _PART.match(name)
    return (found.group(1), int(found.group(2))) if found else (name, 0)


def unit_of(array: str) -> str:
    """The unit (view and part) an array or flag belongs to: ``tokens_b3_224.p1`` → ``224.p1``,
    ``keys_native_crop`` → ``native_crop``, ``done_square@1024`` → ``square@1024``."""
    rest, part = split_unit(array)
    return unit(views.of_array(rest), part)


def view_of(array: str) -> str:
    """The view an array belongs to, its part dropped (``tokens_b3_224.p1`` → ``224``)."""
    return split_unit(unit_of(array))[0]


def parse(array: str) -> ArrayName:
    """An array's name read back: ``cls_tokens_b3_224.p1`` → (cls_tokens, 224, 3, 1)."""
    rest, part = split_unit(array)
    view = views.of_array(rest)
    head = rest[: -len(view) - 1] if rest.endswith(f"_{view}") else rest
    found = _BLOCK.match(head)
    if found:
        return ArrayName(found.group(1), view, int(found.group(2)), part)
    return ArrayName(head, view, None, part)


def named(kind: str, view: str, block: int | None, depth: int, part: int = 0) -> str:
    """The array of ``kind`` at ``block`` (None or the last: the plain name) of ``view``."""
    return ArrayName(kind, view, None if block is None or block == depth - 1 else block, part).name


def facet_kinds(facet: str, family: str = "vit", rope: bool = True) -> tuple[str, ...]:
    """The patch arrays' kinds one facet stores: DINOv3's q and k also after RoPE."""
    kind = FACETS[facet]
    if family == "dinov3" and rope and facet in ("q", "k"):
        return (kind, f"{kind}_rope")
    return (kind,)
