"""The report section of the linear probes: ``results/linear_patch`` and ``results/linear_image``,
each store's scores side by side, where each probe's labels came from, and the per-class scores."""

from __future__ import annotations

from .content import Section, Table
from .context import Context
from .sections_kit import HOW, _lacking, _pct


def linear(ctx: Context) -> Section:
    section = Section("linear", "Linear probes on the frozen tokens (labels read through the ledger)")
    any_found = False
    for level, metrics in (
        ("patch", (("miou", "patch mIoU"), ("accuracy", "patch accuracy"), ("miou_dense", "dense mIoU (original pixels)"))),
        ("image", (("map", "mAP (categories present)"),)),
    ):
        found = {s.label: s.result(f"linear_{level}") for s in ctx.stores if s.result(f"linear_{level}") is not None}
        if not found:
            continue
        any_found = True
        rows = [[text, *[_pct(float(ds[key].values), 2) for ds in found.values()]] for key, text in metrics]
        rows.append(["chosen regularisation", *[str(ds.attrs.get("settings", {}).get("weight_decay" if level == "patch" else "c", "?")) for ds in found.values()]])
        section.blocks.append(Table(["", *found], rows, f"Linear probe, {level} level, in %."))
        prov = []
        for label, ds in found.items():
            led = ds.attrs.get("ledger", {})
            pan = ds.attrs.get("panels", {})
            prov.append(
                [
                    label,
                    f"{pan.get('train', {}).get('name', '?')}: {ctx.book.describe(led.get('train'))}",
                    f"{pan.get('val', {}).get('name', '?')}: {ctx.book.describe(led.get('val'))}",
                ]
            )
        section.blocks.append(Table(["store", "train labels (fit)", "val labels (score)"], prov, f"Where the {level}-level probe's labels came from."))
        per = "class" if level == "patch" else "category"
        score = "iou" if level == "patch" else "ap"
        names = list(dict.fromkeys(str(c) for ds in found.values() for c in ds[per].values))
        table = []
        for name in names:
            table.append([name, *[_pct(float(ds[score].sel({per: name}).values), 1) if name in [str(c) for c in ds[per].values] else "–" for ds in found.values()]])
        section.blocks.append(Table([per, *found], table, f"Per {per}: {'IoU' if level == 'patch' else 'AP'} on the val panel, in %."))
        _lacking(section, [s for s in ctx.stores if s.label not in found], f"{level}-level probe", HOW[f"linear_{level}"])
    if not any_found:
        section.missing(f"No linear probes yet: {HOW['linear_patch']} (and with `--level image`).")
    return section
