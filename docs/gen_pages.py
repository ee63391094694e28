"""The generated pages of the documentation site, written from the code that defines them.

Run by mkdocs as a hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds the pages below to the
build, never to ``docs/`` on disk, so no generated text is ever edited by hand or goes stale.

- ``protocols/<name>.md`` for every protocol of ``probe_toolkit.protocols.registry.protocols()``:
  summary, settings table (from the frozen dataclass's fields, defaults and comments), what it
  reads and the results it writes, the published references, what differs from them;
- ``protocols/index.md``: the table of every protocol (and the nav's Protocols section);
- ``views.md`` from ``probe_toolkit.store.views.TABLE`` and ``panel-kinds.md`` from
  ``probe_toolkit.labels.catalogue.KINDS``;
- ``benchmarks.md`` from the JSON records the benchmarks append (``benchmarks/records/*.jsonl``);
- ``results.md``: each table of ``RESULTS``, written by ``probe table``'s code from the records under ``docs/data/records``;
- ``training.md``: ``training/README.md``.

``on_page_markdown`` replaces ``<!-- readme-example: NAME -->`` with the README's example block of
that name (``tools/readme_examples.py`` keeps those equal to what the commands print), and
``<!-- generated: NAME -->`` with the text ``GENERATED[NAME]`` makes (``architectures``: the released sizes).

    python docs/gen_pages.py OUT     # writes the generated pages into OUT, to read them without mkdocs
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RECORDS = ROOT / "benchmarks" / "records"  # where the benchmarks' JSON lines are appended
REPO = "../"  # how a generated page at depth one reaches the site's root pages

# a protocol -> the manual page that describes its command at length (a new protocol without one
# still gets its generated page; only the link is missing)
MANUAL = {
    "entropy": "commands/entropy.md",
    "neighbours": "commands/neighbours.md",
    "decode": "commands/decode.md",
    "decode-stream": "commands/decode.md",
    "decode-sweep": "commands/decode.md",
    "score": "commands/decode.md",
    "linear": "commands/linear.md",
    "knn": "commands/frozen-features.md",
    "attention-masks": "commands/frozen-features.md",
    "propagate": "commands/frozen-features.md",
    "hummingbird": "commands/dense.md",
    "linear-segmentation": "commands/segment.md",
    "linear-depth": "commands/depth.md",
    "rank": "commands/labelfree.md",
    "position": "commands/labelfree.md",
    "similarity": "commands/labelfree.md",
    "overcluster": "commands/labelfree.md",
}


def _cell(value: object) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text


def _code(value: object) -> str:
    return f"`{value}`" if str(value) != "" else ""


def field_comments(cls: type) -> dict[str, str]:
    """The comment written beside each field of a settings dataclass (``tau: float = 0.2  # ...``)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__ == "builtins":
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            match = re.match(r"^\s+(\w+)\s*:\s*[^#]+?#\s*(.+)$", line)
            if match:
                found[match[1]] = match[2].strip()
    return found


def parser_commands() -> dict[str, object]:
    """Every ``probe`` command as the parser builds it (click's, through typer), by its full name (``panel add``)."""
    import typer

    from probe_toolkit import cli

    found: dict[str, object] = {}

    def walk(command, path: str) -> None:  # typer carries its own click: groups are told by their commands
        if getattr(command, "commands", None):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            found[path] = command

    walk(typer.main.get_command(cli.app), "")
    return found


def parser_options(command) -> list[tuple[str, str, str]]:
    """(flags, default, help) of each option of one parsed command, as ``--help`` shows them."""
    rows = []
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option" or param.hidden or param.name == "help":
            continue
        flags = " / ".join(", ".join(opts) for opts in (param.opts, param.secondary_opts) if opts)
        default = "(required)" if param.required else "off" if param.is_flag and not param.default else repr(param.default) if param.default is not None else ""
        rows.append((flags, default, param.help or ""))
    return rows


def parser_flags(command) -> set[str]:
    return {o for param in command.params for o in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())) if o.startswith("-")}


def settings_rows(cls: type, flags: set[str] | None = None) -> list[tuple[str, str, str, str, str]]:
    """(parameter, flag, type, default, note) for every field of a protocol's settings: the flag only where the
    command's parser has it (``flags``), else the setting is the Python API's alone; the note is the field's declared
    help and constraint (``infra.settings.setting``), or, for settings not yet declared that way, the comment beside it."""
    from probe_toolkit.cli.app import flag
    from probe_toolkit.infra.settings import declared

    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        found = declared(f)
        if found is not None:
            comments[f.name] = found.help + (f" Must be {found.constraint.text}." if found.constraint is not None else "")
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = repr(f.default_factory())  # type: ignore[misc]
        else:
            default = "(required)"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        spelled = flag(f.name) if flags is None or flag(f.name) in flags else "(Python only)"
        rows.append((f.name, spelled, kind, default, comments.get(f.name, "")))
    return rows


def options_table(command) -> list[str]:
    out = ["| option | default | help |", "|---|---|---|"]
    out += [f"| `{flags}` | {f'`{_cell(default)}`' if default else ''} | {_cell(text)} |" for flags, default, text in parser_options(command)]
    return [*out, ""]


def options_page() -> str:
    """Every command's options, from the parser itself (the manual's pages describe them at length)."""
    out = [
        "# Every option of every command",
        "",
        "Generated from the command-line parser (typer's commands, as `probe COMMAND --help` prints them): nothing here is typed by hand.",
        "",
    ]
    for name, command in sorted(parser_commands().items()):
        summary = (command.help or "").strip().split("\n")[0]
        out += [f"## `probe {name}`", "", _cell(summary), ""]
        out += options_table(command)
    return "\n".join(out) + "\n"


def cli_commands() -> set[str]:
    """The names of the ``probe`` commands (typer's, or the function's name with dashes)."""
    from probe_toolkit import cli

    return {c.name or c.callback.__name__.replace("_", "-") for c in cli.app.registered_commands}


def placement_fields() -> list[str]:
    from probe_toolkit.infra.placement import Placement

    return [f.name for f in dataclasses.fields(Placement)]


def protocol_page(protocol, commands: set[str] | None = None) -> str:
    from probe_toolkit.store.arrays import holds

    reads = protocol.reads
    commands = cli_commands() if commands is None else commands
    out = [f"# `{protocol.name}`", "", protocol.summary, ""]
    python = f'`probe.run("{protocol.name}", {protocol.source}, ...)` in Python ([Python API]({REPO}api.md))'
    command = protocol.command.name or protocol.name if protocol.command is not None else protocol.name
    if command in commands:
        out += [f"Run it: `probe {command} --help` on the command line, or {python}; its first input is `{protocol.source}`.", ""]
    else:
        out += [f"Run it: {python}; its first input is `{protocol.source}`. On the command line it is reached through another command (see the manual below).", ""]
    manual = MANUAL.get(protocol.name)
    if manual:
        out += [f"The command at length: [manual]({REPO}{manual}).", ""]
    out += ["## Settings", ""]
    parsed = parser_commands().get(command) if protocol.command is not None else None
    rows = settings_rows(protocol.settings, parser_flags(parsed) if parsed is not None else set())
    if rows:
        out += [
            f"`{protocol.settings.__name__}`, a frozen dataclass that checks itself (errors name the parameter).",
            "",
            "| parameter | flag | type | default | note |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| `{name}` | {f'`{flag}`' if flag.startswith('-') else flag} | `{_cell(kind)}` | `{_cell(default)}` | {_cell(note)} |"
            for name, flag, kind, default, note in rows
        ]
    else:
        out += ["No settings: the run is defined by its inputs."]
    out += [
        "",
        "Placement (where the work runs, not what it computes): "
        + (", ".join(f"`{name}`" for name in protocol.placement) or "none (it runs in this process)")
        + f" — see [Scaling out]({REPO}scaling.md).",
        "",
    ]
    if protocol.command is not None:
        out += [
            "## On the command line",
            "",
            f"`probe {command} {protocol.source.upper()}`: {protocol.command.help}",
            "",
            "Every option, as the command's parser has it (`probe " + command + " --help`):",
            "",
        ]
        out += options_table(parsed) if parsed is not None else ["(reached through another command)", ""]
    out += ["## What it reads", ""]
    out += [f"- **source**: {reads.source}"]
    if reads.arrays:
        out += ["- **arrays**: " + "; ".join(f"`{a}` ({holds(a)})" if holds(a) else f"`{a}`" for a in reads.arrays)]
    if reads.views:
        out += ["- **views**: " + ", ".join(_view_link(v) for v in reads.views)]
    if reads.labels:
        kinds = ", ".join(f"[`{k}`]({REPO}panel-kinds.md#{_anchor(k, 'kind')})" for k in reads.panel_kinds) or "any"
        out += [f"- **labels**: yes, through a panel and the ledger (panel kinds: {kinds})"]
    else:
        out += ["- **labels**: none"]
    out += ["", "## What it writes", ""]
    out += [f"- `results/{r}/<run id>/` (a record: `record.json` beside the arrays; see [records]({REPO}store.md#records))" for r in protocol.results]
    out += ["", "`<panel>` and `<grid>` stand for the run's panel name and grid.", ""]
    out += ["## Published references", ""]
    out += [f"- {ref.paper} — code: `{ref.code}`" for ref in protocol.references] or ["- none"]
    out += ["", "## What differs from the reference", ""]
    if isinstance(protocol.differences, str):
        out += [protocol.differences or "Nothing stated.", ""]
    else:
        out += [
            "Each record carries this list (`record.json`: `differences`), and the report shows it beside the protocol's numbers.",
            "",
            "| what differs | why | effect on the number |",
            "|---|---|---|",
        ]
        out += [f"| {_cell(d.what)} | {_cell(d.why)} | {_cell(d.effect)} |" for d in protocol.differences]
        out += [""]
    return "\n".join(out)


def _view_link(view: str) -> str:
    """A view named in the table links to its row; another size of a family (``hbird@448``) says its family."""
    from probe_toolkit.store.views import NAMES
    from probe_toolkit.store.views import view as spec

    return f"[`{view}`]({REPO}views.md#{_anchor(view)})" if view in NAMES else f"`{view}` (the `{spec(view).family}` family at {spec(view).size} px)"


def _anchor(text: str, prefix: str = "view") -> str:
    return prefix + "-" + re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def protocols_index(protocols) -> str:
    out = [
        "# Protocols",
        "",
        "Every protocol is declared once in `probe_toolkit/protocols/` and registered; this page and each "
        "protocol's page are generated from that registry (`probe list` prints the same).",
        "",
        "| protocol | summary | results |",
        "|---|---|---|",
    ]
    for p in protocols:
        out.append(f"| [`{p.name}`]({p.name}.md) | {_cell(p.summary)} | {', '.join(f'`{r}`' for r in p.results)} |")
    return "\n".join(out) + "\n"


def views_page() -> str:
    from probe_toolkit.store.views import listed

    out = [
        "# Views",
        "",
        "Every view is a family at a size, or an image at its own size, defined once in `probe_toolkit/store/views.py` (torch-free, its "
        "`FAMILIES` table); extraction, the grids, the store, the decoders, `probe list` and this page read that table. A sized view is "
        "`<family>@<S>` (`square@1024`, `eval@448`, `hbird@448`, Hummingbird's memory views `hbird@448_aug0`), S any multiple of the "
        "network's patch (another size is refused in one line naming the nearest two). The names views had before sizes were free are "
        "aliases of their sizes, and a store names their arrays by them as it always did (`tokens_224`, `keys_480`): every store written "
        "before reads unchanged; at /14 an alias keeps its rule (the 480 view reads its 34 whole patches from the top left). On the command "
        "line `native-crop` and `native_crop` are the same view. How the arrays are laid out: [The store layout](store.md).",
        "",
        "| view | also named | rule | filter | grid | stores by default | size | follows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in listed():
        anchors = "".join(f'<span id="{_anchor(n)}"></span>' for n in (v.name, *v.aliases))  # the protocols' pages link the aliases
        out.append(
            f"| {anchors}`{v.name}` | {', '.join(f'`{a}`' for a in v.aliases)} | {_cell(v.rule)} | {_cell(v.filter)} | "
            f"{_cell(v.grid)} | {', '.join(v.reads)} | {'fixed' if v.fixed else 'each image its own'} | {_cell(v.reference)} |"
        )
    out += [
        "",
        "By default the short family stores tokens and the attention maps (the 96 view, SelfPatch's local crops, tokens only), as "
        "stores always did; `--facets`, `--blocks`, `--attention stats` and `--for` choose otherwise ([extract](commands/extract.md)).",
    ]
    return "\n".join(out) + "\n"


def panel_kinds_page() -> str:
    from probe_toolkit.labels.catalogue import KINDS

    out = [
        "# Panel kinds",
        "",
        "What `probe panel add` reads (from `probe_toolkit/labels/catalogue.py`; `probe list` prints the same). "
        "Labels enter only through panels, and every read is written to the ledger first: [panels and the ledger](commands/panels.md).",
        "",
        "| kind | layout and the code it follows |",
        "|---|---|",
    ]
    out += [f'| <span id="{_anchor(k, "kind")}"></span>`{k}` | {_cell(v)} |' for k, v in KINDS.items()]
    return "\n".join(out) + "\n"


def architectures_table() -> str:
    """The released sizes by name (``probe_toolkit.store.architectures.RELEASED``; ``probe list`` prints the same)."""
    from probe_toolkit.store.architectures import RELEASED

    out = [
        "| name (`--arch`) | patch | width | depth | heads | MLP hidden | class token | final norm | position grid | registers | LayerScale |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, a in RELEASED.items():
        out.append(
            f"| `{name}` | {a.patch} | {a.width} | {a.depth} | {a.heads} | {a.mlp_hidden} | {'yes' if a.class_token else 'no'} | "
            f"{'yes' if a.final_norm else 'no'} | {a.pos_grid} × {a.pos_grid} | {a.registers} | {'yes' if a.layerscale else 'no'} |"
        )
    return "\n".join(out) + "\n"


DINOV3_NAMES = {
    "vit-s16-dinov3": "ViT-S/16",
    "vit-s16plus-dinov3": "ViT-S+/16",
    "vit-b16-dinov3": "ViT-B/16",
    "vit-l16-dinov3": "ViT-L/16",
    "vit-l16plus-dinov3": "ViT-L+/16",
    "vit-h16plus-dinov3": "ViT-H+/16",
    "vit-7b16-dinov3": "ViT-7B/16",
}


def dinov3_files(name: str) -> tuple[int, dict[str, dict]]:
    """(the network's parameters, {layout: its file's state dict}) for a released DINOv3 size, every
    tensor on the meta device (no memory), written by ``store.dinov3_layouts`` from timm's own names."""
    from probe_toolkit.store import dinov3_layouts
    from probe_toolkit.store.architectures import DINOV3_RELEASED
    from probe_toolkit.store.backbone import build_vit

    arch = DINOV3_RELEASED[name]
    backbone = dict(build_vit(arch, device="meta").state_dict())
    parameters = sum(v.numel() for v in backbone.values())
    head_dim = arch.width // arch.heads
    backbone["rope.periods"] = dinov3_layouts.rope_periods(head_dim)
    heads = {}
    if name == "vit-7b16-dinov3":  # hub/backbones.py dinov3_vit7b16: untie_global_and_local_cls_norm=True, so the file holds local_cls_norm
        import torch

        heads["local_cls_norm"] = {k: torch.empty(arch.width, device="meta") for k in ("weight", "bias")}
    return parameters, {
        "dinov3-official": dinov3_layouts.to_official(backbone, heads),
        "dinov3-timm": dinov3_layouts.to_timm(backbone, head_dim),
        "dinov3-hf": dinov3_layouts.to_hf(backbone, head_dim),
    }


def dinov3_networks_table() -> str:
    """Every released DINOv3 ViT in each of its three layouts: tensors and values in the file, and the
    parameters of the network probe builds (``probe_toolkit.store.architectures.DINOV3_RELEASED``)."""
    from probe_toolkit.store.architectures import DINOV3_RELEASED

    out = [
        "| network (`--arch`) | width · depth · heads | feed-forward | network parameters | layout | tensors in the file | values in the file |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, arch in DINOV3_RELEASED.items():
        parameters, files = dinov3_files(name)
        ffn = f"{'SwiGLU' if arch.ffn == 'swiglu' else 'MLP'} {arch.mlp_hidden}" + ("" if arch.qkv_bias else ", no qkv bias")
        for i, (layout, state) in enumerate(files.items()):
            head = [f"DINOv3 {DINOV3_NAMES[name]} (`{name}`)", f"{arch.width} · {arch.depth} · {arch.heads}", ffn, f"{parameters:,}"] if i == 0 else [""] * 4
            out.append("| " + " | ".join(head + [f"`{layout}`", str(len(state)), f"{sum(v.numel() for v in state.values()):,}"]) + " |")
    return "\n".join(out) + "\n"


def dinov3_keys_table(folder: Path = RECORDS) -> str:
    """The latest ``benchmarks/dinov3_keys.py`` record of each view: CorLoc and mean best IoU with the keys before and after RoPE."""
    latest = {}
    for record in benchmark_records(folder):
        if record.get("benchmark") == "dinov3_keys":
            latest[record["view"]] = record
    if not latest:
        return "*No record of `benchmarks/dinov3_keys.py` yet.*\n"
    out = ["| view | preset | CorLoc, plain / rope (%) | mean best IoU, plain / rope (%) | record |", "|---|---|---|---|---|"]
    for view, record in latest.items():
        rows = {(r["preset"], r["keys"]): r for r in record["rows"]}
        for preset in dict.fromkeys(r["preset"] for r in record["rows"]):
            plain, rope = rows[(preset, "plain")], rows[(preset, "rope")]
            out.append(
                f"| {view} | {preset} | {plain['corloc']:.1f} / {rope['corloc']:.1f} | {plain['mean_best_iou']:.1f} / {rope['mean_best_iou']:.1f} | "
                f"`{record['_source']}` ({record['seeds']} networks, {record['scenes']} scenes, {record['date'][:10]}) |"
            )
    return "\n".join(out) + "\n"


def lost_ties_table(folder: Path = RECORDS) -> str:
    """The latest ``benchmarks/lost_ties.py`` record: images whose LOST seed, mask and CorLoc move with the tie rule."""
    latest = [r for r in benchmark_records(folder) if r.get("benchmark") == "lost_ties"][-1:]
    if not latest:
        return "*No record of `benchmarks/lost_ties.py` yet.*\n"
    record = latest[0]
    out = ["| network (random weights) | images | seed moved | mask moved | of the 7 photographs | CorLoc argsort / lowest index (%) |", "|---|---|---|---|---|---|"]
    for r in record["rows"]:
        out.append(
            f"| {r['network']} | {r['images']} | {r['seed_moved']} | {r['mask_moved']} | {r['photos_mask_moved']} | "
            f"{r['corloc_argsort']:.1f} / {r['corloc_lowest_index']:.1f} |"
        )
    out.append(
        f"\n`{record['_source']}` ({record['date'][:10]}, view {record['view']}, torch {record['torch']}; "
        f"analyses.argsort {record['argsort_ms_per_image']:.2f} ms an image against torch.argsort's {record['torch_argsort_ms_per_image']:.2f} ms)"
    )
    return "\n".join(out) + "\n"


def plan_tables(folder: Path = RECORDS) -> str:
    """The latest ``benchmarks/plan.py`` records: disk per image of each plan against today's eval224, peak memory of
    ``--attention stats`` by tokens beside the explicit maps' size, and ``--blocks all`` against ``last``."""
    latest: dict[tuple[str, str], dict] = {}
    for record in benchmark_records(folder):
        if record.get("benchmark") == "plan":
            latest[(record["measure"], str(record.get("plan") or record.get("view")) + str(record.get("device", "cpu")) + str(record.get("depth", 12)))] = record
    if not latest:
        return "*No record of `benchmarks/plan.py` yet.*\n"
    out = []
    disk = [r for (m, _), r in latest.items() if m == "disk"]
    if disk:
        out += ["| plan (ViT-S/16) | on disk an image | uncompressed | against eval224 | ImageNet-1k train (1,281,167) | record |", "|---|---|---|---|---|---|"]
        out += [
            f"| `{r['plan']}` | {r['disk_bytes_per_image'] / 1024:,.1f} KiB | {r['planned_bytes_per_image'] / 1024:,.1f} KiB | {r['vs_eval224']:.3g}× | "
            f"{r['imagenet_train_gib']:,.1f} GiB | `{r['_source']}` ({r['machine']}, load {r['load']}, {r['date'][:10]}) |"
            for r in disk
        ]
        out.append("")
    memory = sorted((r for (m, _), r in latest.items() if m == "memory"), key=lambda r: (r.get("device", "cpu"), -r.get("depth", 12), r["tokens"]))
    if memory:
        out += [
            "| view | patch tokens | blocks | peak, no attention | peak, --attention stats | seconds, none / stats | peak, probe entropy | "
            "explicit maps, one block / every block | device | record |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| `{r['view']}` | {r['tokens']:,} | {r.get('depth', 12)} of 12 | {r['peak_none_mib']:,.0f} MiB | {r['peak_stats_mib']:,.0f} MiB | "
            f"{r['seconds_none']:,.0f} / {r['seconds_stats']:,.0f} | {r['peak_entropy_mib']:,.0f} MiB | "
            f"{r['explicit_map_one_block_mib']:,.0f} / {r['explicit_maps_all_blocks_mib']:,.0f} MiB | {r.get('device', 'cpu')} | "
            f"`{r['_source']}` ({r['machine']}, load {r['load']}" + (f" to {r['load_end']}" if "load_end" in r else "") + ") |"
            for r in memory
        ]
        out.append("")
    blocks = [r for (m, _), r in latest.items() if m == "blocks"]
    if blocks:
        out += ["| images at 224 | --blocks last | --blocks all --facets tokens | last / all | on disk an image, last / all | record |", "|---|---|---|---|---|---|"]
        out += [
            f"| {r['images']} | {r['seconds_last']:.1f} s | {r['seconds_all']:.1f} s | {r['ratio']:.3g} | {r['disk_last_bytes_per_image'] / 1024:,.0f} / "
            f"{r['disk_all_bytes_per_image'] / 1024:,.0f} KiB | `{r['_source']}` ({r['machine']}, {r.get('device', 'cpu')}, load {r['load']}) |"
            for r in blocks
        ]
    return "\n".join(out) + "\n"


# what probe.run returns as ``run.report``, per protocol, and the objects those hold
# the scores objects a protocol's result holds (each protocol's own result type comes from the registry: ``Protocol.result``)
NESTED_RESULTS = ("labels.scoring:Scores", "analyses.knn:KnnResult", "analyses.hummingbird:MiouResult", "analyses.segment:Scores")


def api_reports() -> list[str]:
    """Every result type the Python API returns (``run.report``), as "module:Class", each once."""
    from probe_toolkit.protocols.registry import protocols

    return list(dict.fromkeys([*(p.result for p in protocols() if isinstance(p.result, str)), *NESTED_RESULTS]))


def api_reports_table() -> str:
    """Every field of every report object of the Python API: name, type, the comment beside it in the code."""
    import importlib

    out = []
    for dotted in api_reports():
        module, name = dotted.split(":")
        cls = getattr(importlib.import_module(f"probe_toolkit.{module}"), name)
        comments = field_comments(cls)
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        doc = "" if doc.startswith(f"{name}(") else doc  # dataclasses' generated signature says nothing new
        out += [f"### `{name}` (`probe_toolkit.{module}`)", "", *([_cell(doc), ""] if doc else []), "| field | type | what it holds |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            out.append(f"| `{f.name}` | `{_cell(kind)}` | {_cell(comments.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out) + "\n"


DATA = ROOT / "docs" / "data" / "records"  # the records the results page reads (tools/docs_records.py copies them out of a demo)


class ResultsTable(NamedTuple):  # (a NamedTuple: a dataclass needs its module in sys.modules, which a hook file is not)
    """One table of the results page: ``probe table`` over stores kept under ``docs/data/records``."""

    title: str
    about: str  # where the stores' records come from, in a sentence
    stores: dict[str, str]  # row label (``--label``) -> store folder under docs/data/records
    protocols: tuple[str, ...] = ("knn", "decode", "hummingbird", "entropy")

    def paths(self) -> list[str]:
        """The stores as the command names them, from the repository's root."""
        return [(DATA / name).relative_to(ROOT).as_posix() for name in self.stores.values()]

    def arguments(self) -> list[str]:
        """``probe table``'s arguments that print this table."""
        labels = [part for label, path in zip(self.stores, self.paths()) for part in ("--label", f"{label}={path}")]
        return ["table", *self.paths(), "--protocols", ",".join(self.protocols), *labels, "--format", "markdown"]

    def text(self) -> str:
        """The table as ``probe table`` writes it: the same build and render, on the same records."""
        from probe_toolkit.report import paper

        stores = [ROOT / path for path in self.paths()]
        return paper.render(paper.build(stores, self.protocols, {str(s): label for s, label in zip(stores, self.stores)}), "markdown")


RESULTS = (
    ResultsTable(
        "The demo: a tiny SelfPatch network, trained and at random initialisation",
        "Records of `probe demo --quick` (copied by `tools/docs_records.py`): the shipped photographs and synthetic labelled "
        "scenes, a tiny SelfPatch network trained on the spot beside the same network before training. The numbers show what "
        "the table holds; they are no benchmark of any released checkpoint.",
        {"demo SelfPatch, trained": "demo-trained.zarr", "demo SelfPatch, random init": "demo-random.zarr"},
    ),
)


def _store_line(label: str, store: Path) -> str:
    """What a row's store is, from its manifest: the network, its size, the checkpoint's digest and the images."""
    from probe_toolkit.store import cache

    manifest = cache.manifest(store)
    arch = manifest.get("arch") or {}
    checkpoint = manifest.get("checkpoint") or {}
    size = ", ".join(f"{key} {arch[key]}" for key in ("width", "depth", "heads", "patch") if key in arch)
    return (
        f"- **{label}**: network `{manifest.get('network', '?')}` ({size}), checkpoint sha256 `{str(checkpoint.get('sha256', '?'))[:12]}`, "
        f"{manifest.get('n_images', '?')} images, extracted by probe {manifest.get('toolkit_version', '?')}"
    )


def results_page(tables: tuple[ResultsTable, ...] = RESULTS) -> str:
    import shlex

    out = [
        "# Results",
        "",
        "Every table on this page is written by `probe table` ([a paper table from records](commands/report.md#probe-table-a-paper-table-from-records)) from the records "
        "kept under `docs/data/records/` in this repository, at every build of this site: the same code, on the same "
        "records, as the command printed under each table, which prints it again from a checkout. Only records measured "
        "alike share a column; each column's title says on which images and with which settings (those that differ from "
        "the protocol's defaults) its numbers were measured.",
        "",
    ]
    for table in tables:
        out += [f"## {table.title}", "", table.about, ""]
        out += [_store_line(label, ROOT / path) for label, path in zip(table.stores, table.paths())]
        out += ["", "```bash", shlex.join(["probe", *table.arguments()]), "```", "", table.text()]
    return "\n".join(out) + "\n"


# the placeholders a hand-written page may hold, each replaced by text generated from the code
GENERATED = {
    "architectures": architectures_table,
    "dinov3-networks": dinov3_networks_table,
    "dinov3-keys": dinov3_keys_table,
    "api-reports": api_reports_table,
    "lost-ties": lost_ties_table,
    "plan": plan_tables,
}


def benchmark_records(folder: Path = RECORDS) -> list[dict]:
    """Every JSON line appended under ``folder`` (``*.jsonl``), in file then line order."""
    found = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                record = json.loads(line)
                record.setdefault("benchmark", path.stem)
                record["_source"] = f"{path.name}:{number}"
                found.append(record)
    return found


def _scripts() -> list[tuple[str, str]]:
    """(script, first line of its docstring) for every benchmark script."""
    import ast

    out = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out.append((path.name, doc.strip().split("\n\n")[0].replace("\n", " ")))
    return out


def _is_rows(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _flat(record: dict, prefix: str = "") -> dict[str, str]:
    """A record's scalar fields as cells (nested dicts as ``a.b``, lists of values joined); lists of rows
    (``_is_rows``) and the bookkeeping keys are left to their own tables."""
    out: dict[str, str] = {}
    for key, value in record.items():
        if key in ("benchmark", "_source") or _is_rows(value):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        elif isinstance(value, list):
            out[name] = ", ".join(_value(v) for v in value)
        else:
            out[name] = _value(value)
    return out


def _value(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return _cell(json.dumps(value) if isinstance(value, (dict, list)) else value)


def _record_table(rows: list[tuple[dict[str, str], str]]) -> list[str]:
    """A table whose columns are the union of the rows' fields, each row in its own record's order."""
    keys = list(dict.fromkeys(k for cells, _ in rows for k in cells))
    out = ["| " + " | ".join([*keys, "record"]) + " |", "|" + "---|" * (len(keys) + 1)]
    out += ["| " + " | ".join([*(cells.get(k, "") for k in keys), source]) + " |" for cells, source in rows]
    return [*out, ""]


def benchmarks_page(folder: Path = RECORDS) -> str:
    records = benchmark_records(folder)
    out = [
        "# Benchmarks",
        "",
        "Each script in `benchmarks/` measures the toolkit and a baseline in the same process and prints one JSON "
        "line of results. Appended to `benchmarks/records/<name>.jsonl`, those lines are the only source of this "
        "page's tables: no figure here is typed by hand.",
        "",
        "```bash",
        "python benchmarks/knn.py | tail -n 1 >> benchmarks/records/knn.jsonl",
        "```",
        "",
    ]
    if not records:
        out += [
            '!!! note "No records yet"',
            "    None were recorded on this machine yet: `benchmarks/records/` holds no JSON lines. The figures measured "
            "before records existed are kept, dated, on [History](history.md).",
            "",
        ]
    else:
        by_name: dict[str, list[dict]] = {}
        for record in records:
            by_name.setdefault(str(record["benchmark"]), []).append(record)
        for name, rows in by_name.items():
            out += [f"## {name}", ""]
            out += _record_table([(_flat(r), f"`{r['_source']}`") for r in rows])
            nested = list(dict.fromkeys(k for r in rows for k, v in r.items() if _is_rows(v) and v))
            for key in nested:  # a record's list of measurements: one table, each row naming its record
                out += [f"### {name}: {key}", ""]
                out += _record_table([(_flat(item), f"`{r['_source']}`") for r in rows if _is_rows(r.get(key)) for item in r[key]])
            out.append("")
    out += ["## The scripts", "", "| script | what it measures |", "|---|---|"]
    out += [f"| `benchmarks/{name}` | {_cell(doc)} |" for name, doc in _scripts()]
    return "\n".join(out) + "\n"


def training_page() -> str:
    text = (ROOT / "training" / "README.md").read_text(encoding="utf-8")
    return text


def pages() -> dict[str, str]:
    """Every generated page, by its path inside the site's sources."""
    from probe_toolkit.protocols.registry import protocols

    registered = protocols()
    commands = cli_commands()
    out = {f"protocols/{p.name}.md": protocol_page(p, commands) for p in registered}
    out["protocols/index.md"] = protocols_index(registered)
    out["views.md"] = views_page()
    out["panel-kinds.md"] = panel_kinds_page()
    out["benchmarks.md"] = benchmarks_page()
    out["results.md"] = results_page()
    out["training.md"] = training_page()
    out["commands/options.md"] = options_page()
    return out


def readme_examples() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import readme_examples as tool
    finally:
        sys.path.pop(0)
    return tool.blocks((ROOT / "README.md").read_text(encoding="utf-8"))


# --- mkdocs hooks ---


def on_config(config):
    """The nav's ``Protocols`` section, filled from the registry (mkdocs.yml names only its index)."""
    from probe_toolkit.protocols.registry import protocols

    for item in config["nav"] or []:
        if isinstance(item, dict) and "Protocols" in item:
            item["Protocols"] = ["protocols/index.md"] + [{p.name: f"protocols/{p.name}.md"} for p in protocols()]
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, content in pages().items():
        if files.get_file_from_path(path) is not None:
            files.remove(files.get_file_from_path(path))
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = re.sub(r"<!-- generated: ([\w-]+) -->\n", lambda m: GENERATED[m[1]](), markdown)
    if "<!-- readme-example:" not in markdown:
        return markdown
    blocks = readme_examples()

    def block(match: re.Match) -> str:
        name = match[1]
        if name not in blocks:
            raise ValueError(f"{page.file.src_uri}: the README has no example block {name!r}")
        return f"```\n{blocks[name]}```\n"

    return re.sub(r"<!-- readme-example: ([\w-]+) -->\n", block, markdown)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "build/docs-generated")
    for path, content in pages().items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(content, encoding="utf-8")
    print(f"wrote {len(pages())} pages under {target}")
