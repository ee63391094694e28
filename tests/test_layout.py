"""The package's folders are the flow's stages, and no module imports from a later stage.

Read statically (every import statement, also those inside functions), so a lazy import cannot
hide a backwards arrow. ``training/`` may use the toolkit; only ``cli`` and ``demo`` (the way in)
may start a training run, and nothing else in the toolkit imports ``training``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import probe_toolkit

PACKAGE = Path(probe_toolkit.__file__).parent
STAGES = ["infra", "store", "analyses", "labels", "results", "commands", "protocols", "report", "demo", "cli"]
# design.md's layout: "protocols/ or commands/: one module per protocol: its settings, inputs, record and presentation":
# one stage in two folders (a protocol's declaration and run context in protocols/, its run in commands/, each naming the other)
RANK = {stage: STAGES.index("protocols") if stage == "commands" else i for i, stage in enumerate(STAGES)}
ROOT_MODULES = {"_version": "infra", "__init__": "cli", "__main__": "cli", "cli": "cli"}


def stage_of(module: str) -> str:
    head = module.split(".")[0]
    return ROOT_MODULES.get(head, head)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module under probe_toolkit) for every toolkit import in the file."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - node.level])
                target = base + (node.module.split(".") if node.module else [])
                names = [".".join(target + [alias.name]) for alias in node.names] if not node.module else [".".join(target)]
            elif node.module and node.module.split(".")[0] == "probe_toolkit":
                rest = node.module.split(".")[1:]
                names = [".".join(rest + [alias.name]) for alias in node.names] if not rest else [".".join(rest)]
            else:
                continue
            found += [(node.lineno, name) for name in names if name]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".", 1)[1]) for alias in node.names if alias.name.startswith("probe_toolkit.")]
    return found


def test_every_module_sits_in_a_stage_folder():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in ROOT_MODULES)
    assert loose == []
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(STAGES)  # cli/ is a package of command modules


def test_no_module_imports_from_a_later_stage():
    backwards = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = stage_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for line, module in imported_modules(path):
            theirs = stage_of(module)
            if theirs == "__version__":
                continue
            assert theirs in STAGES, f"{path}:{line} imports {module}, which is in no stage"
            if RANK[theirs] > RANK[mine]:
                backwards.append(f"{path.relative_to(PACKAGE)}:{line} ({mine}) imports {module} ({theirs})")
    assert backwards == []


def test_only_the_way_in_starts_training():
    starters = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name.split(".")[0] == "training" for name in names):
                starters.append(stage_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts)))
    assert set(starters) <= {"cli", "demo"}


def test_training_imports_the_toolkit_by_its_stage_paths():
    """training/ uses the backbone and the selection rules from the toolkit (one home for each)."""
    text = "\n".join(p.read_text() for p in (PACKAGE.parent / "training").rglob("*.py"))
    assert "from probe_toolkit.store.backbone import" in text
    assert "from probe_toolkit.analyses import selection" in text


def test_no_command_unpacks_the_placement():
    """A protocol's run asks its ``RunContext`` where it runs (``device()``, ``decoder()``,
    ``search_device()``, ``sharded``, ``shard()``, ``placed()``): the placement's fields are read in
    the run context and the runner only, so each rule (``auto``, backend torch, a shard) is written once."""
    unpacked = []
    for path in sorted((PACKAGE / "commands").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                held = node.value
                if (isinstance(held, ast.Name) and held.id == "placement") or (isinstance(held, ast.Attribute) and held.attr == "placement"):
                    unpacked.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reads placement.{node.attr}")
    assert unpacked == []


def _torch_loads_without_weights_only(path: Path) -> list[int]:
    """Lines of ``path`` that call ``torch.load`` without ``weights_only=True`` written out."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
                safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
                if not safe:
                    bad.append(node.lineno)
    return bad


def test_every_torch_load_reads_weights_only():
    """Safety: a checkpoint is a pickle, and only ``weights_only=True`` keeps it from running code (the package, the
    training code, the benchmarks, the tools and the tests alike)."""
    repository = Path(probe_toolkit.__file__).resolve().parents[1]
    files = [p for folder in ("probe_toolkit", "training", "benchmarks", "tools", "tests") for p in sorted((repository / folder).rglob("*.py"))]
    assert len(files) > 100
    found = {str(p.relative_to(repository)): lines for p in files if (lines := _torch_loads_without_weights_only(p))}
    assert not found, found
    # the check is not vacuous: a call without the keyword, or with a value that is not the constant True, is found
    assert _torch_loads_without_weights_only_text("torch.load(f)\ntorch.load(f, weights_only=flag)\ntorch.load(f, weights_only=True)") == [1, 2]


def _torch_loads_without_weights_only_text(text: str) -> list[int]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.py"
        path.write_text(text, encoding="utf-8")
        return _torch_loads_without_weights_only(path)
