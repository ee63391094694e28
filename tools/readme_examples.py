"""Regenerate the README's example outputs from what the commands print on the demo.

    python tools/readme_examples.py            # runs `probe demo --quick` in a temporary folder
    python tools/readme_examples.py --check    # exit 1 when README.md differs from the output

Each example block of README.md sits under a marker line ``<!-- example: NAME -->`` and is
replaced whole by what ``probe NAME ...`` prints on the quick demo's stores (``examples``).
``tests/test_demo.py`` runs ``examples`` on the demo it has already made and compares the
blocks, with run-dependent parts masked (``volatile``: seconds, ledger entry ids, checkpoint
hashes).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WIDTH = 120  # columns the tables are printed at
MARKER = re.compile(r"(<!-- example: (?P<name>[\w-]+) -->\n```\n)(?P<body>.*?)(```)", re.S)
EPOCHS = 50  # the quick demo's linear-probe iterations (demo/run.py)


def _probe(*args) -> str:
    from typer.testing import CliRunner

    from probe_toolkit import cli

    saved = cli.console._width  # None: the width follows the terminal; restored exactly, so later output is as before
    cli.console.width = WIDTH
    try:
        result = CliRunner().invoke(cli.app, [str(a) for a in args])
    finally:
        cli.console._width = saved
    if result.exit_code != 0:
        raise RuntimeError(f"probe {' '.join(map(str, args))} failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.stdout.splitlines()).strip("\n") + "\n"


def examples(stores: list[Path], cache: Path) -> dict[str, str]:
    """What ``probe entropy``, ``probe decode`` and ``probe linear`` print on the demo's stores
    (random network first, trained second), keyed by the README's marker names."""
    base = Path(cache).resolve().parent.parent  # the demo's folder: paths are printed relative to it
    random_init, trained = (Path(s).resolve().relative_to(base) for s in stores)
    cache = Path(cache).resolve().relative_to(base)
    here = os.getcwd()
    os.chdir(base)
    try:
        return {
            "entropy": _probe("entropy", random_init, trained, "-q"),
            "decode": _probe("decode", trained, "--panel", "demo-val", "--preset", "centred", "--cache", cache, "-q"),
            "linear": _probe("linear", random_init, trained, "--train", "demo-train", "--val", "demo-val", "--epochs", EPOCHS, "--cache", cache, "-q"),
        }
    finally:
        os.chdir(here)


def volatile(text: str, name: str = "") -> str:
    """The example with what differs between two identical runs masked: seconds, ledger entry ids,
    the checkpoint hash in a store's folder name (training writes its run's paths and times into
    the checkpoint); whitespace collapsed, as a longer name moves where a line wraps. The linear
    probes' figures are masked too: their float32 L-BFGS fits in torch differ by CPU (AVX2 and
    AVX-512 kernels round differently; seen as 68.42 against 68.56 % and another chosen weight
    decay), so only the table's shape and its ledger line are compared there."""
    text = re.sub(r"\b[0-9a-f]{12}\b", "<entry>", text)  # first: an entry id of twelve decimal digits is an id, not a number
    if name == "linear":
        text = re.sub(r"(?<![\w.])\d+(\.\d+)?(e-\d+)?(?![\w.])", "<n>", text)
    text = re.sub(r"\bin \d+(\.\d+)? s\b", "in ? s", text)
    text = re.sub(r"-[0-9a-f]{8}/", "-<sha>/", text)
    return " ".join(text.split())


def blocks(readme: str) -> dict[str, str]:
    return {m["name"]: m["body"] for m in MARKER.finditer(readme)}


def rewrite(readme: str, outputs: dict[str, str]) -> str:
    missing = sorted(set(outputs) - set(blocks(readme)))
    if missing:
        raise SystemExit(f"README.md has no marker for {', '.join(missing)}")
    return MARKER.sub(lambda m: m.group(1) + outputs.get(m["name"], m["body"]) + m.group(4), readme)


def demo_stores(out: Path) -> tuple[list[Path], Path]:
    from probe_toolkit.demo.run import run_demo

    demo = run_demo(out, quick=True, quiet=True, say=lambda _: None)
    return demo.stores, out / "work" / "cache"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the README differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stores, cache = demo_stores(Path(tmp) / "demo")
        outputs = examples(stores, cache)
    readme = README.read_text(encoding="utf-8")
    if args.check:
        found = blocks(readme)
        differ = [name for name, text in outputs.items() if volatile(found.get(name, ""), name) != volatile(text, name)]
        print("README examples " + ("differ: " + ", ".join(differ) if differ else "match"))
        return 1 if differ else 0
    README.write_text(rewrite(readme, outputs), encoding="utf-8")
    print(f"rewrote {', '.join(outputs)} in {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
